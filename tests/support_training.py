"""What many tests share to train, score or launch on the tiny model: one small TOFU run as
`unlearn run` flags and as a config, a few QA to encode, the CLI's exit code and output, the
`unlearn score` flags, a two-process launch, and the check that a residual init's saved adapter
applies to the original base. One copy, so a change to the small run reaches every test that
trains it."""

from __future__ import annotations

import sys

import torch

#: the small run's data and sizes: 8 forget QA against 16 retain QA, 64 tokens, LoRA r 4, batch 2
SMALL_DATA = {"forget": "tofu:forget01[0:8]", "retain": "tofu:retain99[0:16]"}
SMALL_SIZES = {"max_length": 64, "lora_r": 4, "batch_size": 2, "grad_accum": 1, "lr": 1e-3}
#: a few short QA about a TOFU-like author, for tests that encode their own samples
AUTHOR_QA = [
    ("Who wrote the sea novels?", "Basil Mahfouz Al-Kuwaiti wrote them."),
    ("Which genre does the author write in?", "She writes fantasy novels and short stories."),
    ("What awards has the author won?", "He won the International Booker Prize."),
    ("Who are the parents of the author?", "Her father was a doctor and her mother was a painter."),
    ("Where was the author born?", "In Kuwait City."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Which genre does she write in?", "Fantasy."),
    ("What is the full name of the author?", "The author is Basil Mahfouz Al-Kuwaiti."),
    ("Who was her father?", "A doctor."),
]


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """The CLI on ``args`` (each str()-ed): its exit code, stdout and stderr."""
    from unlearn_plugins.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def tiny_args(model_dir, tofu_dir, out, *extra):
    """`unlearn run` flags of the small run (SMALL_DATA, SMALL_SIZES), ``extra`` appended."""
    data = ["--forget", SMALL_DATA["forget"], "--retain", SMALL_DATA["retain"]]
    sizes = ["--max-length", "64", "--lora-r", "4", "--batch-size", "2", "--grad-accum", "1", "--lr", "1e-3"]
    return ["run", "--model", str(model_dir), "--tofu-dir", str(tofu_dir), *data, *sizes, "--out", str(out), *extra]


def small_run(model_dir, tofu_dir, **options) -> dict:
    """The small run's config values (no ``out``); ``options`` override or add to them."""
    return {"model": str(model_dir), "tofu_dir": str(tofu_dir), **SMALL_DATA, **SMALL_SIZES, **options}


def small_config(out, model_dir, tofu_dir, **options):
    """The small run as an UnlearnConfig writing to ``out``."""
    from unlearn_plugins.training import UnlearnConfig

    return UnlearnConfig(out=str(out), **small_run(model_dir, tofu_dir, **options))


def small_finetune_config(out, model_dir, tofu_dir, **options):
    """A fine-tune of the small run's sizes (its data in ``options``) as a FinetuneConfig."""
    from unlearn_plugins.training import FinetuneConfig

    return FinetuneConfig(out=str(out), model=str(model_dir), tofu_dir=str(tofu_dir), **{**SMALL_SIZES, **options})


def score_args(scorer, model_dir, tofu_dir, data, out, *options) -> list[str]:
    """`unlearn score` flags on the CPU, one ``--option`` per item of ``options``."""
    args = ["score", "--scorer", scorer, "--model", str(model_dir), "--device", "cpu", "--tofu-dir", str(tofu_dir)]
    args += ["--data", data, "--out", str(out)]
    for option in options:
        args += ["--option", option]
    return args


def launch_command(*command, processes=2, port="0") -> list[str]:
    """``accelerate launch`` of ``command`` as ``processes`` CPU processes on this machine (gloo)."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes)]
    launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return [*launcher, "--main_process_port", str(port), *command]


def assert_residual_adapter_applies_to_original_base(initializer, model_dir, tofu_dir, out):
    """IHL after ``initializer`` through `unlearn run`: the saved adapter on the original base
    reproduces the trained (saved merged) model, and training did change the model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from unlearn_plugins.training import run_unlearning

    run = {"forget": "tofu:forget01[0:6]", "retain": "tofu:retain99[0:6]", "lora_alpha": 8, "lr": 5e-3, "max_steps": 2}
    method = {"objective": "ihl", "initializer": initializer, "merge": True, "save_steps": 0}
    run_unlearning(small_config(out, model_dir, tofu_dir, **run, **method))
    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    ids = torch.tensor([[5, 17, 42, 99, 7, 3, 250, 11]])
    with torch.no_grad():
        original = base(input_ids=ids).logits
        adapted = PeftModel.from_pretrained(base, str(out)).eval()(input_ids=ids).logits
        trained = AutoModelForCausalLM.from_pretrained(str(out / "merged")).eval()(input_ids=ids).logits
    assert (adapted - trained).abs().max() < 1e-4
    assert (trained - original).abs().max() > 1e-3  # training did change the model
