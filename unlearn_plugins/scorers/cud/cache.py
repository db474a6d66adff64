"""CUD's disk cache (``$UNLEARN_CACHE_DIR/cud`` or the option ``cache_dir``): each anchor run's
per-sample losses (``anchors/KEY.json``) and each sample's EAP-IG matrix (``matrices/KEY.pt``),
keyed by fingerprints of the model weights, the samples and the settings, so a second scoring
skips both; under ``accelerate launch`` it is also how the processes hand their share to the
main one (``shards/RUN-I.json`` marks which weights and folder each process used).

The keys are on users' disks: changing how one is computed recomputes every cached result
(tests/test_digests.py pins them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ...files import json_digest
from ...interfaces import QASample

KEY_LENGTH = 32  # hex digits of a cache key


def model_fingerprint(model) -> str:
    """A digest of every parameter (name, shape, dtype, sums, first values): changes when
    the weights change (another fine-tune, an adapter), cheap to compute."""
    import hashlib

    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            head = flat[:16].double().cpu().tolist()
            stats = [float(flat.double().sum()), float(flat.double().pow(2).sum())]
            h.update(json.dumps([name, list(p.shape), str(p.dtype), stats, head]).encode())
    device = next(model.parameters()).device.type
    if device != "cpu":  # another device rounds otherwise (CPU keys stay as they were)
        h.update(device.encode())
    return h.hexdigest()[:24]


def samples_fingerprint(samples: Sequence[QASample]) -> str:
    """A digest of the samples' questions and answers, in order."""
    import hashlib

    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s.question, s.answer]).encode())
    return h.hexdigest()[:24]


def anchor_run_key(model_fp: str, pool_fp: str, objective: str, seed: int, runner: dict) -> str:
    """Key of one anchor run: the weights, the pool's samples, the run and the runner's settings."""
    return json_digest(("anchor-run", model_fp, pool_fp, objective, seed, runner, *_prompt_part()), length=KEY_LENGTH)


def matrix_key(model_fp: str, sample: QASample, settings: dict) -> str:
    """Key of one sample's EAP-IG matrix: the weights, the sample and the EAP-IG settings."""
    return json_digest(
        ("eap-ig", model_fp, sample.question, sample.answer, settings, *_prompt_part()), length=KEY_LENGTH
    )


def _prompt_part() -> tuple:
    """The prompt format in force, when it is not the default (data/prompts.py)."""
    from ...data import prompts

    return prompts.key_part(prompts.active())


def default_cache_dir() -> Path:
    from ...models import cache_dir

    return cache_dir() / "cud"


class CUDCache:
    """The cache folder ``root``: reads give None for a missing or unreadable entry (the caller
    recomputes it); writes are temp-then-rename."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def read_anchor_run(self, key: str) -> tuple[list[float], dict] | None:
        """(losses, info) of a cached anchor run."""
        path = self.root / "anchors" / f"{key}.json"
        if not path.is_file():
            return None
        try:
            cached = json.loads(path.read_text())
            return [float(x) for x in cached["losses"]], dict(cached.get("info") or {})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_anchor_run(self, key: str, record: dict[str, Any]) -> None:
        from ...files import write_json

        write_json(self.root / "anchors" / f"{key}.json", record)

    def read_matrix(self, key: str):
        """The cached scores of the graph's real edges (a 1-D tensor)."""
        import torch

        path = self.root / "matrices" / f"{key}.pt"
        if not path.is_file():
            return None
        try:
            tensor = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # truncated or garbled
            return None
        return tensor if isinstance(tensor, torch.Tensor) else None

    def write_matrix(self, key: str, tensor) -> None:
        import torch

        from ...files import atomic_open

        with atomic_open(self.root / "matrices" / f"{key}.pt", "wb") as handle:
            torch.save(tensor, handle)

    def shard_marker(self, run_id: str, index: int) -> Path:
        """Where process ``index`` of a launched scoring records its weights and cache folder."""
        return self.root / "shards" / f"{run_id}-{index}.json"
