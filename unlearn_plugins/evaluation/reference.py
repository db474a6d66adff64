"""Retain-model reference files: the per-sample forget-split truth ratios that Forget Quality
compares against.

A reference is made by evaluating the retain model with a forget truth-ratio task
(`unlearn eval --save-reference FILE`). Samples are identified by a hash of question and
answer, so a reference made on another split, or with another ``--limit``, is refused
instead of silently giving a meaningless p-value.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import DataError
from ..files import write_json

FORMAT = "unlearn-plugins/tofu-retain-reference"
VERSION = 1
HINT = (
    "make one by evaluating the retain model (trained without the forget split) with the same task and "
    "--limit: unlearn eval --model RETAIN_MODEL --tasks {task} --save-reference ref.json"
)


def sample_key(question: str, answer: str) -> str:
    """A short stable id of a TOFU sample."""
    return hashlib.sha1(f"{question}\x1f{answer}".encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Reference:
    path: str
    task: str
    split: str
    keys: tuple[str, ...]
    truth_ratios: tuple[float, ...]

    def describe(self) -> str:
        return f"split {self.split!r}, {len(self.keys)} samples (task {self.task})"

    def matches_split(self, split_keys: Sequence[str]) -> bool:
        """True when the reference covers the first len(reference) samples of the split
        (lm-eval's --limit keeps the first N documents)."""
        return tuple(split_keys[: len(self.keys)]) == self.keys

    def check_evaluated(self, keys: Sequence[str], *, task: str, split: str) -> None:
        """Refuse a reference whose samples differ from the ones evaluated."""
        if tuple(keys) == self.keys:
            return
        shorter = min(len(keys), len(self.keys))
        if tuple(keys[:shorter]) == self.keys[:shorter]:  # same split, another size
            raise DataError(
                f"retain reference {self.path} has {len(self.keys)} samples but {task} evaluated {len(keys)} "
                f"of split {split!r}: use the same --limit as when the reference was made, or {HINT.format(task=task)}"
            )
        raise DataError(
            f"retain reference {self.path} was made on {self.describe()}; {task} evaluates split {split!r} "
            f"({len(keys)} samples): {HINT.format(task=task)}"
        )


def write_reference(path: str | os.PathLike, *, task: str, split: str, keys: Sequence[str],
                    truth_ratios: Sequence[float], model: str | None = None, adapter: str | None = None) -> None:
    """Write a reference file atomically."""
    if len(keys) != len(truth_ratios) or not keys:
        raise ValueError("a reference needs one truth ratio per sample, and at least one sample")
    write_json(path, {
        "format": FORMAT,
        "version": VERSION,
        "task": task,
        "split": split,
        "model": model,
        "adapter": adapter,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "samples": [{"key": k, "truth_ratio": float(tr)} for k, tr in zip(keys, truth_ratios)],
    })


def read_reference(path: str | os.PathLike) -> Reference:
    """Load and validate a reference file; errors name the file and the field."""
    path = Path(path).expanduser()
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"retain reference {path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"retain reference {path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"retain reference {path}: field 'format' must be {FORMAT!r} (made by unlearn eval --save-reference)")
    if data.get("version") != VERSION:
        raise DataError(f"retain reference {path}: field 'version': unsupported value {data.get('version')!r}")
    for field in ("task", "split"):
        if not isinstance(data.get(field), str):
            raise DataError(f"retain reference {path}: field '{field}' must be a string")
    samples = data.get("samples")
    if not isinstance(samples, list) or not samples:
        raise DataError(f"retain reference {path}: field 'samples' must be a non-empty list")
    keys, ratios = [], []
    for i, item in enumerate(samples):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise DataError(f"retain reference {path}: samples[{i}]: field 'key' must be a string")
        tr = item.get("truth_ratio")
        if isinstance(tr, bool) or not isinstance(tr, (int, float)) or math.isnan(tr) or tr < 0:
            raise DataError(f"retain reference {path}: samples[{i}]: field 'truth_ratio' must be a non-negative number")
        keys.append(item["key"])
        ratios.append(float(tr))
    return Reference(str(path), data["task"], data["split"], tuple(keys), tuple(ratios))


def references_from(value: Any) -> list[Reference]:
    """Reference files named in task metadata (a path, a list of paths, or a comma list)."""
    if value in (None, "", []):
        return []
    if isinstance(value, (str, os.PathLike)):
        value = [v for v in str(value).split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise DataError(f"metadata 'retain_reference' must be a path or a list of paths, got {type(value).__name__}")
    return [read_reference(v) for v in value]
