"""CUD stratification v3, phase 1: is CUD's instability CUD's or v2's anchor runs'? The design,
declared before any of it runs (:data:`DESIGN`, machine-readable; ``python
bench/cud_stratification_v3.py design`` prints it with what it can detect and its cost). The
code that runs it is not written yet; v2 (``bench/cud_stratification_v2.py``) stays the record of
the old setting.

Declared design
===============

**What changes from v2, and only that.** v2's phase 1 (three CUD scorings of the same 560 query
QA) used anchor runs that were not the paper's: LoRA at lr 1e-3, batch 2, stopped once the pool's
mean answer probability fell below 0.1 (NPO after 8-12 of 40 steps an epoch, so many pool QA
never had a gradient step), every objective at open-unlearning's YAML settings (SimNPO hardly
moved its pool). v3 repeats it with the anchor runs of the CUD code (the ``cud`` scorer's
defaults, ``anchor_recipe=paper``: each objective's checkpoint settings, all weights trained,
batch 4 x 8, one warmup epoch, the whole budget, no stop). Everything else is v2's: the target
(rebuilt from v2's recipe and checked against v2's fingerprint), the author pools (anchor pools
A and B of 80 QA, 4 authors each; the 560-QA query pool of 28 authors), the anchor runs retaining
the query pool, the vote (2 of 3 seeds, then 3 of 5 methods, k = pool / 8 = 10), binary 75-edge
greedy circuits, EAP-IG inputs mode with 5 steps, the EAP-IG matrices of the query QA (identical
query circuits in every scoring: what differs between scorings is the anchors alone).

**Unit of replication.** As v2's phase 1: a scoring of the 560 query QA; reliability is the rank
agreement of two scorings over those QA. The query QA are the rows, not independent replicates of
an anchor draw: each comparison is one draw of anchors against another.

**Scorings.** ``A012`` (pool A, anchor-run seeds 0, 1, 2), ``A345`` (pool A, seeds 3, 4, 5),
``B012`` (pool B, seeds 0, 1, 2): 45 anchor runs.

**Declared comparisons** (judged by the stop rule): ``seeds`` = A012 vs A345, ``pools`` = A012 vs
B012. Shown, not judged: A345 vs B012; the paper's robustness checks on A012's runs: scores from
GradDiff-chosen vs UNDIAL-chosen anchors (``per_objective``: each objective's own stable anchors;
the paper reports rho = 0.76) and A012 scored with cosine vs Jaccard vs Hamming similarity.

**Measures** (v2's): Spearman of the 560 scores, with a Fisher-z interval (Bonett and Wright's
standard error); overlap of the top-40 hard and top-40 easy sets as a fraction of 40 (chance
40/560 = 0.07). Per anchor run: the pool's mean answer probability before and after
(``forget_prob_before``, ``forget_prob``); an objective whose three runs on a pool all keep more
than 90 % of it is reported as not having unlearned the pool (it stays in the vote, as in the
paper's; the vote without it is shown, not judged).

**Stop rule** (v2's, unchanged): phase 2 runs only if, in both declared comparisons, the Spearman
and both top-40 overlaps are at least 0.5; a scoring whose vote leaves no easy or no hard anchor
stops the study too. Stopping again with faithful anchor runs would say that the instability is
CUD's at this scale (one 135M model, 80-QA pools); passing would say it was v2's anchor runs.

**Cost** (``design`` prints the estimate): on this project's 2-core AVX2 machine a GradDiff step
of the paper's recipe (32 pool and 32 retain QA, all weights, fp32) took about 6 CPU-minutes, so
the 45 anchor runs (360 steps a scoring) come to about 130 CPU-hours, the EAP-IG matrices to about
2 more, and v2's bf16 target cannot be rebuilt there in useful time (a bf16 matmul is ~50x slower
than fp32 on that CPU): phase 1 needs a machine with bf16 units or a GPU.

**Order.** The diagnostics on v2's matrices (``bench/cud_diagnostics.py``) first; if they show
that anchor count decides the agreement (the loss-chosen control's pools Spearman rises by 0.2 or
more from k = 10 to k = 25), v3 is declared again with larger pools before it runs (this
declaration is then replaced, not amended after any v3 run).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cud_stratification_v2 as v2  # noqa: E402

FORMAT = 1
RECORDS = Path(__file__).resolve().parent / "results" / "cud_stratification_v3"

DESIGN: dict[str, Any] = {
    "format": FORMAT,
    "from_v2": "target, author pools, query pool, retain of the anchor runs, vote, circuits, EAP-IG settings",
    "unit": "a scoring of the 560 query QA; reliability = rank agreement of two scorings",
    "anchor_runs": "the cud scorer's defaults: anchor_recipe=paper (full-parameter, batch 4 x 8, one warmup epoch, "
    "each objective's checkpoint settings), the whole budget, stop_prob none",
    "scorings": {"A012": ["A", [0, 1, 2]], "A345": ["A", [3, 4, 5]], "B012": ["B", [0, 1, 2]]},
    "comparisons": {"seeds": ["A012", "A345"], "pools": ["A012", "B012"]},
    "shown_not_judged": {
        "seeds_and_pools": ["B012", "A345"],
        "graddiff_vs_undial_anchors": "A012 runs, per_objective anchors of grad_diff vs undial (paper: rho 0.76)",
        "similarity": "A012 scored with cosine, jaccard, hamming (pairwise Spearman)",
        "vote_without_objectives_that_did_not_unlearn": "shown when an objective kept > 90% of its pool's probability",
    },
    "top_k": 40,
    "threshold": 0.5,
    "stop_rule": "stop unless, in every declared comparison, Spearman >= 0.5 and the top-40 hard and easy overlaps "
    "(fraction of 40) >= 0.5; a scoring that cannot be made (no easy or no hard anchor) stops too",
    "did_not_unlearn": 0.9,
    "order": "after bench/cud_diagnostics.py; redeclared with larger pools if the loss-chosen control's pools "
    "Spearman rises by >= 0.2 from k = 10 to k = 25",
}

#: one full-parameter anchor-run step (batch 4 x 8: 32 pool QA and, with a retain term, 32 retain
#: QA) and one EAP-IG matrix, in CPU-seconds, measured on this project's 2-core AVX2 machine
#: (fp32, 2 threads; see the ``measured`` entries of :func:`estimate`)
MEASURED = {
    "eap_ig_cpu_s_per_qa": 11.4,
    "eap_ig_source": "8 TOFU QA, inputs mode, 5 steps, fp32, 2 threads: 91.4 CPU-s (25.6 s wall a QA under load)",
    "grad_diff_step_cpu_s": 360.0,
    "grad_diff_source": "SmolLM2-135M, the paper's GradDiff recipe, 80 pool QA, 2 steps of 32 + 32 QA, fp32, 2 threads: "
    "884 CPU-s with the probability checks and the reload (2 x 879 s wall under load), about 360 CPU-s a step "
    "(bench/cud_anchor_run_cost.py; NPO's first step: 782 s wall under a similar load)",
}
#: the other objectives' step cost relative to GradDiff's (not measured: the same forward and
#: backward passes; NPO, RMU and UNDIAL add a forward pass of the frozen reference model, about a third)
ASSUMED_STEP_RATIO = {"grad_diff": 1.0, "npo": 4 / 3, "simnpo": 1.0, "rmu": 4 / 3, "undial": 4 / 3}


def steps_per_run(pool: int, epochs: float, batch: int = 4, accum: int = 8) -> int:
    """Optimizer steps of one anchor run over ``pool`` QA, as the Trainer counts them."""
    from unlearn_plugins.training.config import steps_per_epoch

    return int(round(epochs * steps_per_epoch(pool, batch, accum)))


def estimate(step_cpu_s: dict[str, float], pool: int = 80, query: int = 560) -> dict:
    """CPU-hours of phase 1: 3 scorings x 5 objectives x 3 seeds anchor runs at their recipe's
    epochs (``step_cpu_s``: CPU-seconds of one step per objective, measured), the EAP-IG matrices
    of the query QA and the anchors (at most the two pools), and v2's target (recorded: 6192 s at
    2 threads for the target and 800 answer NLLs on v2's AMX machine)."""
    from unlearn_plugins.scorers.cud import PAPER_ANCHOR_RUNS

    runs = {}
    for objective, recipe in PAPER_ANCHOR_RUNS.items():
        steps = steps_per_run(pool, recipe["epochs"])
        runs[objective] = {"steps": steps, "cpu_h_per_run": steps * step_cpu_s[objective] / 3600}
    anchor_h = 3 * 3 * sum(r["cpu_h_per_run"] for r in runs.values())
    eap_h = (query + 2 * pool) * MEASURED["eap_ig_cpu_s_per_qa"] / 3600
    target_h = 6191.8 * 2 / 3600
    return {
        "runs": runs,
        "anchor_runs_cpu_h": anchor_h,
        "eap_ig_cpu_h": eap_h,
        "target_cpu_h": target_h,
        "total_cpu_h": anchor_h + eap_h + target_h,
        "measured": {**MEASURED, "step_cpu_s": step_cpu_s},
    }


