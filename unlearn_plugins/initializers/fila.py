"""FILA (Cha et al., ICLR 2025): Fisher-importance-weighted LoRA initialisation.

Importance per weight element, gathered as the reference gathers it: model in train mode,
shuffled forget batches of 4, each forget sample paired with a uniformly drawn retain sample,
one pass; each batch contributes its token count n_b times the squared gradient of its mean
answer-token NLL. I = (If / nf) / (1e-5 + Ir / nr) with nf, nr the token totals; row weights
w = sqrt(sum_j I_ij); rank-r SVD diag(w) W ~ U S V^T; with S <- S / s: A = (V sqrt(S))^T,
B = diag(1 / (w + 1e-5)) U sqrt(S), base W - s B A. Our default SVD is more accurate than
the reference's (``niter=2, oversample=0`` restores it); see docs/methods.md, "FILA".

The gradients are taken with the decoder blocks recomputed in the backward pass (non-reentrant
activation checkpointing, dropout replayed from the saved RNG state): the same numbers with one
block's activations alive instead of every block's (the demo's FILA importance: 2.9 -> 2.2 GiB).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Annotated

from ..data.qa import pad_batch
from ..errors import ModelError, UnlearnError
from ..interfaces import InitResult
from ..likelihood import token_nll
from ..training.lora import decoder_blocks, lora_layers
from .residual import model_device, sync_from_rank0, write_residual

EPS = 1e-5
SVD_KINDS = ("randomized", "exact")
RETAIN_KINDS = ("paired", "all")


@contextmanager
def seeded(seed: int):
    """Seed torch's RNGs for the block and give the caller's RNG state back afterwards."""
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def weighted_lowrank(
    weight,
    importance,
    r: int,
    scaling: float,
    *,
    svd: str = "randomized",
    niter: int = 4,
    oversample: int = 8,
    seed: int = 0,
):
    """FILA's decomposition: (A (r x d_in), B (d_out x r)) from W and an importance map.

    ``svd="randomized"``: torch.svd_lowrank with r + ``oversample`` columns and ``niter`` power
    iterations (the reference: oversample 0, niter 2); ``svd="exact"``: a full SVD.
    """
    import torch

    w = importance.float().sum(1).clamp_min(0).sqrt()
    m = w.unsqueeze(1) * weight.float().to(w.device)
    if svd == "exact":
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
        v = vh.mH
    else:
        with seeded(seed):
            u, s, v = torch.svd_lowrank(m, q=min(r + oversample, min(m.shape)), niter=niter)
    u, s, v = u[:, :r], s[:r] / scaling, v[:, :r]
    root = s.sqrt()
    a = (v * root).T
    b = (1.0 / (w + EPS)).unsqueeze(1) * (u * root)
    return a, b


def sample_batches(n_forget: int, n_retain: int, *, batch_size: int, passes: int, retain: str, seed: int):
    """(forget batches, retain batches) as index lists, drawn like the reference's data loader:
    each pass a fresh permutation of the forget set cut into batches (the last may be short);
    ``retain="paired"``: each forget sample paired with a uniformly drawn retain sample;
    ``retain="all"``: the whole retain set, freshly shuffled, in its own batches."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    forget, kept = [], []
    for _ in range(passes):
        order = torch.randperm(n_forget, generator=gen).tolist()
        batches = [order[i : i + batch_size] for i in range(0, n_forget, batch_size)]
        forget += batches
        if retain == "paired":
            kept += [torch.randint(n_retain, (len(b),), generator=gen).tolist() for b in batches]
        else:
            order = torch.randperm(n_retain, generator=gen).tolist()
            kept += [order[i : i + batch_size] for i in range(0, n_retain, batch_size)]
    return forget, kept


@contextmanager
def recomputed_blocks(model, on: bool = True):
    """Each decoder block's forward under non-reentrant activation checkpointing for the block
    (torch.utils.checkpoint, ``use_reentrant=False``): its activations are dropped after the
    forward and recomputed in the backward, with the forward's RNG state (dropout draws the same
    masks) and autocast state. The gradients are the same; the model's forwards are restored
    after. The caller passes ``use_cache=False`` (a cache would be written twice). The blocks are
    :func:`..training.lora.decoder_blocks`'; a model without them runs as it is."""
    from torch.utils.checkpoint import checkpoint

    try:
        blocks = decoder_blocks(model)[1] if on else []
    except ModelError:  # no repeated blocks to recompute: the plain pass
        blocks = []

    def wrap(forward):
        def run(*args, **kwargs):
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)

        return run

    saved = [(block, block.__dict__.get("forward")) for block in blocks]
    try:
        for block in blocks:
            block.forward = wrap(block.forward)
        yield
    finally:
        for block, own in saved:
            if own is None:
                del block.forward
            else:
                block.forward = own


