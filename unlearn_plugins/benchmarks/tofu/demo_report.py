"""The TOFU demo's report: a table for the terminal and, in the report folder, results.json,
summary.md and three PNG plots (Forget Quality vs Model Utility per method, the CUD score
histogram, easy vs hard circuit depth profiles), plus the CUD scores and the CUD-easy /
CUD-hard splits. The demo is a study (``demo.toml`` beside this module, run by :mod:`.demo`);
:func:`study_report` reads its cells' stage folders (the study's cache) and writes this report
from them. Every file is written by the studies' report writer
(:mod:`unlearn_plugins.study.report_writer`): all together, atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from unlearn_plugins.plots import finish_png, plot_log_scatter, pyplot
from unlearn_plugins.scorers.cud.scorer import PAPER_OBJECTIVES
from unlearn_plugins.study import report_writer
from unlearn_plugins.study.report_writer import (
    Section,
    anchor_runs,
    cud_meta,
    format_value,
    jsonl_rows,
    stage_timings,
    wall_time_line,
)

COLUMNS = (
    "model",
    "Forget Quality",
    "Model Utility",
    "forget prob",
    "forget ROUGE-L",
    "prob CUD-easy",
    "prob CUD-hard",
)


def _per_sample(samples: dict[str, Path], task: str, metric: str) -> dict[int, float]:
    path = samples.get(task)
    return {row["doc_id"]: float(row[metric]) for row in jsonl_rows(path)} if path else {}


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def model_row(name: str, label: str, eval_dir: Path, easy: Sequence[int], hard: Sequence[int]) -> dict[str, Any]:
    """One model's numbers from its evaluation folder."""
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs
    from unlearn_plugins.evaluation.reference import read_reference

    from . import metrics as tm

    written = read_outputs(eval_dir)  # lm-eval's results_<date>.json and samples_<task>_<date>.jsonl
    summary = written.summary
    metrics = summary["metrics"]
    fq = next(iter(summary["forget_quality"].values()), {}).get("value")
    if fq is None and (eval_dir / "reference.json").is_file():  # the retain model is its own reference
        ratios = read_reference(eval_dir / "reference.json").truth_ratios
        fq = tm.forget_quality(ratios, ratios)
    probs = _per_sample(written.samples, "tofu_forget_prob", "prob")
    return {
        "name": name,
        "label": label,
        "forget_quality": fq,
        "model_utility": summary["model_utility"]["value"],
        "model_utility_parts": summary["model_utility"]["parts"],
        "forget_prob": metrics.get("tofu_forget_prob", {}).get("prob"),
        "forget_rougeL_recall": metrics.get("tofu_forget_rouge", {}).get("rougeL_recall"),
        "forget_truth_ratio": metrics.get("tofu_forget_truth_ratio", {}).get("truth_ratio"),
        "forget_prob_cud_easy": _mean([probs.get(i) for i in easy]),
        "forget_prob_cud_hard": _mean([probs.get(i) for i in hard]),
        "forget_prob_per_sample": [probs.get(i) for i in sorted(probs)],
        "eval_seconds": summary.get("elapsed_s"),
    }


#: the row keys of the table's columns after the model's label
VALUES = (
    "forget_quality",
    "model_utility",
    "forget_prob",
    "forget_rougeL_recall",
    "forget_prob_cud_easy",
    "forget_prob_cud_hard",
)


def _cells(r: dict) -> list[str]:
    return [r["label"], *(format_value(r[k]) for k in VALUES)]


def render_table(rows: Sequence[dict], *, markdown: bool = False) -> str:
    """The TOFU demo's table of ``rows``, for the terminal or as Markdown."""
    return report_writer.render_table(rows, markdown=markdown, columns=COLUMNS, cells=_cells)


# ----------------------------------------------------------------------------- plots


#: the Forget Quality vs Model Utility plot's x label, y label and title
FQ_MU_LABELS = (
    "Forget Quality (KS p-value vs the retain model, log scale; higher is better)",
    "Model Utility (higher is better)",
    "TOFU: Forget Quality vs Model Utility",
)


def plot_fq_mu(rows: Sequence[dict], path: Path) -> None:
    markers = {"full": "s", "retain": "*"}
    plot_log_scatter(
        rows, path, x="forget_quality", y="model_utility", floor=1e-12, markers=markers, labels=FQ_MU_LABELS, height=4.6
    )


