"""The report of an author-unit study: per test author and method the numbers of its
evaluation, the declared comparisons over the authors (:mod:`.design_report`), each method's
paired Model Utility against the target, the noise ceiling, the operating points and their
sweep traces; ``study.json``, ``summary.md``, one trace plot per method and (with a
``[verdict]``) ``verdict.md``, the block a README quotes (:func:`verdict_block`), each written to
a temporary file and renamed.

Reads only the stage folders of the cache (restored from ``--records`` where they were
recorded): an evaluation's numbers (:func:`.report.evaluation_metrics`), its forget truth ratios
against the retain model's of the same author (:func:`.statistics.truth_ratio_distances`: the KS
statistic and the Wasserstein distance of the log ratios beside Forget Quality), its Model
Utility samples paired with the target's on the same QA (:func:`.statistics.mu_paired_bootstrap`),
``operating_point.json`` and the sweep runs' ``trace.jsonl``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from unlearn_plugins import tables
from unlearn_plugins.errors import DataError, UnlearnError
from unlearn_plugins.study import report_writer
from unlearn_plugins.study.cells import Plan
from unlearn_plugins.study.report_writer import FileWriter, Report, Section, text_file

from . import design_report
from .design import LEADER, LOWER_IS_BETTER, Design
from .operating_cell import read_result
from .report import CorruptEvaluation, evaluation_metrics, read_evaluation
from .statistics import group_summary, mu_paired_bootstrap, noise_ceiling, truth_ratio_distances

REPORT_FORMAT = 1
#: the per-author numbers reported beside Forget Quality (the ``[evaluation] report`` keys and the usual ones)
PER_AUTHOR = (
    ("forget_quality", "Forget Quality"),
    ("ks_statistic", "KS statistic"),
    ("wasserstein_log", "W1 log truth ratio"),
    ("model_utility", "Model Utility"),
    ("model_utility_diff", "MU - target (paired)"),
    ("forget_prob", "forget prob"),
    ("forget_rougeL", "forget ROUGE-L"),
    ("retain_prob", "retain prob"),
)
TRUTH_RATIO_TASK = "tofu_forget_truth_ratio"
#: the range of each per-author number: an interval over the authors is cut to it (as the
#: seed-unit report's, :data:`.report.RANGES`); a paired difference of a [0, 1] number to [-1, 1]
RANGES: dict[str, tuple[float | None, float | None]] = {
    "forget_quality": (0.0, 1.0),
    "ks_statistic": (0.0, 1.0),
    "wasserstein_log": (0.0, None),
    "model_utility": (0.0, 1.0),
    "model_utility_diff": (-1.0, 1.0),
    "forget_prob": (0.0, 1.0),
    "forget_rougeL": (0.0, 1.0),
    "retain_prob": (0.0, 1.0),
}
#: how the report says it (summary.md)
RANGES_TEXT = (
    "cut to the metric's range: Forget Quality, KS statistic, Model Utility, probabilities and ROUGE-L "
    "to [0, 1], the W1 distance to >= 0, a difference of two [0, 1] numbers to [-1, 1]"
)


def forget_truth_ratios(samples: dict[str, list[dict]]) -> list[float]:
    """The forget truth ratios of an evaluation's samples, in doc order."""
    from .report import checked_number

    rows = samples.get(TRUTH_RATIO_TASK, [])
    if not rows:
        raise CorruptEvaluation(f"no {TRUTH_RATIO_TASK} samples (the forget truth ratios)")
    for i, row in enumerate(rows):
        if isinstance(row.get("doc_id"), bool) or not isinstance(row.get("doc_id"), int):
            raise CorruptEvaluation(f"{TRUTH_RATIO_TASK} samples: row {i}: field 'doc_id' must be an integer")
    rows = sorted(rows, key=lambda r: r["doc_id"])
    where = f"{TRUTH_RATIO_TASK} samples: doc"
    return [
        checked_number(r.get("truth_ratio"), f"{where} {r['doc_id']}: field 'truth_ratio'", (0.0, None), required=True)
        for r in rows
    ]


