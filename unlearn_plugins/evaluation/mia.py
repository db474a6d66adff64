"""Membership inference on QA samples: does the forget set still look like training data?

Each attack turns one sample into a score, signed like a loss (higher = less likely a member);
the AUC of forget (label 0) against holdout (label 1) samples is then 1 when the forget set looks
far more "trained on" than QA the model never saw, 0.5 when it looks the same. These are
open-unlearning's attacks (src/evals/metrics/mia/) with its conventions:

- ``loss``: mean answer-token NLL over every answer token;
- ``zlib``: that loss divided by the zlib-compressed byte length of the answer text;
- ``min_k``: minus the mean of the lowest k fraction of answer-token log-probabilities;
- ``min_k++``: the same over token log-probabilities standardised by the model's own expected
  log-probability and its variance at that position (Min-K%++);
- ``gradnorm``: the mean over parameter tensors of the p-norm of the gradient of the answer loss;
- ``reference``: the loss minus a reference model's loss on the same sample (the retain model).

The token-level attacks (``min_k``, ``min_k++``, ``gradnorm``) leave out the answer's last token
(the end-of-turn token), as the reference does; ``loss``, ``zlib`` and ``reference`` use all of
them. privleak (MUSE) compares the unlearned model's AUC with the retain model's.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Sequence

from ..data.qa import IGNORE_INDEX, pad_batch, read_jsonl, split_path
from ..errors import DataError, UnlearnError
from ..interfaces import QASample
from .reference import sample_key

ATTACKS = ("loss", "zlib", "min_k", "min_k++", "gradnorm", "reference")
#: Min-K%'s k: the fraction of lowest answer-token log-probabilities averaged
MIN_K = 0.4


# ----------------------------------------------------------------------------- the documents
# the forget and holdout splits interleaved: what the tofu_mia task scores and what
# `unlearn eval --mia` scores directly on the model (membership.py), the same rows


def load_qa_split(split: str, tofu_dir: str | None, what: str) -> tuple[list[QASample], str]:
    """(samples, label) of a split named in metadata: a split of the TOFU folder or a JSON-lines file."""
    if not split:
        raise DataError(
            f"the MIA tasks read the {what} split from metadata '{what}_split' (a TOFU split name or a "
            f"JSON-lines file in TOFU's format): unlearn eval --{what}-split X, or lm_eval --metadata "
            f'\'{{"{what}_split": "X"}}\''
        )
    is_file = split.endswith((".json", ".jsonl")) or Path(split).expanduser().is_file()
    path = split_path(split, None, tofu_dir)  # a file needs no TOFU folder
    return read_jsonl(path), (str(path) if is_file else path.stem)


def mia_documents(
    forget_split: str, holdout_split: str, tofu_dir: str | None = None
) -> list[tuple[QASample, str, str]]:
    """(sample, "forget" | "holdout", split label) for both splits, interleaved (forget 0, holdout
    0, forget 1, ...; the longer split's rest at the end), so lm-eval's --limit N keeps about as
    many of each. A sample in both splits is refused: it cannot be a member and a non-member."""
    forget, forget_label = load_qa_split(forget_split, tofu_dir, "forget")
    holdout, holdout_label = load_qa_split(holdout_split, tofu_dir, "holdout")
    forget_keys = {sample_key(s.question, s.answer): s for s in forget}
    shared = next((s for s in holdout if sample_key(s.question, s.answer) in forget_keys), None)
    if shared is not None:
        raise DataError(
            f"{shared.where}: this holdout sample is also in the forget split "
            f"({forget_keys[sample_key(shared.question, shared.answer)].where}); the holdout split must "
            "be QA the model never trained on"
        )
    docs = []
    for i in range(max(len(forget), len(holdout))):
        if i < len(forget):
            docs.append((forget[i], "forget", forget_label))
        if i < len(holdout):
            docs.append((holdout[i], "holdout", holdout_label))
    return docs


def n_evaluated(n: int, limit: int | float | None) -> int:
    """How many documents lm-eval's --limit keeps."""
    if limit is None:
        return n
    return min(n, int(limit) if limit >= 1 else int(math.ceil(n * limit)))


def _answer_positions(labels) -> tuple[int, int]:
    """(first, last) index into the shifted log-probs (position t predicts token t+1) of one
    sample's answer tokens, the last answer token left out (the reference's ``[:-1]``)."""
    import torch

    idx = torch.nonzero(labels != IGNORE_INDEX, as_tuple=True)[0]
    if idx.numel() < 2 or int(idx[0]) == 0:
        return 0, 0
    return int(idx[0]) - 1, int(idx[-2])


def _forward(model, examples: Sequence[dict], pad_token_id: int):
    import torch

    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in pad_batch(list(examples), pad_token_id).items()}
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    if not bool(torch.isfinite(logits).all()):
        raise UnlearnError("membership inference: the model's output is NaN/inf: its weights are corrupt or diverged")
    return logits, batch


