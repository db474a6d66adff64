"""Per-sample answer log-likelihoods, batched: the quantity behind answer probability,
the ``loss`` scorer and the TOFU metrics."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from .data.qa import IGNORE_INDEX, pad_batch
from .errors import UnlearnError


def token_nll(logits, labels):
    """Per-token NLL (B, T-1) of shifted labels, 0 where labels are -100, plus the mask.

    Only the answer positions go through the fp32 log-softmax: a training step keeps its output
    for the backward pass, and over every position (prompt and padding too) it was the largest
    single block of a LoRA step's memory (batch x length x vocab floats, 49,152 wide for
    SmolLM2). Each row's value is the same as over the full tensor."""
    import torch.nn.functional as F

    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE_INDEX
    rows = F.cross_entropy(logits[:, :-1, :][mask].float(), shift_labels[mask], reduction="none")
    nll = rows.new_zeros(shift_labels.shape).masked_scatter(mask, rows)
    return nll, mask


def forward(model, part: Mapping[str, Any], **kwargs):
    """Model outputs for one padded part of a batch (input_ids, attention_mask)."""
    return model(input_ids=part["input_ids"], attention_mask=part["attention_mask"], **kwargs)


def masked_mean(values, mask):
    """Mean of ``values`` over the True entries of ``mask`` (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def mean_nll(model, part):
    """Mean token NLL over all answer tokens of the batch (the usual causal-LM loss)."""
    logits = forward(model, part).logits
    nll, mask = token_nll(logits, part["labels"])
    return masked_mean(nll, mask)


def answer_nll(model, examples: Sequence[dict], pad_token_id: int, *, batch_size: int = 8, progress: bool = False):
    """(summed answer NLL, answer token count) per encoded example, in input order.

    Examples are bucketed by length so padding stays small. A NaN/inf in the model's output
    (corrupt or diverged weights) is an UnlearnError, never a probability or score.
    """
    import torch

    device = next(model.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    out: list[tuple[float, int]] = [(0.0, 0)] * len(examples)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="answer likelihood", unit="batch")
    with torch.inference_mode():
        for idx in batches:
            batch = {k: v.to(device) for k, v in pad_batch([examples[i] for i in idx], pad_token_id).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            nll, mask = token_nll(logits, batch["labels"])
            totals = nll.sum(1)
            if not bool(torch.isfinite(totals).all()):
                bad = [idx[j] for j in torch.nonzero(~torch.isfinite(totals)).flatten().tolist()]
                raise UnlearnError(non_finite_message(bad, len(examples), model))
            sums, counts = totals.tolist(), mask.sum(1).tolist()
            for j, i in enumerate(idx):
                out[i] = (sums[j], int(counts[j]))
    return out


def mean_answer_nlls_in_training(model, args, examples: Sequence[dict], pad_token_id: int, *, batch_size: int = 8):
    """Per example its mean answer-token NLL under a model the Trainer is training (from a
    callback): in eval mode (no dropout) and under the run's bf16 autocast when it has one, then
    back to the mode it was in. ``args``: the Trainer's TrainingArguments."""
    import contextlib

    import torch

    training = model.training
    model.eval()
    autocast = (
        torch.autocast(device_type=args.device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    )
    try:
        with autocast:
            stats = answer_nll(model, examples, pad_token_id, batch_size=batch_size)
    finally:
        model.train(training)
    return [s / max(n, 1) for s, n in stats]


def non_finite_message(positions: Sequence[int], total: int, model=None) -> str:
    shown = ", ".join(str(i) for i in sorted(positions)[:5]) + (", ..." if len(positions) > 5 else "")
    name = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", "")
    which = f"model {name}" if name else "the model"
    return (
        f"the output of {which} is NaN/inf (samples at positions {shown} of {total}): its weights are "
        f"corrupt or diverged, so no probability or score can be computed"
    )


def answer_probability(nll_sum: float, n_tokens: int) -> float:
    """TOFU's length-normalised probability exp(-mean token NLL)."""
    return math.exp(-nll_sum / max(n_tokens, 1))
