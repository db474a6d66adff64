"""The relearning attack: a few fine-tuning steps on part of the forget set, then measure the
other part. Forgetting that was only suppression comes back for samples the attack never
showed (Hu et al., "Jogging the Memory of Unlearned LLMs"; Lynch et al., "Eight Methods to
Evaluate Robust Unlearning"); a model that really lost the knowledge relearns the shown part
only. The training itself is ``unlearn finetune`` (LoRA, merged) on the shown part."""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..errors import UnlearnError
from ..interfaces import AttackResult


def split_forget(n: int, fraction: float, *, group: int = 20) -> tuple[list[int], list[int]]:
    """(rows to relearn on, rows to measure) of ``n`` forget samples: the first ``fraction`` of
    each block of ``group`` rows (TOFU: an author's 20 QA), so the measured QA are about people
    the attack also showed."""
    if not 0 < fraction < 1:
        raise UnlearnError(f"relearn: fraction must be in (0, 1), got {fraction}")
    train, measure = [], []
    for start in range(0, n, group):
        rows = list(range(start, min(start + group, n)))
        k = min(len(rows) - 1, max(1, math.floor(len(rows) * fraction)))
        train += rows[:k]
        measure += rows[k:]
    if not measure or not train:
        raise UnlearnError(
            f"relearn: {n} forget sample(s) cannot be split into a part to relearn and a part to measure"
        )
    return train, measure


@dataclass
class Relearn:
    """Fine-tune (LoRA, merged) on the first ``fraction`` of each author's forget QA for ``steps``
    optimizer steps; the evaluation then measures the rest (``measure.json``)."""

    fraction: float = field(default=0.5, metadata={"help": "share of each author's forget QA shown to the attack"})
    steps: int = field(default=10, metadata={"help": "optimizer steps"})
    lr: float = field(default=1e-4, metadata={"help": "learning rate (constant)"})
    batch_size: int = field(default=4, metadata={"help": "QA per step"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=32.0, metadata={"help": "LoRA alpha"})
    max_length: int = field(default=512, metadata={"help": "tokens per QA (chat prompt + answer)"})
    group: int = field(default=20, metadata={"help": "QA per author in the forget split (TOFU: 20)"})
    seed: int = field(default=0, metadata={"help": "training seed"})
    needs_forget_data: ClassVar[bool] = True

    def __post_init__(self):
        if not 0 < self.fraction < 1:
            raise ValueError(f"fraction must be in (0, 1), got {self.fraction}")
        for name in ("steps", "batch_size", "lora_r", "group"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

    def attack(self, context) -> AttackResult:
        from ..files import write_jsonl
        from ..training import FinetuneConfig, run_finetune

        samples = context.forget_samples()
        train, measure = split_forget(len(samples), self.fraction, group=self.group)
        with tempfile.TemporaryDirectory(prefix="relearn-") as tmp:
            data = str(Path(tmp) / "relearn.json")
            write_jsonl(data, [samples[i].to_record() for i in train])
            result = run_finetune(
                FinetuneConfig(
                    out=str(Path(tmp) / "run"),
                    model=context.model_dir(),
                    data=data,
                    max_steps=self.steps,
                    lr=self.lr,
                    batch_size=self.batch_size,
                    grad_accum=1,
                    lora_r=self.lora_r,
                    lora_alpha=self.lora_alpha,
                    max_length=self.max_length,
                    seed=self.seed,
                    device=context.device,
                    dtype=context.dtype,
                    merge=True,
                    save_steps=0,
                    overwrite=True,
                    trust_remote_code=context.trust_remote_code,
                )
            )
            context.adopt_folder(Path(tmp) / "run" / "merged")
        return AttackResult(
            info={
                "trained_on": train,
                "steps": result.record.get("steps"),
                "final_loss": result.record.get("final_loss"),
            },
            measure_on=measure,
        )
