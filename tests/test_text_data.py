"""Documents as forget and retain data (``text:`` specs): windows of --max-length tokens checked
against a hand computation, bad corpora refused in one line, QA-only objectives refusing text,
and a short `unlearn run` on a tiny text corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unlearn_plugins.cli import main
from unlearn_plugins.data import text
from unlearn_plugins.errors import DataError

pytestmark = pytest.mark.usefixtures("single_thread")


class CharTokenizer:
    """One token per character (its code point): token counts are known by hand. ``bos``:
    an id added in front by ``add_special_tokens=True``, as Llama's tokenizer adds BOS."""

    def __init__(self, bos: int | None = None):
        self.bos = bos

    def __call__(self, s: str, add_special_tokens: bool = True):
        ids = ([self.bos] if add_special_tokens and self.bos is not None else []) + [ord(c) for c in s]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


def ids(s: str) -> list[int]:
    return [ord(c) for c in s]


def test_windows_match_a_hand_computation():
    # "abcdefghij" + "\n\n" + "klm" = 15 tokens; windows of 4, stride 4: 4 + 4 + 4 + 3 (kept)
    docs = [text.Document("abcdefghij", "d0"), text.Document("klm", "d1")]
    got = text.windows(CharTokenizer(), docs, 4)
    assert [list(w.input_ids) for w in got] == [ids("abcd"), ids("efgh"), ids("ij\n\n"), ids("klm")]
    encoded = text.encode_windows(got)
    for e in encoded:  # labels on every token, no prompt, no padding
        assert e["labels"] == e["input_ids"] and e["attention_mask"] == [1] * len(e["input_ids"])
    assert [w.index for w in got] == [0, 1, 2, 3]
    # a length that divides the stream: no empty last window
    assert [list(w.input_ids) for w in text.windows(CharTokenizer(), docs, 5)] == [
        ids("abcde"),
        ids("fghij"),
        ids("\n\nklm"),
    ]


def test_windows_keep_a_tokenizer_bos_inside_max_length():
    got = text.windows(CharTokenizer(bos=1), [text.Document("abcdefg", "d0")], 4)
    assert [list(w.input_ids) for w in got] == [[1, *ids("abc")], [1, *ids("def")], [1, *ids("g")]]


def test_windows_with_the_tiny_tokenizer_cover_the_stream(tiny_tokenizer):
    docs = [text.Document("The capital of France is Paris.", "a"), text.Document("Who are the parents?", "b")]
    stream = tiny_tokenizer(docs[0].text + "\n\n" + docs[1].text, add_special_tokens=False)["input_ids"]
    got = text.windows(tiny_tokenizer, docs, 8)
    assert len(got) == -(-len(stream) // 8)
    assert [t for w in got for t in w.input_ids] == stream
    assert all(len(w.input_ids) == 8 for w in got[:-1]) and 1 <= len(got[-1].input_ids) <= 8


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_reads_jsonl_and_a_folder_of_txt(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}, {"text": "  "}, {"text": "two", "id": 3}])
    assert [d.text for d in text.read_documents(f"text:{f}")] == ["one", "two"]
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "b.txt").write_text("second", encoding="utf-8")
    (folder / "a.txt").write_text("first", encoding="utf-8")
    assert [d.text for d in text.read_documents(f"text:{folder}")] == ["first", "second"]


@pytest.mark.parametrize(
    "content,needle",
    [
        ("", "has no text"),
        ('{"body": "x"}\n', "c.jsonl:1: no 'text' field"),
        ('{"text": "ok"}\n{"text": 3}\n', "c.jsonl:2: field 'text' is not a string"),
        ('{"text": "ok"}\nnot json\n', "c.jsonl:2: not valid JSON"),
    ],
)
def test_bad_corpora_are_named(tmp_path, content, needle):
    f = tmp_path / "c.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=needle):
        text.read_documents(f"text:{f}")


def test_bad_specs_are_named(tmp_path):
    for spec, needle in [
        ("text:", "bad data spec"),
        (f"text:{tmp_path / 'missing.jsonl'}", "does not exist"),
        (f"text:{tmp_path}", "holds no .txt files"),
        ("text:hf:only-an-id", "expected text:hf:ID:SPLIT:COLUMN"),
    ]:
        with pytest.raises(DataError, match=needle):
            text.read_documents(spec)


def test_hub_id_not_cached_names_what_to_download(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="not in the local datasets cache.*load_dataset") as exc:
        text.read_documents("text:hf:unlearn-plugins-test/no-such-corpus:train:text")
    assert "\n" not in str(exc.value)


# ----------------------------------------------------------------------------- the CLI


def corpus(tmp_path: Path, name: str, seed: int) -> Path:
    sentences = [
        "The capital of France is Paris.",
        "She writes fantasy novels and short stories about the sea.",
        "Her father was a doctor and her mother was a painter.",
        "He won the International Booker Prize for his debut novel.",
    ]
    rows = [{"text": " ".join(sentences[(i + seed) % 4] for i in range(k + 2))} for k in range(3)]
    return write_jsonl(tmp_path / name, rows)


def cli_args(tiny_model_dir, tmp_path, objective, out, *extra):
    return [
        "run",
        "--model",
        str(tiny_model_dir),
        "--forget",
        f"text:{corpus(tmp_path, 'forget.jsonl', 0)}",
        "--retain",
        f"text:{corpus(tmp_path, 'retain.jsonl', 1)}",
        "--objective",
        objective,
        "--max-length",
        "16",
        "--lora-r",
        "2",
        "--batch-size",
        "2",
        "--max-steps",
        "1",
        "--save-steps",
        "0",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize(
    "objective", ["grad_diff", "npo", "rmu", "grad_ascent", "simnpo", "wga", "satimp", "undial", "ihl", "ceu"]
)
def test_unlearn_run_trains_on_text_windows(objective, tiny_model_dir, tiny_tokenizer, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(cli_args(tiny_model_dir, tmp_path, objective, out))
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["steps"] == 1
    forget = text.load_windows(f"text:{tmp_path / 'forget.jsonl'}", tiny_tokenizer, 16)
    assert record["samples"]["forget"] == len(forget) > 3  # windows, not the 3 documents
    assert (out / "adapter_model.safetensors").is_file()


def test_qa_objective_refuses_text(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(cli_args(tiny_model_dir, tmp_path, "idk_dpo", out))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("error: ")
    assert "idk_dpo" in err[0] and "question-answer data" in err[0]
    assert not out.exists()


def test_missing_text_field_is_one_cli_line(tiny_model_dir, tmp_path, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, {"content": "no text here"}])
    args = cli_args(tiny_model_dir, tmp_path, "grad_diff", tmp_path / "run")
    args[args.index("--forget") + 1] = f"text:{bad}"
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "bad.jsonl:2: no 'text' field" in err[0]
    assert not (tmp_path / "run").exists()


def test_shared_documents_are_refused(tiny_model_dir, tmp_path, capsys):
    args = cli_args(tiny_model_dir, tmp_path, "grad_diff", tmp_path / "run")
    args[args.index("--retain") + 1] = args[args.index("--forget") + 1]
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "share 3 document(s)" in err[0]
    assert not (tmp_path / "run").exists()


def test_dry_run_plans_text_windows(tiny_model_dir, tmp_path, capsys):
    args = cli_args(tiny_model_dir, tmp_path, "grad_diff", tmp_path / "run", "--dry-run")
    assert main(args) == 0, capsys.readouterr().err
    assert not (tmp_path / "run").exists()
