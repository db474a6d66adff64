"""Task Vector (Ilharco et al. 2023; a MUSE baseline): fine-tune on the forget set with plain
NLL, then move the weights the other way: ``W = W0 - alpha * (W_ft - W0)``.

The training is an ordinary per-batch loss; the subtraction is done once after training by the
optional ``finish`` step of the objective contract (docs/plugins.md), before anything is saved.
"""

from __future__ import annotations

from typing import Annotated, Any

from ..errors import UnlearnError
from .base import ForgetRetainObjective, check_option, mean_nll


class TaskVector(ForgetRetainObjective):
    """Train with L = NLL(forget) (descent, no retain term), then negate the update scaled by
    ``alpha_tv`` (1.0, MUSE's default). Under LoRA the update is ``s * B A``: B is multiplied by
    ``-alpha_tv``. With --full-finetune the starting weights are copied to CPU memory in
    ``prepare`` (one copy of the trainable weights) and every trained weight is set to
    ``W0 - alpha_tv * (W - W0)``."""

    name = "task_vector"
    default_alpha = 0.0

    def __init__(
        self,
        *,
        alpha_tv: Annotated[float, "scale of the subtracted task vector (MUSE's --alpha)"] = 1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_option(self.name, "alpha_tv", alpha_tv, alpha_tv > 0, "a number > 0")
        self.alpha_tv = float(alpha_tv)
        self._initial: dict[str, Any] | None = None

    def forget_loss(self, model, batch, reference_model=None):
        return mean_nll(model, batch["forget"])

    def prepare(self, context):
        from ..training import lora

        model = context.model
        if _is_peft(model):
            if not lora.adapter_is_noop(model):
                raise UnlearnError(
                    "objective 'task_vector' under LoRA needs an adapter that starts at zero (B = 0, "
                    "the default 'kaiming' initializer): the update is negated by negating B"
                )
            context.info["task_vector"] = {"mode": "lora", "alpha_tv": self.alpha_tv}
            self._initial = None
        else:
            self._initial = {
                name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad
            }
            context.info["task_vector"] = {"mode": "full", "alpha_tv": self.alpha_tv}
        return None

    def finish(self, model, context):
        """Replace the fine-tuned update by ``-alpha_tv`` times it, in place."""
        import torch

        with torch.no_grad():
            if _is_peft(model):
                from ..training import lora

                n = 0
                for _, module in lora.lora_layers(model):
                    adapter = lora.active_adapter(model)
                    for holder in (module.lora_B, module.lora_embedding_B):
                        if adapter in holder:
                            part = holder[adapter]
                            tensors = [part] if isinstance(part, torch.Tensor) else list(part.parameters())
                            for t in tensors:
                                t.mul_(-self.alpha_tv)
                            n += 1
                context.info["task_vector"]["negated_lora_layers"] = n
                return
            if self._initial is None:
                raise UnlearnError("objective 'task_vector': finish() called without prepare()")
            for name, p in model.named_parameters():
                if name in self._initial:
                    w0 = self._initial[name].to(p.device, torch.float32)
                    p.copy_(w0 - self.alpha_tv * (p.float() - w0))
            context.info["task_vector"]["changed_tensors"] = len(self._initial)
            self._initial = None


def _is_peft(model) -> bool:
    from peft import PeftModel

    return isinstance(getattr(model, "module", model), PeftModel)
