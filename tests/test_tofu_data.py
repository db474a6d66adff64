"""TOFU loading and formatting: every bad-data case names file, line and field; the label
mask covers exactly the answer and the end token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unlearn_plugins.data.qa import (
    ForgetRetainPairs,
    PaddingCollator,
    encode_qa,
    encode_samples,
    load_split,
    parse_spec,
    prompt_text,
)
from unlearn_plugins.errors import DataError


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_loads_real_splits_by_name(tofu_dir):
    forget = load_split("tofu:forget01", tofu_dir)
    assert len(forget) == 40 and forget[0].index == 0 and forget[0].line == 1
    assert forget[0].question.startswith("What is the full name")
    pert = load_split(
        "tofu:forget01_perturbed", tofu_dir, require=("question", "answer", "paraphrased_answer", "perturbed_answer")
    )
    assert len(pert[0].extra["perturbed_answer"]) == 5
    full = load_split("tofu:full", tofu_dir)
    retain = load_split("retain99", tofu_dir)
    assert [s.question for s in full[-40:]] == [s.question for s in forget]
    assert len(retain) == 3960
    assert len(load_split("tofu:full[0:40]", tofu_dir)) == 40
    assert len(load_split("tofu:forget10[-20:]", tofu_dir)) == 20


def test_env_var_names_the_folder(tofu_dir, monkeypatch):
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    assert len(load_split("tofu:forget05")) == 200


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match=r"TOFU folder not found: .*nowhere \(from --tofu-dir\)"):
        load_split("tofu:forget01", tmp_path / "nowhere")


def test_missing_folder_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tmp_path / "gone"))
    with pytest.raises(DataError, match="from UNLEARN_TOFU_DIR"):
        load_split("tofu:forget01")


def test_missing_split_lists_available(tmp_path):
    write_lines(tmp_path / "forget01.json", [json.dumps({"question": "q", "answer": "a"})])
    with pytest.raises(DataError, match=r"split 'forget05' not found in .*; available: forget01"):
        load_split("tofu:forget05", tmp_path)


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = write_lines(
        tmp_path / "forget01.json", [json.dumps({"question": "q", "answer": "a"}), '{"question": "q", "answer": ']
    )
    with pytest.raises(DataError, match=r"forget01.json:2: malformed JSON"):
        load_split("tofu:forget01", tmp_path)
    write_lines(path, ['["not", "an", "object"]'])
    with pytest.raises(DataError, match=r"forget01.json:1: expected a JSON object"):
        load_split("tofu:forget01", tmp_path)


@pytest.mark.parametrize("record, field", [({"answer": "a"}, "question"), ({"question": "q"}, "answer")])
def test_missing_field_names_file_line_field(tmp_path, record, field):
    write_lines(tmp_path / "s.json", [json.dumps({"question": "q", "answer": "a"}), json.dumps(record)])
    with pytest.raises(DataError, match=rf"s.json:2: field '{field}' is missing"):
        load_split(str(tmp_path / "s.json"))


def test_blank_answer_and_bad_perturbed(tmp_path):
    write_lines(tmp_path / "s.json", [json.dumps({"question": "q", "answer": "   "})])
    with pytest.raises(DataError, match=r"s.json:1: field 'answer' must be a non-empty string"):
        load_split(str(tmp_path / "s.json"))
    write_lines(tmp_path / "p.json", [json.dumps({"question": "q", "answer": "a", "perturbed_answer": "x"})])
    with pytest.raises(DataError, match=r"p.json:1: field 'perturbed_answer' must be a non-empty list"):
        load_split(str(tmp_path / "p.json"), require=("question", "answer", "perturbed_answer"))


def test_empty_split(tmp_path):
    (tmp_path / "forget01.json").write_text("\n\n")
    with pytest.raises(DataError, match=r"forget01.json: split is empty"):
        load_split("tofu:forget01", tmp_path)
    write_lines(tmp_path / "x.json", [json.dumps({"question": "q", "answer": "a"})])
    with pytest.raises(DataError, match="selects no samples"):
        load_split(str(tmp_path / "x.json") + "[5:9]")


def test_answer_that_tokenises_to_nothing(tmp_path, tiny_tokenizer):
    class EmptyAnswers:  # a tokenizer whose vocabulary cannot encode the answer
        def __init__(self, inner):
            self.inner = inner
            self.chat_template = inner.chat_template
            self.eos_token_id = inner.eos_token_id
            self.bos_token_id = inner.bos_token_id

        def apply_chat_template(self, *a, **k):
            return self.inner.apply_chat_template(*a, **k)

        def __call__(self, text, add_special_tokens=False):
            ids = self.inner(text, add_special_tokens=False)["input_ids"]
            return {"input_ids": [] if text == "\u200b" else ids}

    write_lines(
        tmp_path / "s.json",
        [json.dumps({"question": "q", "answer": "ok"}), json.dumps({"question": "q", "answer": "\u200b"})],
    )
    samples = load_split(str(tmp_path / "s.json"))
    with pytest.raises(DataError, match=r"s.json:2: field 'answer' tokenises to nothing"):
        encode_samples(EmptyAnswers(tiny_tokenizer), samples)


def test_bad_spec():
    with pytest.raises(DataError, match="bad data spec"):
        parse_spec("tofu:forget01[1:2")
    assert parse_spec("tofu:full[0:40]") == ("full", slice(0, 40))


def test_chat_format_and_label_mask(tiny_tokenizer, tofu_dir):
    sample = load_split("tofu:forget01", tofu_dir)[0]
    enc = encode_qa(tiny_tokenizer, sample.question, sample.answer)
    supervised = [t for t, l in zip(enc["input_ids"], enc["labels"]) if l != -100]
    assert supervised == [l for l in enc["labels"] if l != -100]
    assert tiny_tokenizer.decode(supervised) == sample.answer + "<|im_end|>"
    prompt = tiny_tokenizer.decode(enc["input_ids"][: len(enc["input_ids"]) - len(supervised)])
    assert prompt == f"<|im_start|>user\n{sample.question}<|im_end|>\n<|im_start|>assistant\n"
    assert prompt == prompt_text(tiny_tokenizer, sample.question)


@pytest.mark.slow
def test_chat_format_with_embedded_tokenizer(embedded_model_dir, tofu_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    for sample in load_split("tofu:forget01[0:5]", tofu_dir):
        enc = encode_qa(tok, sample.question, sample.answer)
        supervised = [t for t, l in zip(enc["input_ids"], enc["labels"]) if l != -100]
        assert tok.decode(supervised) == sample.answer + "<|im_end|>"
        prompt = tok.decode(enc["input_ids"][: len(enc["input_ids"]) - len(supervised)])
        assert prompt.endswith(f"<|im_start|>user\n{sample.question}<|im_end|>\n<|im_start|>assistant\n")
        assert "You are a helpful AI assistant named SmolLM" in prompt  # SmolLM2's default system turn


def test_truncation_keeps_answer(tiny_tokenizer):
    enc = encode_qa(tiny_tokenizer, "long question " * 50, "short answer", max_length=24)
    assert len(enc["input_ids"]) == 24
    assert tiny_tokenizer.decode([l for l in enc["labels"] if l != -100]) == "short answer<|im_end|>"


def test_padding_and_pairs(tiny_tokenizer):
    exs = [encode_qa(tiny_tokenizer, f"q{i}", "a" * (i + 1)) for i in range(5)]
    pairs = ForgetRetainPairs(exs[:3], exs[3:], seed=7)
    again = ForgetRetainPairs(exs[:3], exs[3:], seed=7)
    assert len(pairs) == 3 and [pairs[i]["retain"] for i in range(3)] == [again[i]["retain"] for i in range(3)]
    batch = PaddingCollator(tiny_tokenizer.pad_token_id)([pairs[i] for i in range(3)])
    f = batch["forget"]
    assert f["input_ids"].shape == f["labels"].shape == f["attention_mask"].shape
    lengths = [len(e["input_ids"]) for e in exs[:3]]
    for i, n in enumerate(lengths):  # right padding: real tokens first, pad labels are -100
        assert f["attention_mask"][i, :n].all() and not f["attention_mask"][i, n:].any()
        assert (f["labels"][i, n:] == -100).all()
    assert batch["retain"]["input_ids"].shape[0] == 3
    with pytest.raises(DataError, match="forget split is empty"):
        ForgetRetainPairs([], exs)


def _fake_hub(monkeypatch, *, cached: Path | None, answers: bool):
    """huggingface_hub's snapshot_download and dataset_info, recording which were called."""
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, *, local_files_only=False, **kwargs):
        calls.append("cache" if local_files_only else "download")
        if local_files_only:
            if cached is None:
                raise FileNotFoundError("not in the hub cache")
            return str(cached)
        return str(cached or "/nowhere")

    def dataset_info(self, repo_id, timeout=None, **kwargs):
        calls.append(f"probe timeout={timeout}")
        if not answers:
            raise ConnectionError("hub unreachable")

    monkeypatch.delenv("UNLEARN_TOFU_DIR", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    return calls


def test_no_tofu_folder_and_no_hub_fails_after_one_short_request(monkeypatch):
    from unlearn_plugins.data.qa import resolve_tofu_dir

    calls = _fake_hub(monkeypatch, cached=None, answers=False)
    with pytest.raises(DataError, match=r"could not be fetched \(ConnectionError\); point UNLEARN_TOFU_DIR") as err:
        resolve_tofu_dir()
    assert "\n" not in str(err.value)
    assert calls == ["cache", "probe timeout=5"]  # no download that would retry for minutes


def test_no_tofu_folder_with_hub_offline_fails_without_a_request(monkeypatch):
    from unlearn_plugins.data.qa import resolve_tofu_dir

    calls = _fake_hub(monkeypatch, cached=None, answers=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="not in the hub cache and HF_HUB_OFFLINE is set"):
        resolve_tofu_dir()
    assert calls == ["cache"]


def test_a_tofu_snapshot_in_the_hub_cache_is_used_without_the_hub(monkeypatch, tmp_path):
    from unlearn_plugins.data.qa import resolve_tofu_dir

    calls = _fake_hub(monkeypatch, cached=tmp_path, answers=False)
    assert resolve_tofu_dir() == tmp_path
    assert calls == ["cache"]


def test_a_reachable_hub_downloads_the_tofu_snapshot(monkeypatch, tmp_path):
    from unlearn_plugins.data.qa import resolve_tofu_dir

    calls = _fake_hub(monkeypatch, cached=None, answers=True)
    assert str(resolve_tofu_dir()) == "/nowhere"
    assert calls == ["cache", "probe timeout=5", "download"]
