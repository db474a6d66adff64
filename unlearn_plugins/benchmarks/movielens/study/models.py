"""A MovieLens study's target and retrain models (``rec_finetune`` stages): the recommendation
recipe (:data:`unlearn_plugins.benchmarks.movielens.recipes.RECIPE`, LoRA merged into the base) with
the study's ``[target.finetune]`` / ``[retain.finetune]`` over it, on every user's training
prompts (the target, ``train``) or the retained users' only (the retrain model, ``train_retain``,
the gold standard of unlearning and the JSD reference). The merged model is ``run/merged``."""

from __future__ import annotations

from pathlib import Path

#: the benchmark part each model is fine-tuned on
PARTS = {"target": "train", "retrain": "train_retain"}


def build_finetune(tmp: Path, p: dict) -> None:
    from .. import recipes

    train = recipes.train_target if p["part"] == "train" else recipes.train_retrain
    train(
        p["bench"],
        tmp / "run",
        model=p["model"],
        device=p["device"],
        seed=p["seed"],
        **{"max_length": p["max_length"], **p["finetune"]},
    )


def merged(folder: str | Path) -> str:
    """The model a ``rec_finetune`` stage folder holds."""
    return str(Path(folder) / "run" / "merged")


__all__ = ["build_finetune", "merged", "PARTS"]
