"""Recommendation metrics of the MovieLens tasks as pure functions, and the retrain model's
prediction reference file that JSD compares against (docs/methods.md, "Recommendation
unlearning").

* P(Yes) = P(Yes) / (P(Yes) + P(No)) = sigmoid(log P(Yes) - log P(No)) from the two answer
  log-likelihoods;
* AUC: corpus-level ROC AUC of P(Yes) against the labels (scikit-learn's roc_auc_score;
  NaN when the labels hold one class only);
* LogLoss: mean binary cross-entropy (scikit-learn's log_loss);
* accuracy: P(Yes) > 0.5 against the label;
* JSD: mean over samples of the Jensen-Shannon divergence (natural log, so in [0, ln 2])
  between the Bernoulli predictions of the evaluated model and of the retrained model.

A prediction reference holds the retrained model's P(Yes) per sample (keyed by a hash of the
prompt, answer, user, movie and time), so a JSD on samples the reference lacks is refused
rather than computed on mismatched samples; a reference made on a superset (the whole forget
set) serves any subset of it (e.g. the CUD-easy users' prompts).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation.reference import (
    ReferenceFormat,
    TaskReference,
    load_reference_file,
    write_reference_file,
)
from unlearn_plugins.evaluation.reference import references_from as retain_references_from

FORMAT = "unlearn-plugins/rec-prediction-reference"
VERSION = 1
KIND = ReferenceFormat("prediction reference", FORMAT, VERSION, ("task", "split"))
HINT = (
    "make one from the retrained model (trained without the forgotten users): evaluate it with {task} "
    "and the same --limit, then unlearn_plugins.benchmarks.movielens.tasks.metrics.reference_from_samples(...)"
)


def p_yes(loglik_yes: float, loglik_no: float) -> float:
    """P(Yes) / (P(Yes) + P(No)) from the two log-likelihoods (stable for any magnitude)."""
    d = loglik_yes - loglik_no
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


def _pairs(items: Iterable[Sequence[float]]) -> tuple[list[int], list[float]]:
    labels, probs = [], []
    for label, prob in items:
        labels.append(int(label))
        probs.append(float(prob))
    return labels, probs


def auc(items: Iterable[Sequence[float]]) -> float:
    """ROC AUC over (label, P(Yes)) pairs; NaN (with a warning) when only one class occurs."""
    from sklearn.metrics import roc_auc_score

    labels, probs = _pairs(items)
    if len(set(labels)) < 2:
        warnings.warn(
            f"AUC is undefined: all {len(labels)} labels are {labels[0] if labels else '-'}",
            RuntimeWarning,
            stacklevel=2,
        )
        return float("nan")
    return float(roc_auc_score(labels, probs))


def logloss(items: Iterable[Sequence[float]]) -> float:
    """Mean binary cross-entropy over (label, P(Yes)) pairs (scikit-learn clips P to (eps, 1 - eps))."""
    from sklearn.metrics import log_loss

    labels, probs = _pairs(items)
    return float(log_loss(labels, probs, labels=[0, 1]))


def accuracy(items: Iterable[Sequence[float]]) -> float:
    labels, probs = _pairs(items)
    return sum(int(p > 0.5) == y for y, p in zip(labels, probs)) / len(labels)


def bernoulli_jsd(p: float, q: float) -> float:
    """Jensen-Shannon divergence (natural log) between Bernoulli(p) and Bernoulli(q)."""
    from scipy.spatial.distance import jensenshannon

    return float(jensenshannon([p, 1.0 - p], [q, 1.0 - q])) ** 2


def mean_jsd(ps: Sequence[float], qs: Sequence[float]) -> float:
    if len(ps) != len(qs) or not ps:
        raise ValueError("JSD needs two equally long, non-empty prediction lists")
    return sum(bernoulli_jsd(p, q) for p, q in zip(ps, qs)) / len(ps)


# ----------------------------------------------------------------------------- reference files


@dataclass(frozen=True)
class PredictionReference(TaskReference):
    p_yes: tuple[float, ...]

    def overlaps(self, keys: Sequence[str]) -> bool:
        """True when the reference holds any of these samples (made on this split, or a superset)."""
        mine = set(self.keys)
        return any(k in mine for k in keys)

    def aligned(self, keys: Sequence[str], *, task: str) -> list[float]:
        """The reference's P(Yes) for exactly these samples, in their order (a reference made on
        a superset, e.g. the whole forget set for its easy users, serves any subset), or an
        error saying how many are missing."""
        by_key = dict(zip(self.keys, self.p_yes))
        missing = sum(k not in by_key for k in keys)
        if missing:
            raise DataError(
                f"prediction reference {self.path} ({self.describe()}) lacks {missing} of the {len(keys)} "
                f"samples {task} evaluated: make it on the same samples (and --limit), or "
                f"{HINT.format(task=task)}"
            )
        return [by_key[k] for k in keys]


def write_prediction_reference(
    path: str | os.PathLike,
    *,
    task: str,
    split: str,
    keys: Sequence[str],
    p_yes: Sequence[float],
    model: str | None = None,
    adapter: str | None = None,
) -> None:
    """Write a reference file atomically (one P(Yes) in [0, 1] per sample key)."""
    if len(keys) != len(p_yes) or not keys:
        raise ValueError("a prediction reference needs one P(Yes) per sample, and at least one sample")
    if len(set(keys)) != len(keys):
        raise ValueError("a prediction reference needs distinct sample keys")
    write_reference_file(
        path,
        format=FORMAT,
        version=VERSION,
        fields={"task": task, "split": split, "model": model, "adapter": adapter},
        samples=[{"key": k, "p_yes": float(p)} for k, p in zip(keys, p_yes)],
    )


def read_prediction_reference(path: str | os.PathLike) -> PredictionReference:
    """Load and validate a reference file; errors name the file and the field."""
    path, data, samples = load_reference_file(path, KIND)
    keys, probs = [], []
    for i, item in enumerate(samples):
        p = item.get("p_yes")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise DataError(f"prediction reference {path}: samples[{i}]: field 'p_yes' must be a number in [0, 1]")
        keys.append(item["key"])
        probs.append(float(p))
    if len(set(keys)) != len(keys):
        raise DataError(f"prediction reference {path}: field 'samples' repeats a key")
    return PredictionReference(str(path), data["task"], data["split"], tuple(keys), tuple(probs))


def references_from(value: Any) -> list[PredictionReference]:
    """Reference files named in task metadata (a path, a list of paths, or a comma list)."""
    return retain_references_from(value, read_prediction_reference, "retrain_reference")


def reference_from_samples(
    samples: Sequence[dict], path: str | os.PathLike, *, task: str, model: str | None = None, adapter: str | None = None
) -> None:
    """Write a reference from lm-eval's logged samples of a MovieLens task (one dict per
    document with ``doc_id``, ``doc`` and the ``jsd`` field (key, P(Yes)) its
    process_results returns), e.g. ``Evaluation.samples[task]`` or a samples_*.jsonl file's rows."""
    rows = sorted(samples, key=lambda s: s["doc_id"])
    if not rows or "jsd" not in rows[0]:
        raise DataError(f"no MovieLens forget-task samples with a 'jsd' field to make a reference from (task {task})")
    split = rows[0]["doc"].get("split", "?") if isinstance(rows[0].get("doc"), dict) else "?"
    write_prediction_reference(
        path,
        task=task,
        split=split,
        keys=[r["jsd"][0] for r in rows],
        p_yes=[float(r["jsd"][1]) for r in rows],
        model=model,
        adapter=adapter,
    )
