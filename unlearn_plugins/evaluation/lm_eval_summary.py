"""lm-eval's results summarised TOFU-style: each task's metrics, Forget Quality per forget
truth-ratio task (its retain reference is in the task's metadata) and Model Utility, a harmonic
mean that lm-eval groups cannot express (its formula is the TOFU benchmark's ``metrics``, reached
through the benchmark registry)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .reference import HINT


@dataclass
class Evaluation:
    """lm-eval's output and our summary of it. ``tracker``: lm-eval's EvaluationTracker, started
    with the evaluation and naming the model (``model_args``), which writes the files."""

    results: dict[str, Any]
    summary: dict[str, Any]
    samples: dict[str, list[dict]] = field(default_factory=dict)
    tracker: Any = None


def json_safe(value: Any) -> Any:
    """NaN/inf -> None and unknown objects -> str, so the JSON files are valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def metrics_of(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{task or group: {metric: value}} without stderr and bookkeeping entries."""
    table: dict[str, dict[str, Any]] = {}
    for name, row in results.get("results", {}).items():
        for key, value in row.items():
            metric, sep, filt = key.partition(",")
            if not sep or metric.endswith("_stderr"):
                continue
            table.setdefault(name, {})[metric] = value
    return table


def summarize(
    results: dict[str, Any], leaves: dict[str, Any] | None = None, *, describe: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Task metrics plus Forget Quality (per forget truth-ratio task) and Model Utility."""
    from .metrics_reference import table_rows
    from .reference import forget_quality_task

    metrics = metrics_of(results)
    fq: dict[str, Any] = {}
    for name, task in (leaves or {}).items():
        if not forget_quality_task(task):
            continue
        value = metrics.get(name, {}).get("forget_quality")
        entry = {
            "value": value,
            "split": task.split_label,
            "reference": task.reference.path if task.reference else None,
        }
        if value is None:
            entry["note"] = "unavailable: no retain reference; " + HINT.format(task=name)
        fq[name] = entry
    from ..host import required_benchmark_part

    mu_value, parts, missing = required_benchmark_part("tofu", "metrics").model_utility(metrics)
    mu: dict[str, Any] = {"value": mu_value, "parts": parts}
    if missing and (parts or any(t.startswith("tofu_") for t in metrics)):
        mu["missing"] = missing
        mu["note"] = "unavailable: add the tasks of the tag tofu_model_utility (they include ROUGE generation)"
    retain_table = table_rows(metrics, leaves or {})
    return {
        **(describe or {}),
        "tasks": sorted(metrics),
        "metrics": metrics,
        "forget_quality": fq,
        "model_utility": mu,
        **({"retain_table": retain_table} if retain_table else {}),
        "versions": {
            "lm_eval": results.get("versions", {}),
            "lm_eval_package": _version("lm_eval"),
            "unlearn_plugins": _version("unlearn-plugins"),
        },
    }


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist if dist != "lm_eval" else "lm-eval")
    except md.PackageNotFoundError:
        return None
