"""A small author-unit study and its records made in code, without training anything: every
evaluation, sweep trace and operating point a finished run would have recorded, with numbers
chosen so that the declared verdict holds (ReGLU's forget truth ratios are the retain model's,
IHL's are not; every model's Model Utility samples are the target's). The report reads them as
it reads a real run's records (tests of ``unlearn study --report-only`` that need a whole study's
records in seconds: tests/test_bad_input_round4.py)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from support_checks import author_study_toml

STUDY = author_study_toml(
    "synthetic_authors",
    8,
    [13, 14, 15, 16, 17, 18],
    12,
    rest="""[sweep]
author = 12
lr = [1e-3]
epochs = 2
trace = ["forget_quality", "wasserstein_log"]
model_utility_evaluations_max = 1

[[comparisons]]
family = "leader"
metric = "forget_quality"
method = "leader"
post_hoc = true

[verdict]
method = "reglu"
family = "primary"
utility_margin = 0.02

[evaluation]
mu_size = 4
batch_size = 8
gen_margin = 4
""",
)

DATE = "2026-01-01T00-00-00.000000"
#: forget QA per author, QA per Model Utility part
N_FORGET, N_MU = 20, 4
#: the Model Utility tasks and the metrics each has in its samples
MU_TASKS = {
    "tofu_retain_prob": ("prob",),
    "tofu_retain_rouge": ("rougeL_recall",),
    "tofu_retain_truth_ratio": ("truth_ratio",),
    "tofu_real_authors": ("prob", "truth_ratio"),
    "tofu_real_authors_rouge": ("rougeL_recall",),
    "tofu_world_facts": ("prob", "truth_ratio"),
    "tofu_world_facts_rouge": ("rougeL_recall",),
}


def _json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1))


def _stage(folder: Path, label: str) -> None:
    _json(folder / "stage.json", {"format": 1, "label": label, "seconds": 1.0})
    _json(folder / "resources.json", {"seconds": 1.0, "peak_rss_mb": 100.0, "threads": 1})


def reference_ratios(author: int) -> list[float]:
    rng = random.Random(f"reference-{author}")
    return [round(rng.uniform(0.4, 0.9), 6) for _ in range(N_FORGET)]


def mu_rows() -> dict[str, list[dict]]:
    """The same Model Utility samples for every model (paired differences 0)."""
    rng = random.Random("mu")
    return {
        task: [
            {"doc_id": i, "filter": "none", **{m: round(rng.uniform(0.2, 0.8), 6) for m in metrics}}
            for i in range(N_MU)
        ]
        for task, metrics in MU_TASKS.items()
    }


def write_evaluation(folder: Path, name: str, ratios: list[float], reference: list[float] | None, *, retain=False):
    """An evaluation stage folder as a study records it (lm-eval's layout, our summary)."""
    from unlearn_plugins.benchmarks.tofu.metrics import forget_quality

    _stage(folder, f"evaluate: {name}")
    rows = mu_rows()
    samples = {
        "tofu_forget_truth_ratio": [{"doc_id": i, "filter": "none", "truth_ratio": r} for i, r in enumerate(ratios)],
        "tofu_forget_prob": [{"doc_id": i, "filter": "none", "prob": 0.1} for i in range(N_FORGET)],
        "tofu_forget_rouge": [{"doc_id": i, "filter": "none", "rougeL_recall": 0.2} for i in range(N_FORGET)],
        **rows,
    }
    for task, task_rows in samples.items():
        path = folder / name / f"samples_{task}_{DATE}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in task_rows))
    metrics = {
        "tofu_forget_prob": {"prob": 0.1},
        "tofu_forget_rouge": {"rouge1_recall": 0.2, "rougeL_recall": 0.2},
        "tofu_forget_truth_ratio": {"truth_ratio": sum(ratios) / len(ratios)},
        "tofu_retain_prob": {"prob": sum(r["prob"] for r in rows["tofu_retain_prob"]) / N_MU},
    }
    summary = {"metrics": metrics, "model_utility": {"value": 0.5}}
    if reference is not None:
        summary["forget_quality"] = {"tofu_forget_truth_ratio": {"value": forget_quality(ratios, reference)}}
    _json(folder / name / f"results_{DATE}.json", {"results": {}, "unlearn_summary": summary})
    _json(folder / "extraction_strength.json", {"mean": 0.3, "per_sample": [0.3] * N_FORGET})
    if retain:
        _json(
            folder / "reference.json",
            {
                "format": "unlearn-plugins/tofu-retain-reference",
                "version": 1,
                "task": "tofu_forget_truth_ratio",
                "split": "forget.json",
                "samples": [{"key": f"k{i}", "truth_ratio": r} for i, r in enumerate(ratios)],
            },
        )


def method_ratios(method: str, author: int) -> list[float]:
    """ReGLU: the retain model's ratios (Forget Quality 1); IHL: shifted (far lower)."""
    ref = reference_ratios(author)
    return ref if method == "reglu" else [round(r + 0.35, 6) for r in ref]


def write_records(study_path: Path, records: Path, cache: Path) -> None:
    """Every record of the study's finished run, in ``records`` (``cache``: a scratch cache
    folder the plan is made against; nothing is written there)."""
    from unlearn_plugins.benchmarks.tofu.study.design_plan import plan_design
    from unlearn_plugins.benchmarks.tofu.study.operating_point import Rule, choose
    from unlearn_plugins.study import load_study

    study = load_study(str(study_path))
    plan = plan_design(study, cache=cache, dry_run=True)
    for cell_id, cp in plan.cells.items():
        stage = cp.stages[-1]
        folder = records / Path(stage.folder).name
        kind, a = cp.cell.kind, cp.cell.author
        if kind in ("target", "retain"):
            _json(folder / "resources.json", {"seconds": 1.0, "peak_rss_mb": 100.0, "threads": 1})
        elif kind == "eval_retain":
            write_evaluation(folder, cell_id.replace("/", "-"), reference_ratios(a), None, retain=True)
        elif kind == "eval_full":
            write_evaluation(folder, cell_id.replace("/", "-"), method_ratios("ihl", a), reference_ratios(a))
        elif kind == "sweep":
            _json(folder / "resources.json", {"seconds": 1.0, "peak_rss_mb": 100.0, "threads": 1})
            trace = folder / "trace" / "trace.jsonl"
            trace.parent.mkdir(parents=True)
            weight = stage.params["config"].get("regularizer_options", {}).get("weight", 0.0)
            trace.write_text(
                "".join(
                    json.dumps({"epoch": e, "forget_quality": round(0.2 + 0.1 * e + weight, 6), "wasserstein_log": 0.1})
                    + "\n"
                    for e in (1, 2)
                )
            )
    for cp in plan.cells.values():  # the operating points, chosen by the rule from the traces
        if cp.cell.kind != "operating_point":
            continue
        stage = cp.stages[-1]
        points = []
        for run in stage.params["runs"]:
            trace = records / Path(run["folder"]).name / "trace" / "trace.jsonl"
            for line in trace.read_text().splitlines():
                p = json.loads(line)
                points.append({**run["setting"], "epoch": p["epoch"], "forget_quality": p["forget_quality"],
                               "wasserstein_log": p["wasserstein_log"], "adapter": f"{run['folder']}/trace/epoch{p['epoch']}"})  # fmt: skip
        rule = Rule(**stage.params["rule"])
        best = choose([{k: v for k, v in p.items() if k != "adapter"} for p in points], rule)["pending"][0]["index"]
        points[best]["model_utility_diff"] = 0.0
        result = choose([{k: v for k, v in p.items() if k != "adapter"} for p in points], rule)
        use = result["use"]["index"]
        folder = records / Path(stage.folder).name
        _stage(folder, cp.cell.label)
        paired = {"difference": 0.0, "model": 0.5, "target": 0.5, "low": 0.0, "high": 0.0, "width": 0.0}
        _json(
            folder / "operating_point.json",
            {
                "use": points[use] | {"index": use},
                "qualified": result["qualified"],
                "final": result["final"],
                "capped": not result["final"],
                "reason": result["reason"],
                "rule": result["rule"],
                "evaluations": [{"point": best, "folder": "point", "model_utility_paired": paired}],
                "points": points,
            },
        )
    for cp in plan.cells.values():  # the test cells, keyed at their points once those are in the cache
        if cp.cell.kind == "operating_point":
            shutil.copytree(records / Path(cp.stages[-1].folder).name, cp.stages[-1].folder)
    plan = plan_design(study, cache=cache, dry_run=True)
    for cell_id, cp in plan.cells.items():
        if cp.cell.kind != "method":
            continue
        run, check = cp.stages
        _json(records / Path(run.folder).name / "resources.json", {"seconds": 1.0, "peak_rss_mb": 100.0, "threads": 1})
        ratios = method_ratios(cp.cell.method, cp.cell.author)
        write_evaluation(
            records / Path(check.folder).name, cell_id.replace("/", "-"), ratios, reference_ratios(cp.cell.author)
        )
