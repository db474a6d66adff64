"""Membership-inference reference files: what the retain model (never trained on the forget set)
scores on the same forget and holdout samples, for the reference attack (its per-sample losses)
and privleak (its AUCs).

A reference is made by evaluating the retain model with the ``tofu_mia`` task
(`unlearn eval --save-mia-reference FILE`, with ``--mia`` to include the attacks computed
outside lm-eval). Samples are identified by a hash of question and answer, so a reference
made on other splits, or with another ``--limit``, is refused.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import DataError
from .reference import ReferenceFormat, load_reference_file, write_reference_file

FORMAT = "unlearn-plugins/tofu-mia-reference"
VERSION = 1
KIND = ReferenceFormat(
    "MIA reference", FORMAT, VERSION, ("forget_split", "holdout_split"), "unlearn eval --save-mia-reference"
)
MEMBERS = ("forget", "holdout")
HINT = (
    "make one by evaluating the retain model (trained without the forget split) with the same splits and "
    "--limit: unlearn eval --model RETAIN_MODEL --tasks tofu_mia --forget-split F --holdout-split H --mia "
    "--save-mia-reference mia_ref.json"
)


@dataclass(frozen=True)
class MIAReference:
    path: str
    forget_split: str
    holdout_split: str
    keys: tuple[str, ...]
    members: tuple[str, ...]
    losses: tuple[float, ...]
    aucs: dict[str, float]

    def describe(self) -> str:
        return f"forget {self.forget_split!r} vs holdout {self.holdout_split!r}, {len(self.keys)} samples"

    def loss_of(self) -> dict[str, float]:
        return dict(zip(self.keys, self.losses))

    def matches(self, keys: Sequence[str]) -> bool:
        """True when the reference covers the first len(reference) documents (--limit keeps the first N)."""
        return tuple(keys[: len(self.keys)]) == self.keys

    def check_evaluated(self, keys: Sequence[str], *, task: str) -> None:
        """Refuse a reference whose samples differ from the ones evaluated."""
        if sorted(keys) == sorted(self.keys):
            return
        raise DataError(
            f"MIA reference {self.path} covers {len(self.keys)} samples ({self.describe()}) but {task} "
            f"evaluated {len(keys)} others: use the --limit the reference was made with, or {HINT}"
        )


def mismatch(ref: MIAReference, task: str, forget_split: str, holdout_split: str, n: int) -> str:
    """Why ``ref`` does not fit the documents a task evaluates."""
    return (
        f"task {task} evaluates forget {forget_split!r} vs holdout {holdout_split!r} ({n} samples) but the MIA "
        f"reference {ref.path} was made on {ref.describe()}; {HINT}"
    )


def write_mia_reference(
    path: str | os.PathLike,
    *,
    forget_split: str,
    holdout_split: str,
    keys: Sequence[str],
    members: Sequence[str],
    losses: Sequence[float],
    aucs: dict[str, float],
    model: str | None = None,
    adapter: str | None = None,
) -> None:
    if not (len(keys) == len(members) == len(losses)) or not keys:
        raise ValueError("an MIA reference needs one member label and loss per sample, and at least one sample")
    write_reference_file(
        path,
        format=FORMAT,
        version=VERSION,
        fields={
            "forget_split": forget_split,
            "holdout_split": holdout_split,
            "model": model,
            "adapter": adapter,
            "auc": {name: float(value) for name, value in aucs.items()},
        },
        samples=[{"key": k, "member": m, "loss": float(v)} for k, m, v in zip(keys, members, losses)],
    )


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def read_mia_reference(path: str | os.PathLike) -> MIAReference:
    """Load and validate an MIA reference file; errors name the file and the field."""
    path, data, _ = load_reference_file(path, KIND)
    aucs = data.get("auc")
    if not isinstance(aucs, dict) or not all(
        isinstance(k, str) and _number(v) and 0 <= v <= 1 for k, v in aucs.items()
    ):
        raise DataError(f"MIA reference {path}: field 'auc' must map attack names to AUCs in [0, 1]")
    keys, members, losses = [], [], []
    for i, item in enumerate(data["samples"]):
        if item.get("member") not in MEMBERS:
            raise DataError(f"MIA reference {path}: samples[{i}]: field 'member' must be 'forget' or 'holdout'")
        if not _number(item.get("loss")):
            raise DataError(f"MIA reference {path}: samples[{i}]: field 'loss' must be a finite number")
        keys.append(item["key"])
        members.append(item["member"])
        losses.append(float(item["loss"]))
    return MIAReference(
        str(path), data["forget_split"], data["holdout_split"], tuple(keys), tuple(members), tuple(losses), dict(aucs)
    )