def reference_ratios(eval_retain: str | Path) -> list[float]:
    """The retain model's forget truth ratios (its evaluation's ``reference.json``)."""
    from unlearn_plugins.evaluation.reference import read_reference

    try:
        return list(read_reference(Path(eval_retain) / "reference.json").truth_ratios)
    except DataError as exc:
        raise CorruptEvaluation(str(exc)) from None


def mu_rows(samples: dict[str, list[dict]]) -> dict[str, list[dict]]:
    from ..metrics import MU_PARTS

    tasks = {task for parts in MU_PARTS.values() for task, _ in parts}
    return {task: rows for task, rows in samples.items() if task in tasks}


def author_numbers(folder: str | Path, reference: list[float], target: dict[str, list[dict]] | None) -> dict:
    """One evaluation's numbers: the report's, the truth-ratio distances to the retain model,
    and (given the target's Model Utility samples on the same QA) the paired difference."""
    numbers = evaluation_metrics(Path(folder))
    _, samples = read_evaluation(Path(folder))
    distances = truth_ratio_distances(forget_truth_ratios(samples), reference)
    numbers.update(ks_statistic=distances["ks_statistic"], wasserstein_log=distances["wasserstein_log"])
    if target is not None:
        paired = mu_paired_bootstrap(mu_rows(samples), target)
        numbers["model_utility_paired"] = paired
        numbers["model_utility_diff"] = paired["difference"]
    return numbers


def collect(plan: Plan, results: dict[str, dict]) -> dict[str, Any]:
    """Everything study.json holds but the study's settings: cells, per-author values, the
    analysis, the noise ceiling and the operating points."""
    study = plan.study
    design: Design = study.design
    cells: dict[str, dict] = {}
    for cell_id, cp in plan.cells.items():
        result = results.get(cell_id, {"status": "not run"})
        cells[cell_id] = {
            "kind": cp.cell.kind,
            "author": cp.cell.author,
            "method": cp.cell.method,
            "seed": cp.cell.seed,
            "status": result["status"],
            "source": result.get("source"),
            "error": result.get("error"),
            "log": result.get("log"),
            "stages": [s.folder for s in cp.stages],
        }

    def done(cell_id: str) -> bool:
        return cells.get(cell_id, {}).get("status") == "done"

    def read(cell_id: str, compute):
        try:
            return compute()
        except (OSError, ValueError, KeyError, TypeError, UnlearnError) as exc:
            cells[cell_id].update(status="failed", error=f"its evaluation is unreadable: {exc}")
            return None

    references: dict[str, dict] = {}  # author -> {"retain": numbers, "full": numbers}
    ratios: dict[int, list[float]] = {}
    targets: dict[int, dict] = {}
    for a in design.authors:
        retain_id, full_id = f"eval-retain/author{a}", f"eval-full/author{a}"
        entry: dict[str, Any] = {}
        if done(retain_id):
            folder = plan.cells[retain_id].result
            ratios[a] = ref = read(retain_id, lambda folder=folder: reference_ratios(folder))
            if ref is not None:
                entry["retain"] = read(retain_id, lambda folder=folder, ref=ref: author_numbers(folder, ref, None))
                if entry["retain"] is None:  # a damaged retain evaluation is no one's reference
                    ratios[a] = None
        if done(full_id) and a in ratios and ratios[a] is not None:
            folder = plan.cells[full_id].result
            target = read(full_id, lambda folder=folder: mu_rows(read_evaluation(Path(folder))[1]))
            if target is not None:
                targets[a] = target
                entry["full"] = read(full_id, lambda folder=folder, a=a: author_numbers(folder, ratios[a], None))
        references[str(a)] = entry

    per_author: dict[str, dict[str, dict]] = {m.name: {} for m in study.methods}
    for cell_id, cp in plan.cells.items():
        if cp.cell.kind != "method" or not done(cell_id):
            continue
        a = cp.cell.author
        if ratios.get(a) is None or a not in targets:
            cells[cell_id].update(
                status="failed", error=f"the retain or target evaluation of author {a} is missing or unreadable"
            )
            continue
        numbers = read(cell_id, lambda cp=cp, a=a: author_numbers(cp.result, ratios[a], targets[a]))
        if numbers is not None:
            cells[cell_id]["metrics"] = numbers
            per_author[cp.cell.method][str(a)] = numbers

    methods = [m.name for m in study.methods]
    values = {
        key: {m: {a: per_author[m].get(str(a), {}).get(key) for a in design.test_authors} for m in methods}
        for key in ("forget_quality", "ks_statistic", "wasserstein_log")
    }
    mu_diffs = {
        m: {a: per_author[m].get(str(a), {}).get("model_utility_diff") for a in design.test_authors} for m in methods
    }
    labels = {m.name: m.label for m in study.methods}
    complete = all(v is not None for per in values["forget_quality"].values() for v in per.values())
    analysis = design_report.analyse(design, values, mu_diffs, methods, labels) if _any(values) else None
    summaries = {
        m: {
            key: group_summary(
                [per_author[m][str(a)][key] for a in design.test_authors if str(a) in per_author[m]],
                method=study.ci,
                bounds=RANGES[key],
            )
            for key, _ in PER_AUTHOR
        }
        for m in methods
    }
    if analysis is not None:
        for family in analysis["families"].values():
            for row in family["rows"]:
                row["authors"] = _authors_used(row, design.test_authors)
    lacking = _lacking(design, analysis, methods, values["forget_quality"], labels)
    if lacking is not None and design.verdict is not None:
        analysis = analysis or {"families": {}, "utility": {}}
        analysis["verdict"] = {
            "holds": None,
            "reason": lacking,
            "failures": [],
            "sentences": [f"No verdict: {lacking}."],
        }
    return {
        "cells": cells,
        "references": references,
        "per_author": per_author,
        "summaries": summaries,
        "analysis": analysis,
        "complete": complete,
        "lacking": lacking,
        "noise_ceiling": _ceiling(plan, design, ratios, done, read),
        "operating_points": _operating_points(plan, study, done),
    }


