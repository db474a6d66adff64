"""Retain-model references of task-level metrics, and the table that sets a model beside them.

A task opts in with the task metadata ``retain_table`` (MUSE's tasks do, for its "six-way" table):
``{table: TITLE, row: LABEL, metric: METRIC, scale: 100, save: [METRIC, ...], retrained: VALUE}``:
the table and row the task's ``metric`` is shown in (times ``scale``), the metrics a retain
reference keeps of it (``save``, default ``[metric]``), and, when the retrained model's value is
fixed by definition (MUSE's PrivLeak: 0), ``retrained``. `unlearn eval --save-reference FILE` on
the retain (retrained) model writes these metrics; `--retain-reference FILE` on the unlearned model
hands the file to the tasks (metadata ``retain_reference``, as TOFU's truth-ratio reference: a
task may read a value from it, MUSE's PrivLeak its retain AUC) and shows each row beside the
retain model's value. The file's envelope is :func:`.reference.write_reference_file`'s; its
samples are ``{"key": "TASK/METRIC", "value": x}``. A reference made with another ``--limit`` is
refused.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import DataError
from .reference import ReferenceFormat, load_reference_file, write_reference_file

FORMAT = "unlearn-plugins/retain-metrics-reference"
VERSION = 1
KIND = ReferenceFormat("retain reference", FORMAT, VERSION, made_by="unlearn eval --save-reference")
META_KEY = "retain_table"
HINT = (
    "make one by evaluating the retain model with the same tasks and --limit: "
    "unlearn eval --model RETAIN_MODEL --tasks {tasks} --save-reference ref.json"
)


@dataclass(frozen=True)
class MetricsReference:
    path: str
    limit: float | None
    values: dict[str, dict[str, float]]  # {task: {metric: value}}

    def describe(self) -> str:
        return f"tasks {', '.join(sorted(self.values))} (--limit {self.limit})"


def is_metrics_reference(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file of this format (anything unreadable is left to the other readers)."""
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def spec_of(task: Any) -> dict | None:
    """A task's ``retain_table`` metadata, checked (None when it has none)."""
    config = getattr(task, "config", None)
    meta = getattr(config, "metadata", None) or {}
    spec = meta.get(META_KEY) if isinstance(meta, dict) else None
    if spec is None:
        return None
    name = getattr(config, "task", "?")
    if not isinstance(spec, dict) or not all(isinstance(spec.get(k), str) for k in ("table", "row", "metric")):
        raise DataError(f"task {name}: metadata '{META_KEY}' needs string fields 'table', 'row' and 'metric'")
    return spec


def table_rows(metrics: dict[str, dict[str, Any]], leaves: dict[str, Any]) -> list[dict]:
    """The rows of the tasks with ``retain_table`` metadata: this model's value, the metrics a
    reference keeps, and the retain model's value (from ``retained``, else from a retain
    reference among the task's metadata ``retain_reference``, else None)."""
    rows = []
    for name, task in leaves.items():
        spec = spec_of(task)
        if spec is None:
            continue
        got = metrics.get(name, {})
        refs = (getattr(task.config, "metadata", None) or {}).get("retain_reference")
        found = reference_value(refs, name, spec["metric"])
        retrained, source = (spec["retrained"], "by definition") if "retrained" in spec else found or (None, None)
        rows.append(
            {
                "table": spec["table"],
                "row": spec["row"],
                "task": name,
                "metric": spec["metric"],
                "scale": float(spec.get("scale", 1.0)),
                "value": got.get(spec["metric"]),
                "saves": {m: got.get(m) for m in spec.get("save", [spec["metric"]])},
                "retrained": retrained,
                "reference": source,
            }
        )
    return rows


