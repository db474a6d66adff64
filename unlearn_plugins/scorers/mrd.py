"""MRD, Memory Removal Difficulty (Feng et al.; docs/methods.md): how much a sample's
answer likelihood moves under tiny random weight perturbations.

For k = 0..K-1 (seed + k), add N(0, sigma^2) to every parameter and accumulate, per
sample, the sum over answer tokens of (log p_t - log p~_t) / log p_t; MRD = |mean over k|
(signed per-perturbation sums, absolute value of their mean), optionally clipped.
Well-memorised answers (log p_t near 0) get large values: higher = harder to unlearn.
Tokens with log p_t = 0 exactly have no defined ratio and are skipped.

Precision: at sigma = 1e-5 the change in log p is of the order of fp32 rounding, so by
default both likelihoods are computed in fp64 (``precision="fp32"``: faster, but scores then
depend on batch layout and thread count). Perturbation k sets each weight to original +
sigma * noise_k in that precision (the originals upcast exactly), so nothing drifts. The noise
is drawn in fp32 from a generator per device seeded with seed + k, in parameter order, the same
draws in both precisions. Hugging Face RMSNorms compute in fp32 whatever their input; in fp64
they are switched to fp64.

Memory (``chunk``): ``"layer"`` (default) holds the precision's weights of the embedding, the
head and one decoder block at a time: each block's are made (and perturbed) when the forward
reaches it and dropped after, the noise drawn in the same order, so the scores are those of a
whole copy to the bit (tests/test_mrd.py) for the cost of one block, not of the model (an fp64
copy is 8 bytes per parameter: 64 GB at 8B); ``"model"``: a whole copy in the precision, for
architectures whose parameters are not ordered embedding, blocks, head (also the fallback).
The caller's model is restored afterwards (weights, norms, attention implementation, mode).
"""

from __future__ import annotations

import contextlib
import copy
import math
import types
import warnings
from typing import Sequence

from ..data.qa import IGNORE_INDEX, MIN_MAX_LENGTH, encode_samples, pad_batch
from ..errors import UnlearnError
from ..interfaces import QASample
from .baselines import check_float_option, check_int_option

PRECISIONS = ("fp64", "fp32")
CHUNKS = ("layer", "model")


def _check_options(perturbations, sigma, precision, chunk="layer") -> None:
    if isinstance(perturbations, bool) or not isinstance(perturbations, int) or perturbations < 1:
        raise UnlearnError(
            f"MRD option perturbations: needs an integer >= 1 (at least one perturbation), got {perturbations!r}"
        )
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (math.isfinite(sigma) and sigma >= 0):
        raise UnlearnError(f"MRD option sigma: must be a finite number >= 0, got {sigma!r}")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise UnlearnError(f"MRD option precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if not isinstance(chunk, str) or chunk not in CHUNKS:
        raise UnlearnError(f"MRD option chunk: {chunk!r} is not one of {', '.join(CHUNKS)}")


def _rms_forward(self, x):
    """w * x / rms(x) in the input's dtype (Hugging Face's RMSNorm rounds to fp32 first)."""
    import torch

    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._mrd_eps))


def _full_precision(model, dtype):
    """Make the model compute in ``dtype`` where Hugging Face modules round to fp32 internally:
    RMSNorms that compute w * x / rms(x) get a dtype-preserving forward; eager attention
    (fp32 softmax) is switched to SDPA. Anything else that rounds is warned about. Returns a
    function that undoes it."""
    import torch

    patched = []

    gen = torch.Generator().manual_seed(0)
    for name, module in model.named_modules():
        if "RMSNorm" not in type(module).__name__:
            continue
        weight = getattr(module, "weight", None)
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if weight is None or eps is None or weight.dim() != 1:
            warnings.warn(
                f"MRD: {name} ({type(module).__name__}) may compute in fp32; scores may be less precise", stacklevel=2
            )
            continue
        x = torch.randn(2, weight.numel(), generator=gen, dtype=dtype).to(weight.device)
        with torch.no_grad():
            got = module(x)
            want = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        if torch.equal(got, want):
            continue
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
            warnings.warn(
                f"MRD: {name} ({type(module).__name__}) is not w * x / rms(x) and may compute in fp32; "
                f"scores may be less precise",
                stacklevel=2,
            )
            continue
        module._mrd_eps = float(eps)
        module.forward = types.MethodType(_rms_forward, module)
        patched.append(module)
    config = getattr(model, "config", None)
    eager = getattr(config, "_attn_implementation", None) == "eager"
    if eager:
        try:
            model.set_attn_implementation("sdpa")
        except Exception:  # noqa: BLE001 - an architecture without SDPA keeps eager attention
            eager = False
            warnings.warn("MRD: eager attention computes its softmax in fp32; scores may be less precise", stacklevel=2)

    def undo() -> None:
        for module in patched:
            del module.forward, module._mrd_eps
        if eager:
            model.set_attn_implementation("eager")

    return undo


