"""Baseline difficulty scores: answer length and answer loss before unlearning."""

from __future__ import annotations

from typing import Sequence

from ..data.tofu import encode_samples
from ..interfaces import QASample
from ..likelihood import answer_nll


class LengthScorer:
    """Number of answer tokens (end token included): longer answers are harder to erase."""

    def __init__(self, max_length: int = 512):
        self.max_length = max_length

    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[float]:
        encoded = encode_samples(tokenizer, samples, max_length=self.max_length)
        return [float(sum(1 for x in e["labels"] if x != -100)) for e in encoded]


class LossScorer:
    """Mean answer-token NLL before unlearning. A low loss means a well-memorised
    sample, so the score is the negated loss: higher = harder to unlearn."""

    def __init__(self, batch_size: int = 8, max_length: int = 512, progress: bool = False):
        self.batch_size = batch_size
        self.max_length = max_length
        self.progress = progress

    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[float]:
        encoded = encode_samples(tokenizer, samples, max_length=self.max_length)
        stats = answer_nll(model, encoded, tokenizer.pad_token_id, batch_size=self.batch_size, progress=self.progress)
        return [-(s / max(n, 1)) for s, n in stats]
