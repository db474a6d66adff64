"""MRD, Memory Removal Difficulty (Feng et al., arXiv 2504.06658): how much a sample's
answer likelihood moves under tiny random weight perturbations.

For k = 0..K-1 (seed + k), add N(0, sigma^2) to every parameter and accumulate, per
sample, sum over answer tokens of (log p_t - log p~_t) / log p_t; MRD = |mean over k|,
optionally clipped. Well-memorised answers (log p_t near 0) get large values: higher =
harder to unlearn. Runs in fp32 (sigma = 1e-5 vanishes in bf16 weights: a bf16 model is
scored on an fp32 copy). The perturbation is the outer loop and all samples the inner
one; weights are restored by regenerating the seeded noise and subtracting it (no
reload, no second copy; the restored weights differ from the original by float rounding
only). Tokens with log p_t = 0 exactly have no defined ratio and are skipped.
"""

from __future__ import annotations

import copy
from typing import Sequence

from ..data.tofu import encode_samples, pad_batch
from ..interfaces import QASample
from ..likelihood import token_nll


def _answer_nll(model, batches, device):
    """Per-token answer NLL (B, T-1) fp32 and its mask, for each padded batch."""
    import torch

    out = []
    with torch.inference_mode():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                           use_cache=False).logits
            nll, mask = token_nll(logits, batch["labels"].to(device))
            out.append((nll.double(), mask))
    return out


def _perturb(params, seed: int, sigma: float, sign: float) -> None:
    """Add (sign=+1) or remove (sign=-1) the seeded noise N(0, sigma^2) on every parameter."""
    import torch

    generators = {}
    with torch.no_grad():
        for p in params:
            dev = p.device
            if dev not in generators:
                generators[dev] = torch.Generator(device=dev).manual_seed(seed)
            noise = torch.randn(p.shape, generator=generators[dev], device=dev, dtype=p.dtype)
            p.add_(noise, alpha=sign * sigma)


def mrd_scores(model, examples: Sequence[dict], pad_token_id: int, *, perturbations: int = 100,
               sigma: float = 1e-5, seed: int = 42, clip: float | None = None, batch_size: int = 8,
               progress: bool = False) -> list[float]:
    """MRD of each encoded example (input_ids / attention_mask / labels)."""
    import torch

    if perturbations < 1:
        raise ValueError(f"MRD needs at least one perturbation, got {perturbations}")
    work = model
    if any(p.dtype != torch.float32 for p in model.parameters()):
        work = copy.deepcopy(model).float()  # fp32: the noise would vanish in bf16
    was_training = work.training
    work.eval()
    device = next(work.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    groups = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    batches = [pad_batch([examples[i] for i in g], pad_token_id) for g in groups]
    base = _answer_nll(work, batches, device)
    totals = [torch.zeros(len(g), dtype=torch.float64, device=device) for g in groups]
    params = list(work.parameters())
    steps = range(perturbations)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="MRD perturbations", unit="perturbation")
    try:
        for k in steps:
            _perturb(params, seed + k, sigma, +1.0)
            try:
                for total, (nll, mask), (nll_p, _) in zip(totals, base, _answer_nll(work, batches, device)):
                    ok = mask & (nll > 0)
                    # (log p - log p~) / log p with log p = -nll
                    ratio = torch.where(ok, (nll - nll_p) / torch.where(ok, nll, torch.ones_like(nll)), 0.0)
                    total += ratio.sum(1)
            finally:
                _perturb(params, seed + k, sigma, -1.0)
    finally:
        work.train(was_training)
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

    def __init__(self, perturbations: int = 100, sigma: float = 1e-5, seed: int = 42, clip: float | None = None,
                 batch_size: int = 8, max_length: int = 512, progress: bool = False):
        self.perturbations = int(perturbations)
        self.sigma = float(sigma)
        self.seed = int(seed)
        self.clip = None if clip is None else float(clip)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.progress = progress

    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[float]:
        examples = encode_samples(tokenizer, samples, max_length=self.max_length)
        return mrd_scores(model, examples, tokenizer.pad_token_id, perturbations=self.perturbations,
                          sigma=self.sigma, seed=self.seed, clip=self.clip, batch_size=self.batch_size,
                          progress=self.progress)