def _comparison_count(design: Design, methods: list[str]) -> int:
    """How many comparisons the study declares (the post hoc leader's: one per other method)."""
    return sum(len(c.pairs) if c.method != LEADER else len(methods) - 1 for c in design.comparisons)


def _lacking(design: Design, analysis, methods: list[str], fq: dict, labels: dict) -> str | None:
    """Why no verdict can be stated ("N of M comparisons lack data: ..."), or None when every
    declared comparison has every test author on both sides: a verdict needs complete data."""
    total = _comparison_count(design, methods)
    authors = list(design.test_authors)
    rows = [row for family in (analysis or {}).get("families", {}).values() for row in family["rows"]]
    short = sum(1 for row in rows if len(row.get("units") or ()) < len(authors)) + (total - len(rows))
    groups: dict[tuple, list[str]] = {}  # the authors without a value -> the methods that lack them
    for m in methods:
        gone = tuple(a for a in authors if fq.get(m, {}).get(a) is None)
        if gone:
            groups.setdefault(gone, []).append(m)
    if not short and not groups:
        return None
    parts = []
    for gone, lack in groups.items():
        who = "no method" if len(lack) == len(methods) else ", ".join(labels.get(m, m) for m in lack)
        has = "has" if len(lack) == 1 or len(lack) == len(methods) else "have"
        on = f"any of the {len(authors)} test authors" if len(gone) == len(authors) else f"author(s) {_ids(gone)}"
        parts.append(f"{who} {has} {'a value' if who == 'no method' else 'no value'} on {on}")
    head = f"{short} of {total} comparisons lack data" if total else "test cells lack data"
    return head + (f" ({'; '.join(parts)})" if parts else "")


def _ids(authors) -> str:
    return ", ".join(map(str, authors))


