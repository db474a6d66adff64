"""VILA (Kim et al., COLM 2025): FILA with the importance estimated in LoRA space.

LoRA parameters drawn N(0, 0.05^2); gradients only for lora_A / lora_B; importance is
the variance E[g^2] - E[g]^2 over batches (token-weighted), mapped back to the weight
shape by I_W = I_B @ I_A; I = If / (1e-5 + retain_weight * Ir) (retain_weight 1.3 in
the VILA TOFU config); then FILA's decomposition.
"""

from __future__ import annotations

from .fila import EPS, FILAInit, _Grads, accumulate
from .residual import lora_modules


class VILAInit(FILAInit):
    """LoRA-space variance importance. Options: std (0.05), retain_weight (1.3), batch_size, niter."""

    def __init__(self, std: float = 0.05, retain_weight: float = 1.3, batch_size: int = 8, niter: int = 4, seed: int = 0):
        super().__init__(batch_size=batch_size, niter=niter)
        self.std, self.retain_weight, self.seed = std, retain_weight, seed

    def importance(self, peft_model, forget, retain, pad_token_id):
        import torch

        adapter = peft_model.active_adapter
        modules = lora_modules(peft_model)
        gen = torch.Generator().manual_seed(self.seed)
        params = {}
        with torch.no_grad():
            for name, m in modules:
                for part in ("lora_A", "lora_B"):
                    p = getattr(m, part)[adapter].weight
                    p.copy_((torch.randn(p.shape, generator=gen) * self.std).to(p))
                    params[f"{name}.{part}"] = p

        def variance(examples):
            with _Grads(peft_model, params):
                sq, first, n = accumulate(peft_model, examples, pad_token_id, params, batch_size=self.batch_size,
                                          second_moment_only=False)
            return {k: (sq[k] / n - (first[k] / n) ** 2).clamp_min(0) for k in params}

        vf, vr = variance(forget), variance(retain)
        out = {}
        for name, _ in modules:
            i_f = vf[f"{name}.lora_B"] @ vf[f"{name}.lora_A"]
            i_r = vr[f"{name}.lora_B"] @ vr[f"{name}.lora_A"]
            out[name] = i_f / (EPS + self.retain_weight * i_r)
        return out