def detectable(n: int = 560, k: int = 40, threshold: float = 0.5) -> dict:
    """What one comparison can tell apart: the 95 % half-width of a Spearman over ``n`` rows at
    0 and at the threshold, the probability that the point estimate clears the threshold when
    the true value is 0.4 or 0.6 (normal approximation, Bonett-Wright standard error), and the
    binomial SD of a top-k overlap fraction at 0.5."""
    from scipy.stats import norm

    def se(rho: float) -> float:
        return math.sqrt((1 + rho**2 / 2) / (n - 3)) * (1 - rho**2)  # of rho, from the z scale

    return {
        "spearman_half_width_at_0": 1.96 * se(0.0),
        "spearman_half_width_at_threshold": 1.96 * se(threshold),
        "p_pass_if_true_0.6": float(norm.sf((threshold - 0.6) / se(0.6))),
        "p_pass_if_true_0.4": float(norm.sf((threshold - 0.4) / se(0.4))),
        "overlap_sd_at_0.5": math.sqrt(0.25 / k),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("design",))
    p.add_argument("--step-cpu-s", type=json.loads, default=None, help='{"grad_diff": s, ...}: other step costs')
    args = p.parse_args(argv)
    steps = args.step_cpu_s or {o: MEASURED["grad_diff_step_cpu_s"] * r for o, r in ASSUMED_STEP_RATIO.items()}
    out: dict[str, Any] = {
        "design": DESIGN,
        "authors": v2.author_pools(),
        "detectable": detectable(),
        "estimate": estimate(steps),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
