"""The target and retrain models: the same LoRA fine-tune of the base model, on every
user's training prompts (target) or on the retained users' only (retrain, the gold standard
of unlearning).

The recipe (:data:`RECIPE`): LoRA r 16 / alpha 32 on every linear layer of the decoder
blocks, lr 1e-3 constant, batch 8, 2 epochs, prompts cut at 384 tokens (MovieLens-100K
prompts with K = 10 are 100-260 SmolLM2 tokens), merged into the base so the unlearning runs,
`unlearn eval` and lm-eval load it as a plain model. TALLRec tunes LoRA r 8 with lr 1e-4 for
many epochs on few prompts; one higher learning rate and two epochs keep the fine-tune
inside a CPU budget. The full MovieLens-100K benchmark has ~79k training prompts; this
machine (2 CPU cores) fits a subsample: :data:`BUDGET_SETTINGS` keeps 100 users with their 10
most recent training prompts each (~1,000 prompts) and 5 test prompts each.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from unlearn_plugins.training.config import FinetuneConfig

from .benchmark import BenchmarkSettings, part_path, read_info

RECIPE: dict[str, Any] = {
    "lora_r": 16,
    "lora_alpha": 32.0,
    "lora_dropout": 0.0,
    "lr": 1e-3,
    "lr_scheduler": "constant",
    "epochs": 2.0,
    "batch_size": 8,
    "grad_accum": 1,
    "max_length": 384,
    "seed": 0,
    "merge": True,
    "save_steps": 0,
}
#: the documented subsample that fits a 2-core CPU budget (see the module docstring)
BUDGET_SETTINGS = BenchmarkSettings(users=100, max_train_per_user=10, max_eval_per_user=5)


def finetune_config(
    benchmark_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    part: str,
    model: str = "smollm2-135m",
    **overrides: Any,
) -> FinetuneConfig:
    """The recipe on one part of a written benchmark; ``overrides``: any FinetuneConfig field."""
    read_info(benchmark_dir)  # a benchmark folder, or a clear error
    options = {**RECIPE, **overrides}
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
    unknown = sorted(set(options) - fields)
    if unknown:
        from unlearn_plugins.training.config import ConfigError

        raise ConfigError(f"recipe: unknown option(s) {unknown}; options are FinetuneConfig fields")
    return FinetuneConfig(out=str(out), model=model, data=str(part_path(benchmark_dir, part)), **options)


def target_config(benchmark_dir, out, **kwargs) -> FinetuneConfig:
    """The target model: every user's training prompts (train.json)."""
    return finetune_config(benchmark_dir, out, part="train", **kwargs)


def retrain_config(benchmark_dir, out, **kwargs) -> FinetuneConfig:
    """The retrained model: the retained users' training prompts only (train_retain.json)."""
    return finetune_config(benchmark_dir, out, part="train_retain", **kwargs)


def train_target(benchmark_dir, out, **kwargs):
    """Fine-tune the target (``run_finetune``); returns its RunResult (merged model in OUT/merged)."""
    from unlearn_plugins.training.run import run_finetune

    return run_finetune(target_config(benchmark_dir, out, **kwargs))


def train_retrain(benchmark_dir, out, **kwargs):
    """Fine-tune the retrained model (``run_finetune``); returns its RunResult."""
    from unlearn_plugins.training.run import run_finetune

    return run_finetune(retrain_config(benchmark_dir, out, **kwargs))


def merged_model(out: str | os.PathLike) -> Path:
    """Where a recipe run put its merged model."""
    return Path(out) / "merged"
