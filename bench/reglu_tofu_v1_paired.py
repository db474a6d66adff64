"""reglu_tofu (v1) re-read with the author-unit study's statistics, from its committed records alone (no cache,
no model): per unlearning cell, Model Utility against the target's on the same QA (a paired
bootstrap over the QA) beside the report's unpaired per-evaluation interval, and the forget
truth ratios against the retain model's as Forget Quality (the KS p-value), the KS statistic and
the 1-Wasserstein distance of the log truth ratios. Per forget size, ReGLU against each rival
over the seeds with Holm's correction is in the report; this is the evaluation-level view.

    python bench/reglu_tofu_v1_paired.py [--study docs/study/reglu_tofu/study.json]
        [--records bench/results/reglu_tofu] [--out docs/study/reglu_tofu_v2/v1_reanalysis.json]

Prints a Markdown table and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unlearn_plugins.benchmarks.tofu.study.report import read_evaluation  # noqa: E402
from unlearn_plugins.benchmarks.tofu.study.statistics import mu_paired_bootstrap, truth_ratio_distances  # noqa: E402
from unlearn_plugins.evaluation.reference import read_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def record(records: Path, stage: str) -> Path:
    """The record folder of a stage folder named in study.json (the same base name)."""
    folder = records / Path(stage).name
    if not folder.is_dir():
        raise SystemExit(f"reglu_tofu_v1_paired: no record {folder} (of stage {stage})")
    return folder


def reanalyse(study: dict, records: Path) -> dict:
    cells = study["cells"]
    target, retain = {}, {}
    for k in study["study"]["forget_sizes"]:
        target[k] = read_evaluation(record(records, cells[f"eval-full/forget{k}"]["stages"][0]))[1]
        retain[k] = read_reference(record(records, cells[f"eval-retain/forget{k}"]["stages"][0]) / "reference.json")
    rows = {}
    for k in study["study"]["forget_sizes"]:  # the target itself: the distance unlearning starts from
        ratios = [r["truth_ratio"] for r in target[k]["tofu_forget_truth_ratio"]]
        distances = truth_ratio_distances(ratios, retain[k].truth_ratios)
        rows[f"full/forget{k}"] = {
            "method": "full",
            "forget": k,
            "seed": None,
            **{key: distances[key] for key in ("forget_quality", "ks_statistic", "wasserstein_log")},
        }
    for cid, cell in cells.items():
        if cell["kind"] in ("target", "retain", "eval") or cell.get("seed") is None or "metrics" not in cell:
            continue
        k = cell["forget"]
        samples = read_evaluation(record(records, cell["stages"][-1]))[1]
        ratios = [r["truth_ratio"] for r in samples["tofu_forget_truth_ratio"]]
        distances = truth_ratio_distances(ratios, retain[k].truth_ratios)
        paired = mu_paired_bootstrap(samples, target[k])
        rows[cid] = {
            "method": cell["method"],
            "forget": k,
            "seed": cell["seed"],
            "forget_quality_reported": cell["metrics"]["forget_quality"],
            **{key: distances[key] for key in ("forget_quality", "ks_statistic", "wasserstein_log")},
            "model_utility": cell["metrics"]["model_utility"],
            "model_utility_diff": paired["difference"],
            "model_utility_diff_low": paired["low"],
            "model_utility_diff_high": paired["high"],
            "paired_width": paired["width"],
            "unpaired_width": (cell["metrics"].get("model_utility_ci") or {}).get("width"),
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=ROOT / "docs/study/reglu_tofu/study.json")
    parser.add_argument("--records", type=Path, default=ROOT / "bench/results/reglu_tofu")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/study/reglu_tofu_v2/v1_reanalysis.json")
    args = parser.parse_args(argv)
    rows = reanalyse(json.loads(args.study.read_text()), args.records)
    print(
        "| cell | FQ | KS statistic | W1 of log truth ratios | MU - target's MU, paired 95% | paired width "
        "| unpaired width |"
    )
    print("|---|---|---|---|---|---|---|")
    for cid, r in sorted(rows.items(), key=lambda kv: (kv[1]["forget"], kv[1]["method"], kv[1]["seed"] or 0)):
        if r["seed"] is None:
            print(
                f"| {cid} (target) | {r['forget_quality']:.3f} | {r['ks_statistic']:.3f} | {r['wasserstein_log']:.3f} | - | - | - |"
            )
            continue
        print(
            f"| {cid} | {r['forget_quality']:.3f} | {r['ks_statistic']:.3f} | {r['wasserstein_log']:.3f} | "
            f"{r['model_utility_diff']:+.3f} [{r['model_utility_diff_low']:+.3f}, {r['model_utility_diff_high']:+.3f}] "
            f"| {r['paired_width']:.3f} | {r['unpaired_width']:.3f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    mismatch = [
        c
        for c, r in rows.items()
        if r["seed"] is not None and abs(r["forget_quality"] - r["forget_quality_reported"]) > 1e-9
    ]
    print(json.dumps({"bench": "reglu_tofu_v1_paired", "cells": len(rows), "fq_mismatch": mismatch}))
    return 1 if mismatch else 0


if __name__ == "__main__":
    raise SystemExit(main())