def plot_cud_histogram(scores: Sequence[dict], easy: Sequence[int], hard: Sequence[int], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    groups = {
        "CUD-easy": [r["score"] for r in scores if r["index"] in set(easy)],
        "CUD-hard": [r["score"] for r in scores if r["index"] in set(hard)],
        "other": [r["score"] for r in scores if r["index"] not in set(easy) | set(hard)],
    }
    bins = [i / 20 for i in range(21)]
    ax.hist(
        [groups["CUD-easy"], groups["other"], groups["CUD-hard"]],
        bins=bins,
        stacked=True,
        label=[
            f"{k} (n={len(v)})"
            for k, v in (("CUD-easy", groups["CUD-easy"]), ("other", groups["other"]), ("CUD-hard", groups["CUD-hard"]))
        ],
        color=["tab:green", "tab:gray", "tab:red"],
    )
    ax.set_xlabel("CUD score (0 = like the easy anchors, 1 = like the hard anchors)")
    ax.set_ylabel("forget samples")
    ax.set_title("CUD difficulty of the forget samples")
    ax.legend(fontsize=8)
    finish_png(fig, path)


def plot_depth_profile(scores: Sequence[dict], easy: Sequence[int], hard: Sequence[int], path: Path) -> None:
    """Mean circuit edges per destination layer (all components), easy vs hard."""
    import numpy as np

    from unlearn_plugins.circuits.plot import mean_placement

    plt = pyplot()
    by_index = {r["index"]: r for r in scores}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, group, color in (("CUD-easy", easy, "tab:green"), ("CUD-hard", hard, "tab:red")):
        profile = np.asarray(mean_placement([by_index[i] for i in group])).sum(axis=1)
        ax.plot(range(len(profile)), profile, marker="o", color=color, label=f"{name} (n={len(group)})")
    ax.set_xlabel(f"destination layer ({len(profile) - 1} = logits)")
    ax.set_ylabel("mean circuit edges per sample")
    ax.set_title("Where the circuits sit: easy vs hard samples")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    finish_png(fig, path)


# ----------------------------------------------------------------------------- the report


def study_report(
    out: Path,
    plan,
    results: dict[str, dict],
    *,
    config: dict,
    budget: dict,
    notice: str | None,
    wall_s: float,
    train_dtype: str = "library default",
) -> tuple[dict, str, dict]:
    """The report of the demo's study, run (:func:`unlearn_plugins.study.runner.run_plan`): its
    one forget size's target and retain models, each method's unlearning run, every model's
    evaluation (and with [evaluation] robustness its measurement), and the CUD cell."""
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs
    from unlearn_plugins.study.cells import REALLY_FORGOTTEN

    from .data import load_benchmark

    study = plan.study
    (k,) = study.forget_sizes
    (seed,) = study.seeds
    cells = plan.cells
    bench = load_benchmark(plan.benches[k]["folder"])
    targets = {
        name: {"key": cells[cell].stages[0].params["key"], "model": plan.models[cell]}
        for name, cell in (("full", "target"), ("retain", f"retain/forget{k}"))
    }
    evals = {"full": Path(cells[f"eval-full/forget{k}"].result), "retain": Path(cells[f"eval-retain/forget{k}"].result)}
    runs = {}
    for method in study.methods:
        cp = cells[f"{method.name}/forget{k}/seed{seed}"]
        run = Path(cp.stages[0].folder)
        runs[method.name] = {"key": run.name.rsplit("-", 1)[1], "adapter": str(run / "run")}
        evals[method.name] = Path(cp.result)
    forgetting = (
        {name: folder / REALLY_FORGOTTEN for name, folder in evals.items()} if study.evaluation.robustness else {}
    )
    configs = read_outputs(evals["full"]).results.get("configs", {})
    cap = ((configs.get("tofu_forget_rouge") or {}).get("generation_kwargs") or {}).get("max_gen_toks")
    evaluation = {
        "tasks": list(study.evaluation.tasks),
        "batch_size": study.evaluation.batch_size,
        "max_gen_toks": cap,
        "dtype": study.evaluation.dtype or "library default",
    }
    return write_report(
        out,
        config=config,
        budget=budget,
        bench=bench,
        notice=notice,
        targets=targets,
        runs=runs,
        methods=study.methods,
        evals=evals,
        cud_dir=Path(cells[f"cud/forget{k}"].result),
        timings=stage_timings(cells, results),
        wall_s=wall_s,
        evaluation=evaluation,
        train_dtype=train_dtype,
        forgetting=forgetting,
    )


def write_report(
    out: Path,
    *,
    config: dict,
    budget: dict,
    bench,
    notice,
    targets,
    runs,
    methods,
    evals,
    cud_dir: Path,
    timings: dict,
    wall_s: float,
    evaluation: dict,
    train_dtype: str = "library default",
    forgetting: dict | None = None,
) -> tuple[dict, str, dict]:
    """results.json, summary.md, the plots and CUD's files in ``out``; with ``forgetting`` (model
    name -> its `unlearn eval --mia --robustness` folder, from ``--robustness``) also the "Is it
    really forgotten?" tables and forget_prob_under_attack.png."""
    scores = jsonl_rows(cud_dir / "scores.jsonl")
    by_question = {r["question"]: r["index"] for r in scores}
    easy = [by_question[r["question"]] for r in jsonl_rows(cud_dir / "easy.json")]
    hard = [by_question[r["question"]] for r in jsonl_rows(cud_dir / "hard.json")]
    labels = [("full", "full (before unlearning)"), ("retain", "retain (never saw the forget set)")]
    labels += [(m.name, m.label) for m in methods]
    rows = [model_row(name, label, evals[name], easy, hard) for name, label in labels]
    table = render_table(rows)
    anchors = json.loads((cud_dir / "anchors.json").read_text())
    meta = cud_meta(cud_dir)
    results = {
        "config": config,
        "budget": budget,
        "benchmark": bench.describe(),
        "notice": notice,
        "models": rows,
        "evaluation": evaluation,
        "train_dtype": train_dtype,
        "targets": targets,
        "unlearning_runs": {m.name: {"label": m.label, "settings": m.settings, **runs[m.name]} for m in methods},
        "cud": {
            "scores": [{k: r[k] for k in ("index", "score", "s_E", "s_H", "anchor", "circuit_depth")} for r in scores],
            "easy": easy,
            "hard": hard,
            "anchors": {k: anchors.get(k) for k in ("easy", "hard")},
            "anchor_pool": meta.get("anchor_pool"),
            "anchor_votes": meta.get("anchors"),
            # the vote's thresholds and what the circuits were compared as (paper: 3 of 5, binary)
            "settings": {k: (meta.get("settings") or {}).get(k) for k in ("min_votes", "min_objectives", "vector")},
            # the anchor runs' UnlearnConfig options (lr, epochs, retain, dtype, ...)
            "anchor_unlearn": ((meta.get("settings") or {}).get("runner") or {}).get("options"),
            "anchor_runs": anchor_runs(meta),
            "seed_agreement": {o: a.get("mean_spearman") for o, a in (meta.get("seed_agreement") or {}).items()},
            "objective_agreement": meta.get("objective_agreement"),
        },
        "stages": timings,
        "wall_time_s": round(wall_s, 1),
    }
    figures = Section(
        [
            "![Forget Quality vs Model Utility](fq_vs_mu.png)",
            "![CUD scores](cud_histogram.png)",
            "![Circuit depth, easy vs hard](circuit_depth.png)",
            "",
        ],
        {
            "fq_vs_mu.png": lambda path: plot_fq_mu(rows, path),
            "cud_histogram.png": lambda path: plot_cud_histogram(scores, easy, hard, path),
            "circuit_depth.png": lambda path: plot_depth_profile(scores, easy, hard, path),
        },
    )
    attacks = Section()
    if forgetting:
        from unlearn_plugins.evaluation import really_forgotten
        from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

        order = ["retain", "full", *(m.name for m in methods)]
        named = dict(labels)
        results["really_forgotten"] = [
            {"name": name, **really_forgotten.row(named[name], read_outputs(forgetting[name]).summary)}
            for name in order
            if name in forgetting
        ]
        attacks = Section(
            _really_forgotten_lines(results),
            {
                "forget_prob_under_attack.png": lambda path: really_forgotten.plot_under_attack(
                    results["really_forgotten"], path
                )
            },
        )
    sections = [Section(_head_lines(results, rows)), figures, attacks, Section([wall_time_line(results), ""])]
    return report_writer.write_demo(out, results, table, sections=sections, cud_dir=cud_dir, scores=scores)


def _head_lines(results: dict, rows: Sequence[dict]) -> list[str]:
    """summary.md up to its plots: the demo's data and budget, CUD's anchors and the table."""
    b, bench = results["budget"], results["benchmark"]
    cfg = results["config"]
    lines = [
        "# unlearn-plugins demo",
        "",
        f"Model `{cfg['model']}`; data: {bench['description']}; {len(bench['authors'])} authors "
        f"(20 QA each), forget author(s) {bench['forget_authors']}, retain author(s) {bench['retain_authors']}.",
    ]
    if results.get("notice"):
        lines += ["", f"**Notice:** {results['notice']}."]
    lines += [
        "",
        f"Every method unlearned the {bench['sizes']['forget']} forget QA with the same budget: LoRA r "
        f"{b['unlearn']['lora_r']}, lr {b['unlearn']['lr']}, {b['unlearn']['epochs']:g} epochs, batch "
        f"{b['unlearn']['batch_size']} x {b['unlearn']['grad_accum']}; base weights while training: "
        f"{results.get('train_dtype', 'library default')}, weights while evaluating: "
        f"{results['evaluation'].get('dtype', 'library default')}. Forget Quality is the KS-test p-value of "
        f"the forget truth ratios against the retain model's; Model Utility is the harmonic mean of prob, "
        f"ROUGE-L and truth ratio on retain QA ({bench['sizes']['retain_perturbed']}), real authors and world facts "
        f"({bench['sizes']['real_authors_perturbed']} each); ROUGE generations stop after "
        f"{results['evaluation']['max_gen_toks']} new tokens (the longest reference answer + a margin). "
        f"Columns 'prob CUD-easy/hard': mean answer "
        f"probability on the {len(results['cud']['easy'])} lowest / highest CUD-scored forget samples.",
        *_cud_anchor_lines(results["cud"]),
        "",
        render_table(rows, markdown=True),
        "",
    ]
    return lines


def _really_forgotten_lines(results: dict) -> list[str]:
    """The "Is it really forgotten?" section (``--robustness``): membership inference, then the
    forget probability and ROUGE-L under the probes and after the attacks."""
    rows = results.get("really_forgotten")
    if not rows:
        return []
    from unlearn_plugins.evaluation import really_forgotten

    return [
        "## Is it really forgotten?",
        "",
        "Membership inference: AUC of telling the forget QA from a holdout author's (in no model's "
        "training data; 0.5 = cannot, 1 = the forget set looks trained on); privleak (MUSE, Min-K%) "
        "against the retain model (0 = as private as it, negative = the forget set still looks "
        "trained on). Then the forget probability and ROUGE-L plain, under the paraphrase and "
        "few-shot-format probes and after relearning (10 steps on half of the forget QA, measured on "
        "the other half; the plain model on that half in brackets) and int4 quantization; worst = "
        "the highest (attack-aware).",
        "",
        really_forgotten.table(rows),
        "",
        "![Forget probability before and after each attack](forget_prob_under_attack.png)",
        "",
    ]


def _cud_anchor_lines(cud: dict) -> list[str]:
    """One sentence on where CUD's anchors came from (a pool disjoint from the scored forget QA)."""
    pool, runs = cud.get("anchor_pool"), cud.get("anchor_runs") or []
    if not pool or not runs:
        return []
    objectives = sorted({r["objective"] for r in runs})
    seeds = len(runs) // max(len(objectives), 1)
    steps = sorted(r["steps"] for r in runs if r.get("steps") is not None)
    span = "n/a" if not steps else str(steps[0]) if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"
    agree = ", ".join(f"{o} {v:.2f}" for o, v in cud["seed_agreement"].items() if v is not None) or "n/a"
    votes = cud.get("anchor_votes", {}).get("all", {})
    return [
        "",
        f"CUD anchors were chosen on {pool['size']} retain-author QA that are not scored "
        f"({len(votes.get('easy', []))} easy, {len(votes.get('hard', []))} hard), by "
        f"{' and '.join(objectives)} x {seeds} seeds (kept when chosen by at least half the seeds of an "
        f"objective and half the objectives); the anchor runs stopped after {span} steps; seed-to-seed "
        f"Spearman of their losses: {agree}.",
        *(
            []
            if set(objectives) == set(PAPER_OBJECTIVES)
            else [
                f"Deviation: the CUD paper votes over five methods ({', '.join(PAPER_OBJECTIVES)}), keeping a "
                f"sample 3 of them choose; this vote used {len(objectives)} (threshold "
                f"{(cud.get('settings') or {}).get('min_objectives', 'n/a')}) to save anchor runs.",
            ]
        ),
    ]