def _answer_logp(model, batches, device, dtype):
    """Per batch: log p of every answer token (flat, ``dtype``) and the row it belongs to."""
    import torch

    out = []
    with torch.inference_mode():
        for batch in batches:
            labels = batch["labels"].to(device)
            logits = model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                use_cache=False,
            ).logits
            target = labels[:, 1:]
            rows, pos = torch.nonzero(target != IGNORE_INDEX, as_tuple=True)
            logp = torch.log_softmax(logits[rows, pos].to(dtype), dim=-1).gather(1, target[rows, pos][:, None])[:, 0]
            out.append((logp, rows))
    return out


def _set_perturbed(params, originals, seed: int, sigma: float) -> None:
    """params[i] = originals[i] + sigma * N(0, 1) draws from one fp32 generator per device
    seeded with ``seed``, in parameter order (copy, then add: exact, no drift)."""
    import torch

    generators = {}
    with torch.no_grad():
        for p, p0 in zip(params, originals):
            dev = p.device
            if dev not in generators:
                generators[dev] = torch.Generator(device=dev).manual_seed(seed)
            noise = torch.randn(p.shape, generator=generators[dev], device=dev, dtype=torch.float32)
            p.copy_(p0)
            p.add_(noise.to(p.dtype), alpha=sigma)


def _decoder_blocks(model):
    """The longest ModuleList of one module class (the decoder blocks), or None."""
    import torch.nn as nn

    best = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            if best is None or len(module) > len(best):
                best = module
    return best


class _LayerByLayer:
    """The caller's model computing in ``dtype`` with one group of weights at a time in that
    precision: the parameters before the decoder blocks (embeddings; a tied head with them)
    for the whole forward, each block's while it runs, those after (final norm, head) from
    the first module that owns one. Each group is made from the originals (+ sigma x noise
    drawn then, in parameter order: the draws of a whole copy). ``None`` from :meth:`build`
    when the parameter order does not allow it."""

    def __init__(self, model, dtype, head, blocks, tail, tail_modules):
        self.model, self.dtype = model, dtype
        self.head, self.blocks, self.tail, self.tail_modules = head, blocks, tail, tail_modules
        self.seed: int | None = None
        self.sigma = 0.0
        self._generators: dict = {}
        self._tail_done = False

    @classmethod
    def build(cls, model, dtype):
        blocks = _decoder_blocks(model)
        if blocks is None:
            return None
        params = list(model.parameters())
        position = {id(p): i for i, p in enumerate(params)}
        groups = [[position[id(p)] for p in block.parameters()] for block in blocks]
        flat = [i for g in groups for i in g]
        if not flat or flat != list(range(flat[0], flat[0] + len(flat))):
            return None  # blocks' parameters not contiguous and in block order
        if any(position[id(p)] < flat[0] or position[id(p)] > flat[-1] for b in blocks for p in b.parameters()):
            return None
        head = params[: flat[0]]
        tail = params[flat[-1] + 1 :]
        tail_ids = {id(p) for p in tail}
        tail_modules = [m for m in model.modules() if any(id(p) in tail_ids for p in m.parameters(recurse=False))]
        if len({id(p) for m in tail_modules for p in m.parameters(recurse=False)} & tail_ids) != len(tail_ids):
            return None
        return cls(model, dtype, head, [(b, list(b.parameters())) for b in blocks], tail, tail_modules)

    def _make(self, params):
        """Swap each parameter's data for original (+ sigma x noise) in the precision; return
        the originals to put back."""
        import torch

        saved = []
        for p in params:
            original = p.data
            new = original.to(self.dtype, copy=True)
            if self.seed is not None:
                dev = original.device
                if dev not in self._generators:
                    self._generators[dev] = torch.Generator(device=dev).manual_seed(self.seed)
                noise = torch.randn(p.shape, generator=self._generators[dev], device=dev, dtype=torch.float32)
                new.add_(noise, alpha=self.sigma)  # upcast inside the add: no second copy of the noise
                del noise
            p.data = new
            saved.append((p, original))
        return saved

    @staticmethod
    def _restore(saved):
        for p, original in saved:
            p.data = original
        saved.clear()

    @contextlib.contextmanager
    def hooked(self):
        """Hooks on the model for the block's duration (the model as it was after)."""
        saved_outer: list = []
        handles = []

        def start(module, args, kwargs=None):
            self._generators = {}
            self._tail_done = False
            saved_outer.extend(self._make(self.head))

        def finish(module, args, out):
            self._restore(saved_outer)

        def block_pre(params, holder):
            def pre(module, args):
                holder.extend(self._make(params))

            return pre

        def block_post(holder):
            def post(module, args, out):
                self._restore(holder)

            return post

        def tail_pre(module, args):
            if not self._tail_done:
                self._tail_done = True
                saved_outer.extend(self._make(self.tail))

        try:
            handles.append(self.model.register_forward_pre_hook(start))
            for block, params in self.blocks:
                holder: list = []
                handles.append(block.register_forward_pre_hook(block_pre(params, holder)))
                handles.append(block.register_forward_hook(block_post(holder)))
            for module in self.tail_modules:
                handles.append(module.register_forward_pre_hook(tail_pre))
            handles.append(self.model.register_forward_hook(finish))
            yield
        finally:
            for h in handles:
                h.remove()
            self._restore(saved_outer)


