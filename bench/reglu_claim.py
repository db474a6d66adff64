"""Does the ReGLU paper's claim hold on a `reglu_tofu` study: the best Forget Quality at
near-target utility? Reads the study's study.json; per forget size, ReGLU's Forget Quality
against every other method's (one-sided p-values over the seeds: the study report's exact
permutation test and Welch's t-test), and whether each method's mean Model Utility is within
--tolerance of the target model's. Prints a Markdown table per forget size, then one JSON line.

The claim holds at a forget size when ReGLU's utility is near the target's and its Forget
Quality is above that of every other near-target method at permutation p <= --alpha: a claim
about all rivals at once (an intersection-union test), which needs no correction for the
several tests. The table also gives each p Holm-corrected over the rivals (the statement "ReGLU
beats rival X" about one rival needs it), and Welch's p only where both methods' seeds vary.

    python bench/reglu_claim.py docs/study/reglu_tofu/study.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from unlearn_plugins.benchmarks.tofu.study.report import leader_tests  # noqa: E402


def claim(data: dict, method: str = "reglu", tolerance: float = 0.02, alpha: float = 0.05) -> dict:
    """Per forget size: the claimant's tests against every other method, and the verdict."""
    out = {}
    for forget in sorted({g["forget"] for g in data["groups"]}):
        groups = [g for g in data["groups"] if g["forget"] == forget]
        target = next(r for r in data["references"] if r["forget"] == forget and r["name"] == "full")
        mu = {g["method"]: g["metrics"]["model_utility"]["mean"] for g in groups}
        near = {m: v is not None and v >= target["model_utility"] - tolerance for m, v in mu.items()}
        test = leader_tests(groups, method=method)
        if test is None:
            out[str(forget)] = {"holds": None, "why": f"{method}: fewer than 2 seeds done"}
            continue
        rivals = [r for r in test["against"] if near[r["method"]]]
        # a rival with one seed cannot be tested: the claim is then undecided, not held
        if any(r["permutation_p"] is None for r in rivals):
            holds = None
        else:
            holds = near[method] and all(r["permutation_p"] <= alpha for r in rivals)
        out[str(forget)] = {
            "holds": None if holds is None else bool(holds),
            "why": "a near-target rival has one seed: no permutation test" if holds is None else None,
            "target_model_utility": target["model_utility"],
            "model_utility": mu,
            "near_target": near,
            "against": test["against"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study_json", type=Path)
    parser.add_argument("--method", default="reglu", help="the claimant (a method name of the study)")
    parser.add_argument("--tolerance", type=float, default=0.02, help="near-target: mean MU >= target's - this")
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args(argv)
    data = json.loads(args.study_json.read_text())
    labels = {g["method"]: g["label"] for g in data["groups"]}
    if args.method not in labels:
        print(
            f"reglu_claim: {args.study_json}: no method {args.method!r} (it has {', '.join(labels)})", file=sys.stderr
        )
        return 2
    result = claim(data, args.method, args.tolerance, args.alpha)
    for forget, r in result.items():
        print(f"\nForget {forget}: target Model Utility {r.get('target_model_utility', float('nan')):.3f}")
        if r["holds"] is None and "against" not in r:
            print(r["why"])
            continue
        print(
            f"| {labels[args.method]} vs | difference in mean FQ | permutation p | Holm p | Welch p | its MU "
            "| near-target MU |"
        )
        print("|---|---|---|---|---|---|---|")
        for row in r["against"]:
            welch = "n/a" if row["welch_p"] is None else f"{row['welch_p']:.3f}"
            m = row["method"]
            holm_p = "n/a" if row.get("holm_p") is None else f"{row['holm_p']:.3f}"
            print(
                f"| {row['label']} | {row['difference']:+.3f} | "
                f"{'n/a' if row['permutation_p'] is None else format(row['permutation_p'], '.3f')} | {holm_p} | {welch} "
                f"| {r['model_utility'][m]:.3f} | {'yes' if r['near_target'][m] else 'no'} |"
            )
        mine = r["model_utility"][args.method]
        print(f"{labels[args.method]}: MU {mine:.3f}, near-target {'yes' if r['near_target'][args.method] else 'no'}")
    verdict = {k: v["holds"] for k, v in result.items()}
    print(json.dumps({"bench": "reglu_claim", "method": args.method, "claim_holds": verdict, "alpha": args.alpha}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
