"""A difficulty scorer: how well the model predicts a sample's least predictable answer token."""

from __future__ import annotations

from dataclasses import dataclass, field

from unlearn_plugins.data.qa import encode_samples, pad_batch
from unlearn_plugins.likelihood import token_nll


@dataclass
class MaxSurprisalScorer:
    """Score = -max_t NLL(answer token t): high when even the hardest answer token is
    memorised, so the sample is harder to unlearn."""

    batch_size: int = field(default=8, metadata={"help": "samples per forward pass"})
    max_length: int = field(default=512, metadata={"help": "tokens per sample (chat prompt + answer)"})

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    def score(self, samples, *, model, tokenizer):
        import torch

        encoded = encode_samples(tokenizer, samples, max_length=self.max_length)
        device = next(model.parameters()).device
        scores = []
        with torch.inference_mode():
            for start in range(0, len(encoded), self.batch_size):
                batch = pad_batch(encoded[start : start + self.batch_size], tokenizer.pad_token_id)
                batch = {k: v.to(device) for k, v in batch.items()}
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                nll, mask = token_nll(logits, batch["labels"])
                worst = nll.masked_fill(~mask, float("-inf")).max(dim=1).values
                scores.extend((-worst).tolist())
        return scores
