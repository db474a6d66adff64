"""TOFU's metrics as pure functions of per-answer log-likelihoods (docs/methods.md, "TOFU metrics").

Every probability is length-normalised the way TOFU defines it: ``exp(-mean answer-token
NLL)`` over the answer tokens plus the end token. The lm-eval tasks and any direct
computation feed these functions, so both give the same numbers by construction.

Conventions that differ between public implementations, and the one chosen here:

* truth ratio ``tr = exp(-mean_i L_wrong_i) / exp(-L_correct)`` computed in log space,
  without open-unlearning's ``+1e-10`` guard (original TOFU has none; the guard changes
  values once the correct answer's probability falls below ~1e-8);
* extraction strength ``1 - k/n`` with ``k`` ranging over ``0..n`` (an empty suffix always
  matches, so a sample with no matching suffix scores 0; open-unlearning stops at
  ``k = n-1`` and scores such a sample ``1/n``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

#: The nine (task, metric) pairs whose harmonic mean is TOFU's Model Utility.
MODEL_UTILITY_PARTS: tuple[tuple[str, str], ...] = (
    ("tofu_retain_prob", "prob"),
    ("tofu_retain_rouge", "rougeL_recall"),
    ("tofu_retain_truth_ratio", "truth_ratio"),
    ("tofu_real_authors", "prob"),
    ("tofu_real_authors_rouge", "rougeL_recall"),
    ("tofu_real_authors", "truth_ratio"),
    ("tofu_world_facts", "prob"),
    ("tofu_world_facts_rouge", "rougeL_recall"),
    ("tofu_world_facts", "truth_ratio"),
)


def mean_nll(loglik_sum: float, n_tokens: int) -> float:
    """Mean per-token negative log-likelihood of an answer (TOFU's ``avg_loss``)."""
    if n_tokens <= 0:
        raise ValueError(f"an answer needs at least one token, got {n_tokens}")
    return -loglik_sum / n_tokens


def probability(avg_nll: float) -> float:
    """Length-normalised answer probability ``exp(-mean NLL)``."""
    return math.exp(-avg_nll)


def truth_ratio(correct_nll: float, wrong_nlls: Sequence[float]) -> float:
    """``exp(-mean(wrong mean NLLs)) / exp(-correct mean NLL)``: below 1 when the model
    prefers the correct (paraphrased) answer to the perturbed ones."""
    if not wrong_nlls:
        raise ValueError("truth ratio needs at least one wrong answer")
    return math.exp(correct_nll - sum(wrong_nlls) / len(wrong_nlls))


def forget_truth_ratio(ratios: Iterable[float]) -> float:
    """Forget-split aggregate: ``mean(min(tr, 1/tr))`` (1 = cannot tell true from false)."""
    values = [min(tr, 1.0 / tr) if tr > 0 else 0.0 for tr in ratios]
    return sum(values) / len(values)


def true_better_truth_ratio(ratios: Iterable[float]) -> float:
    """Retain / real-authors / world-facts aggregate: ``mean(max(0, 1 - tr))``."""
    values = [max(0.0, 1.0 - tr) for tr in ratios]
    return sum(values) / len(values)


def probability_with_options(correct_nll: float, wrong_nlls: Sequence[float]) -> float:
    """``p_true / (p_true + sum p_wrong)`` with length-normalised probabilities
    (real authors, world facts)."""
    p_true = probability(correct_nll)
    total = p_true + sum(probability(x) for x in wrong_nlls)
    return p_true / total if total > 0 else 0.0


@lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def rouge_recall(generation: str, reference: str) -> dict[str, float]:
    """ROUGE-1 and ROUGE-L recall (rouge-score, stemmed) of a generation against the answer."""
    scores = _rouge_scorer().score(reference, generation)
    return {"rouge1_recall": scores["rouge1"].recall, "rougeL_recall": scores["rougeL"].recall}


def extraction_strength(first_matching_suffix: int, n_tokens: int) -> float:
    """``1 - k/n`` where ``k`` is the smallest position from which every greedy
    (teacher-forced) prediction equals the label; ``k = n`` when none does."""
    if n_tokens <= 0:
        raise ValueError(f"an answer needs at least one token, got {n_tokens}")
    if not 0 <= first_matching_suffix <= n_tokens:
        raise ValueError(f"k must lie in [0, {n_tokens}], got {first_matching_suffix}")
    return 1.0 - first_matching_suffix / n_tokens


def first_matching_suffix(predictions: Sequence[int], labels: Sequence[int]) -> int:
    """Smallest ``k`` with ``predictions[k:] == labels[k:]`` (``len(labels)`` if none)."""
    if len(predictions) != len(labels):
        raise ValueError("predictions and labels differ in length")
    k = len(labels)
    while k > 0 and predictions[k - 1] == labels[k - 1]:
        k -= 1
    return k


def forget_quality(model_ratios: Sequence[float], reference_ratios: Sequence[float]) -> float:
    """TOFU's Forget Quality: the two-sample KS test p-value between the model's and the
    retain model's per-sample truth ratios on the forget split."""
    if not model_ratios or not reference_ratios:
        raise ValueError("forget quality needs truth ratios from both models")
    from scipy.stats import ks_2samp

    return float(ks_2samp(list(model_ratios), list(reference_ratios)).pvalue)


def harmonic_mean(values: Iterable[float]) -> float:
    """Harmonic mean; 0 when any value is 0 (the limit), as in TOFU's Model Utility."""
    values = list(values)
    if not values:
        raise ValueError("harmonic mean of nothing")
    if any(v < 0 for v in values):
        raise ValueError(f"harmonic mean needs non-negative values, got {values}")
    if any(v == 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)


def model_utility(metrics: Mapping[str, Mapping[str, float]]) -> tuple[float | None, dict[str, float], list[str]]:
    """(Model Utility or None, the parts found, the parts missing) from ``{task: {metric: value}}``."""
    parts: dict[str, float] = {}
    missing: list[str] = []
    for task, metric in MODEL_UTILITY_PARTS:
        value = metrics.get(task, {}).get(metric)
        name = f"{task}/{metric}"
        if value is None or (isinstance(value, float) and math.isnan(value)):
            missing.append(name)
        else:
            parts[name] = float(value)
    return (harmonic_mean(parts.values()) if not missing else None), parts, missing


#: Model Utility's nine parts by split: (task, metric) for probability, ROUGE-L and truth ratio
MU_PARTS = {
    "retain": (
        ("tofu_retain_prob", "prob"),
        ("tofu_retain_rouge", "rougeL_recall"),
        ("tofu_retain_truth_ratio", "truth_ratio"),
    ),
    "real_authors": (
        ("tofu_real_authors", "prob"),
        ("tofu_real_authors_rouge", "rougeL_recall"),
        ("tofu_real_authors", "truth_ratio"),
    ),
    "world_facts": (
        ("tofu_world_facts", "prob"),
        ("tofu_world_facts_rouge", "rougeL_recall"),
        ("tofu_world_facts", "truth_ratio"),
    ),
}
