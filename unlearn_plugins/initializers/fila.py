"""FILA (Cha et al., ICLR 2025): Fisher-importance-weighted LoRA initialisation.

Per weight element, Fisher importance on forget and retain data (squared gradients of
the mean answer-token NLL, weighted by each batch's token count, one pass);
I = (If / nf) / (1e-5 + Ir / nr); row weights w = sqrt(sum_j I_ij); a rank-r randomized
SVD of diag(w) W gives U, S, V; with S <- S / s: A = (V sqrt(S))^T,
B = diag(1 / (w + 1e-5)) U sqrt(S), base W - s B A.
"""

from __future__ import annotations

from ..interfaces import InitResult
from ..likelihood import token_nll
from .residual import batches, lora_modules, model_device, sync_from_rank0, write_residual

EPS = 1e-5


def weighted_lowrank(weight, importance, r: int, scaling: float, *, niter: int = 4, seed: int = 0):
    """FILA's decomposition: (A (r x d_in), B (d_out x r)) from W and an importance map."""
    import torch

    w = importance.float().sum(1).clamp_min(0).sqrt()
    m = w.unsqueeze(1) * weight.float()
    torch.manual_seed(seed)
    u, s, v = torch.svd_lowrank(m, q=min(r + 8, min(m.shape)), niter=niter)
    u, s, v = u[:, :r], s[:r] / scaling, v[:, :r]
    root = s.sqrt()
    a = (v * root).T
    b = (1.0 / (w + EPS)).unsqueeze(1) * (u * root)
    return a, b


def accumulate(model, examples, pad_token_id, params: dict, *, batch_size: int, second_moment_only: bool = True):
    """Token-weighted sums over batches of g^2 (and g) for each named parameter, and the token count."""
    import torch

    sq = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    first = None if second_moment_only else {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    total, device = 0, model_device(model)
    for batch in batches(examples, pad_token_id, batch_size, device):
        model.zero_grad(set_to_none=True)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        nll, mask = token_nll(out.logits, batch["labels"])
        n = int(mask.sum())
        (nll.sum() / max(n, 1)).backward()
        for name, p in params.items():
            g = p.grad.float()
            sq[name].add_(g * g, alpha=n)
            if first is not None:
                first[name].add_(g, alpha=n)
        total += n
    model.zero_grad(set_to_none=True)
    return sq, first, total


class _Grads:
    """Enable gradients for exactly ``params`` while inside the block."""

    def __init__(self, model, params):
        self.model, self.params = model, params

    def __enter__(self):
        self.saved = [(p, p.requires_grad) for p in self.model.parameters()]
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in self.params.values():
            p.requires_grad_(True)

    def __exit__(self, *exc):
        for p, flag in self.saved:
            p.requires_grad_(flag)


class FILAInit:
    """Fisher-weighted init. Options: batch_size (8), niter (randomized SVD power iterations, 4)."""

    residual = True

    def __init__(self, batch_size: int = 8, niter: int = 4):
        self.batch_size, self.niter = batch_size, niter

    def importance(self, peft_model, forget, retain, pad_token_id):
        modules = lora_modules(peft_model)
        params = {name: m.get_base_layer().weight for name, m in modules}
        with _Grads(peft_model, params), peft_model.disable_adapter():
            f_sq, _, nf = accumulate(peft_model, forget, pad_token_id, params, batch_size=self.batch_size)
            r_sq, _, nr = accumulate(peft_model, retain, pad_token_id, params, batch_size=self.batch_size)
        return {name: (f_sq[name] / nf) / (EPS + r_sq[name] / nr) for name in params}

    def initialize(self, peft_model, *, forget, retain, tokenizer) -> InitResult:
        if not forget or not retain:
            raise ValueError(f"{type(self).__name__} needs both forget and retain examples")
        adapter = peft_model.active_adapter
        importance = self.importance(peft_model, forget, retain, tokenizer.pad_token_id)
        for name, module in lora_modules(peft_model):
            w0 = module.get_base_layer().weight
            a, b = weighted_lowrank(w0, importance.pop(name), module.r[adapter], module.scaling[adapter], niter=self.niter)
            write_residual(module, adapter, a, b)
        sync_from_rank0(peft_model)
        return InitResult(residual=True, info={"init": type(self).__name__.replace("Init", "").lower()})
