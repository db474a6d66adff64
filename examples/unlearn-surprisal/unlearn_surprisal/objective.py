"""An unlearning objective: gradient ascent that stops pushing tokens already forgotten."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from unlearn_plugins.likelihood import token_nll


@dataclass
class CappedAscent:
    """L = -mean NLL over the forget answer tokens whose NLL is still below ``cap``
    + alpha * mean NLL of the retain answers. A token counts as forgotten once its NLL
    reaches ``cap``; it then stops pushing, so the ascent cannot run away on it."""

    cap: float = field(default=5.0, metadata={"help": "answer-token NLL (nats) at which a token is forgotten"})
    alpha: float = field(default=1.0, metadata={"help": "weight of the retain NLL (0: no retain data needed)"})
    needs_reference_model: ClassVar[bool] = False

    def __post_init__(self):
        if not self.cap > 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        self.last_terms = {}

    @property
    def needs_retain_data(self) -> bool:
        return self.alpha > 0

    @staticmethod
    def _token_nll(model, part):
        logits = model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
        return token_nll(logits, part["labels"])

    def loss(self, model, batch, reference_model=None):
        nll, mask = self._token_nll(model, batch["forget"])
        active = mask & (nll.detach() < self.cap)
        forget = -(nll * active).sum() / active.sum().clamp_min(1)
        self.last_terms = {"forget": forget.detach(), "active": active.sum() / mask.sum().clamp_min(1)}
        if self.alpha == 0:
            return forget
        nll, mask = self._token_nll(model, batch["retain"])
        retain = (nll * mask).sum() / mask.sum().clamp_min(1)
        self.last_terms["retain"] = retain.detach()
        return forget + self.alpha * retain
