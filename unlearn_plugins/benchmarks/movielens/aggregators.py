"""Combining the shard models' predictions: SISA's average and RecEraser's attention.

Each shard model k gives, per prompt, its Yes-vs-No log-odds s_k = log P(Yes) - log P(No) and
its final hidden state e_k at the answer position (the shard's representation of the
prompt, as RecEraser's shard user/item embeddings are). An aggregator maps (e, s) of all
shards to one log-odds.

* ``average`` (SISA, as E2URec's sisa_evaluate.py averages the shards' logits): mean_k s_k;
* ``attention`` (RecEraser, chenchongthu/Recommendation-Unlearning, ``attention_based_agg``):
  e'_k = W_k e_k + b_k (a transform per shard, ``trans_W`` / ``trans_B``), weights
  a_k = exp(h . relu(W_A e'_k + b_A)) / sum_j exp(...), output sum_k a_k s_k; trained with the
  shards frozen, on labelled prompts, binary cross-entropy.

Deviations (docs/methods.md): the aggregated quantity is the shards' log-odds (an LLM
recommender has no user/item embeddings to combine and score by a dot product); hidden
states are standardised per dimension first; Adam (lr 1e-2, 50 epochs, batch 256) instead of
Adagrad (lr 1e-3, batch 1024) for the few hundred prompts it is fitted on here, and no
dropout (it applied to the aggregated user embedding).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from unlearn_plugins.errors import UnlearnError


class AverageAggregator:
    """SISA: the mean of the shards' log-odds; nothing to fit."""

    name = "average"

    def __init__(self, **options: Any):
        if options:
            raise UnlearnError(f"aggregator 'average' takes no options, got {sorted(options)}")

    def fit(self, features, log_odds, labels) -> dict:
        return {}

    def combine(self, features, log_odds):
        return log_odds.float().mean(1)

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


class AttentionAggregator:
    """RecEraser's attention over shards (see the module docstring). Options: ``trans_dim``
    (64, the reference's embedding size; attention size = trans_dim // 2), ``epochs`` (50),
    ``lr`` (1e-2), ``batch_size`` (256), ``weight_decay`` (1e-5 on the transforms), ``seed``."""

    name = "attention"

    def __init__(
        self,
        *,
        trans_dim: int = 64,
        epochs: int = 50,
        lr: float = 1e-2,
        batch_size: int = 256,
        weight_decay: float = 1e-5,
        seed: int = 0,
    ):
        for option, value in (("trans_dim", trans_dim), ("epochs", epochs), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (2 if option == "trans_dim" else 1):
                raise UnlearnError(
                    f"aggregator 'attention': option {option!r} must be an integer >= "
                    f"{2 if option == 'trans_dim' else 1}, got {value!r}"
                )
        if not lr > 0 or weight_decay < 0:
            raise UnlearnError(
                f"aggregator 'attention': lr must be > 0 and weight_decay >= 0, got {lr}, {weight_decay}"
            )
        self.trans_dim, self.epochs, self.lr = trans_dim, epochs, float(lr)
        self.batch_size, self.weight_decay, self.seed = batch_size, float(weight_decay), seed
        self.params: dict[str, Any] | None = None

    def _init(self, shards: int, dim: int):
        import torch

        g = torch.Generator().manual_seed(self.seed)
        t, a = self.trans_dim, self.trans_dim // 2

        def glorot(*shape):
            fan_in, fan_out = shape[-2] if len(shape) > 1 else shape[-1], shape[-1]
            return torch.randn(*shape, generator=g) * (2.0 / (fan_in + fan_out)) ** 0.5

        wa = torch.fmod(torch.randn(t, a, generator=g), 2.0) * (2.0 / (a + t)) ** 0.5  # truncated normal
        return {
            "trans_W": glorot(shards, dim, t),
            "trans_B": glorot(shards, t),
            "WA": wa,
            "BA": torch.zeros(a),
            "HA": torch.full((a, 1), 0.01),
        }

    def weights(self, features, params=None):
        """(n, shards) attention weights of standardised features."""
        import torch

        p = params or self.params
        x = (features.float() - p["mean"]) / p["std"]
        e = torch.einsum("nkd,kdt->nkt", x, p["trans_W"]) + p["trans_B"]
        scores = torch.einsum("nka,ao->nko", torch.relu(e @ p["WA"] + p["BA"]), p["HA"])[..., 0]
        return torch.softmax(scores, dim=1)

    def combine(self, features, log_odds, params=None):
        if (params or self.params) is None:
            raise UnlearnError("aggregator 'attention' is not fitted (call fit first)")
        return (self.weights(features, params) * log_odds.float()).sum(1)

    def fit(self, features, log_odds, labels) -> dict:
        """Train the attention on (n, shards, d) features, (n, shards) log-odds and (n,) 0/1 labels."""
        import torch
        import torch.nn.functional as F

        n, shards, dim = features.shape
        if n == 0:
            raise UnlearnError("aggregator 'attention': no prompts to fit on")
        feats = features.float()
        flat = feats.reshape(-1, dim)
        params = {k: v.requires_grad_(True) for k, v in self._init(shards, dim).items()}
        fixed = {"mean": flat.mean(0), "std": flat.std(0).clamp_min(1e-6)}
        opt = torch.optim.Adam(
            [
                {"params": [params["trans_W"], params["trans_B"]], "weight_decay": self.weight_decay},
                {"params": [params["WA"], params["BA"], params["HA"]], "weight_decay": 0.0},
            ],
            lr=self.lr,
        )
        g = torch.Generator().manual_seed(self.seed)
        y = torch.as_tensor(labels, dtype=torch.float32)
        odds = log_odds.float()
        losses = []
        for _ in range(self.epochs):
            perm = torch.randperm(n, generator=g)
            total = 0.0
            for start in range(0, n, self.batch_size):
                idx = perm[start : start + self.batch_size]
                out = self.combine(feats[idx], odds[idx], {**params, **fixed})
                loss = F.binary_cross_entropy_with_logits(out, y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(idx)
            losses.append(total / n)
        self.params = {**{k: v.detach() for k, v in params.items()}, **fixed}
        return {"loss_first_epoch": losses[0], "loss_last_epoch": losses[-1], "prompts": n}

    def state(self) -> dict:
        return {} if self.params is None else {k: v.clone() for k, v in self.params.items()}

    def load_state(self, state: dict) -> None:
        self.params = dict(state) if state else None


AGGREGATORS = {"average": AverageAggregator, "attention": AttentionAggregator}


def make_aggregator(name: str, options: dict | None = None):
    """An aggregator by name (``average`` or ``attention``) with its options."""
    try:
        cls = AGGREGATORS[name]
    except KeyError:
        raise UnlearnError(f"unknown aggregator {name!r}; aggregators: {', '.join(sorted(AGGREGATORS))}") from None
    try:
        return cls(**dict(options or {}))
    except TypeError as exc:
        raise UnlearnError(f"aggregator {name!r} rejected its options {options}: {exc}") from None


def save_state(aggregator, path: str | os.PathLike) -> None:
    """The fitted parameters as a torch file, written temp-then-rename."""
    import torch

    from unlearn_plugins.files import atomic_open

    with atomic_open(Path(path), "wb") as handle:
        torch.save(aggregator.state(), handle)


def load_state(aggregator, path: str | os.PathLike) -> None:
    import torch

    aggregator.load_state(torch.load(Path(path), map_location="cpu", weights_only=True))
