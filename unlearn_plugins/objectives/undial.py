"""UNDIAL: self-distillation towards the reference distribution with the true token's logit lowered."""

from __future__ import annotations

from .base import ForgetRetainObjective, check_option, forward, reference_outputs, shifted


def undial_loss(logits, ref_logits, labels, beta: float):
    """Mean over answer tokens of CE(q, p), q = softmax(z_ref - beta * onehot(y)), p = softmax(z)."""
    import torch.nn.functional as F

    cur, target, mask = shifted(logits, labels)  # (N, V), (N,)
    ref = ref_logits[:, :-1, :][mask].float()
    if target.numel() == 0:
        return cur.sum() * 0.0
    ref = ref - beta * F.one_hot(target, ref.size(-1)).to(ref.dtype)
    q = F.softmax(ref, dim=-1)
    return -(q * F.log_softmax(cur, dim=-1)).sum(-1).mean()


class UNDIAL(ForgetRetainObjective):
    """Distil the reference model's forget-answer distribution with the answer token's logit
    reduced by beta (10): forgets the token without pushing probability anywhere extreme.
    No retain term by default (alpha = 0)."""

    name = "undial"
    default_alpha = 0.0
    forget_needs_reference = True

    def __init__(self, *, beta: float = 10.0, **kwargs):
        super().__init__(**kwargs)
        check_option(self.name, "beta", beta, beta >= 0, "a number >= 0")
        self.beta = float(beta)

    def forget_loss(self, model, batch, reference_model=None):
        part = batch["forget"]
        logits = forward(model, part).logits
        ref_logits = reference_outputs(reference_model, part).logits
        return undial_loss(logits, ref_logits, part["labels"], self.beta)