def _authors_used(row: dict, authors) -> str:
    """Which test authors a comparison used: "all 10", "9 (not 193)" or "none"."""
    used = [a for a in authors if a in (row.get("units") or ())]
    if len(used) == len(authors):
        return f"all {len(authors)}"
    if not used:
        return "none"
    return f"{len(used)} (not {_ids(a for a in authors if a not in used)})"


def _any(values: dict) -> bool:
    return any(v is not None for per_metric in values.values() for per in per_metric.values() for v in per.values())


def _ceiling(plan: Plan, design: Design, ratios: dict, done, read) -> dict[str, Any]:
    """The noise ceiling of each author with its retain seeds' evaluations (``read``: a cell that
    cannot be read is failed, and left out)."""
    out: dict[str, Any] = {}
    for a in (design.noise_ceiling or {}).get("authors", ()):
        if ratios.get(a) is None:
            continue
        seeds = {}
        for s in design.noise_ceiling["seeds"]:
            cell_id = f"ceiling/author{a}/seed{s}"
            if not done(cell_id):
                continue
            folder = Path(plan.cells[cell_id].result)
            found = read(cell_id, lambda folder=folder: forget_truth_ratios(read_evaluation(folder)[1]))
            if found is not None and read(cell_id, lambda found=found, a=a: noise_ceiling(ratios[a], {"x": found})):
                seeds[f"seed{s}"] = found
        if seeds:
            out[str(a)] = noise_ceiling(ratios[a], seeds)
    return out


def _operating_points(plan: Plan, study, done) -> dict[str, Any]:
    from .operating_cell import sweep_points

    out: dict[str, Any] = {}
    for m in study.methods:
        cell_id = f"operating-point/{m.name}"
        if cell_id not in plan.cells:
            continue
        stage = plan.cells[cell_id].stages[-1]
        result = read_result(stage.folder) if done(cell_id) else None
        runs = [r for r in stage.params["runs"] if (Path(r["folder"]) / "trace").is_dir()]
        traced = sweep_points(runs) if runs else []
        if result is None:  # not chosen yet: the traces of the sweep runs that have finished
            points = traced
        else:
            points = _with_traced_measures(result["points"], traced)
        out[m.name] = {
            "use": _setting(result["use"]) if result and result.get("use") else None,
            "qualified": result.get("qualified") if result else None,
            "reason": result.get("reason") if result else "not chosen yet",
            "evaluations": result.get("evaluations", []) if result else [],
            "points": [{k: v for k, v in p.items() if k != "adapter"} for p in points],
        }
    return out


def _with_traced_measures(points: list[dict], traced: list[dict]) -> list[dict]:
    """A chosen cell's points with the trace measures it did not keep filled in from the sweep
    traces (cells chosen before ``heldout_prob`` counted as a measure dropped it), matched by
    setting and epoch; the cell's own values win."""
    from .operating_point import MEASURES, point_key

    by_key = {point_key(t): t for t in traced}
    return [{**{k: v for k, v in by_key.get(point_key(p), {}).items() if k in MEASURES}, **p} for p in points]


def _setting(use: dict) -> dict:
    return {k: v for k, v in use.items() if k not in ("adapter",)}


# ----------------------------------------------------------------------------- writing


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 10**-digits or not math.isfinite(value)):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def _p(value: float | None) -> str:
    return "-" if value is None else (f"{value:.4f}" if value >= 1e-4 else f"{value:.1e}")


