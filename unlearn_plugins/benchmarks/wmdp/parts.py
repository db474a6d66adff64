"""Parts of a forget corpus for the two grids MUSE adds to a single forget set (Shi et al. 2024):
scalability (forget sets of growing size) and sustainability (requests one after another).

The documents are put in one seeded order; a forget fraction ``f`` takes the first
``ceil(f * n)`` of them, so a smaller set is inside every larger one, and the
``K`` sequential folds cut the same order into ``K`` consecutive, disjoint runs (sizes differ by
at most one). Each part is written as JSON lines (field ``text``) in the corpus's own document
order, so fraction 1.0 is the whole corpus and its windows are the study's own. Works on any
``text:`` corpus (WMDP's, MUSE's, the synthetic one)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

#: the seed of the documents' order (one order per corpus: the parts of every study agree)
SEED = 0
#: the file of each part in a parts folder, and the record of which documents each part holds
INFO = "parts.json"


def fraction_name(fraction: float) -> str:
    return f"fraction{fraction:g}"


def fold_name(k: int) -> str:
    return f"request{k}"


def size(fraction: float, n: int) -> int:
    """How many of ``n`` documents the fraction takes: ceil(f n), at least one (f n rounded
    first, so 0.1 x 30 is 3, not 4)."""
    return max(1, math.ceil(round(fraction * n, 9)))


def order(n: int, seed: int) -> list[int]:
    """The documents' seeded order (the same for every grid of one corpus and seed)."""
    indices = list(range(n))
    random.Random(seed).shuffle(indices)
    return indices


def check(n: int, fractions: tuple[float, ...] = (), folds: int = 0) -> str | None:
    """Why the grid cannot be cut from ``n`` documents (None: it can)."""
    if folds and folds > n:
        return f"{folds} folds of {n} forget documents: at most one fold per document"
    sizes = [size(f, n) for f in fractions]
    for a, b, after, before in zip(fractions[1:], fractions, sizes[1:], sizes):
        if after == before:
            return f"{b:g} and {a:g} both select {after} of the {n} forget documents"
    return None


def select(n: int, seed: int, fractions: tuple[float, ...] = (), folds: int = 0) -> dict[str, list[int]]:
    """{part name: the sorted indices of its documents}: each fraction's nested selection and
    each fold's disjoint one."""
    why = check(n, fractions, folds)
    if why:
        raise ValueError(why)
    ranked = order(n, seed)
    parts = {fraction_name(f): sorted(ranked[: size(f, n)]) for f in fractions}
    for k in range(folds):
        start, stop = k * n // folds, (k + 1) * n // folds
        parts[fold_name(k + 1)] = sorted(ranked[start:stop])
    return parts


def write(folder: Path, spec: str, seed: int, fractions: tuple[float, ...] = (), folds: int = 0) -> dict:
    """Each part of the ``text:`` corpus ``spec`` as ``NAME.jsonl`` in ``folder``, and
    :data:`INFO` (the corpus's document count and every part's indices)."""
    from unlearn_plugins.data.text import read_documents
    from unlearn_plugins.errors import DataError

    documents = read_documents(spec)
    try:
        parts = select(len(documents), seed, fractions, folds)
    except ValueError as exc:
        raise DataError(f"forget corpus {spec}: {exc}") from None
    folder.mkdir(parents=True, exist_ok=True)
    for name, indices in parts.items():
        rows = (json.dumps({"text": documents[i].text}, ensure_ascii=False) + "\n" for i in indices)
        (folder / f"{name}.jsonl").write_text("".join(rows), encoding="utf-8")
    info = {"documents": len(documents), "seed": seed, "parts": parts}
    (folder / INFO).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


__all__ = ["check", "select", "size", "write", "order", "fraction_name", "fold_name", "INFO", "SEED"]
