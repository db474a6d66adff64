"""Forget requests on users: forgetting a user means all of that user's training
interactions; the other users' interactions are retained.

The forgotten users are a seeded uniform sample of a fraction of the users (E2URec shuffles
the users with a fixed seed and forgets the first 5-20%; 10% is its unlearning scripts'
default). CUD's anchor users are drawn the same way from the retained users only, so the
anchor pool never shares a user with the forget request it helps to score.
"""

from __future__ import annotations

import random
from typing import Iterable, Sequence

from unlearn_plugins.errors import DataError

#: fraction of users whose interactions a forget request removes (E2URec's default, forget_0.1_user)
DEFAULT_FORGET_FRACTION = 0.1


def _count(fraction: float, n: int, what: str) -> int:
    if not 0 < fraction < 1:
        raise DataError(f"{what} must be between 0 and 1 (exclusive), got {fraction!r}")
    return min(max(1, int(round(fraction * n))), n - 1)


def choose_forget_users(users: Iterable[int], fraction: float = DEFAULT_FORGET_FRACTION, seed: int = 0) -> list[int]:
    """A seeded sample of round(fraction x users) users (at least one, never all), sorted."""
    pool = sorted(set(users))
    if len(pool) < 2:
        raise DataError(f"a forget request needs at least 2 users (some to forget, some to retain), got {len(pool)}")
    n = _count(fraction, len(pool), "forget_fraction")
    return sorted(random.Random(f"forget:{seed}").sample(pool, n))


def choose_anchor_users(users: Iterable[int], forget_users: Sequence[int], count: int, seed: int = 0) -> list[int]:
    """``count`` retained users (never a forgotten one) for CUD's anchor pool, seeded, sorted."""
    forgotten = set(forget_users)
    pool = sorted(u for u in set(users) if u not in forgotten)
    if not 1 <= count < len(pool):
        raise DataError(
            f"anchor users: asked for {count} of the {len(pool)} retained users; the anchor runs also "
            f"need retained users outside the pool (count must be between 1 and {len(pool) - 1})"
        )
    return sorted(random.Random(f"anchor:{seed}").sample(pool, count))