def sample_statistics(
    model,
    examples: Sequence[dict],
    pad_token_id: int,
    *,
    attacks: Sequence[str] = ATTACKS[:4],
    k: float = 0.4,
    texts: Sequence[str] | None = None,
    batch_size: int = 8,
) -> dict[str, list[float]]:
    """Per-sample scores of the forward-only attacks (``loss``, ``zlib``, ``min_k``, ``min_k++``)
    for encoded examples (``encode_qa`` rows); ``zlib`` needs the answer ``texts``."""
    import torch
    import torch.nn.functional as F

    unknown = [a for a in attacks if a not in ("loss", "zlib", "min_k", "min_k++")]
    if unknown:
        raise UnlearnError(
            f"membership inference: {unknown[0]!r} is not a forward-only attack (loss, zlib, min_k, min_k++)"
        )
    if "zlib" in attacks and (texts is None or len(texts) != len(examples)):
        raise UnlearnError("membership inference: the zlib attack needs one answer text per sample")
    if not 0 < k <= 1:
        raise UnlearnError(f"membership inference: k must be in (0, 1], got {k}")
    out: dict[str, list[float]] = {a: [] for a in attacks}
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            logits, batch = _forward(model, examples[start : start + batch_size], pad_token_id)
            logp = F.log_softmax(logits[:, :-1, :], dim=-1)
            labels = batch["labels"]
            shifted = labels[:, 1:]
            target = logp.gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
            for j in range(logits.shape[0]):
                i = start + j
                mask = shifted[j] != IGNORE_INDEX
                avg_loss = float(-target[j][mask].sum() / mask.sum().clamp_min(1))
                if "loss" in attacks:
                    out["loss"].append(avg_loss)
                if "zlib" in attacks:
                    out["zlib"].append(avg_loss / len(zlib.compress(texts[i].encode("utf-8"))))
                lo, hi = _answer_positions(labels[j])
                tokens = target[j, lo:hi]
                if "min_k" in attacks:
                    out["min_k"].append(min_k_score(tokens.double().tolist(), k))
                if "min_k++" in attacks:
                    vocab = logp[j, lo:hi].double()
                    mu = (vocab.exp() * vocab).sum(-1)
                    sigma = ((vocab.exp() * vocab.square()).sum(-1) - mu.square()).clamp_min(1e-6)
                    out["min_k++"].append(min_k_score(((tokens.double() - mu) / sigma.sqrt()).tolist(), k))
    return out


def min_k_score(values: Sequence[float], k: float) -> float:
    """Minus the mean of the lowest ``k`` fraction (at least one) of per-token values."""
    if not values:
        return 0.0
    n = max(1, int(len(values) * k))
    return -sum(sorted(values)[:n]) / n


