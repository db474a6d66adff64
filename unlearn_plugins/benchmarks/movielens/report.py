"""The MovieLens demo's report, in the TOFU demo's format: a table for the terminal and, in
the report folder, results.json, summary.md, three PNG plots (AUC per model, JSD to the
retrain model against unlearning time, the forget users' CUD scores), the CUD scores and the
CUD-easy / CUD-hard users' prompts. Reads only the stage folders of its study's cells
(unlearn_plugins/benchmarks/movielens/demo.toml, planned by :mod:`unlearn_plugins.benchmarks.movielens.study.cells`);
the report writer of every study (:mod:`unlearn_plugins.study.report_writer`) writes its files
together."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, Sequence

from unlearn_plugins.plots import finish_png, plot_log_scatter, pyplot
from unlearn_plugins.study import report_writer
from unlearn_plugins.study.report_writer import (
    Section,
    anchor_runs,
    cud_meta,
    format_value,
    jsonl_rows,
    stage_seconds,
    stage_timings,
    wall_time_line,
)

COLUMNS = (
    "model",
    "test AUC",
    "forget AUC",
    "JSD to retrain",
    "time (s)",
    "forget AUC CUD-easy",
    "forget AUC CUD-hard",
)
KEYS = ("test_auc", "forget_auc", "jsd_to_retrain", "seconds", "forget_auc_cud_easy", "forget_auc_cud_hard")


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def subset_auc(rows: Sequence[dict], users: Sequence[int]) -> float | None:
    """Forget AUC over the prompts of ``users``, from a forget task's per-sample rows (each
    holds its document's user and the (label, P(Yes)) pair the task's AUC aggregates); None
    when those prompts hold one class only."""
    from .tasks import metrics as rm

    chosen = set(users)
    items = [row["auc"] for row in rows if row["doc"]["user_id"] in chosen]
    if not items:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # one class: reported as n/a
        return _finite(rm.auc(items))


def model_row(
    name: str,
    label: str,
    eval_dir: Path,
    *,
    easy: Sequence[int],
    hard: Sequence[int],
    reference: str,
    seconds: float | None,
) -> dict[str, Any]:
    """One model's numbers from its evaluation folder."""
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    from .tasks import metrics as rm

    written = read_outputs(eval_dir)
    metrics = written.summary["metrics"]
    test, forget = metrics.get("movielens_rec", {}), metrics.get("movielens_rec_forget", {})
    rows = sorted(jsonl_rows(written.samples["movielens_rec_forget"]), key=lambda r: r["doc_id"])
    jsd = _finite(forget.get("jsd"))
    if jsd is None and (eval_dir / "reference.json").is_file():  # the retrain model is its own reference
        ref = rm.read_prediction_reference(reference)
        keys = [r["jsd"][0] for r in rows]
        jsd = rm.mean_jsd([float(r["jsd"][1]) for r in rows], ref.aligned(keys, task="movielens_rec_forget"))
    return {
        "name": name,
        "label": label,
        "test_auc": _finite(test.get("auc")),
        "test_logloss": _finite(test.get("logloss")),
        "test_acc": _finite(test.get("acc")),
        "forget_auc": _finite(forget.get("auc")),
        "forget_logloss": _finite(forget.get("logloss")),
        "forget_acc": _finite(forget.get("acc")),
        "jsd_to_retrain": jsd,
        "seconds": seconds,
        "forget_auc_cud_easy": subset_auc(rows, easy),
        "forget_auc_cud_hard": subset_auc(rows, hard),
        "forget_p_yes": [float(r["auc"][1]) for r in rows],
        "eval_seconds": written.summary.get("elapsed_s"),
    }


def _cells(r: dict) -> list[str]:
    cells = [r["label"]]
    for k in KEYS:
        value = r[k]
        cells.append(f"{value:.0f}" if k == "seconds" and value is not None else format_value(value))
    return cells


def render_table(rows: Sequence[dict], *, markdown: bool = False) -> str:
    return report_writer.render_table(rows, markdown=markdown, columns=COLUMNS, cells=_cells)


# ----------------------------------------------------------------------------- plots