def sections(report: dict, traces: dict[str, FileWriter] | None = None) -> list[Section]:
    """summary.md's sections: the design, the verdict (with verdict.md, the block a README
    quotes), the comparisons, the per-method and per-author tables, the noise ceiling, the
    operating points (with ``traces``, their plots) and the cells not finished."""
    study, design = report["study"], report["design"]
    labels = {m["name"]: m["label"] for m in report["methods"]}
    lines = [f"# Study: {study['name']}", "", study.get("description") or "", ""]
    lines += [
        f"Unit of replication: the forget author ({len(design['test_authors'])} test authors: "
        f"{', '.join(map(str, design['test_authors']))}; author {design['reserved_author']} reserved for the "
        f"operating points). Intervals: 95% Student-t over the authors of the paired differences, {RANGES_TEXT}.",
        "",
    ]
    if not report["complete"] or report.get("lacking"):
        lines += [
            "**Incomplete:** "
            + (report.get("lacking") or "some test cells have not finished")
            + "; the tests below use the authors each pair has (column authors).",
            "",
        ]
    out = [Section(lines)]
    analysis = report.get("analysis")
    if analysis and "verdict" in analysis:
        verdict = analysis["verdict"]
        if verdict.get("holds") is None:
            title = "## No verdict (a verdict needs every declared comparison on every test author)"
        elif report["complete"]:
            title = "## Verdict"
        else:
            title = "## Interim verdict (not final: some test cells have not finished)"
        block = verdict_block(report)
        files = {"verdict.md": text_file(block + "\n")} if block is not None else {}
        out.append(Section([title, ""] + [f"- {s}" for s in verdict["sentences"]] + [""], files))
    if analysis:
        lines = []
        for family, result in analysis["families"].items():
            title = f"## Comparisons: {family} ({result['metric']}" + (
                ", lower is better" if result["lower_is_better"] else ""
            )
            lines += [title + (", post hoc" if result["post_hoc"] else "") + ")", ""]
            rows = []
            for row in result["rows"]:
                iv = row.get("interval") or {}
                rows.append(
                    [
                        labels.get(row["method"], row["method"]),
                        labels.get(row["rival"], row["rival"]),
                        row.get("authors", "-"),
                        _fmt(row["difference"]),
                        iv.get("text") or "-",
                        f"{row.get('wins', '-')}/{row.get('ties', '-')}/{row.get('losses', '-')}",
                        _p(row["permutation_p"]),
                        _p(row["holm_p"]),
                        _p(row["wilcoxon_p"]),
                    ]
                )
            header = ["method", "rival", "authors", "mean difference", "95% interval", "wins/ties/losses"]
            header += ["permutation p", "Holm p", "Wilcoxon p"]
            lines += [tables.markdown_table(header, rows, align="lllrllrrr"), ""]
        out.append(Section(lines))
    lines = ["## Per method, over the test authors (mean and 95% t interval, or no spread)", ""]
    rows = [
        [m["label"], *(report["summaries"][m["name"]][key].get("text", "n/a") for key, _ in PER_AUTHOR)]
        for m in report["methods"]
    ]
    lines += [tables.markdown_table(["method", *(title for _, title in PER_AUTHOR)], rows)]
    lines += ["", "## Forget Quality per test author", ""]
    authors = [str(a) for a in design["test_authors"]]
    rows = []
    for m in report["methods"]:
        row = report["per_author"][m["name"]]
        rows.append([m["label"], *(_fmt(row.get(a, {}).get("forget_quality")) for a in authors)])
    for name in ("full", "retain"):
        row = {a: report["references"].get(a, {}).get(name) or {} for a in authors}
        rows.append([f"{name} (reference)", *(_fmt(row[a].get("forget_quality")) for a in authors)])
    lines += [tables.markdown_table(["method", *authors], rows, align="l" + "r" * len(authors)), ""]
    out.append(Section(lines))
    if report["noise_ceiling"]:
        rows = [
            [a, seed, _fmt(d["forget_quality"]), _fmt(d["ks_statistic"]), _fmt(d["wasserstein_log"])]
            for a, c in report["noise_ceiling"].items()
            for seed, d in c["seeds"].items()
        ]
        header = ["author", "seed", "Forget Quality", "KS statistic", "W1 log truth ratio"]
        table = tables.markdown_table(header, rows, align="llrrr")
        out.append(Section(["## Noise ceiling (other retain seeds against seed 0)", "", table, ""]))
    if report["operating_points"]:
        rows = []
        for name, op in report["operating_points"].items():
            use = op["use"] or {}
            setting = ", ".join(
                f"{k} {v:g}" for k, v in use.items() if k not in ("epoch", "index") and not _is_measure(k)
            )
            rows.append([labels.get(name, name), setting or "-", use.get("epoch", "-"), op["qualified"], op["reason"]])
        header = ["method", "setting", "epochs", "qualified", "reason"]
        lines = ["## Operating points (reserved author)", "", tables.markdown_table(header, rows, align="llrll")]
        lines += [
            "",
            "Traces: `trace-<method>.png` (Forget Quality and held-out probability against epochs; "
            "Model Utility where it was evaluated).",
            "",
        ]
        out.append(Section(lines, traces or {}))
    failed = [cid for cid, c in report["cells"].items() if c["status"] not in ("done",)]
    if failed:
        out.append(
            Section(
                ["## Cells not finished", ""]
                + [
                    f"- {cid}: {report['cells'][cid]['status']}"
                    + (f" ({report['cells'][cid]['error']})" if report["cells"][cid].get("error") else "")
                    for cid in failed
                ]
                + [""]
            )
        )
    return out


