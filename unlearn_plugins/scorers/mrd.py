"""MRD, Memory Removal Difficulty (Feng et al.; docs/methods.md): how much a sample's
answer likelihood moves under tiny random weight perturbations.

For k = 0..K-1 (seed + k), add N(0, sigma^2) to every parameter and accumulate, per
sample, the sum over answer tokens of (log p_t - log p~_t) / log p_t; MRD = |mean over k|
(signed per-perturbation sums, absolute value of their mean), optionally clipped.
Well-memorised answers (log p_t near 0) get large values: higher = harder to unlearn.
Tokens with log p_t = 0 exactly have no defined ratio and are skipped.

Precision: at sigma = 1e-5 the change in log p is of the order of fp32 rounding, so by
default both likelihoods come from an fp64 copy of the model on its own device
(``precision="fp32"``: an fp32 copy, faster, but scores then depend on batch layout and
thread count). The caller's model is never modified: perturbation k sets each copied
weight to original + sigma * noise_k (the originals upcast exactly), so nothing drifts.
The noise is drawn in fp32 from a generator per device seeded with seed + k, the same
draws in both precisions. Hugging Face RMSNorms compute in fp32 whatever their input;
in the fp64 copy they are switched to fp64.
"""

from __future__ import annotations

import copy
import math
import types
import warnings
from typing import Sequence

from ..data.tofu import IGNORE_INDEX, MIN_MAX_LENGTH, encode_samples, pad_batch
from ..errors import UnlearnError
from ..interfaces import QASample
from .baselines import check_float_option, check_int_option

PRECISIONS = ("fp64", "fp32")


def _check_options(perturbations, sigma, precision) -> None:
    if isinstance(perturbations, bool) or not isinstance(perturbations, int) or perturbations < 1:
        raise UnlearnError(
            f"MRD option perturbations: needs an integer >= 1 (at least one perturbation), got {perturbations!r}"
        )
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (math.isfinite(sigma) and sigma >= 0):
        raise UnlearnError(f"MRD option sigma: must be a finite number >= 0, got {sigma!r}")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise UnlearnError(f"MRD option precision: {precision!r} is not one of {', '.join(PRECISIONS)}")


def _rms_forward(self, x):
    """w * x / rms(x) in the input's dtype (Hugging Face's RMSNorm rounds to fp32 first)."""
    import torch

    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._mrd_eps))


def _full_precision(model, dtype) -> None:
    """Make the copy compute in ``dtype`` where Hugging Face modules round to fp32 internally:
    RMSNorms that compute w * x / rms(x) get a dtype-preserving forward; eager attention
    (fp32 softmax) is switched to SDPA. Anything else that rounds is warned about."""
    import torch

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
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "eager":
        try:
            model.set_attn_implementation("sdpa")
        except Exception:  # noqa: BLE001 - an architecture without SDPA keeps eager attention
            warnings.warn("MRD: eager attention computes its softmax in fp32; scores may be less precise", stacklevel=2)


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
    progress: bool = False,
) -> list[float]:
    """MRD of each encoded example (input_ids / attention_mask / labels)."""
    import torch

    _check_options(perturbations, sigma, precision)
    dtype = torch.float64 if precision == "fp64" else torch.float32
    originals = [p.detach() for p in model.parameters()]
    work = copy.deepcopy(model).to(dtype)
    work.eval()
    if dtype != torch.float32:
        _full_precision(work, dtype)
    params = list(work.parameters())
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
        _set_perturbed(params, originals, seed + k, sigma)
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
        progress: bool = False,
    ):
        _check_options(perturbations, sigma, precision)
        self.perturbations = int(perturbations)
        self.sigma = float(sigma)
        self.seed = check_int_option("mrd", "seed", seed, 0)
        self.clip = None if clip is None else check_float_option("mrd", "clip", clip, 0.0, strict=True)
        self.batch_size = check_int_option("mrd", "batch_size", batch_size, 1)
        self.max_length = check_int_option("mrd", "max_length", max_length, MIN_MAX_LENGTH)
        self.precision = precision
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
            progress=self.progress,
        )
