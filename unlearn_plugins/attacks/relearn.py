"""The relearning attack: a few fine-tuning steps on part of the forget set, then measure the
other part. Forgetting that was only suppression comes back for samples the attack never
showed (Hu et al., "Jogging the Memory of Unlearned LLMs"; Lynch et al., "Eight Methods to
Evaluate Robust Unlearning"); a model that really lost the knowledge relearns the shown part
only. The training itself is ``unlearn finetune`` (LoRA, merged) on the shown part."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Sequence

from ..errors import UnlearnError


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
        raise UnlearnError(f"relearn: {n} forget sample(s) cannot be split into a part to relearn and a part to "
                           "measure")
    return train, measure


def merged_copy(model: str, adapter: str | None, folder: Path, *, device: str | None = None) -> str:
    """``model`` (+ ``adapter`` folded in) saved as a plain checkpoint to fine-tune from."""
    from ..models import load_model

    if adapter is None:
        return model
    loaded, tok = load_model(model, device=device, adapter=adapter)
    loaded = loaded.merge_and_unload()
    loaded.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return str(folder)


def relearn(model: str, *, adapter: str | None, samples: Sequence, out: str, fraction: float = 0.5,
            steps: int = 10, lr: float = 1e-4, batch_size: int = 4, lora_r: int = 16, lora_alpha: float = 32.0,
            max_length: int = 512, seed: int = 0, group: int = 20, device: str | None = None) -> dict:
    """Fine-tune on the first part of the forget set; the merged result lands in ``out/merged``.
    Returns which rows were shown and which are to be measured."""
    from ..files import write_jsonl
    from ..training import FinetuneConfig, run_finetune

    train, measure = split_forget(len(samples), fraction, group=group)
    with tempfile.TemporaryDirectory(prefix="relearn-") as tmp:
        start = merged_copy(model, adapter, Path(tmp) / "start", device=device)
        data = str(Path(tmp) / "relearn.json")
        write_jsonl(data, [samples[i].to_record() for i in train])
        run_finetune(FinetuneConfig(out=out, model=start, data=data, max_steps=steps, lr=lr, batch_size=batch_size,
                                    grad_accum=1, lora_r=lora_r, lora_alpha=lora_alpha, max_length=max_length,
                                    seed=seed, device=device, merge=True, save_steps=0, overwrite=True))
    return {"attack": "relearn", "steps": steps, "lr": lr, "fraction": fraction, "trained_on": train,
            "measure_on": measure, "model": str(Path(out) / "merged")}
