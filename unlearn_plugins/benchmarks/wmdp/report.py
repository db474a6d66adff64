"""A WMDP study's report: ``summary.md`` and ``study.json`` in ``--out``.

One row per model: the base model, the taught target (synthetic) and every method x seed, with
each task's accuracy and its 95% Wilson interval over the questions (the interval of one
evaluation: the question sample's error, not the seeds'), the change from the target with an
exact McNemar test on the same questions (two-sided binomial test of the discordant pairs), and
the cell's wall time (its stages' resources.json). A grid study (MUSE's scalability or
sustainability) keeps the base and target rows there and gives its cells a table of their own, a
row per method x seed x forget fraction (or request), where the synthetic corpus's cloze accuracy
is also split between the questions about the documents forgotten so far and the others."""

from __future__ import annotations

import json
import math
from pathlib import Path

from unlearn_plugins import tables
from unlearn_plugins.study import report_writer
from unlearn_plugins.study.report_writer import Report, Section

from .stages import SUMMARY, wilson

LABELS = {
    "wmdp_synthetic_cloze": "synthetic hazard (cloze)",
    "wmdp_synthetic": "synthetic hazard (WMDP format)",
    "wmdp_local": "WMDP",
    "wmdp_mmlu": "MMLU subset",
}


def mcnemar(before: list[int], after: list[int]) -> float | None:
    """Exact two-sided McNemar p-value of paired 0/1 outcomes (None when not paired)."""
    if len(before) != len(after) or not before:
        return None
    b = sum(1 for x, y in zip(before, after) if x == 1 and y == 0)
    c = sum(1 for x, y in zip(before, after) if x == 0 and y == 1)
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _seconds(cell_plan) -> float | None:
    total, found = 0.0, False
    for stage in cell_plan.stages:
        record = _read(Path(stage.folder) / "resources.json")
        if record and "seconds" in record:
            total += float(record["seconds"])
            found = True
    return round(total, 1) if found else None


def _part(cell_id: str, parts: dict) -> dict:
    """A grid cell's forget part: its fraction or request, and the documents forgotten so far."""
    name = cell_id.rsplit("/", 1)[1]
    if name.startswith("fraction"):
        return {"fraction": float(name.removeprefix("fraction")), "documents": parts[name]["indices"]}
    k = int(name.removeprefix("request"))
    so_far = sorted(i for j in range(1, k + 1) for i in parts[f"request{j}"]["indices"])
    return {"request": k, "documents": so_far}


def rows_of(plan) -> list[dict]:
    parts = (plan.benches.get(0) or {}).get("parts")
    rows = []
    for cell_id, cell_plan in plan.cells.items():
        if cell_plan.cell.kind == "target":
            continue
        summary = _read(Path(cell_plan.result) / SUMMARY)
        name = {"eval-base": "base", "eval-target": "target"}.get(cell_id, cell_id)
        rows.append(
            {
                "row": name,
                "cell": cell_id,
                "method": cell_plan.cell.method,
                "seed": cell_plan.cell.seed,
                "tasks": summary["tasks"] if summary else None,
                "seconds": _seconds(cell_plan),
                "teach_seconds": None,
            }
        )
        if parts and cell_plan.cell.kind == "method":
            rows[-1]["part"] = _part(cell_id, parts)
    target = plan.cells.get("target")
    if target is not None:
        for row in rows:
            if row["row"] == "target":
                row["teach_seconds"] = _seconds(target)
    return rows


def _fmt(entry: dict | None) -> str:
    if not entry:
        return "not run"
    return f"{entry['acc']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"


def _cell(row: dict, col: str) -> str:
    text = _fmt((row["tasks"] or {}).get(col))
    paired = row["paired"].get(col)
    if paired is not None:
        text += f" ({paired['delta']:+.3f}, p {paired['mcnemar_p']:.2g})"
    return text


def _table(first: list[str], rows: list[dict], columns: list[str], lead, extra=()) -> str:
    """A markdown table: ``lead(row)`` cells, each column's accuracy (and its change from the
    reference), ``extra`` (heading, function of the row) columns, the wall time."""
    head = [
        *first,
        *[LABELS.get(c.split(":")[0], c) + (" acc_norm" if c.endswith(":acc_norm") else "") for c in columns],
        *[name for name, _ in extra],
    ]
    head += ["wall s"]
    table = []
    for row in rows:
        cells = [*lead(row), *[_cell(row, col) for col in columns], *[f(row) for _, f in extra]]
        seconds = row["seconds"]
        if row["teach_seconds"] is not None and seconds is not None:
            seconds = f"{row['teach_seconds']:.0f} teach + {seconds:.0f} eval"
        cells.append(str(seconds) if seconds is not None else "")
        table.append(cells)
    return tables.markdown_table(head, table)


def _subset(entry: dict | None, keep: list[bool]) -> dict | None:
    """A task's accuracy on the questions ``keep`` marks (None: none, or not evaluated)."""
    if not entry or len(entry["correct"]) != len(keep) or not any(keep):
        return None
    correct = [c for c, k in zip(entry["correct"], keep) if k]
    low, high = wilson(sum(correct), len(correct))
    return {"acc": sum(correct) / len(correct), "n": len(correct), "low": low, "high": high, "correct": correct}


