"""Gradient-ascent family: GradAscent, GradDiff and the token-weighted WGA and SatImp,
plus plain NLL (used by `unlearn finetune` to build target models)."""

from __future__ import annotations

from ..training.objective import NLL  # noqa: F401  (fine-tuning's objective, kept importable here)
from .base import ForgetRetainObjective, check_option, forward, masked_mean, mean_nll, token_nll


class GradAscent(ForgetRetainObjective):
    """L = -NLL(forget): raise the forget answers' loss; no retain term by default."""

    name = "grad_ascent"
    default_alpha = 0.0

    def forget_loss(self, model, batch, reference_model=None):
        return -mean_nll(model, batch["forget"])


class GradDiff(ForgetRetainObjective):
    """L = -NLL(forget) + NLL(retain) (gamma = alpha = 1)."""

    name = "grad_diff"

    def forget_loss(self, model, batch, reference_model=None):
        return -mean_nll(model, batch["forget"])


class WGA(ForgetRetainObjective):
    """Weighted gradient ascent: L = -mean(w * token NLL), w = p^beta detached (beta = 1).

    Tokens the model already finds unlikely get little weight, so the ascent does not
    keep pushing on tokens that are forgotten.
    """

    name = "wga"

    def __init__(self, *, beta: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        check_option(self.name, "beta", beta, beta >= 0, "a number >= 0")
        self.beta = float(beta)

    def token_weight(self, p):
        return p**self.beta

    def forget_loss(self, model, batch, reference_model=None):
        part = batch["forget"]
        nll, mask = token_nll(forward(model, part).logits, part["labels"])
        weight = self.token_weight((-nll).exp().detach())
        return -masked_mean(weight * nll, mask)


class SatImp(WGA):
    """SatImp: like WGA with w = p^beta1 (1 - p)^beta2 (beta1 = 5, beta2 = 1); gamma 0.1, alpha 1."""

    name = "satimp"
    default_gamma = 0.1

    def __init__(self, *, beta1: float = 5.0, beta2: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        check_option(self.name, "beta1", beta1, beta1 >= 0, "a number >= 0")
        check_option(self.name, "beta2", beta2, beta2 >= 0, "a number >= 0")
        self.beta1, self.beta2 = float(beta1), float(beta2)

    def token_weight(self, p):
        return p**self.beta1 * (1 - p) ** self.beta2