def markdown(report: dict) -> str:
    """summary.md's text (its :func:`sections`)."""
    return Report(report, sections(report)).summary()


def _is_measure(key: str) -> bool:
    from .operating_point import MEASURES

    return key in MEASURES


#: the comments that enclose a verdict block in a README (its study's name in the first)
VERDICT_START = "<!-- verdict of {name}: generated from its study.json (unlearn study {name} --report-only) -->"
VERDICT_END = "<!-- end of the verdict of {name} -->"


def verdict_block(report: dict) -> str | None:
    """The verdict as a README carries it (``verdict.md`` of the report), from study.json: the
    verdict's sentences, then each comparison of every declared family with its Holm p; None
    when the study declares no verdict or has no analysis yet."""
    analysis = report.get("analysis") or {}
    verdict = analysis.get("verdict")
    if verdict is None:
        return None
    name = report["study"]["name"]
    labels = {m["name"]: m["label"] for m in report["methods"]}
    n = len(report["design"]["test_authors"])
    done = sum(1 for c in report["cells"].values() if c["kind"] == "method" and c["status"] == "done")
    total = sum(1 for c in report["cells"].values() if c["kind"] == "method")
    # an unfinished run's verdict is stated as interim, so a README quoting it cannot pass it off as final
    interim = (
        ""
        if done == total or verdict.get("holds", False) is None
        else f"Interim, not final ({done} of {total} test cells finished): "
    )
    lines = [VERDICT_START.format(name=name), "", f"**{interim}{verdict['sentences'][0]}**", ""]
    lines += [f"- {s}" for s in verdict["sentences"][1:]]
    for family, result in analysis["families"].items():
        if family == report["study"]["design"]["verdict"]["family"]:
            continue
        kind = "post hoc, " if result["post_hoc"] else ""
        direction = ", lower is better" if result.get("lower_is_better") else ""
        for row in result["rows"]:
            shown = (
                "untested"
                if row["holm_p"] is None
                else f"difference {row['difference']:+.3f}, Holm p {row['holm_p']:.4f}"
            )
            lines.append(
                f"- {family} ({kind}{result['metric']}{direction}): {labels.get(row['method'], row['method'])} vs "
                f"{labels.get(row['rival'], row['rival'])}: {shown}"
            )
    lines += ["", f"({n} test authors; {done} of {total} test cells finished.)", "", VERDICT_END.format(name=name)]
    return "\n".join(lines)


def readme_verdict(readme: str, name: str) -> str | None:
    """The verdict block of study ``name`` in a README's text (markers included), or None."""
    start, end = VERDICT_START.format(name=name), VERDICT_END.format(name=name)
    if start not in readme:
        return None
    i = readme.index(start)
    j = readme.find(end, i)
    if j < 0:
        raise ValueError(f"the README's verdict of {name} has no end marker ({end})")
    return readme[i : j + len(end)]


