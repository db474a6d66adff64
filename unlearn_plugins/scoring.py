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
