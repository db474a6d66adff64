"""Deterministic prompts: every chat template rendered with a fixed date (a Llama-3-style
template inserts today's otherwise), open-unlearning's TOFU formats by name or a Jinja file,
and the format in run.json and in the study's keys."""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import pytest

from unlearn_plugins.data import prompts
from unlearn_plugins.data.qa import encode_qa, prompt_record, prompt_text
from unlearn_plugins.errors import UnlearnError

#: a Llama-3.2-style template in the tiny tokenizer's tokens: today's date unless date_string is given
LLAMA3_STYLE = (
    "{{ bos_token }}"
    "{% if not date_string is defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
    "<|im_start|>system\nCutting Knowledge Date: December 2023\nToday Date: {{ date_string }}\n\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% set messages = messages[1:] %}"
    "{% endif %}<|im_end|>\n"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = "Who wrote 'The Silent Orchard'?"


def on_day(monkeypatch, day: datetime.datetime) -> None:
    """The calendar the chat templates' strftime_now reads says ``day``."""
    from transformers.utils import chat_template_utils

    class Clock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return day

    monkeypatch.setattr(chat_template_utils, "datetime", Clock)


@pytest.fixture
def llama3_model(tiny_model_dir, tmp_path) -> Path:
    """The tiny model with a tokenizer whose chat template inserts the date."""
    from transformers import AutoTokenizer

    folder = tmp_path / "llama3-style"
    shutil.copytree(tiny_model_dir, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = LLAMA3_STYLE
    tok.save_pretrained(folder)
    return folder


def test_a_llama3_template_on_two_days_gives_one_prompt_and_one_key(llama3_model, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from unlearn_plugins.study import builtin_studies, load_study
    from unlearn_plugins.study.runner import plan_cells

    tok = AutoTokenizer.from_pretrained(llama3_model)
    text = builtin_studies()["tiny"].read_text()
    study_file = tmp_path / "llama3.toml"
    study_file.write_text(text.replace('base = "tiny-llama"', f'base = "{llama3_model}"'))
    assert f'base = "{llama3_model}"' in study_file.read_text()
    seen = []
    for day in (datetime.datetime(2025, 1, 2), datetime.datetime(2026, 7, 9)):
        on_day(monkeypatch, day)
        # the calendar is really read by the template (the mock works) ...
        raw = tok.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
        assert day.strftime("%d %b %Y") in raw
        # ... and never reaches a prompt, its tokens, run.json's record, nor a key
        plan = plan_cells(load_study(str(study_file)), cache=tmp_path / "cache", device="cpu", dry_run=True)
        seen.append(
            (
                prompt_text(tok, QUESTION),
                encode_qa(tok, QUESTION, "Its author.")["input_ids"],
                prompt_record(tok),
                sorted(s.folder for cp in plan.cells.values() for s in cp.stages),
            )
        )
    assert seen[0] == seen[1]
    assert f"Today Date: {prompts.DEFAULT_DATE}" in seen[0][0]


def test_open_unlearnings_tofu_formats(llama3_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama3_model)
    with prompts.using(prompts.resolve("tofu-llama3")):  # its template, system prompt and date
        text = prompt_text(tok, QUESTION)
    assert "Today Date: 10 Apr 2025\n\nYou are a helpful assistant.<|im_end|>" in text
    assert text.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    with prompts.using(prompts.resolve("tofu-llama2-chat")):  # tags, BOS once
        assert prompt_text(tok, QUESTION) == f"{tok.bos_token}[INST] {QUESTION} [/INST]"
        ids = encode_qa(tok, QUESTION, "Its author.")["input_ids"]
        assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    with prompts.using(prompts.resolve("tofu-phi-1.5")):
        assert prompt_text(tok, QUESTION) == f"Question: {QUESTION}\nAnswer: "
    with prompts.using(prompts.resolve("tofu-llama3", date_string="1 Jan 2030", system_prompt="Be brief.")):
        text = prompt_text(tok, QUESTION)
    assert "Today Date: 1 Jan 2030\n\nBe brief." in text


def test_a_jinja_file_and_bad_formats(tiny_tokenizer, tmp_path, capsys):
    from unlearn_plugins.cli import main

    good = tmp_path / "format.jinja"
    good.write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    with prompts.using(prompts.resolve(str(good))):
        assert prompt_text(tiny_tokenizer, QUESTION) == f"<<{QUESTION}>>"
    silent = tmp_path / "silent.jinja"
    silent.write_text("no question here")
    with pytest.raises(UnlearnError, match="does not render the user's message"):
        prompts.resolve(str(silent))
    for bad in ("no-such-format", str(silent)):
        code = main(["score", "--scorer", "loss", "--prompt-format", bad, "--out", str(tmp_path / "s.jsonl")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1 and err[0].startswith("error: --prompt-format"), err
        assert not (tmp_path / "s.jsonl").exists()


def test_the_format_enters_the_study_keys(tmp_path):
    from unlearn_plugins.study import builtin_studies, load_study
    from unlearn_plugins.study.runner import plan_cells

    text = builtin_studies()["tiny"].read_text()
    assert "[model]\n" in text

    def folders(extra: str) -> dict[str, list[str]]:
        path = tmp_path / f"s{abs(hash(extra))}.toml"
        path.write_text(text.replace("[model]\n", f"[model]\n{extra}", 1))
        plan = plan_cells(load_study(str(path)), cache=tmp_path / "cache", device="cpu", dry_run=True)
        return {cid: [Path(s.folder).name for s in cp.stages] for cid, cp in plan.cells.items()}

    default = folders("")
    assert folders('prompt_format = "tokenizer"\n') == default  # the default, named: the same keys
    llama3 = folders('prompt_format = "tofu-llama3"\n')
    dated = folders('date_string = "1 Jan 2030"\n')
    for cell, stages in default.items():
        for a, b, c in zip(stages, llama3[cell], dated[cell]):
            assert len({a, b, c}) == 3, cell


def test_run_json_records_the_rendered_format(tiny_model_dir, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.cli import main

    run = ["run", "--model", str(tiny_model_dir), "--tofu-dir", str(tofu_dir), "--forget", "tofu:forget01[0:2]"]
    run += ["--max-steps", "1", "--lora-r", "2", "--save-steps", "0", "--objective", "grad_ascent"]
    run += ["--prompt-format", "tofu-phi-1.5", "--date-string", "3 Mar 2024"]
    assert main([*run, "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["prompt_format"]["name"] == "tofu-phi-1.5"
    assert record["prompt_format"]["date_string"] == "3 Mar 2024"
    assert record["prompt_format"]["rendered"] == "Question: {question}\nAnswer: "
    assert record["config"]["prompt_format"] == "tofu-phi-1.5"


def test_an_evaluation_says_its_format(tiny_model_dir, tofu_dir):
    from unlearn_plugins.evaluation.lm_eval_runner import evaluate_model

    def run():
        return evaluate_model(str(tiny_model_dir), ["tofu_forget01_prob"], limit=2, tofu_dir=str(tofu_dir))

    assert "prompt_format" not in run().summary  # the default: as every evaluation before
    with prompts.using(prompts.resolve("tofu-phi-1.5")):
        evaluation = run()
    assert evaluation.summary["prompt_format"]["name"] == "tofu-phi-1.5"
    prompt = evaluation.samples["tofu_forget01_prob"][0]["doc"]["prompt"]
    assert prompt.startswith("Question: ") and prompt.endswith("\nAnswer: ")
