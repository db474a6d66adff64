"""PDU, primal-dual unlearning (open-unlearning ``src/trainer/unlearn/pdu.py``): the retain
loss is a constraint ``NLL(retain) <= retain_loss_eps`` whose multiplier (the retain
preference) is raised by dual ascent after every micro-batch once the warm-up epochs are over.

``L = gamma * F + pref * (NLL(retain) - eps)``, ``F`` = mean over every position of the forget
batch (prompt and padding included, as the reference) of ``(max_v z - mean_v z)^2``, the squared
gap between the largest and the average logit; then ``pref <- max(0, pref + dual_step_size *
(NLL(retain) - eps))``. The update needs the epoch, hence the objective's own ``training_step``.
"""

from __future__ import annotations

from typing import Annotated, Any

from ..errors import UnlearnError
from ..likelihood import forward
from ..options import attributes, options_repr
from .base import RetainDataObjective, check_option, mean_nll


class PDU(RetainDataObjective):
    """Flatten the forget logits subject to a retain-loss constraint with a dual variable."""

    name = "pdu"

    def __init__(
        self,
        *,
        gamma: Annotated[float, "weight of the forget term"] = 1.0,
        alpha: Annotated[float, "starting retain preference (the dual variable)"] = 1.0,
        retain_loss_eps: Annotated[float, "retain-loss bound of the constraint (reference TOFU script: 0.3)"] = 0.3,
        primal_dual: Annotated[bool, "update the retain preference by dual ascent"] = True,
        dual_step_size: Annotated[float, "dual ascent step"] = 1.0,
        dual_update_upon: Annotated[str, "when the dual variable moves: 'step' (only this is supported)"] = "step",
        dual_warmup_epochs: Annotated[int, "epochs before the dual variable moves"] = 5,
    ):
        check_option(self.name, "gamma", gamma, gamma >= 0, "a number >= 0")
        check_option(self.name, "alpha", alpha, alpha >= 0, "a number >= 0")
        check_option(self.name, "dual_step_size", dual_step_size, dual_step_size >= 0, "a number >= 0")
        check_option(self.name, "dual_warmup_epochs", dual_warmup_epochs, dual_warmup_epochs >= 0, "an integer >= 0")
        check_option(self.name, "dual_update_upon", dual_update_upon, dual_update_upon == "step", "'step'")
        self.gamma, self.alpha = float(gamma), float(alpha)
        self.retain_loss_eps = float(retain_loss_eps)
        self.primal_dual = bool(primal_dual)
        self.dual_step_size = float(dual_step_size)
        self.dual_update_upon = dual_update_upon
        self.dual_warmup_epochs = int(dual_warmup_epochs)
        self.preference = self.alpha  # the dual variable
        self.last_terms: dict[str, Any] = {}

    def loss(self, model, batch, reference_model=None):
        """``gamma * F + pref * (NLL(retain) - eps)`` with the current preference (no dual step)."""
        import torch

        if batch.get("retain") is None:
            raise UnlearnError("objective 'pdu' needs retain data (its constraint is on the retain loss)")
        logits = forward(model, batch["forget"]).logits.float()
        logits = logits.reshape(-1, logits.size(-1))
        forget = ((logits.max(dim=-1)[0] - logits.mean(dim=-1)) ** 2).mean()
        nll = mean_nll(model, batch["retain"])
        retain = nll - self.retain_loss_eps
        self._shifted_retain = float(retain.detach())
        weights = torch.tensor([self.gamma, self.preference], dtype=torch.float32, device=forget.device)
        self.last_terms = {
            "forget": forget.detach(),
            "retain": nll.detach(),
            "retain_preference": torch.tensor(self.preference),
        }
        return (weights * torch.stack([forget, retain])).sum()

    def training_step(self, model, batch, reference_model, step):
        loss = self.loss(model, batch)
        if self.primal_dual and int(step.epoch) >= self.dual_warmup_epochs:
            self.preference = max(0.0, self.preference + self.dual_step_size * self._shifted_retain)
        step.backward(loss)
        return loss

    def options(self) -> dict[str, Any]:
        return attributes(
            self, "gamma alpha retain_loss_eps primal_dual dual_step_size dual_update_upon dual_warmup_epochs"
        )

    def __repr__(self) -> str:
        return options_repr(self)
