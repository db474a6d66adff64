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


def forget_quality_task(task: Any) -> bool:
    """Whether an lm-eval task computes Forget Quality against a retain reference of truth ratios
    (TOFU's forget truth-ratio tasks, whose class sets ``FORGET_QUALITY = True`` and which carry
    ``reference`` and ``split_label``): the core asks the task, importing no benchmark's code."""
    return bool(getattr(type(task), "FORGET_QUALITY", False))


def sample_key(question: str, answer: str) -> str:
    """A short stable id of a TOFU sample."""
    return hashlib.sha1(f"{question}\x1f{answer}".encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class ReferenceFormat:
    """A kind of reference file: how errors name it (``what``), its ``format`` tag and
    ``version``, its string fields and the command that makes it (named when the format is off)."""

    what: str
    format: str
    version: int
    strings: tuple[str, ...] = ()
    made_by: str | None = None


#: this module's reference files
KIND = ReferenceFormat("retain reference", FORMAT, VERSION, ("task", "split"), "unlearn eval --save-reference")


@dataclass(frozen=True)
class TaskReference:
    """A reference made with one task on one split: its samples' keys, in order (the values per
    sample: the subclass's last field)."""

    path: str
    task: str
    split: str
    keys: tuple[str, ...]

    def describe(self) -> str:
        return f"split {self.split!r}, {len(self.keys)} samples (task {self.task})"


@dataclass(frozen=True)
class Reference(TaskReference):
    truth_ratios: tuple[float, ...]

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


def write_reference_file(
    path: str | os.PathLike, *, format: str, version: int, fields: dict[str, Any], samples: list[dict]
) -> None:
    """Write a reference file in the envelope :func:`load_reference_file` reads (format,
    version, the given fields, the creation time, the samples), atomically."""
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    write_json(path, {"format": format, "version": version, **fields, "created": created, "samples": samples})


def write_reference(
    path: str | os.PathLike,
    *,
    task: str,
    split: str,
    keys: Sequence[str],
    truth_ratios: Sequence[float],
    model: str | None = None,
    adapter: str | None = None,
) -> None:
    """Write a reference file atomically."""
    if len(keys) != len(truth_ratios) or not keys:
        raise ValueError("a reference needs one truth ratio per sample, and at least one sample")
    write_reference_file(
        path,
        format=FORMAT,
        version=VERSION,
        fields={"task": task, "split": split, "model": model, "adapter": adapter},
        samples=[{"key": k, "truth_ratio": float(tr)} for k, tr in zip(keys, truth_ratios)],
    )


def load_reference_file(path: str | os.PathLike, kind: ReferenceFormat) -> tuple[Path, dict, list]:
    """The checks every reference file shares (retain truth ratios, MIA losses, MovieLens
    predictions): JSON, the ``kind``'s format and version, its string fields and a non-empty
    ``samples`` list. Returns (path, data, samples); errors name the file and the field."""
    what, format, version, strings, made_by = kind.what, kind.format, kind.version, kind.strings, kind.made_by
    path = Path(path).expanduser()
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{what} {path}: file not found") from None
    except ValueError as exc:  # JSON and UTF-8 decoding errors
        raise DataError(f"{what} {path}: not valid JSON: {exc}") from None
    except OSError as exc:
        raise DataError(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    if not isinstance(data, dict) or data.get("format") != format:
        made = f" (made by {made_by})" if made_by else ""
        raise DataError(f"{what} {path}: field 'format' must be {format!r}{made}")
    if data.get("version") != version:
        raise DataError(f"{what} {path}: field 'version': unsupported value {data.get('version')!r}")
    for field in strings:
        if not isinstance(data.get(field), str):
            raise DataError(f"{what} {path}: field '{field}' must be a string")
    samples = data.get("samples")
    if not isinstance(samples, list) or not samples:
        raise DataError(f"{what} {path}: field 'samples' must be a non-empty list")
    for i, item in enumerate(samples):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise DataError(f"{what} {path}: samples[{i}]: field 'key' must be a string")
    return path, data, samples


def read_reference(path: str | os.PathLike) -> Reference:
    """Load and validate a reference file; errors name the file and the field."""
    path, data, samples = load_reference_file(path, KIND)
    keys, ratios = [], []
    for i, item in enumerate(samples):
        tr = item.get("truth_ratio")
        if isinstance(tr, bool) or not isinstance(tr, (int, float)) or math.isnan(tr) or tr < 0:
            raise DataError(f"retain reference {path}: samples[{i}]: field 'truth_ratio' must be a non-negative number")
        keys.append(item["key"])
        ratios.append(float(tr))
    return Reference(str(path), data["task"], data["split"], tuple(keys), tuple(ratios))


def references_from(value: Any, read=None, field: str = "retain_reference") -> list:
    """Reference files named in task metadata ``field`` (a path, a list of paths, or a comma
    list), each read with ``read`` (default: a retain reference)."""
    if value in (None, "", []):
        return []
    if isinstance(value, (str, os.PathLike)):
        value = [v for v in str(value).split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise DataError(f"metadata '{field}' must be a path or a list of paths, got {type(value).__name__}")
    return [(read or read_reference)(v) for v in value]