def plot_trace(name: str, label: str, op: dict, path: Path) -> None:
    """Forget Quality (log) and the held-out probability against epochs, one line per swept
    setting; the Model Utility differences evaluated for the rule as labelled points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    runs: dict[str, list[dict]] = {}
    for p in op["points"]:
        key = ", ".join(
            f"{k} {v:g}" for k, v in p.items() if k not in ("epoch", "index", "adapter") and not _is_measure(k)
        )
        runs.setdefault(key, []).append(p)
    for key, points in runs.items():
        points = sorted(points, key=lambda p: p["epoch"])
        epochs = [p["epoch"] for p in points]
        if all("forget_quality" in p for p in points):
            ax1.plot(epochs, [max(p["forget_quality"], 1e-12) for p in points], marker=".", label=key)
        if all("heldout_prob" in p for p in points):
            ax2.plot(epochs, [p["heldout_prob"] for p in points], marker=".", label=key)
    for i, e in enumerate(op["evaluations"]):
        point = op["points"][e["point"]]
        diff = e["model_utility_paired"]["difference"]
        ax1.annotate(  # staggered: evaluated points often share a Forget Quality
            f"MU {diff:+.3f}",
            (point["epoch"], max(point.get("forget_quality", 1e-12), 1e-12)),
            xytext=(4, -10 - 9 * i),
            textcoords="offset points",
            fontsize=7,
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"},
        )
    use = op.get("use")
    if use and "forget_quality" in use:
        ax1.scatter(
            [use["epoch"]],
            [max(use["forget_quality"], 1e-12)],
            s=120,
            facecolors="none",
            edgecolors="red",
            label="operating point",
        )
    ax1.set_yscale("log")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("Forget Quality (KS p vs the retain model)")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("held-out probability")
    ax1.legend(fontsize=7)
    fig.suptitle(f"{label}: sweep on the reserved author")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def write_report(out: Path, plan: Plan, results: dict[str, dict], run: dict) -> tuple[dict[str, str], str, dict]:
    """study.json, summary.md and trace-<method>.png in ``out``; returns the files, the
    terminal table (the summary's verdict and per-method lines) and study.json's content."""
    study = plan.study
    design: Design = study.design
    data = collect(plan, results)
    report = {
        "format": REPORT_FORMAT,
        "study": {k: v for k, v in study.settings().items() if k != "methods"},
        "study_digest": study.digest(),
        "methods": [{"name": m.name, "label": m.label, "config": m.config} for m in study.methods],
        "design": {
            "unit": design.unit,
            "test_authors": list(design.test_authors),
            "reserved_author": design.reserved_author,
            "lower_is_better": sorted(LOWER_IS_BETTER),
        },
        "ci": {"method": study.ci, "level": 0.95},
        "benchmarks": {str(k): {key: v for key, v in b.items() if key != "content"} for k, b in plan.benches.items()},
        "models": plan.models,
        "cache": str(plan.cache),
        "run": run,
        **data,
        "failed": [cid for cid, c in data["cells"].items() if c["status"] == "failed"],
        "not_run": [cid for cid, c in data["cells"].items() if c["status"] not in ("done", "failed")],
    }
    labels = {m.name: m.label for m in study.methods}
    traces = {
        f"trace-{name}.png": lambda path, name=name: plot_trace(
            name, labels[name], data["operating_points"][name], path
        )
        for name, op in data["operating_points"].items()
        if op["points"]
    }
    files = report_writer.write(out, Report(report, sections(report, traces)))
    return files, terminal_table(report), report


def terminal_table(report: dict) -> str:
    rows = []
    for m in report["methods"]:
        s = report["summaries"][m["name"]]
        rows.append((m["label"], s["forget_quality"].get("text", "n/a"), s["model_utility_diff"].get("text", "n/a")))
    text = tables.text_table(("method", "Forget Quality", "MU - target (paired)"), rows)
    verdict = (report.get("analysis") or {}).get("verdict")
    return text + ("\n" + verdict["sentences"][0] if verdict else "")


__all__ = [
    "write_report",
    "collect",
    "markdown",
    "author_numbers",
    "forget_truth_ratios",
    "verdict_block",
    "readme_verdict",
]
