"""Running a difficulty scorer over samples and checking what it returns."""

from __future__ import annotations

import math
from typing import Any, Sequence

from .errors import UnlearnError
from .interfaces import QASample


def score_samples(scorer: Any, samples: Sequence[QASample], *, model: Any, tokenizer: Any,
                  scorer_name: str = "?") -> list[dict]:
    """Rows ``{index, question, score, ...}``; a scorer may return floats or dicts with a
    'score' key plus extra fields (CUD adds s_E and s_H)."""
    results = scorer.score(samples, model=model, tokenizer=tokenizer)
    results = list(results)
    if len(results) != len(samples):
        raise UnlearnError(f"scorer {scorer_name!r} returned {len(results)} scores for {len(samples)} samples")
    rows = []
    for sample, result in zip(samples, results):
        extra = {}
        if isinstance(result, dict):
            extra = {k: v for k, v in result.items() if k != "score"}
            result = result.get("score")
        try:
            value = float(result)
        except (TypeError, ValueError):
            raise UnlearnError(f"scorer {scorer_name!r} returned a non-number {result!r} for sample {sample.index}") from None
        if math.isnan(value):
            raise UnlearnError(f"scorer {scorer_name!r} returned NaN for sample {sample.index} ({sample.where})")
        rows.append({"index": sample.index, "question": sample.question, "score": value, **extra})
    return rows


def score_sharded(scorer: Any, samples: Sequence[QASample], *, model: Any, tokenizer: Any, group: Any,
                  scorer_name: str = "?") -> list[dict] | None:
    """:func:`score_samples` split over the processes of ``group`` (:mod:`unlearn_plugins.sharding`);
    the rows, in sample order, on the main process, None on the others.

    Scorers with ``prepare_shard`` (see :class:`~unlearn_plugins.interfaces.ShardedScorer`) do their
    share of the work on every process, then the main process scores all samples; the others
    are per-sample: each process scores its contiguous shard and the main process merges.
    """
    shard = group.shard(len(samples))
    prepare = getattr(scorer, "prepare_shard", None)
    if prepare is not None:
        group.everywhere(lambda: prepare(samples, shard, model=model, tokenizer=tokenizer, group=group),
                         f"scorer {scorer_name!r} (shared work)")
        main_rows: list[dict] = []

        def score_all():  # the main process only; the others wait for its outcome
            if group.is_main:
                main_rows.extend(score_samples(scorer, samples, model=model, tokenizer=tokenizer,
                                               scorer_name=scorer_name))

        group.everywhere(score_all, f"scorer {scorer_name!r}")
        return main_rows if group.is_main else None
    mine = [samples[i] for i in shard]
    parts = group.everywhere(
        lambda: score_samples(scorer, mine, model=model, tokenizer=tokenizer, scorer_name=scorer_name) if mine else [],
        f"scorer {scorer_name!r}")
    if not group.is_main:
        return None
    rows = [row for part in parts for row in part]
    if len(rows) != len(samples):  # the shards are contiguous and in process order
        raise UnlearnError(f"scorer {scorer_name!r}: the processes returned {len(rows)} rows for {len(samples)} samples")
    return rows
