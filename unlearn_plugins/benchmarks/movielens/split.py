"""The chronological per-user split: each user's ratings in time order, the earliest
80% for training, the next 10% for validation, the latest 10% for testing (by default).

Per user rather than one global cut in time (E2URec cuts the whole log at 60/20/20%): every
user, forgotten or not, has training interactions to forget and later ones to test on, and
a test prompt's history never reaches into the future.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Sequence

from unlearn_plugins.errors import DataError

from .data import Rating

PARTS = ("train", "valid", "test")
DEFAULT_VALID_FRACTION = 0.1
DEFAULT_TEST_FRACTION = 0.1


def user_timelines(ratings: Iterable[Rating]) -> dict[int, list[Rating]]:
    """Each user's ratings in time order (ties: file order), users in id order."""
    by_user: dict[int, list[Rating]] = defaultdict(list)
    for r in ratings:
        by_user[r.user_id].append(r)
    return {u: sorted(rs, key=lambda r: (r.timestamp, r.source, r.line)) for u, rs in sorted(by_user.items())}


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def split_sizes(
    n: int, valid_fraction: float = DEFAULT_VALID_FRACTION, test_fraction: float = DEFAULT_TEST_FRACTION
) -> tuple[int, int, int]:
    """(train, valid, test) counts of a timeline of ``n`` ratings: fractions rounded half up,
    at least one test (and one valid) rating when the fraction is above 0 and the timeline is
    long enough, and always at least one training rating."""
    for name, value in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0 <= value < 1:
            raise DataError(f"{name} must be in [0, 1), got {value!r}")
    if valid_fraction + test_fraction >= 1:
        raise DataError(f"valid_fraction + test_fraction must be below 1, got {valid_fraction + test_fraction}")
    n_test = max(1, _round(n * test_fraction)) if test_fraction > 0 and n >= 2 else 0
    n_valid = max(1, _round(n * valid_fraction)) if valid_fraction > 0 and n - n_test >= 2 else 0
    n_test = min(n_test, max(n - 1, 0))
    n_valid = min(n_valid, max(n - 1 - n_test, 0))
    return n - n_valid - n_test, n_valid, n_test


def chronological_split(
    timeline: Sequence[Rating],
    valid_fraction: float = DEFAULT_VALID_FRACTION,
    test_fraction: float = DEFAULT_TEST_FRACTION,
) -> list[str]:
    """The part ("train", "valid" or "test") of each rating of one user's time-ordered timeline."""
    n_train, n_valid, n_test = split_sizes(len(timeline), valid_fraction, test_fraction)
    return ["train"] * n_train + ["valid"] * n_valid + ["test"] * n_test
