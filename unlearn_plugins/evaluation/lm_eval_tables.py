"""An evaluation as text: lm-eval's own tables (``make_table``), then TOFU's Forget Quality and
Model Utility, then the tables of tasks beside their retain reference (MUSE's six-way table)."""

from __future__ import annotations

from typing import Any

from .lm_eval_summary import Evaluation
from .metrics_reference import retain_tables


def format_tables(evaluation: Evaluation) -> str:
    """lm-eval's own tables (``make_table``: tasks, then groups), then TOFU's Forget Quality and
    Model Utility when the run has TOFU tasks."""
    from lm_eval.utils import make_table

    tables = [make_table(evaluation.results)]
    if evaluation.results.get("groups"):
        tables.append(make_table(evaluation.results, "groups"))
    tofu = tofu_table(evaluation.summary)
    rows = evaluation.summary.get("retain_table")
    return "\n".join(tables + ([tofu] if tofu else []) + ([retain_tables(rows)] if rows else []))


def tofu_table(summary: dict[str, Any]) -> str:
    """Forget Quality (per forget truth-ratio task) and Model Utility as a Markdown table in
    make_table's style, with a note for each unavailable value ("" when neither applies)."""
    from ..tables import lm_eval_table

    rows: list[list[str]] = []
    for task, entry in summary.get("forget_quality", {}).items():
        rows.append(["Forget Quality", task, _fmt(entry["value"]) if entry["value"] is not None else "unavailable"])
    mu = summary.get("model_utility", {})
    if mu.get("value") is not None or mu.get("missing"):
        rows.append(
            [
                "Model Utility",
                "harmonic mean of 9",
                _fmt(mu["value"])
                if mu.get("value") is not None
                else f"unavailable ({len(mu['missing'])} parts missing)",
            ]
        )
    if not rows:
        return ""
    notes = [e["note"] for e in summary.get("forget_quality", {}).values() if e.get("note")]
    if mu.get("note"):
        notes.append("Model Utility " + mu["note"])
    return "\n".join([lm_eval_table(["TOFU", "Of", "Value"], rows)] + [f"note: {n}" for n in notes])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4) else f"{value:.4f}"
    return "n/a" if value is None else str(value)
