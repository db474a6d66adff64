"""GRU, gradient-rectified unlearning (open-unlearning ``src/trainer/unlearn/gru.py``): the
update is the gradient ascent direction on the forget set, with its component along the retain
gradient removed whenever the two conflict.

Per optimizer step: ``g`` = gradient of ``-NLL(forget)``, ``r`` = gradient of ``NLL(retain)``
(each accumulated over the micro-batches as ``loss / accumulation_steps``); the retain direction
is smoothed, ``r_ema = gamma_gru * r + (1 - gamma_gru) * r_ema_prev`` (``r_ema_prev`` = 0 at
the start); if ``<g, r_ema> < 0`` then ``g <- g - <g, r_ema> / <r_ema, r_ema> * r_ema``. The
optimizer applies ``g`` alone: the retain gradient only steers, it is not descended. This needs
two backward passes per micro-batch, hence the objective's own ``training_step``.
"""

from __future__ import annotations

from typing import Annotated, Any

from ..errors import UnlearnError
from ..options import attributes
from .base import RetainDataObjective, check_option, mean_nll


class GRU(RetainDataObjective):
    """Gradient ascent on the forget set, rectified against an EMA of the retain gradient."""

    name = "gru"

    def __init__(
        self,
        *,
        gamma_gru: Annotated[float, "weight of the current retain gradient in its moving average"] = 0.8,
        forget_loss_type: Annotated[str, "forget loss: 'GradAscent' (the reference's default)"] = "GradAscent",
    ):
        check_option(self.name, "gamma_gru", gamma_gru, 0 <= gamma_gru <= 1, "a number in [0, 1]")
        check_option(self.name, "forget_loss_type", forget_loss_type, forget_loss_type == "GradAscent", "'GradAscent'")
        self.gamma_gru = float(gamma_gru)
        self.forget_loss_type = forget_loss_type
        self.last_terms: dict[str, Any] = {}
        self._forget: dict[str, Any] = {}  # accumulated over the micro-batches of one step
        self._retain: dict[str, Any] = {}
        self._retain_ema: dict[str, Any] | None = None

    def forget_loss(self, model, batch):
        return -mean_nll(model, batch["forget"])

    def loss(self, model, batch, reference_model=None):
        """The logged loss, ``-NLL(forget)`` (training goes through :meth:`training_step`)."""
        return self.forget_loss(model, batch)

    def training_step(self, model, batch, reference_model, step):
        if batch.get("retain") is None:
            raise UnlearnError("objective 'gru' needs retain data (its gradient steers the update)")
        forget = self.forget_loss(model, batch)
        step.backward(forget)
        _store(model, self._forget)
        retain = mean_nll(model, batch["retain"])
        step.backward(retain)
        _store(model, self._retain)
        self.last_terms = {"forget": forget.detach(), "retain": retain.detach()}
        if step.last_micro_batch:
            self.last_terms["dot"] = self.rectify(model)
        return forget

    def rectify(self, model):
        """Set each trainable parameter's ``.grad`` to the rectified forget gradient; the
        accumulators restart. Returns ``<g, r_ema>`` (a tensor, for the log)."""
        import torch

        g, r = self._forget, self._retain
        prev = self._retain_ema or {k: torch.zeros_like(v) for k, v in r.items()}
        ema = {k: self.gamma_gru * r[k] + (1 - self.gamma_gru) * prev[k] for k in r}
        self._retain_ema = ema
        dot = sum(float((g[k] * ema[k]).sum()) for k in g)
        if dot < 0:
            norm = sum(float((ema[k] * ema[k]).sum()) for k in ema)
            g = {k: g[k] - dot / norm * ema[k] for k in g}
        for name, param in model.named_parameters():
            if name in g:
                param.grad = g[name].to(param.dtype)
        self._forget, self._retain = {}, {}
        return torch.tensor(dot)

    def options(self) -> dict[str, Any]:
        return attributes(self, "gamma_gru forget_loss_type")

    def __repr__(self) -> str:
        return f"gru(gamma_gru={self.gamma_gru!r}, forget_loss_type={self.forget_loss_type!r})"


def _store(model, into: dict) -> None:
    """Add the trainable parameters' gradients (float32) to ``into`` and clear them."""
    import torch

    for name, param in model.named_parameters():
        if param.requires_grad:
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            into[name] = into[name] + grad.detach().float() if name in into else grad.detach().float().clone()
            param.grad = None