def gradnorm_scores(model, examples: Sequence[dict], pad_token_id: int, *, p: float = 2) -> list[float]:
    """Per-sample mean over parameter tensors of ||d loss / d theta||_p, the loss being the mean
    NLL of the answer tokens but the last. Every weight of the model takes part, frozen or not;
    of a PEFT model, the base weights and not the adapter's own (the gradient with respect to a
    base weight W is the one with respect to the merged W + BA, so the score is the merged
    model's). Gradients and ``requires_grad`` are restored afterwards."""
    import torch

    if p not in (1, 2, math.inf):
        raise UnlearnError(f"membership inference: gradnorm's p must be 1, 2 or inf, got {p}")
    params = _model_weights(model)
    every = list(model.parameters())
    saved = [(q.requires_grad, q.grad) for q in every]
    was_training = model.training
    scores = []
    try:
        for q in every:
            q.grad = None
        for q in params:
            q.requires_grad_(True)
        model.eval()  # the reference switches to train(): identical for models without dropout
        for ex in examples:
            logits, batch = _forward(model, [ex], pad_token_id)
            lo, hi = _answer_positions(batch["labels"][0])
            logp = torch.log_softmax(logits[0, :-1, :], dim=-1)
            target = logp.gather(-1, batch["input_ids"][0, 1:].unsqueeze(-1)).squeeze(-1)[lo:hi]
            if target.numel() == 0:
                scores.append(0.0)
                continue
            for q in every:
                q.grad = None
            (-target.mean()).backward()
            norms = [q.grad.detach().float().norm(p=p) for q in params if q.grad is not None]
            scores.append(float(torch.stack(norms).mean()))
    finally:
        for q, (requires, grad) in zip(every, saved):
            q.requires_grad_(requires)
            q.grad = grad
        model.train(was_training)
    return scores


def _model_weights(model) -> list:
    """The model's weights: all parameters, less a PEFT adapter's (named with its tuner prefix)."""
    prefix = getattr(getattr(model, "base_model", None), "prefix", None) if hasattr(model, "peft_config") else None
    return [q for name, q in model.named_parameters() if not (prefix and prefix in name)]


def auc(forget_scores: Sequence[float], holdout_scores: Sequence[float]) -> float:
    """ROC AUC with forget = 0 and holdout = 1 (open-unlearning's convention: 1 when the forget
    samples score far lower, i.e. look far more like training data)."""
    from sklearn.metrics import roc_auc_score

    scores = [*forget_scores, *holdout_scores]
    if not forget_scores or not holdout_scores:
        raise UnlearnError("membership inference: the AUC needs forget and holdout samples")
    if not all(math.isfinite(s) for s in scores):
        raise UnlearnError("membership inference: a score is NaN/inf")
    return float(roc_auc_score([0] * len(forget_scores) + [1] * len(holdout_scores), scores))


def privleak(auc_model: float, auc_retain: float) -> float:
    """MUSE's privleak in percent: the relative gap between the model's and the retain model's
    AUC, both taken as 1 - AUC (MUSE states AUC the other way round). 0 = as private as never
    having trained on the forget set; negative = the forget set still looks like training data."""
    model, ref = 1.0 - auc_model, 1.0 - auc_retain
    return (model - ref) / (ref + 1e-10) * 100.0


def reference_scores(
    model, reference, examples: Sequence[dict], pad_token_id: int, *, batch_size: int = 8
) -> list[float]:
    """The reference attack: the model's answer loss minus the reference (retain) model's."""
    own = sample_statistics(model, examples, pad_token_id, attacks=["loss"], batch_size=batch_size)["loss"]
    ref = sample_statistics(reference, examples, pad_token_id, attacks=["loss"], batch_size=batch_size)["loss"]
    return [a - b for a, b in zip(own, ref)]


def exact_memorization(model, examples: Sequence[dict], pad_token_id: int, *, batch_size: int = 8) -> list[float]:
    """Teacher-forced fraction of answer tokens (the last left out, as the reference does) that
    are the model's argmax prediction, per sample."""
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(examples), batch_size):
            logits, batch = _forward(model, examples[start : start + batch_size], pad_token_id)
            pred = logits[:, :-1, :].argmax(-1)
            tokens = batch["input_ids"][:, 1:]
            for j in range(logits.shape[0]):
                lo, hi = _answer_positions(batch["labels"][j])
                out.append(float((pred[j, lo:hi] == tokens[j, lo:hi]).float().mean()) if hi > lo else 0.0)
    return out
