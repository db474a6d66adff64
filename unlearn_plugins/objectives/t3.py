"""T3, "Temper-Then-Tilt" (Block et al., ICML 2026; open-unlearning ``src/trainer/unlearn/t3.py``
and ``src/model/t3.py``): the model is not changed; a small guidance head on its frozen last
hidden states learns, for each answer token, whether it continues a retain (1) or a forget (0)
example, and generation tilts the tempered base distribution by the head's retain probability
(:mod:`unlearn_plugins.guided_lm`).

Through the objective contract's ``wrap_model`` step: the run trains and saves a
:class:`~unlearn_plugins.guided_lm.T3CausalLM` (the base model inside, frozen; only the head
trains). The loss is the reference's: binary cross-entropy of the head's logit for each next
answer token, summed over the retain (label 1) and forget (label 0) answer tokens of the batch and
divided by their count.
"""

from __future__ import annotations

from typing import Annotated, Any

from ..errors import UnlearnError
from ..options import attributes, options_repr
from .base import RetainDataObjective, check_option


def classifier_loss(model, batch):
    """The reference's ``compute_loss``: summed BCE over retain (1) and forget (0) answer tokens,
    over their total count."""
    import torch
    import torch.nn.functional as F

    from ..data.qa import IGNORE_INDEX

    total, count = 0.0, 0
    for split, target in (("retain", 1.0), ("forget", 0.0)):
        part = batch[split]
        logits = model(
            input_ids=part["input_ids"],
            attention_mask=part["attention_mask"],
            labels=part["labels"],
            classifier_only=True,
        ).flatten()
        valid = (part["labels"][:, 1:] != IGNORE_INDEX).flatten()
        if valid.any():
            x = logits[valid].float()
            total = total + F.binary_cross_entropy_with_logits(x, torch.full_like(x, target), reduction="sum")
            count += int(valid.sum())
    if isinstance(total, float):  # no answer token in the batch
        return next(p for p in model.parameters() if p.requires_grad).sum() * 0.0
    return total / max(count, 1)


class T3(RetainDataObjective):
    """Train a guidance head that tells retain from forget continuations; the saved model is the
    frozen base with the head, whose logits are tempered and tilted (module docstring)."""

    name = "t3"

    def __init__(
        self,
        *,
        hidden_size: Annotated[int, "width of the guidance head's hidden layer(s)"] = 100,
        num_hidden_layers: Annotated[int, "hidden layers of the guidance head"] = 1,
        activation_str: Annotated[str, "the head's activation: 'id', 'relu', 'gelu' or 'tanh'"] = "id",
        bias: Annotated[bool, "biases in the head's hidden layers"] = False,
        guidance_scale: Annotated[float, "weight of the head's log-sigmoid in the guided logits"] = 1.0,
        base_temp: Annotated[float, "temperature dividing the base model's log-probabilities"] = 1.0,
    ):
        check_option(self.name, "hidden_size", hidden_size, int(hidden_size) >= 1, "an integer >= 1")
        check_option(self.name, "num_hidden_layers", num_hidden_layers, int(num_hidden_layers) >= 1, "an integer >= 1")
        check_option(
            self.name, "activation_str", activation_str, activation_str in ("id", "relu", "gelu", "tanh"),
            "'id', 'relu', 'gelu' or 'tanh'",
        )  # fmt: skip
        check_option(
            self.name, "num_hidden_layers", num_hidden_layers, not (num_hidden_layers > 1 and activation_str == "id"),
            "1 with activation_str 'id' (stacked linear layers are one linear map)",
        )  # fmt: skip
        check_option(self.name, "base_temp", base_temp, base_temp > 0, "a number > 0")
        self.hidden_size = int(hidden_size)
        self.num_hidden_layers = int(num_hidden_layers)
        self.activation_str = activation_str
        self.bias = bool(bias)
        self.guidance_scale = float(guidance_scale)
        self.base_temp = float(base_temp)
        self.last_terms: dict[str, Any] = {}

    def wrap_model(self, model, context):
        """The frozen model inside a :class:`~unlearn_plugins.guided_lm.T3CausalLM` with a new head."""
        from peft import PeftModel

        from ..guided_lm import T3CausalLM, describe

        if isinstance(getattr(model, "module", model), PeftModel):
            raise UnlearnError(
                "objective 't3' trains a guidance head on the frozen model (no adapter): run it with --full-finetune"
            )
        guidance = {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "activation_str": self.activation_str,
            "bias": self.bias,
        }
        wrapped = T3CausalLM.from_base(
            model, guidance=guidance, guidance_scale=self.guidance_scale, base_temp=self.base_temp
        )
        context.info["t3"] = describe(wrapped)
        return wrapped

    def loss(self, model, batch, reference_model=None):
        if batch.get("retain") is None:
            raise UnlearnError("objective 't3' needs retain data (the head tells retain from forget tokens)")
        return classifier_loss(model, batch)

    def options(self) -> dict[str, Any]:
        return attributes(self, "hidden_size num_hidden_layers activation_str bias guidance_scale base_temp")

    def __repr__(self) -> str:
        return options_repr(self)