def mrd_scores(
    model,
    examples: Sequence[dict],
    pad_token_id: int,
    *,
    perturbations: int = 100,
    sigma: float = 1e-5,
    seed: int = 42,
    clip: float | None = None,
    batch_size: int = 8,
    precision: str = "fp64",
    chunk: str = "layer",
    progress: bool = False,
) -> list[float]:
    """MRD of each encoded example (input_ids / attention_mask / labels)."""
    import torch

    _check_options(perturbations, sigma, precision, chunk)
    dtype = torch.float64 if precision == "fp64" else torch.float32
    layered = _LayerByLayer.build(model, dtype) if chunk == "layer" else None
    if layered is None:
        return _scores(model, examples, pad_token_id, perturbations, sigma, seed, clip, batch_size, dtype, progress)
    was_training = model.training
    model.eval()
    undo = _full_precision(model, dtype) if dtype != torch.float32 else (lambda: None)
    try:
        with layered.hooked():
            return _scores(
                model, examples, pad_token_id, perturbations, sigma, seed, clip, batch_size, dtype, progress, layered
            )
    finally:
        undo()
        model.train(was_training)


def _scores(model, examples, pad_token_id, perturbations, sigma, seed, clip, batch_size, dtype, progress, layered=None):
    """MRD with a whole copy of the model in ``dtype`` or, with ``layered``, on the model itself
    one block at a time (:class:`_LayerByLayer`)."""
    import torch

    if layered is None:
        originals = [p.detach() for p in model.parameters()]
        work = copy.deepcopy(model).to(dtype)
        work.eval()
        if dtype != torch.float32:
            _full_precision(work, dtype)
        params = list(work.parameters())
    else:
        work, params = model, list(model.parameters())
    device = params[0].device
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    batches = [pad_batch([examples[i] for i in g], pad_token_id) for g in groups]
    base = _answer_logp(work, batches, device, dtype)
    totals = [torch.zeros(len(g), dtype=torch.float64, device=device) for g in groups]
    steps = range(perturbations)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="MRD perturbations", unit="perturbation")
    for k in steps:
        if layered is None:
            _set_perturbed(params, originals, seed + k, sigma)
        else:
            layered.seed, layered.sigma = seed + k, sigma
        for total, (lp, rows), (lp_p, _) in zip(totals, base, _answer_logp(work, batches, device, dtype)):
            ok = lp != 0
            ratio = torch.where(ok, (lp - lp_p) / torch.where(ok, lp, torch.ones_like(lp)), 0.0)
            total.index_add_(0, rows, ratio.double())
    del work
    scores = [0.0] * len(examples)
    for g, total in zip(groups, totals):
        values = (total / perturbations).abs()
        if clip is not None:
            values = values.clamp(max=clip)
        for i, v in zip(g, values.tolist()):
            scores[i] = v
    return scores


class MRDScorer:
    """Difficulty scorer ``mrd``: Memory Removal Difficulty of each sample's answer."""

    def __init__(
        self,
        perturbations: int = 100,
        sigma: float = 1e-5,
        seed: int = 42,
        clip: float | None = None,
        batch_size: int = 8,
        max_length: int = 512,
        precision: str = "fp64",
        chunk: str = "layer",
        progress: bool = False,
    ):
        _check_options(perturbations, sigma, precision, chunk)
        self.perturbations = int(perturbations)
        self.sigma = float(sigma)
        self.seed = check_int_option("mrd", "seed", seed, 0)
        self.clip = None if clip is None else check_float_option("mrd", "clip", clip, 0.0, strict=True)
        self.batch_size = check_int_option("mrd", "batch_size", batch_size, 1)
        self.max_length = check_int_option("mrd", "max_length", max_length, MIN_MAX_LENGTH)
        self.precision = precision
        self.chunk = chunk
        self.progress = progress

    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[float]:
        examples = encode_samples(tokenizer, samples, max_length=self.max_length)
        return mrd_scores(
            model,
            examples,
            tokenizer.pad_token_id,
            perturbations=self.perturbations,
            sigma=self.sigma,
            seed=self.seed,
            clip=self.clip,
            batch_size=self.batch_size,
            precision=self.precision,
            chunk=self.chunk,
            progress=self.progress,
        )