def write_metrics_reference(
    path: str | os.PathLike,
    rows: Sequence[dict],
    *,
    limit: float | None,
    model: str | None = None,
    adapter: str | None = None,
) -> list[str]:
    """Write the metrics the rows keep (``saves``); returns the tasks written."""
    samples = []
    for row in rows:
        for metric, value in row["saves"].items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DataError(f"--save-reference: {row['task']} gave no finite {metric} ({value!r})")
            samples.append({"key": f"{row['task']}/{metric}", "value": float(value)})
    if not samples:
        raise DataError("--save-reference: no task of the run keeps a retain reference")
    write_reference_file(
        path,
        format=FORMAT,
        version=VERSION,
        fields={"limit": limit, "model": model, "adapter": adapter},
        samples=samples,
    )
    return sorted({row["task"] for row in rows})


def read_metrics_reference(path: str | os.PathLike) -> MetricsReference:
    """Load and check a metrics reference; errors name the file and the field."""
    path, data, samples = load_reference_file(path, KIND)
    limit = data.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
        raise DataError(f"retain reference {path}: field 'limit' must be a number or null")
    values: dict[str, dict[str, float]] = {}
    for i, item in enumerate(samples):
        task, sep, metric = item["key"].rpartition("/")
        value = item.get("value")
        if not sep or not task or not metric:
            raise DataError(f"retain reference {path}: samples[{i}]: field 'key' must be 'TASK/METRIC'")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DataError(f"retain reference {path}: samples[{i}]: field 'value' must be a finite number")
        values.setdefault(task, {})[metric] = float(value)
    return MetricsReference(str(path), limit, values)


def _paths(value: Any) -> list[str]:
    if value in (None, "", []):
        return []
    if isinstance(value, (str, os.PathLike)):
        return [v for v in str(value).split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    raise DataError(f"metadata 'retain_reference' must be a path or a list of paths, got {type(value).__name__}")


def reference_value(value: Any, task: str, metric: str) -> tuple[float, str] | None:
    """(``task``'s ``metric`` in the first metrics reference among the paths ``value`` that holds
    it, that file's path), or None."""
    for path in _paths(value):
        if not is_metrics_reference(path):
            continue
        ref = read_metrics_reference(path)
        if metric in ref.values.get(task, {}):
            return ref.values[task][metric], ref.path
    return None


def check_metrics_references(leaves: dict[str, Any], paths: Sequence[str], limit: float | None) -> None:
    """Before any compute: each metrics reference must hold a selected task that keeps one, and
    have been made with this run's ``--limit``."""
    kept = {name for name, task in leaves.items() if spec_of(task) is not None}
    for path in paths:
        ref = read_metrics_reference(path)
        if not kept & set(ref.values):
            raise DataError(
                f"retain reference {path} ({ref.describe()}) matches none of the selected tasks"
                + (f" ({', '.join(sorted(kept))})" if kept else "")
            )
        if (ref.limit or None) != (limit or None):
            raise DataError(
                f"retain reference {path} was made with --limit {ref.limit} but this run has --limit {limit}: "
                "use the same --limit, or " + HINT.format(tasks=",".join(sorted(kept & set(ref.values))))
            )


def retain_tables(rows: Sequence[dict]) -> str:
    """One Markdown table per ``table`` title: each row's value beside the retain model's."""
    from ..tables import lm_eval_table

    def fmt(value: Any, scale: float) -> str:
        return "n/a" if not isinstance(value, (int, float)) else f"{value * scale:.2f}"

    out, notes = [], []
    for title in dict.fromkeys(r["table"] for r in rows):
        body = [
            [r["row"], r["task"], fmt(r["value"], r["scale"]), fmt(r["retrained"], r["scale"])]
            for r in rows
            if r["table"] == title
        ]
        out.append(lm_eval_table([title, "Task", "Model", "Retrained"], body))
        if any(r["retrained"] is None for r in rows if r["table"] == title):
            tasks = ",".join(r["task"] for r in rows if r["table"] == title)
            notes.append(f"note: {title}: no retain reference for some rows; " + HINT.format(tasks=tasks))
    return "\n".join(out + notes)