def accumulate(
    model,
    examples,
    index_batches,
    pad_token_id,
    params: dict,
    *,
    first_moment: bool = False,
    checkpointing: bool = True,
):
    """Sums over batches of n_b g_b^2 (and n_b g_b) for each named parameter, and sum n_b, where
    g_b is the gradient of batch b's mean answer-token NLL and n_b its answer-token count.

    Per module: each weight's gradient is added into its sums as soon as the backward pass has
    made it, then dropped, so the gradients of all targeted weights never exist at once (at 7B,
    a second model's worth of memory); the arithmetic is the same. ``checkpointing``: the decoder
    blocks recomputed in the backward (:func:`recomputed_blocks`): the same gradients, one
    block's activations at a time."""
    import torch

    sq = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    first = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()} if first_moment else None
    total, device = 0, model_device(model)
    weight = {"n": 0}

    def consume(name):
        def hook(p):
            g = p.grad.float()
            sq[name].add_(g * g, alpha=weight["n"])
            if first is not None:
                first[name].add_(g, alpha=weight["n"])
            p.grad = None

        return hook

    handles = [p.register_post_accumulate_grad_hook(consume(name)) for name, p in params.items()]
    try:
        with recomputed_blocks(model, checkpointing):
            for idx in index_batches:
                batch = {k: v.to(device) for k, v in pad_batch([examples[i] for i in idx], pad_token_id).items()}
                model.zero_grad(set_to_none=True)
                inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
                logits = model(**inputs, use_cache=False).logits
                nll, mask = token_nll(logits, batch["labels"])
                del logits  # the loss keeps the answer rows it needs: the whole logits need not live through backward
                n = int(mask.sum())
                if n == 0:
                    continue  # no answer tokens: the reference's loss is NaN here; skip the batch
                weight["n"] = n
                (nll.sum() / n).backward()
                total += n
    finally:
        for handle in handles:
            handle.remove()
    model.zero_grad(set_to_none=True)
    return sq, first, total


@contextmanager
def measuring(model, params: dict, seed: int):
    """Gradients for exactly ``params``, train mode (dropout active, as in the reference) and a
    seeded RNG; requires_grad flags, module modes and the caller's RNG are restored after."""
    grads = [(p, p.requires_grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in params.values():
            p.requires_grad_(True)
        model.train()
        with seeded(seed):
            yield
    finally:
        for p, flag in grads:
            p.requires_grad_(flag)
        for m, flag in modes:
            m.training = flag


class FILAInit:
    """Fisher-weighted init. Options: batch_size (4), passes (1), retain ("paired" | "all"),
    svd ("randomized" | "exact"), niter (4), oversample (8), seed (0); see docs/methods.md."""

    residual = True
    name = "fila"
    #: gradients with the decoder blocks recomputed in the backward (the same numbers, less
    #: memory; tests/test_initializers.py compares both)
    checkpointing = True

    def __init__(
        self,
        batch_size: Annotated[int, "forget examples per importance batch"] = 4,
        passes: Annotated[int, "passes over the forget data (each a fresh shuffle)"] = 1,
        retain: Annotated[
            str, "'paired': one drawn retain example per forget example; 'all': the whole retain split"
        ] = "paired",
        svd: Annotated[str, "'randomized' (torch.svd_lowrank) or 'exact'"] = "randomized",
        niter: Annotated[int, "power iterations of the randomized SVD"] = 4,
        oversample: Annotated[int, "extra columns of the randomized SVD"] = 8,
        seed: Annotated[int, "seed of the batch order, the retain draw and the randomized SVD"] = 0,
    ):
        self._check("batch_size", batch_size, isinstance(batch_size, int) and batch_size >= 1, "an integer >= 1")
        self._check("passes", passes, isinstance(passes, int) and passes >= 1, "an integer >= 1")
        self._check("retain", retain, retain in RETAIN_KINDS, " or ".join(map(repr, RETAIN_KINDS)))
        self._check("svd", svd, svd in SVD_KINDS, " or ".join(map(repr, SVD_KINDS)))
        self._check("niter", niter, isinstance(niter, int) and niter >= 0, "an integer >= 0")
        self._check("oversample", oversample, isinstance(oversample, int) and oversample >= 0, "an integer >= 0")
        self._check("seed", seed, isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, "an integer >= 0")
        self.batch_size, self.passes, self.retain = batch_size, passes, retain
        self.svd, self.niter, self.oversample, self.seed = svd, niter, oversample, seed

    def _check(self, option, value, ok, expected):
        if not ok:
            raise UnlearnError(f"initializer {self.name!r}: option {option!r} must be {expected}, got {value!r}")

    def plan(self, forget, retain):
        return sample_batches(
            len(forget), len(retain), batch_size=self.batch_size, passes=self.passes, retain=self.retain, seed=self.seed
        )

    def _counted(self, nf, nr):
        if nf == 0 or nr == 0:
            part = "forget" if nf == 0 else "retain"
            raise UnlearnError(f"initializer {self.name!r}: the {part} examples have no answer tokens")

    def importance(self, peft_model, forget, retain, pad_token_id):
        modules = lora_layers(peft_model)
        params = {name: m.get_base_layer().weight for name, m in modules}
        f_batches, r_batches = self.plan(forget, retain)
        with measuring(peft_model, params, self.seed), peft_model.disable_adapter():
            f_sq, _, nf = accumulate(
                peft_model, forget, f_batches, pad_token_id, params, checkpointing=self.checkpointing
            )
            r_sq, _, nr = accumulate(
                peft_model, retain, r_batches, pad_token_id, params, checkpointing=self.checkpointing
            )
        self._counted(nf, nr)
        # in place, module by module: the forget and retain sums are the only full sets held
        return {name: f_sq.pop(name).div_(nf).div_(r_sq.pop(name).div_(nr).add_(EPS)) for name in params}

    def initialize(self, peft_model, *, forget, retain, tokenizer) -> InitResult:
        if not forget or not retain:
            raise UnlearnError(f"initializer {self.name!r} needs both forget and retain examples")
        adapter = peft_model.active_adapter
        importance = self.importance(peft_model, forget, retain, tokenizer.pad_token_id)
        for name, module in lora_layers(peft_model):
            w0 = module.get_base_layer().weight
            a, b = weighted_lowrank(
                w0,
                importance.pop(name),
                module.r[adapter],
                module.scaling[adapter],
                svd=self.svd,
                niter=self.niter,
                oversample=self.oversample,
                seed=self.seed,
            )
            write_residual(module, adapter, a, b)
        sync_from_rank0(peft_model)
        return InitResult(residual=True, info={"init": self.name})
