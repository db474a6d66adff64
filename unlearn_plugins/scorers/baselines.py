"""Baseline difficulty scores: answer length and answer loss before unlearning."""

from __future__ import annotations

import math
from typing import Sequence

from ..data.qa import IGNORE_INDEX, MIN_MAX_LENGTH, encode_samples
from ..errors import UnlearnError
from ..interfaces import QASample
from ..likelihood import answer_nll


def check_int_option(scorer: str, name: str, value, minimum: int) -> int:
    """A whole-number scorer option (``--option name=N``) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UnlearnError(f"scorer {scorer!r}: option {name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_float_option(scorer: str, name: str, value, minimum: float, *, strict: bool = False) -> float:
    """A finite number option of at least (``strict``: above) ``minimum``."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > minimum if strict else value >= minimum)
    )
    if not ok:
        raise UnlearnError(
            f"scorer {scorer!r}: option {name} must be a finite number {'>' if strict else '>='} "
            f"{minimum}, got {value!r}"
        )
    return float(value)


class LengthScorer:
    """Number of answer tokens (end token included): longer answers are harder to erase."""

    def __init__(self, max_length: int = 512):
        self.max_length = check_int_option("length", "max_length", max_length, MIN_MAX_LENGTH)

    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[float]:
        encoded = encode_samples(tokenizer, samples, max_length=self.max_length)
        return [float(sum(1 for x in e["labels"] if x != IGNORE_INDEX)) for e in encoded]


class LossScorer:
    """Mean answer-token NLL before unlearning. A low loss means a well-memorised
    sample, so the score is the negated loss: higher = harder to unlearn."""

    def __init__(self, batch_size: int = 8, max_length: int = 512, progress: bool = False):
        self.batch_size = check_int_option("loss", "batch_size", batch_size, 1)
        self.max_length = check_int_option("loss", "max_length", max_length, MIN_MAX_LENGTH)
        self.progress = bool(progress)

    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[float]:
        encoded = encode_samples(tokenizer, samples, max_length=self.max_length)
        stats = answer_nll(model, encoded, tokenizer.pad_token_id, batch_size=self.batch_size, progress=self.progress)
        return [-(s / max(n, 1)) for s, n in stats]
