"""IHL, the inverted hinge loss (Cha et al., ICLR 2025): push the true answer token below
the best other token, per answer token; retain NLL as usual."""

from __future__ import annotations

from .base import ForgetRetainObjective, forward, shifted


def inverted_hinge(logits, labels):
    """Mean over answer tokens of max(0, 1 + p_y - max_{v != y} p_v)."""
    import torch
    import torch.nn.functional as F

    cur, target, _ = shifted(logits, labels)
    if target.numel() == 0:
        return cur.sum() * 0.0
    probs = F.softmax(cur, dim=-1)
    p_true = probs.gather(-1, target[:, None]).squeeze(-1)
    others = probs.scatter(-1, target[:, None], float("-inf"))
    p_other = others.max(-1).values
    return torch.clamp(1 + p_true - p_other, min=0).mean()


class IHL(ForgetRetainObjective):
    """IHL(forget) + NLL(retain) (gamma = alpha = 1)."""

    name = "ihl"

    def forget_loss(self, model, batch, reference_model=None):
        part = batch["forget"]
        return inverted_hinge(forward(model, part).logits, part["labels"])
