"""Example plugin: a difficulty scorer from the worst-predicted answer token."""

from __future__ import annotations

from unlearn_plugins import hookimpl
from unlearn_plugins.data.tofu import encode_samples, pad_batch
from unlearn_plugins.likelihood import token_nll


class MaxSurprisalScorer:
    """Score = -max_t NLL(answer token t): high when even the hardest token is memorised."""

    def __init__(self, batch_size: int = 8, max_length: int = 512):
        self.batch_size = batch_size
        self.max_length = max_length

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


@hookimpl
def register_difficulty_scorers(register):
    register("max_surprisal", MaxSurprisalScorer)