def _grid_section(plan, rows: list[dict], columns: list[str], reference: dict | None) -> list[str]:
    """The grid's table: a row per method x seed x forget fraction (or request), and on the
    synthetic corpus the cloze accuracy on the questions about the documents forgotten so far
    beside the rest (each against the reference model on the same questions)."""
    wmdp = plan.study.benchmark
    n = plan.benches[0]["parts"]["documents"]
    grid = [row for row in rows if "part" in row]
    extra = []
    if wmdp.synthetic is not None:
        from .synthetic import Settings, question_documents

        documents = question_documents(Settings(**wmdp.synthetic))
        task = "wmdp_synthetic_cloze"
        for row in grid:
            forgotten = set(row["part"]["documents"])
            row["split"] = {}
            for side, keep in (
                ("forgotten", [d in forgotten for d in documents]),
                ("rest", [d not in forgotten for d in documents]),
            ):
                entry = _subset((row["tasks"] or {}).get(task), keep)
                row["split"][side] = entry
                before = _subset((reference["tasks"] or {}).get(task), keep) if reference else None
                if entry is not None:
                    entry["reference"] = before["acc"] if before else None
                    entry["mcnemar_p"] = mcnemar(before["correct"], entry["correct"]) if before else None

        def split(side: str):
            def cell(row: dict) -> str:
                entry = row["split"].get(side)
                if entry is None:
                    return "no questions" if row["tasks"] else "not run"
                text = _fmt(entry)
                if entry["reference"] is not None:
                    text += f" ({entry['acc'] - entry['reference']:+.3f}, p {entry['mcnemar_p']:.2g})"
                return text

            return cell

        forgotten = "cloze, documents forgotten so far" if wmdp.sequential_folds else "cloze, the part's documents"
        extra = [(forgotten, split("forgotten")), ("cloze, other documents", split("rest"))]
    if wmdp.forget_fractions:
        title = "Scalability: each method x seed unlearns a growing part of the forget documents, from the target"
        first = ["method", "forget fraction"]

        def lead(row):
            return [
                row["cell"].rsplit("/", 1)[0],
                f"{row['part']['fraction']:g} ({len(row['part']['documents'])} of {n})",
            ]

    else:
        title = (
            f"Sustainability: the forget documents in {wmdp.sequential_folds} folds, unlearned one after another "
            "(request k starts from the model request k-1 left)"
        )
        first = ["method", "request"]

        def lead(row):
            documents = len(row["part"]["documents"])
            return [row["cell"].rsplit("/", 1)[0], f"{row['part']['request']} ({documents} of {n} documents so far)"]

    return [f"## {title}", "", _table(first, grid, columns, lead, extra), ""]


def write_report(out: Path, plan, results: dict, *, wall_s: float | None = None) -> tuple[str, list[str]]:
    """summary.md and study.json in ``out``, written together (:mod:`unlearn_plugins.study.report_writer`);
    returns the table for the terminal and the files' names."""
    study = plan.study
    rows = rows_of(plan)
    reference = next((r for r in rows if r["row"] == "target" and r["tasks"]), None)
    reference = reference or next((r for r in rows if r["row"] == "base" and r["tasks"]), None)
    tasks = [t for t in study.evaluation.tasks]
    columns = []
    for t in tasks:
        columns.append(t)
        if t == "wmdp_synthetic_cloze":
            columns.append(f"{t}:acc_norm")
    for row in rows:
        row["paired"] = {}
        if reference is None or row is reference or not row["tasks"]:
            continue
        for col in columns:
            a, b = (reference["tasks"] or {}).get(col), row["tasks"].get(col)
            if a and b:
                row["paired"][col] = {"delta": b["acc"] - a["acc"], "mcnemar_p": mcnemar(a["correct"], b["correct"])}
    main = [row for row in rows if "part" not in row]
    table = _table(["model"], main, columns, lambda row: [row["row"]])
    grid_text = _grid_section(plan, rows, columns, reference) if len(main) < len(rows) else []
    wmdp = study.benchmark
    ref_name = reference["row"] if reference else "none"
    text = [
        f"# Study {study.name}",
        "",
        study.description or "",
        "",
        f"Model `{study.model}`, max_length {study.max_length}; corpus {wmdp.corpus}"
        + (f" ({wmdp.synthetic})" if wmdp.synthetic else f" (forget {wmdp.forget_corpus}, retain {wmdp.retain_corpus})")
        + f"; seeds {list(study.seeds)}; MMLU subset: {wmdp.mmlu_per_subject} questions per subject.",
        "",
        "Accuracy [95% Wilson interval over the questions]; in parentheses the change from the "
        f"{ref_name} model and the exact McNemar p-value on the same questions. Chance is 0.25.",
        "",
        table,
        "",
    ]
    footer = []
    if wall_s is not None:
        footer.append(f"Wall time of this `unlearn study` run: {wall_s:.0f} s (cached cells take none).")
    not_done = [c for c, r in results.items() if r.get("status") != "done"]
    if not_done:
        footer.append(f"Failed cells: {', '.join(not_done)} (logs in {out}/logs).")
    record = {
        "study": study.name,
        "digest": study.digest(),
        "model": study.model,
        "benchmark": {k: v for k, v in wmdp.__dict__.items() if wmdp.LATER_FIELDS.get(k, ...) != v},
        "reference": ref_name,
        "rows": rows,
        "cells": {c: {k: v for k, v in r.items() if k != "log"} for c, r in results.items()},
        "wall_s": wall_s,
    }
    sections = [Section(text), Section(grid_text), Section([*footer, ""])]
    report_writer.write(out, Report(record, sections))
    if grid_text:
        table += "\n\n" + grid_text[2]
    return table, ["summary.md", "study.json"]


__all__ = ["write_report", "mcnemar", "rows_of"]
