"""open-unlearning's evaluation logs, written from and read into ours.

open-unlearning (locuslab/open-unlearning, ``src/evals/base.py``) writes one log per benchmark:
``TOFU_EVAL.json`` / ``MUSE_EVAL.json``, ``{metric: {"agg_value": x, "value_by_index": {i: {...}}}}``
for every metric it computed (those computed as another's ``pre_compute`` too, under the name the
other gives them), and ``<BENCHMARK>_SUMMARY.json``, ``{metric: agg_value}``. Writing ours in that
layout puts a number computed here beside their published ones; reading theirs gives our tables
and, from a retain model's log, the retain reference our Forget Quality needs (their published
retain logs then serve as ``--retain-reference``).

The mapping is by metric meaning, checked against open-unlearning's metric code
(``src/evals/metrics/{memorization,privacy,utility}.py``) and configs
(``configs/eval/{tofu,muse}_metrics/*.yaml``): same per-sample statistic, same aggregate
(TOFU's forget truth ratio: ``mean(min(tr, 1/tr))``; retain, real authors, world facts:
``mean(max(0, 1 - tr))``; MUSE's ROUGE: ROUGE-L F1; PrivLeak in percent on the conventional AUC).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..files import write_json

#: open-unlearning's file name for a benchmark's per-sample log and its summary
EVAL_FILE = "{benchmark}_EVAL.json"
SUMMARY_FILE = "{benchmark}_SUMMARY.json"


@dataclass(frozen=True)
class Metric:
    """One open-unlearning metric and the (task, metric) of ours that computes it.
    ``index_key``: the field of its ``value_by_index`` entries (None: an aggregate only)."""

    name: str
    task: str  # a regular expression over our task names
    metric: str
    index_key: str | None


_FORGET = r"tofu_forget(?:\d\d)?"
_MUSE = r"muse_(?:news|books)"

#: benchmark -> the metrics of its log, in open-unlearning's order
METRICS: dict[str, tuple[Metric, ...]] = {
    "TOFU": (
        Metric("forget_Q_A_Prob", rf"{_FORGET}_prob", "prob", "prob"),
        Metric("forget_Q_A_ROUGE", rf"{_FORGET}_rouge", "rougeL_recall", "rougeL_recall"),
        Metric("forget_Truth_Ratio", rf"{_FORGET}_truth_ratio", "truth_ratio", "score"),
        # forget_quality's pre_compute name: what open-unlearning reads from a retain model's log
        Metric("forget_truth_ratio", rf"{_FORGET}_truth_ratio", "truth_ratio", "score"),
        Metric("extraction_strength", rf"{_FORGET}_extraction_strength", "extraction_strength", "score"),
        Metric("retain_Q_A_Prob", "tofu_retain_prob", "prob", "prob"),
        Metric("retain_Q_A_ROUGE", "tofu_retain_rouge", "rougeL_recall", "rougeL_recall"),
        Metric("retain_Truth_Ratio", "tofu_retain_truth_ratio", "truth_ratio", "score"),
        Metric("ra_Q_A_Prob_normalised", "tofu_real_authors", "prob", "prob"),
        Metric("ra_Q_A_ROUGE", "tofu_real_authors_rouge", "rougeL_recall", "rougeL_recall"),
        Metric("ra_Truth_Ratio", "tofu_real_authors", "truth_ratio", "score"),
        Metric("wf_Q_A_Prob_normalised", "tofu_world_facts", "prob", "prob"),
        Metric("wf_Q_A_ROUGE", "tofu_world_facts_rouge", "rougeL_recall", "rougeL_recall"),
        Metric("wf_Truth_Ratio", "tofu_world_facts", "truth_ratio", "score"),
    ),
    "MUSE": (
        Metric("forget_knowmem_ROUGE", rf"{_MUSE}_knowmem_forget", "rougeL_f1", "rougeL_f1"),
        Metric("retain_knowmem_ROUGE", rf"{_MUSE}_knowmem_retain", "rougeL_f1", "rougeL_f1"),
        Metric("forget_verbmem_ROUGE", rf"{_MUSE}_verbmem", "rougeL_f1", "rougeL_f1"),
        Metric("mia_min_k", rf"{_MUSE}_privleak", "auc_min_k", None),
        Metric("privleak", rf"{_MUSE}_privleak", "privleak", None),
    ),
}

#: summary-level values of ours with no per-sample log: (benchmark, their name)
_FORGET_QUALITY = ("TOFU", "forget_quality")
_MODEL_UTILITY = ("TOFU", "model_utility")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _aggregate(results: dict[str, Any], task: str, metric: str) -> float | None:
    entry = results.get("results", {}).get(task, {})
    return _number(entry.get(f"{metric},none", entry.get(metric)))


def _per_sample(path: Path | None, metric: str, key: str) -> dict[str, dict[str, float]]:
    if path is None:
        return {}
    rows = {}
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}:{line_no}: not valid JSON: {exc}") from None
            value = _number(row.get(metric))
            if value is not None and isinstance(row.get("doc_id"), int):
                rows[row["doc_id"]] = {key: value}
    return {str(i): rows[i] for i in sorted(rows)}


def _matching(names, pattern: str, benchmark: str, name: str) -> str | None:
    found = sorted(t for t in names if re.fullmatch(pattern, t))
    if len(found) > 1:
        raise DataError(
            f"open-unlearning's {EVAL_FILE.format(benchmark=benchmark)} holds one split per metric, but "
            f"{name} would come from {', '.join(found)}: evaluate one forget split per --out folder"
        )
    return found[0] if found else None


def to_open_unlearning(results: dict[str, Any], summary: dict[str, Any], samples: dict[str, Path]) -> dict:
    """``{benchmark: {metric: {"agg_value": ..., "value_by_index": ...}}}`` of one of our
    evaluations (as :func:`lm_eval_runner.read_outputs` gives it); benchmarks without any of
    their tasks in the evaluation are left out."""
    logs: dict[str, dict] = {}
    tasks = set(results.get("results", {}))
    for benchmark, metrics in METRICS.items():
        log: dict[str, dict] = {}
        for m in metrics:
            task = _matching(tasks, m.task, benchmark, m.name)
            value = None if task is None else _aggregate(results, task, m.metric)
            if value is None:
                continue
            entry: dict[str, Any] = {"agg_value": value}
            if m.index_key is not None:
                entry["value_by_index"] = _per_sample(samples.get(task), m.metric, m.index_key)
            log[m.name] = entry
        if benchmark == _FORGET_QUALITY[0]:
            quality = [e.get("value") for e in (summary.get("forget_quality") or {}).values()]
            quality = [v for v in map(_number, quality) if v is not None]
            if len(quality) == 1:
                log[_FORGET_QUALITY[1]] = {"agg_value": quality[0]}
            utility = _number((summary.get("model_utility") or {}).get("value"))
            if utility is not None:
                log[_MODEL_UTILITY[1]] = {"agg_value": utility}
        if log:
            logs[benchmark] = log
    return logs


def write_open_unlearning(out_dir: str | Path, logs: dict[str, dict]) -> list[Path]:
    """Write ``<BENCHMARK>_EVAL.json`` and ``<BENCHMARK>_SUMMARY.json`` per benchmark into
    ``out_dir`` (atomically); returns the files written."""
    out = Path(out_dir)
    written = []
    for benchmark, log in logs.items():
        eval_path = out / EVAL_FILE.format(benchmark=benchmark)
        summary_path = out / SUMMARY_FILE.format(benchmark=benchmark)
        write_json(eval_path, log)
        write_json(summary_path, {name: entry["agg_value"] for name, entry in log.items() if "agg_value" in entry})
        written += [eval_path, summary_path]
    return written


def read_open_unlearning(path: str | Path) -> tuple[str, dict[str, dict]]:
    """(benchmark, log) of an open-unlearning log file: an ``_EVAL.json`` (kept as it is) or a
    ``_SUMMARY.json`` (each value made ``{"agg_value": value}``). Errors name the file."""
    path = Path(path).expanduser()
    match = re.fullmatch(r"(?:.*_)?(TOFU|MUSE)_(EVAL|SUMMARY)\.json", path.name)
    if not match:
        raise DataError(f"{path}: not an open-unlearning log (expected TOFU_EVAL.json, MUSE_SUMMARY.json, ...)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object of metrics")
    benchmark, kind = match.groups()
    log = {}
    for name, entry in data.items():
        if kind == "SUMMARY":
            entry = {"agg_value": entry}
        if not isinstance(entry, dict):
            raise DataError(f"{path}: metric {name!r}: expected an object with 'agg_value'")
        log[name] = entry
    return benchmark, log


def format_log(path: str | Path, benchmark: str, log: dict[str, dict]) -> str:
    """An open-unlearning log as a table: each metric's aggregate, the ones this project computes
    first (in our order), Forget Quality and Model Utility last."""
    ours = [m.name for m in METRICS.get(benchmark, ())]
    last = ["forget_quality", "model_utility"] if benchmark == "TOFU" else []
    names = [n for n in ours if n in log] + sorted(set(log) - set(ours) - set(last)) + [n for n in last if n in log]
    width = max((len(n) for n in names), default=10)
    lines = [f"{path} ({benchmark}, open-unlearning's layout)"]
    for name in names:
        value = _number(log[name].get("agg_value"))
        mark = "" if name in ours or name in last else "  (not computed by this project)"
        lines.append(f"  {name:<{width}}  {'-' if value is None else f'{value:.4f}'}{mark}")
    return "\n".join(lines)


def retain_truth_ratios(path: Path, log: dict[str, dict]) -> list[float]:
    """The per-sample forget truth ratios of a retain model's TOFU log, in index order (what
    open-unlearning's ``ks_test`` reads as ``retain_model_logs``)."""
    entry = log.get("forget_truth_ratio") or log.get("forget_Truth_Ratio")
    by_index = entry.get("value_by_index") if isinstance(entry, dict) else None
    if not isinstance(by_index, dict) or not by_index:
        raise DataError(
            f"{path}: no per-sample forget truth ratios (metric 'forget_truth_ratio' or 'forget_Truth_Ratio' with "
            "'value_by_index'): a retain reference needs open-unlearning's TOFU_EVAL.json, not its summary"
        )
    ratios = []
    try:
        indices = sorted(by_index, key=int)
    except ValueError:
        raise DataError(f"{path}: forget_truth_ratio: value_by_index keys must be sample indices") from None
    for i in indices:
        value = _number((by_index[i] or {}).get("score"))
        if value is None:
            raise DataError(f"{path}: forget_truth_ratio: value_by_index[{i}]: field 'score' must be a number")
        ratios.append(value)
    if [int(i) for i in indices] != list(range(len(indices))):
        raise DataError(f"{path}: forget_truth_ratio: value_by_index must cover samples 0..{len(indices) - 1}")
    return ratios
