"""Users into shards: RecEraser's user-based balanced partition (UBP), and a random one.

Reference: chenchongthu/Recommendation-Unlearning, ``data_partition.py``,
``data_partition_2`` (user-based balanced partition). k users are drawn as centroids; then,
``iterations`` times (part_T = 50): every (user, centroid) pair is scored by the squared
distance of their embeddings, the pairs are visited from the closest, and a user goes to the
pair's shard unless it already has one or the shard holds ``1.2 * users / k`` users; each
centroid becomes the mean of its shard's embeddings.

Deviations (docs/methods.md): the new centroid is the per-dimension mean (the reference's
``np.mean`` of a list of vectors collapses it to one number); user embeddings are not a
pre-trained BPR-MF's but the leading singular vectors of the users x movies matrix of
training ratings coded +1 (liked) / -1 (disliked), scaled by the singular values
(:func:`user_embeddings`); ties are broken by user and shard id, so a seed gives one partition.
"""

from __future__ import annotations

import random
from typing import Mapping, Sequence

from unlearn_plugins.errors import UnlearnError

#: shard capacity relative to an even split (the reference's max_data = 1.2 * len(data) / k)
CAPACITY = 1.2
DEFAULT_ITERATIONS = 50
DEFAULT_EMBEDDING_DIM = 16
PARTITIONS = ("balanced", "random")


def user_embeddings(
    interactions: Mapping[int, Sequence[tuple[int, float]]], dim: int = DEFAULT_EMBEDDING_DIM
) -> dict[int, "list[float]"]:
    """A ``dim``-dimensional embedding per user from (item, label) pairs, label 1 liked / 0 not:
    truncated SVD of the +1/-1 users x items matrix (fewer dimensions when the matrix is smaller)."""
    import numpy as np

    users = sorted(interactions)
    items = sorted({i for pairs in interactions.values() for i, _ in pairs})
    if not users or not items:
        raise UnlearnError("user embeddings need at least one user with one rated item")
    col = {item: j for j, item in enumerate(items)}
    matrix = np.zeros((len(users), len(items)))
    for r, user in enumerate(users):
        for item, label in interactions[user]:
            matrix[r, col[item]] = 1.0 if label else -1.0
    k = max(1, min(dim, min(matrix.shape) - 1 if min(matrix.shape) > 1 else 1))
    u, s, _ = np.linalg.svd(matrix, full_matrices=False)
    signs = np.sign(u[np.abs(u).argmax(0), range(u.shape[1])])  # a fixed sign per component
    signs[signs == 0] = 1
    vectors = (u * signs)[:, :k] * s[:k]
    return {user: vectors[r].tolist() for r, user in enumerate(users)}


def balanced_partition(
    embeddings: Mapping[int, Sequence[float]],
    shards: int,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    seed: int = 0,
    capacity: float = CAPACITY,
) -> list[list[int]]:
    """RecEraser's user-based balanced partition: ``shards`` lists of users (sorted)."""
    import numpy as np

    users = sorted(embeddings)
    n = len(users)
    if not 1 <= shards <= n:
        raise UnlearnError(f"partition: {shards} shards for {n} users; need between 1 and the number of users")
    if iterations < 1:
        raise UnlearnError(f"partition: iterations must be >= 1, got {iterations}")
    vectors = np.array([list(embeddings[u]) for u in users], dtype=np.float64)
    limit = capacity * n / shards
    centroids = vectors[sorted(random.Random(f"partition:{seed}").sample(range(n), shards))].copy()
    members: list[list[int]] = []
    for _ in range(iterations):
        dist = ((vectors[:, None, :] - centroids[None, :, :]) ** 2).sum(-1)  # (users, shards)
        order = sorted(((dist[i, j], i, j) for i in range(n) for j in range(shards)))
        members = [[] for _ in range(shards)]
        placed = [False] * n
        for _, i, j in order:
            if not placed[i] and len(members[j]) < limit:
                members[j].append(i)
                placed[i] = True
        for j, rows in enumerate(members):
            if rows:  # an empty shard keeps its centroid
                centroids[j] = vectors[rows].mean(0)
    empty = [j for j, rows in enumerate(members) if not rows]
    if empty:
        raise UnlearnError(f"partition: shard(s) {empty} ended up empty; use fewer shards or the random partition")
    return [sorted(users[i] for i in rows) for rows in members]


def random_partition(users: Sequence[int], shards: int, *, seed: int = 0) -> list[list[int]]:
    """Users shuffled with the seed and dealt into ``shards`` near-equal lists (SISA's partition)."""
    pool = sorted(set(users))
    if not 1 <= shards <= len(pool):
        raise UnlearnError(f"partition: {shards} shards for {len(pool)} users; need between 1 and the number of users")
    random.Random(f"partition:{seed}").shuffle(pool)
    return [sorted(pool[j::shards]) for j in range(shards)]
