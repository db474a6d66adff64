"""Named method recipes for `unlearn run --preset NAME`: the published defaults of a method,
applied below any --config file and command-line flag."""

from __future__ import annotations

from ..errors import UnlearnError

PRESETS: dict[str, dict] = {
    # ReGLU (Findings of ACL 2026), TOFU defaults of the reference code (see docs/methods.md):
    # RILA init + IHL forget loss + ROL regulariser, LoRA r 32 / alpha 64 on q,k,v,o,gate,up,down;
    # effective batch 32 (4 x 8 per process), AdamW, weight decay 0.01, HF linear decay after a
    # linear warmup of one epoch. RILA's own defaults (faithful pooling, 256 samples per split)
    # are the reference's. The reference's 500-token limit is left to --max-length (default 512:
    # the same for TOFU QA, and a preset value would override callers that set their own).
    "reglu": {
        "objective": "ihl",
        "initializer": "rila",
        "initializer_options": {"beta": 0.7, "rol_rank": 128},
        "regularizer": "rol",
        "regularizer_options": {"weight": 0.5, "rank": 128},
        "lora_r": 32,
        "lora_alpha": 64.0,
        "lora_dropout": 0.0,
        "lr": 1e-4,
        "epochs": 5.0,
        "batch_size": 4,
        "grad_accum": 8,
        "weight_decay": 0.01,
        "lr_scheduler": "linear",
        "warmup_epochs": 1.0,
    },
    # SIBL (open-unlearning pull request 159, configs/trainer/SIBL.yaml): full fine-tuning, batch
    # 2 without accumulation, T = 20 outer iterations (one per micro-batch); the method steps the
    # weights itself, so lr, optimizer and schedule do not act.
    "sibl": {
        "objective": "sibl",
        "full_finetune": True,
        "batch_size": 2,
        "grad_accum": 1,
        "max_steps": 20,
    },
}


def preset(name: str) -> dict:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnlearnError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}") from None
