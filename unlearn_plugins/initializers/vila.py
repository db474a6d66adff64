"""VILA (Kim et al., COLM 2025): FILA with the importance estimated in LoRA space.

As in the reference: lora_A and lora_B drawn N(0, 0.05^2), gradients only for them, the model
in train mode with LoRA dropout 0.05, 10 shuffled passes of forget batches of 4 (each forget
sample paired with a drawn retain sample). Per parameter the token-weighted variance over
batches V = sum n_b g_b^2 / n - (sum n_b g_b / n)^2 (clamped at 0, n = sum n_b over all
passes), mapped to the weight shape by V_B @ V_A; I = (Vf_B @ Vf_A / nf) / (1e-5 + Vr_B @ Vr_A / nr)
(the reference divides by the token totals a second time here); then FILA's decomposition.
See docs/methods.md, "VILA".
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Annotated

from ..errors import UnlearnError
from ..training.lora import lora_layers
from .fila import EPS, FILAInit, accumulate, measuring


@contextmanager
def lora_dropout(modules, adapter: str, p: float):
    """Replace each module's LoRA dropout by Dropout(p) for the block (identity when p = 0)."""
    import torch

    saved = [(m, m.lora_dropout[adapter]) for _, m in modules]
    try:
        for m, _ in saved:
            m.lora_dropout[adapter] = torch.nn.Dropout(p) if p > 0 else torch.nn.Identity()
        yield
    finally:
        for m, layer in saved:
            m.lora_dropout[adapter] = layer


class VILAInit(FILAInit):
    """LoRA-space variance importance. Options: std (0.05), dropout (0.05, LoRA dropout while
    measuring), passes (10), batch_size (4), retain, svd, niter, oversample, seed (as fila)."""

    name = "vila"

    def __init__(
        self,
        std: Annotated[float, "std of the N(0, std^2) draw of lora_A and lora_B while measuring"] = 0.05,
        dropout: Annotated[float, "LoRA dropout while measuring"] = 0.05,
        passes: Annotated[int, "passes over the forget data"] = 10,
        batch_size: Annotated[int, "forget examples per batch"] = 4,
        retain: Annotated[str, "'paired' or 'all' (as fila)"] = "paired",
        svd: Annotated[str, "'randomized' or 'exact' (as fila)"] = "randomized",
        niter: Annotated[int, "power iterations of the randomized SVD"] = 4,
        oversample: Annotated[int, "extra columns of the randomized SVD"] = 8,
        seed: Annotated[int, "seed of the draws and the batch order"] = 0,
        retain_weight: Annotated[None, "removed: set the retain weight on the objective (alpha)"] = None,
    ):
        if retain_weight is not None:
            raise UnlearnError(
                "initializer 'vila': option 'retain_weight' was removed: VILA's 1.3 (lcoef) weights the retain "
                "loss, not the importance; set it on the objective (--objective-option alpha=1.3)"
            )
        super().__init__(
            batch_size=batch_size, passes=passes, retain=retain, svd=svd, niter=niter, oversample=oversample, seed=seed
        )
        self._check("std", std, isinstance(std, (int, float)) and std > 0, "a number > 0")
        self._check("dropout", dropout, isinstance(dropout, (int, float)) and 0 <= dropout < 1, "a number in [0, 1)")
        self.std, self.dropout = float(std), float(dropout)

    def importance(self, peft_model, forget, retain, pad_token_id):
        import torch

        adapter = peft_model.active_adapter
        modules = lora_layers(peft_model)
        gen = torch.Generator().manual_seed(self.seed)
        params = {}
        with torch.no_grad():
            for name, m in modules:
                for part in ("lora_A", "lora_B"):
                    p = getattr(m, part)[adapter].weight
                    p.copy_((torch.randn(p.shape, generator=gen) * self.std).to(p))
                    params[f"{name}.{part}"] = p

        f_batches, r_batches = self.plan(forget, retain)
        with measuring(peft_model, params, self.seed), lora_dropout(modules, adapter, self.dropout):
            f_sq, f_g, nf = accumulate(
                peft_model, forget, f_batches, pad_token_id, params, first_moment=True, checkpointing=self.checkpointing
            )
            r_sq, r_g, nr = accumulate(
                peft_model, retain, r_batches, pad_token_id, params, first_moment=True, checkpointing=self.checkpointing
            )
        self._counted(nf, nr)
        vf = {k: (f_sq[k] / nf - (f_g[k] / nf) ** 2).clamp_min(0) for k in params}
        vr = {k: (r_sq[k] / nr - (r_g[k] / nr) ** 2).clamp_min(0) for k in params}
        out = {}
        for name, _ in modules:
            i_f = vf.pop(f"{name}.lora_B") @ vf.pop(f"{name}.lora_A")
            i_r = vr.pop(f"{name}.lora_B") @ vr.pop(f"{name}.lora_A")
            out[name] = (i_f / nf) / (EPS + i_r / nr)
        return out