def plot_auc(rows: Sequence[dict], path: Path) -> None:
    """Grouped bars per model: test AUC, forget AUC, and the forget AUC of CUD-easy / -hard users."""
    import numpy as np

    plt = pyplot()
    series = (
        ("test_auc", "test AUC (retained users)", "tab:blue"),
        ("forget_auc", "forget AUC", "tab:orange"),
        ("forget_auc_cud_easy", "forget AUC, CUD-easy users", "tab:green"),
        ("forget_auc_cud_hard", "forget AUC, CUD-hard users", "tab:red"),
    )
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(8.0, 4.6))
    for i, (key, label, color) in enumerate(series):
        values = [r[key] if r[key] is not None else float("nan") for r in rows]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label, color=color)
    ax.axhline(0.5, color="gray", lw=0.8, ls="--")
    ax.set_xticks(x, [r["label"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.25)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("AUC (0.5 = chance)")
    ax.set_title("MovieLens: recommendation AUC before and after unlearning")
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    finish_png(fig, path)


def plot_jsd_time(rows: Sequence[dict], path: Path) -> None:
    """JSD to the retrain model's forget predictions (lower: closer to exact unlearning)
    against the seconds each method took (the retrain model: its whole fine-tune)."""
    labels = (
        "unlearning time, s (retrain: its fine-tune), log scale",
        "JSD to the retrain model on the forget prompts",
        "Closeness to retraining vs cost",
    )
    plot_log_scatter(
        rows, path, x="seconds", y="jsd_to_retrain", floor=1e-2, markers={"retrain": "*"}, labels=labels, height=4.4
    )


def plot_cud_users(users: Sequence[dict], easy: Sequence[int], hard: Sequence[int], path: Path) -> None:
    """Each forget user's mean CUD score over their prompts, CUD-easy / CUD-hard coloured."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = ["tab:green" if g["group"] in easy else "tab:red" if g["group"] in hard else "tab:gray" for g in users]
    ax.bar(range(len(users)), [g["score"] for g in users], color=colors)
    ax.set_xticks(range(len(users)), [f"user {g['group']}\n({g['scored']} prompts)" for g in users], fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("mean CUD score (0 = like the easy anchors)")
    ax.set_title("CUD difficulty of the forget users (green: easy, red: hard)")
    finish_png(fig, path)


# ----------------------------------------------------------------------------- the report


def study_budget(study) -> dict:
    """A MovieLens study's budget as results.json and summary.md describe it (the demo's budget:
    the recipe's and the unlearning's overrides, max_length where it is not the recipe's 384;
    the training dtype is reported on its own)."""
    from .recipes import RECIPE

    rec, cud, sharded = study.movielens, study.cud, study.sharded
    length = {"max_length": study.max_length} if study.max_length != RECIPE["max_length"] else {}

    def plain(options: dict) -> dict:
        return {k: v for k, v in options.items() if k != "dtype"}

    e2urec = next(
        (m.settings.get("objective_options", {}) for m in study.methods if m.config["objective"] == "e2urec"), {}
    )
    return {
        "users": rec.users,
        "train_per_user": rec.train_per_user,
        "eval_per_user": rec.eval_per_user,
        "history": rec.history,
        "forget_fraction": rec.forget_fraction,
        "anchor_users": rec.anchor_users,
        "finetune": {**plain(study.target.finetune), **length},
        "unlearn": {**plain(study.budget), **length},
        "e2urec": dict(e2urec),
        "anchor_unlearn": plain(cud.unlearn) if cud else {},
        "cud": dict(cud.scorer) if cud else {},
        "shards": sharded.shards if sharded else 0,
        "aggregator": sharded.aggregator if sharded else None,
        "aggregator_prompts": sharded.aggregator_prompts if sharded else 0,
        "aggregator_options": dict(sharded.aggregator_options) if sharded else {},
        "eval_batch_size": study.evaluation.batch_size,
    }


def study_report(
    out: Path, plan, results: dict, *, config: dict, budget: dict, train_dtype: str, wall_s: float
) -> tuple[dict, str, dict]:
    """The report of a MovieLens study, run (:func:`unlearn_plugins.study.runner.run_plan`): its
    target and retrain models, each method's run (the study's first seed), the sharded
    recommender, every evaluation and the CUD users."""
    from types import SimpleNamespace

    from .study import sharded as sharded_stages
    from .study.evaluate import REFERENCE

    study, cells = plan.study, plan.cells
    seed = study.seeds[0]
    bench = plan.benches[0]
    models, seconds, evals = {}, {}, {}
    for name in ("target", "retrain"):
        stage = cells[name].stages[0]
        models[name] = {"key": stage.params["key"], "model": plan.models[name]}
        seconds[name] = stage_seconds(stage.folder)
    evals["retrain"] = Path(cells["eval-retrain"].result)
    evals["target"] = Path(cells["eval-target"].result)
    methods, runs = [], {}
    for m in study.methods:
        cp = cells[f"{m.name}/seed{seed}"]
        run = Path(cp.stages[0].folder)
        # as the demo's results.json has them: the objective, and no retain set where there is none
        settings = {
            "objective": m.config["objective"],
            **({"retain": None} if m.settings.get("retain") is False else {}),
        }
        methods.append(SimpleNamespace(name=m.name, label=m.label, settings=settings))
        runs[m.name] = {"key": run.name.rsplit("-", 1)[1], "adapter": str(run / "run")}
        seconds[m.name] = stage_seconds(run)
        evals[m.name] = Path(cp.result)
    sharded = sharded_dirs = None
    if study.sharded is not None:
        name = study.sharded.name
        trained = Path(cells[f"{name}/shards"].result)
        unlearned = Path(cells[name].stages[0].folder)
        sharded = {"trained": {"seconds": stage_seconds(trained)}, "unlearned": sharded_stages.unlearning(unlearned)}
        sharded_dirs = {"trained": str(trained / "sharded"), "unlearned": str(unlearned / "sharded")}
        seconds[name] = sharded["unlearned"]["seconds"]
        evals[name] = Path(cells[name].result)
    return write_report(
        out,
        config=config,
        budget=budget,
        dtype=train_dtype,
        bench_dir=Path(bench["folder"]),
        info=bench["info"],
        methods=methods,
        evals=evals,
        reference=str(evals["retrain"] / REFERENCE),
        cud_dir=Path(cells["cud"].result),
        seconds=seconds,
        sharded=sharded,
        sharded_method=(study.sharded.name, study.sharded.method) if study.sharded else None,
        models=models,
        runs=runs,
        sharded_dirs=sharded_dirs,
        timings=stage_timings(cells, results),
        wall_s=wall_s,
    )


def write_report(
    out: Path,
    *,
    config: dict,
    budget: dict,
    dtype,
    bench_dir: Path,
    info: dict,
    methods,
    evals: dict,
    reference: str,
    cud_dir: Path,
    seconds: dict,
    sharded: dict | None,
    sharded_method: tuple[str, str] | None,
    models: dict,
    runs: dict,
    sharded_dirs: dict | None,
    timings: dict,
    wall_s: float,
) -> tuple[dict, str, dict]:
    users = json.loads((cud_dir / "users.json").read_text())
    easy, hard = users["easy"], users["hard"]
    labels = [("target", "original (before unlearning)"), ("retrain", "retrain (never saw the forget users)")]
    labels += [(m.name, m.label) for m in methods]
    if sharded is not None:  # RecEraser, or SISA (the average aggregator)
        unlearned = sharded["unlearned"]["report"]
        name, method = sharded_method
        labels.append((name, f"{method} ({unlearned['shards_total']} shards, {budget['aggregator']})"))
    rows = [
        model_row(
            name,
            label,
            evals[name],
            easy=easy,
            hard=hard,
            reference=reference,
            seconds=None if name == "target" else seconds.get(name),
        )
        for name, label in labels
    ]
    table = render_table(rows)
    meta = cud_meta(cud_dir)
    scores = jsonl_rows(cud_dir / "scores.jsonl")
    results = {
        "config": config,
        "budget": budget,
        "train_dtype": dtype or "library default",
        "benchmark": {k: info[k] for k in ("settings", "source", "users", "forget_users", "anchor_users", "counts")},
        "benchmark_dir": str(bench_dir),
        "models": rows,
        "targets": models,
        "unlearning_runs": {m.name: {"label": m.label, "settings": m.settings, **runs[m.name]} for m in methods},
        "receraser": (
            {"trained": sharded["trained"], "unlearning": unlearned, "folders": sharded_dirs} if sharded else None
        ),
        "retrain_reference": reference,
        "cud": {
            "users": users["scores"],
            "easy_users": easy,
            "hard_users": hard,
            "scores": [{k: r.get(k) for k in ("index", "score", "s_E", "s_H", "circuit_depth")} for r in scores],
            "anchor_pool": meta.get("anchor_pool"),
            "anchor_votes": meta.get("anchors"),
            "anchor_runs": anchor_runs(meta),
        },
        "stages": timings,
        "wall_time_s": round(wall_s, 1),
    }
    figures = Section(
        [
            "![AUC per model](auc.png)",
            "![JSD to retrain vs time](jsd_vs_time.png)",
            "![CUD scores of the forget users](cud_users.png)",
            "",
        ],
        {
            "auc.png": lambda path: plot_auc(rows, path),
            "jsd_vs_time.png": lambda path: plot_jsd_time(rows, path),
            "cud_users.png": lambda path: plot_cud_users(users["scores"], easy, hard, path),
        },
    )
    sections = [Section(_head_lines(results, rows)), figures, Section([wall_time_line(results), ""])]
    return report_writer.write_demo(out, results, table, sections=sections, cud_dir=cud_dir, scores=scores)


def _head_lines(results: dict, rows: Sequence[dict]) -> list[str]:
    """summary.md up to its plots: the data, the budget, CUD's users and the table."""
    b, bench, cfg = results["budget"], results["benchmark"], results["config"]
    counts, source = bench["counts"], bench["source"]
    retrain_s = next((r["seconds"] for r in rows if r["name"] == "retrain"), None)
    runs = results["cud"]["anchor_runs"]
    objectives = sorted({r["objective"] for r in runs})
    names = [run["label"].split(" (")[0] for run in results["unlearning_runs"].values()]
    methods = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
    sharded_text = ""
    if results["receraser"] is not None:
        sharded = results["receraser"]["unlearning"]
        sharded_text = (
            f" {rows[-1]['label'].split(' (')[0]} retrained {len(sharded['shards_retrained'])} of its "
            f"{sharded['shards_total']} shards (shards {sharded['shards_retrained']}"
            + (f", removed {sharded['shards_removed']}" if sharded["shards_removed"] else "")
            + f") and refitted its aggregator in {sharded['seconds']:.0f} s"
            + (f" (the retrain model's fine-tune: {retrain_s:.0f} s)" if retrain_s is not None else "")
            + "."
        )
    lines = [
        "# unlearn-plugins demo: recommendation unlearning (MovieLens)",
        "",
        f"Model `{cfg['model']}`; data: MovieLens ({source.get('layout')}, {source.get('folder')}), "
        f"{len(bench['users'])} users sampled, each with their {b['train_per_user']} latest training prompts "
        f"({b['history']} rated movies shown) and {b['eval_per_user']} latest test prompts. Forget request: all "
        f"{counts['train_forget']} training prompts of {len(bench['forget_users'])} users {bench['forget_users']}; "
        f"the target model trained on {counts['train']} prompts, the retrain model on {counts['train_retain']}.",
        "",
        f"Test AUC: the {counts['test_retain']} test prompts of the retained users; forget AUC and JSD: the forget "
        f"users' {counts['train_forget']} training prompts (JSD: the mean Jensen-Shannon divergence of P(Yes) to "
        f"the retrain model's). {methods} unlearned with the same budget: LoRA r "
        f"{b['unlearn'].get('lora_r')}, lr {b['unlearn'].get('lr')}, {b['unlearn'].get('epochs', 0):g} epochs, "
        f"batch {b['unlearn'].get('batch_size')}; training base weights: {results['train_dtype']}." + sharded_text,
        "",
        f"CUD: each forget prompt scored (EAP-IG on the Yes/No token; anchors chosen by "
        f"{' and '.join(objectives) or 'n/a'} x {len(runs) // max(1, len(objectives))} "
        f"seeds on the {b['anchor_users']} anchor users' prompts, never scored; a deviation from the CUD paper's "
        f"vote over five methods, threshold 3), users ranked by their mean score: "
        f"CUD-easy users {results['cud']['easy_users']}, CUD-hard users {results['cud']['hard_users']}; the last "
        f"two columns are the forget AUC over those users' prompts (n/a: one class only).",
        "",
        render_table(rows, markdown=True),
        "",
    ]
    return lines
