"""CUD stratification v2: a study that can decide whether CUD's hard and easy sets unlearn
differently from random sets. v1 (bench/cud_stratification.py, docs/study/cud_stratification.*)
stays as the record; this file declares v2's design before any of it runs, runs phase 1
(reliability), and holds the analysis functions of both phases.

Declared design (fixed before running; :data:`DESIGN` is the machine-readable copy, written to
the records on the first run and checked on every later one)
======================================================================================

**Target.** SmolLM2-135M-Instruct fine-tuned with v1's recipe (LoRA r 16, lr 1e-3, 3 epochs,
merged; 2 threads so that a rebuilt target is bit-identical) on the 40 TOFU authors that have
paraphrased and perturbed answers: ``retain_perturbed`` (TOFU authors 0-19) then
``forget10_perturbed`` (TOFU authors 180-199), 800 QA; study author ``a`` owns rows
``20a .. 20a+19``.

**Pools, by author** (a fixed permutation of the 40 authors, ``random.Random(35)``): anchor pool
A (4 authors, 80 QA), anchor pool B (4 authors, 80 QA), held-out authors (4, 80 QA: never
unlearned, never in a retain loss; what unlearning destroys is measured on them), query pool
(28 authors, 560 QA), split into 4 sub-pools of 7 authors (140 QA) for phase 2. The unlearning
runs of phase 2 retain anchor pools A and B (authors not in the query pool); CUD's anchor runs
retain the query pool (as the paper's runs retain everything else the model knows).

**Phase 1, reliability** (this file runs it). The query pool is scored three times with the
paper's CUD scoring, the scorer's defaults then: binary circuit masks (cosine of 0/1 edge masks),
anchors voted by the five methods (GradDiff, NPO, SimNPO, RMU, UNDIAL x 3 seeds; kept by 2 of 3
seeds, then 3 of 5 methods), k = pool/8 = 10, greedy 75-edge circuits, EAP-IG inputs mode with 5
steps. Anchor runs as v1, not the paper's (LoRA r 16, lr 1e-3, batch 2, at most 3 epochs, stopped
when the pool's mean answer probability falls below 0.1, checked every 2 steps):

- ``A012``: anchor pool A, anchor-run seeds 0, 1, 2 (the primary scoring, used by phase 2);
- ``A345``: anchor pool A, seeds 3, 4, 5 (same pool, other seeds);
- ``B012``: anchor pool B, seeds 0, 1, 2 (disjoint pool, same seeds).

Declared comparisons: ``seeds`` = A012 vs A345, ``pools`` = A012 vs B012 (B012 vs A345 is shown,
not judged). Per comparison: Spearman of the 560 scores, and the overlap of the top-40 hard (40
highest scores) and top-40 easy (40 lowest) sets as a fraction of 40 (chance: 40/560 = 0.07).

**Stop rule.** Phase 2 runs only when, in *both* declared comparisons, the Spearman *and* both
overlaps are at least 0.5. Otherwise (or when a scoring cannot be made: the vote leaves no easy
or no hard anchor) the study reports that CUD is not stable at this scale and stops: that is its
result. (Phase 2 builds hard and easy sets of 40 from CUD's ranking; if fewer than half of a
top-40 set survives another draw of seeds or anchors, the sets are mostly the draw's.)

**Phase 2, stratification** (declared before phase 1 ran; runs only if phase 1 passes):

- Objectives: grad_diff, npo, simnpo, each analysed on its own (never pooled: v1's disagree in
  sign). Budget per objective from a pilot on 2 random pilot sets (not reused): LoRA lr 5e-4,
  batch 4, probabilities of the set and of the held-out QA traced every epoch (10 steps) up to 10
  epochs; the budget is the whole epoch whose mean efficacy is within 30-70 % (nearest 50 %) with
  held-out retain probability above half the target's. An objective with no such epoch is
  reported and left out.
- Sets of 40 QA. Per sub-pool k (4 disjoint sub-pools): ``hard_k`` = its 40 highest A012 scores,
  ``easy_k`` = its 40 lowest: 4 independent hard and 4 easy sets. Random sets: 24, each 40 QA
  drawn from the whole query pool without replacement (independent draws, ``random.Random(3500
  + j)``; different sets may share QA). One run per set and objective, seed 100 + set number.
  The unit is the set.
- Primary measure (per run): **damage-adjusted efficacy** = forget efficacy - held-out drop, both
  in points: efficacy = 100 (1 - mean p_after / mean p_before) over the set's QA, held-out drop
  = 100 (1 - mean q_after / mean q_before) over the held-out QA (p, q: answer probability,
  exp(-mean answer-token NLL)). Raw efficacy is reported beside it.
- Before any stratified set is analysed, the minimum detectable difference (MDD) of set means
  at 80 % power is printed and recorded per objective, from the random sets' SD of the primary
  measure: two-sided pooled two-sample t test, n1 = 4 (hard or easy sets), n2 = 24 (random
  sets), alpha = 0.05 / 6 (Holm's first-step level for 6 comparisons); the normal-approximation
  value is recorded beside it.
- Declared comparisons: hard - random and easy - random, per objective (2 x 3 = 6); Welch t test
  on set means, one family, Holm-corrected; 95 % Welch intervals and set-bootstrap intervals.
- Per-sample correlations (descriptive, Holm within their own family of scorer x objective):
  Spearman of CUD (A012), MRD (100 perturbations, the paper's count) and the pre-unlearning loss
  with the per-sample *change* post - pre answer NLL on the random sets' QA (averaged over the
  random sets a QA is in). (The relative probability drop 1 - p_after / p_before = 1 - exp(-(post
  - pre)) is a monotone function of that change: the same Spearman.) Never with the post level,
  which contains the pre level.

Phase 2 as implemented (:class:`Phase2`; choices the declaration left open, fixed before any
phase-2 run): pilot set j = ``random.Random(3400 + j).sample(query rows, 40)``, its run seed 90 +
j; set numbers: random j -> j, hard k -> 24 + k, easy k -> 28 + k (seed 100 + number); every run
is LoRA r 16 / alpha 32, bf16 base, lr 5e-4, batch 4 (10 steps an epoch), retaining anchor pools
A and B, the objective's defaults otherwise; the set's and the held-out QA's answer NLLs are
measured at the end of every epoch in the training process (eval mode, :func:`epoch_probe`), the
pilots' trace for the budget and a run's last epoch for its result; the random sets of an
objective run first, its MDD is recorded (``phase2/mdd-OBJECTIVE.json``) and printed, then its
hard and easy sets; MRD scores the query pool last. The loss scorer's score is the negated
answer NLL before unlearning (``before.json``), as the ``loss`` scorer computes it.

Running
=======

Phase 1 writes a small record per finished unit under ``bench/results/cud_stratification_v2/``
(``--records``): ``design.json``; ``target_fingerprint.json`` (the rebuilt target's held-out
NLLs); ``before.json`` (every row's answer NLL before unlearning); ``anchor_runs/SCORING/
OBJECTIVE-sSEED.json`` (each anchor run's per-sample losses, written as it finishes);
``scoring-NAME.json`` (each scoring's 560 scores, anchors and vote). A rerun skips whatever is
recorded (models and EAP-IG matrices live in ``--cache``; an anchor run is redone only if its
record is missing). The report is made from the records alone::

    UNLEARN_TOFU_DIR=../shared/data/tofu OMP_NUM_THREADS=2 python bench/cud_stratification_v2.py phase1
    UNLEARN_TOFU_DIR=../shared/data/tofu OMP_NUM_THREADS=2 python bench/cud_stratification_v2.py phase2
    python bench/cud_stratification_v2.py report --out docs/study
    python bench/cud_stratification_v2.py v1     # v1's records read with these measures (README)

Phase 2 records under ``phase2/``: ``pilot-OBJECTIVE.json`` (the pilots' traces and the budget),
``mdd-OBJECTIVE.json``, ``runs/OBJECTIVE/SET.json`` (each run's NLLs after), ``scores-mrd.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

FORMAT = 1
RECORDS = Path(__file__).resolve().parent / "results" / "cud_stratification_v2"
QA_PER_AUTHOR = 20
PAPER = {"hard_minus_random": -14.1, "easy_minus_random": 3.3}
PAPER_OBJECTIVES = ("grad_diff", "npo", "simnpo", "rmu", "undial")

#: the declared design (see the module docstring); changing it after phase 1 started is an error
DESIGN: dict[str, Any] = {
    "format": FORMAT,
    "unit": "the set (phase 2); the query pool's 560 QA (phase 1 rank agreement)",
    "data": ["tofu:retain_perturbed", "tofu:forget10_perturbed"],
    "authors": 40,
    "author_permutation_seed": 35,
    "pools": {"anchor_A": 4, "anchor_B": 4, "heldout": 4, "query": 28, "query_subpools": 4},
    "phase1": {
        "scorings": {"A012": ["A", [0, 1, 2]], "A345": ["A", [3, 4, 5]], "B012": ["B", [0, 1, 2]]},
        "primary_scoring": "A012",
        "comparisons": {"seeds": ["A012", "A345"], "pools": ["A012", "B012"]},
        "shown_not_judged": {"seeds_and_pools": ["B012", "A345"]},
        "top_k": 40,
        "stop_rule": "stop unless, in every declared comparison, Spearman >= 0.5 and the top-40 hard and easy "
        "overlaps (fraction of 40) >= 0.5; a scoring that cannot be made (no easy or no hard anchor) stops too",
        "threshold": 0.5,
        "cud": "scorer defaults: vector=binary, five-method vote (3 of 5 methods, 2 of 3 seeds), k=pool/8",
    },
    "phase2": {
        "objectives": ["grad_diff", "npo", "simnpo"],
        "budget": "per objective: the whole epoch (10 steps, batch 4, lr 5e-4, <= 10 epochs) of 2 random pilot sets "
        "whose mean efficacy is within 30-70% (nearest 50%) with held-out retain prob > half the target's; "
        "none: the objective is reported and left out",
        "set_size": 40,
        "hard_sets": 4,
        "easy_sets": 4,
        "random_sets": 24,
        "seeds": "one per set: 100 + set number",
        "retain": "anchor pools A and B (authors not in the query pool)",
        "primary_measure": "damage-adjusted efficacy = efficacy - held-out drop (points)",
        "secondary_measure": "raw efficacy (points)",
        "mdd": "80% power, two-sided pooled t, n1=4, n2=24, alpha=0.05/6, SD of the random sets' primary measure; "
        "printed before stratified sets are analysed",
        "comparisons": "hard - random, easy - random, per objective: Welch t on set means, Holm over the 6",
        "per_sample_correlation": "Spearman(score, post - pre answer NLL) on the random sets' QA, per objective; "
        "scorers cud (A012), mrd (100 perturbations), loss; Holm within scorer x objective",
    },
}


# ============================================================================= analysis
# (pure functions on numbers: tests/test_cud_stratification_v2.py checks them on constructed inputs)


def probs(nlls: Sequence[float]) -> list[float]:
    """Answer probabilities exp(-mean answer-token NLL)."""
    return [math.exp(-x) for x in nlls]


def efficacy_points(nll_before: Sequence[float], nll_after: Sequence[float]) -> float:
    """100 x (1 - mean p_after / mean p_before) over the same QA: how much of the set's answer
    probability unlearning removed, in points (negative: it rose)."""
    if len(nll_before) != len(nll_after) or not nll_before:
        raise ValueError("efficacy needs the same non-empty QA before and after")
    return 100.0 * (1.0 - sum(probs(nll_after)) / sum(probs(nll_before)))


def damage_adjusted(
    forget_before: Sequence[float],
    forget_after: Sequence[float],
    heldout_before: Sequence[float],
    heldout_after: Sequence[float],
) -> dict:
    """The primary measure of one run, from answer NLLs: ``efficacy`` on the unlearned set,
    ``heldout_drop`` (the same formula on the held-out QA, i.e. the damage), and ``adjusted`` =
    efficacy - held-out drop, all in points. A run that destroys everything scores ~0, not 100."""
    eff = efficacy_points(forget_before, forget_after)
    drop = efficacy_points(heldout_before, heldout_after)
    return {"efficacy": eff, "heldout_drop": drop, "adjusted": eff - drop}


def change_correlation(
    scores: dict[int, float], nll_before: dict[int, float], nll_after: dict[int, Sequence[float]]
) -> dict:
    """Spearman of a difficulty score with each QA's *change* in answer NLL (post - pre; the
    post value averaged over the runs that unlearned it), over the rows present in all three.
    A positive rho: higher scores lost more (were unlearned more). Never the post level: it
    holds the pre level, so the loss scorer would correlate with it by construction."""
    from scipy.stats import spearmanr

    rows = sorted(r for r in nll_after if r in scores and r in nll_before and nll_after[r])
    if len(rows) < 3:
        return {"rho": None, "p": None, "n": len(rows)}
    change = [sum(nll_after[r]) / len(nll_after[r]) - nll_before[r] for r in rows]
    test = spearmanr([scores[r] for r in rows], change)
    rho = float(test.statistic)
    if math.isnan(rho):
        return {"rho": None, "p": None, "n": len(rows)}
    return {"rho": rho, "p": float(test.pvalue), "n": len(rows)}


def _two_sample_power(delta: float, sd: float, n1: int, n2: int, alpha: float) -> float:
    """Power of the two-sided pooled two-sample t test to detect a true difference ``delta``."""
    from scipy.stats import nct, t

    df = n1 + n2 - 2
    nc = delta / (sd * math.sqrt(1.0 / n1 + 1.0 / n2))
    crit = t.ppf(1.0 - alpha / 2.0, df)
    upper, lower = float(nct.sf(crit, df, nc)), float(nct.cdf(-crit, df, nc))
    # scipy's tail far from a large noncentrality can come back NaN: it is 0 there
    return (0.0 if math.isnan(upper) else upper) + (0.0 if math.isnan(lower) else lower)


def minimum_detectable_difference(
    sd: float, n1: int, n2: int, *, alpha: float = 0.05, power: float = 0.8, method: str = "t"
) -> float:
    """The smallest true difference of two group means that a two-sided two-sample test at level
    ``alpha`` detects with probability ``power``, for groups of ``n1`` and ``n2`` units with
    standard deviation ``sd`` (each).

    ``method="normal"``: (z_{1-alpha/2} + z_{power}) * sd * sqrt(1/n1 + 1/n2) (the textbook
    formula; it ignores that sd is estimated). ``method="t"`` (default): the exact difference at
    which the pooled t test (df = n1 + n2 - 2) reaches ``power``, from the noncentral t
    distribution (solved numerically; larger than the normal value for small groups)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if sd < 0 or n1 < 1 or n2 < 1 or not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("mdd needs sd >= 0, n1, n2 >= 1, 0 < alpha, power < 1")
    se = math.sqrt(1.0 / n1 + 1.0 / n2)
    normal = (norm.ppf(1.0 - alpha / 2.0) + norm.ppf(power)) * sd * se
    if method == "normal" or sd == 0:
        return float(normal)
    if method != "t":
        raise ValueError(f"method {method!r}: 't' or 'normal'")
    if n1 + n2 - 2 < 1:
        raise ValueError("the t method needs n1 + n2 >= 3")
    # power rises from alpha at 0; the t value is above the normal one and, for df >= 1, below a
    # few times it (the upper end grows until it brackets the root; huge noncentralities give NaN)
    high = 2.0 * normal
    while _two_sample_power(high, sd, n1, n2, alpha) < power:
        high *= 2.0
    return float(brentq(lambda d: _two_sample_power(d, sd, n1, n2, alpha) - power, 0.0, high, xtol=1e-10 * sd))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-Bonferroni adjusted p-values (step-down; monotone; capped at 1) of one family."""
    order = sorted(pvalues, key=lambda k: (pvalues[k], k))
    m = len(order)
    out, running = {}, 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[key]))
        out[key] = running
    return out


def compare_sets(kind: Sequence[float], rnd: Sequence[float], *, n_boot: int = 10000, seed: int = 0) -> dict:
    """mean(kind) - mean(rnd) with sets as units: Welch t test (p, 95 % interval) and a 95 %
    percentile bootstrap interval resampling sets within each group."""
    import numpy as np
    from scipy.stats import t, ttest_ind

    a, b = np.asarray(kind, dtype=float), np.asarray(rnd, dtype=float)
    diff = float(a.mean() - b.mean())
    out: dict[str, Any] = {"diff": diff, "n": [len(a), len(b)], "p": None, "ci": None, "ci_boot": None}
    if min(len(a), len(b)) < 2:
        return out
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se > 0:
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
        half = float(t.ppf(0.975, df)) * se
        out["ci"] = [diff - half, diff + half]
        out["p"] = float(ttest_ind(a, b, equal_var=False).pvalue)
        out["df"] = float(df)
    rng = np.random.default_rng(seed)
    boot = a[rng.integers(0, len(a), (n_boot, len(a)))].mean(1) - b[rng.integers(0, len(b), (n_boot, len(b)))].mean(1)
    low, high = np.percentile(boot, [2.5, 97.5])
    out["ci_boot"] = [float(low), float(high)]
    return out


def top_rows(scores: dict[int, float], k: int, *, hardest: bool) -> list[int]:
    """The k rows with the highest (``hardest``) or lowest scores; ties broken by row number."""
    order = sorted(scores, key=lambda r: ((-scores[r] if hardest else scores[r]), r))
    return sorted(order[:k])


def spearman_interval(rho: float, n: int, level: float = 0.95) -> list[float]:
    """Fisher-z interval of a Spearman correlation with Bonett and Wright's (2000) standard error
    sqrt((1 + rho^2 / 2) / (n - 3)): how precisely n rows pin the reliability down."""
    from scipy.stats import norm

    if n <= 3 or abs(rho) >= 1:
        return [rho, rho]
    half = norm.ppf(0.5 + level / 2) * math.sqrt((1 + rho**2 / 2) / (n - 3))
    z = math.atanh(rho)
    return [math.tanh(z - half), math.tanh(z + half)]


def agreement(a: dict[int, float], b: dict[int, float], k: int) -> dict:
    """How two scorings of the same rows agree: Spearman, and the overlap of their top-k hard and
    top-k easy sets as a fraction of k (``chance``: the expected overlap of random sets, k / n)."""
    from scipy.stats import spearmanr

    rows = sorted(set(a) & set(b))
    if len(rows) != len(a) or len(rows) != len(b):
        raise ValueError("the two scorings cover different rows")
    rho = float(spearmanr([a[r] for r in rows], [b[r] for r in rows]).statistic)
    out = {
        "spearman": None if math.isnan(rho) else rho,
        "spearman_ci": None if math.isnan(rho) else spearman_interval(rho, len(rows)),
        "n": len(rows),
        "k": k,
        "chance": k / len(rows),
    }
    for kind, hardest in (("hard", True), ("easy", False)):
        shared = set(top_rows(a, k, hardest=hardest)) & set(top_rows(b, k, hardest=hardest))
        out[f"{kind}_overlap"] = len(shared) / k
        out[f"{kind}_shared"] = len(shared)
    return out


def stop_rule(
    scorings: dict[str, dict[int, float] | None],
    comparisons: dict[str, Sequence[str]],
    *,
    k: int = 40,
    threshold: float = 0.5,
) -> dict:
    """Phase 1's decision. ``scorings``: name -> {row: score}, or None for a scoring that could
    not be made (no easy or no hard anchor survived the vote). Every declared comparison needs a
    Spearman >= ``threshold`` and top-k hard and easy overlaps >= ``threshold``; ``stop`` is True
    otherwise, with the reasons. A comparison with a missing (not yet run) scoring leaves the
    decision open (``decided`` False) unless another comparison already stops the study."""
    results, reasons, open_ = {}, [], []
    for name, (x, y) in comparisons.items():
        if x not in scorings or y not in scorings:
            open_.append(name)
            continue
        if scorings[x] is None or scorings[y] is None:
            failed = [s for s in (x, y) if scorings[s] is None]
            results[name] = {"scorings": [x, y], "undefined": f"no CUD scores from {', '.join(failed)}"}
            reasons.append(f"{name}: CUD could not score the pool with {', '.join(failed)} (too few anchors)")
            continue
        a = agreement(scorings[x], scorings[y], k)
        results[name] = {"scorings": [x, y], **a}
        for measure in ("spearman", "hard_overlap", "easy_overlap"):
            value = a[measure]
            if value is None or value < threshold:
                shown = "undefined" if value is None else f"{value:.2f}"
                reasons.append(f"{name} ({x} vs {y}): {measure.replace('_', ' ')} {shown} < {threshold}")
    decided = bool(reasons) or not open_
    return {
        "comparisons": results,
        "threshold": threshold,
        "k": k,
        "stop": bool(reasons) if decided else None,
        "decided": decided,
        "pending": open_,
        "reasons": reasons,
    }


# ============================================================================= pools


def author_pools(n_authors: int = 40, seed: int = 35, sizes: dict | None = None) -> dict[str, list[int]]:
    """The study authors of each pool (a fixed permutation, then consecutive blocks):
    ``anchor_A``, ``anchor_B``, ``heldout``, ``query`` and ``subpool0..`` (the query's authors in
    equal consecutive blocks)."""
    sizes = dict(sizes or DESIGN["pools"])
    order = list(range(n_authors))
    random.Random(seed).shuffle(order)
    out, at = {}, 0
    for name in ("anchor_A", "anchor_B", "heldout", "query"):
        out[name] = sorted(order[at : at + sizes[name]])
        at += sizes[name]
    if at != n_authors:
        raise ValueError(f"the pools take {at} of {n_authors} authors")
    query = [a for a in order if a in set(out["query"])]
    per = len(query) // sizes["query_subpools"]
    for j in range(sizes["query_subpools"]):
        out[f"subpool{j}"] = sorted(query[j * per : (j + 1) * per])
    return out


def rows_of(authors: Sequence[int]) -> list[int]:
    return [a * QA_PER_AUTHOR + i for a in authors for i in range(QA_PER_AUTHOR)]


# ============================================================================= phase 1


@dataclass
class StudyConfig:
    model: str = "smollm2-135m"
    max_length: int = 128
    finetune: dict = field(
        default_factory=lambda: dict(
            lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=8, grad_accum=1, dtype="bf16"
        )
    )
    target_threads: int = 2
    fingerprint_tolerance: float = 1e-3
    # the paper's CUD scoring: everything not given here is the scorer's default (of v2's time)
    # (vector=binary, similarity=cosine, five-method vote, k = pool / 8, greedy circuits)
    cud: dict = field(default_factory=lambda: dict(steps=5, n_edges=75, stop_prob=0.1, check_steps=2, max_rows=20))
    anchor_unlearn: dict = field(
        default_factory=lambda: dict(
            lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=2, grad_accum=1, dtype="bf16"
        )
    )
    objectives: tuple = PAPER_OBJECTIVES
    device: str | None = None


class RecordedRunner:
    """CUD's anchor runs through the study's records: a run already recorded (``anchor_runs/
    SCORING/OBJECTIVE-sSEED.json``) is read from there, any other is run by ``inner`` (a
    :class:`~unlearn_plugins.scorers.cud.TrainerAnchorRunner`) and recorded as soon as it
    finishes. ``describe()`` (part of CUD's cache key) names the runner's settings without the
    machine's paths, so that the key holds on another machine."""

    def __init__(self, inner, folder: Path, settings: dict, log=None):
        self.inner, self.folder, self.settings = inner, folder, settings
        self.log = log or (lambda msg: None)
        self.last_info: dict | None = None

    def describe(self) -> dict:
        return {"runner": "cud_stratification_v2", **self.settings}

    def path(self, objective: str, seed: int) -> Path:
        return self.folder / f"{objective}-s{seed}.json"

    def losses(self, samples, *, model, tokenizer, objective, seed):
        from unlearn_plugins.files import write_json

        path = self.path(objective, seed)
        if path.is_file():
            record = json.loads(path.read_text())
            if record.get("n") == len(samples):
                self.last_info = {**record.get("info", {}), "recorded": True}
                return [float(x) for x in record["losses"]]
        started = time.perf_counter()
        self.log(f"anchor run {self.folder.name} {objective}/seed {seed} ...")
        losses = self.inner.losses(samples, model=model, tokenizer=tokenizer, objective=objective, seed=seed)
        info = dict(self.inner.last_info or {})
        info["checks"] = [
            {"step": c["step"], "forget_prob": round(c["forget_prob"], 5)} for c in info.get("checks", [])
        ]
        info["seconds"] = round(time.perf_counter() - started, 1)
        write_json(path, {"objective": objective, "seed": seed, "n": len(samples), "losses": losses, "info": info})
        self.log(
            f"anchor run {self.folder.name} {objective}/seed {seed}: {info.get('steps')} steps, pool prob "
            f"{info.get('forget_prob', float('nan')):.3f}, {info['seconds']:.0f} s"
        )
        self.last_info = info
        return losses


class Phase1:
    def __init__(self, config: StudyConfig, cache: Path, records: Path):
        from unlearn_plugins.stages import Stages, digest
        from unlearn_plugins.study.records import packs

        if packs(records):
            raise SystemExit(
                f"error: {records} holds packed records, and a run adds loose ones: unpack them first "
                f"(unlearn records unpack {records}), and pack them again after the run"
            )
        self.config, self.cache, self.records = config, cache, records
        self.digest = digest
        self.samples = load_samples()
        if len(self.samples) != DESIGN["authors"] * QA_PER_AUTHOR:
            raise SystemExit(f"error: expected {DESIGN['authors'] * QA_PER_AUTHOR} QA, got {len(self.samples)}")
        self.authors = author_pools(DESIGN["authors"], DESIGN["author_permutation_seed"])
        self.rows = {name: rows_of(a) for name, a in self.authors.items()}
        self.stages = Stages(cache, total=2 + len(DESIGN["phase1"]["scorings"]))
        self.key = digest(
            "cud-stratification-v2", FORMAT, config.model, DESIGN["data"], config.finetune, config.max_length
        )
        self.started = time.perf_counter()
        self._target: str | None = None
        self._model = None

    def log(self, msg: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp} {time.perf_counter() - self.started:7.0f} s] {msg}", file=sys.stderr, flush=True)

    # -- the design record
    def check_design(self) -> None:
        from unlearn_plugins.files import write_json

        current = {"design": DESIGN, "config": asdict(self.config), "authors": self.authors}
        current = json.loads(json.dumps(current))
        path = self.records / "design.json"
        if path.is_file():
            recorded = json.loads(path.read_text())
            if recorded != current:
                raise SystemExit(
                    f"error: {path} records another design or configuration than this file declares; the design "
                    "is fixed before running: restore it, or move the records away to start a new study"
                )
        else:
            write_json(path, current)

    # -- the target
    def target(self) -> str:
        import torch

        from unlearn_plugins.files import write_json
        from unlearn_plugins.training import FinetuneConfig, run_finetune

        if self._target:
            return self._target
        c = self.config
        folder = self.stages.folder("target", "target", self.digest(self.key))
        heldout = [self.samples[i] for i in self.rows["heldout"]]

        def build(tmp: Path):
            data = write_samples(tmp / "train.json", self.samples)
            threads = torch.get_num_threads()
            torch.set_num_threads(c.target_threads)
            try:
                run_finetune(
                    FinetuneConfig(
                        out=str(tmp / "run"),
                        model=c.model,
                        data=data,
                        merge=True,
                        save_steps=0,
                        max_length=c.max_length,
                        seed=0,
                        device=c.device,
                        **c.finetune,
                    )
                )
                model, tok = load(str(tmp / "run" / "merged"), c.device)
                nll = mean_nlls(model, tok, [(s.question, s.answer) for s in heldout], c.max_length)
            finally:
                torch.set_num_threads(threads)
            write_json(
                tmp / "fingerprint.json", {"heldout_nll": nll, "threads": c.target_threads, "torch": torch.__version__}
            )

        self.stages.run("fine-tune the target on 40 TOFU authors", folder, build)
        now = json.loads((folder / "fingerprint.json").read_text())
        path = self.records / "target_fingerprint.json"
        if path.is_file():
            recorded = json.loads(path.read_text())
            gaps = [abs(a - b) for a, b in zip(recorded["heldout_nll"], now["heldout_nll"])]
            if len(gaps) != len(now["heldout_nll"]) or not max(gaps) <= c.fingerprint_tolerance:
                raise SystemExit(
                    f"error: the target in {folder} differs from the recorded one ({path}): the recorded "
                    "scorings belong to another model; move the records away to start over"
                )
            self.log(f"target matches its recorded fingerprint (max |NLL difference| {max(gaps):.1e})")
        else:
            write_json(path, now)
        self._target = str(folder / "run" / "merged")
        return self._target

    def model(self):
        if self._model is None:
            self._model = load(self.target(), self.config.device)
        return self._model

    # -- every row's answer NLL before unlearning (the loss baseline; phase 2's p_before)
    def before(self) -> dict:
        from unlearn_plugins.files import write_json

        path = self.records / "before.json"
        if path.is_file():
            return json.loads(path.read_text())
        started = time.perf_counter()
        self.log("answer NLL of the 800 QA before unlearning ...")
        model, tok = self.model()
        nll = mean_nlls(model, tok, [(s.question, s.answer) for s in self.samples], self.config.max_length)
        out = {"nll": nll, "seconds": round(time.perf_counter() - started, 1)}
        write_json(path, out)
        return out

    # -- one CUD scoring of the query pool
    def scoring(self, name: str) -> dict:
        from unlearn_plugins.files import write_json, write_jsonl
        from unlearn_plugins.scorers.cud import AnchorError, CUDScorer, TrainerAnchorRunner
        from unlearn_plugins.scoring import score_samples

        path = self.records / f"scoring-{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
        c = self.config
        pool_name, seeds = DESIGN["phase1"]["scorings"][name]
        pool_rows, query_rows = self.rows[f"anchor_{pool_name}"], self.rows["query"]
        retain = self.cache / "data" / "anchor_retain_query_pool.json"
        if not retain.is_file():
            write_samples(retain, [self.samples[i] for i in query_rows])
        run_options = {**c.anchor_unlearn, "max_length": c.max_length, "save_steps": 0}
        inner = TrainerAnchorRunner(
            self.target(),
            {**run_options, "retain": str(retain)},
            stop_prob=c.cud["stop_prob"],
            check_steps=c.cud["check_steps"],
        )
        runner = RecordedRunner(
            inner,
            self.records / "anchor_runs" / name,
            {
                "target": self.key,
                "retain": "query pool",
                "options": run_options,
                "stop_prob": c.cud["stop_prob"],
                "check_steps": c.cud["check_steps"],
            },
            self.log,
        )
        options = {k: v for k, v in c.cud.items() if k not in ("stop_prob", "check_steps")}
        scorer = CUDScorer(
            anchor_data=[self.samples[i] for i in pool_rows],
            objectives=list(c.objectives),
            seeds=list(seeds),
            runner=runner,
            max_length=c.max_length,
            cache_dir=str(self.cache / "cud"),
            progress=True,
            **options,
        )
        model, tok = self.model()
        started = time.perf_counter()
        self.log(f"scoring {name}: pool {pool_name} ({len(pool_rows)} QA), seeds {seeds}, {len(query_rows)} query QA")
        record: dict[str, Any] = {
            "name": name,
            "pool": pool_name,
            "seeds": list(seeds),
            "pool_rows": pool_rows,
            "query_rows": query_rows,
        }
        try:
            rows = score_samples(
                scorer, [self.samples[i] for i in query_rows], model=model, tokenizer=tok, scorer_name="cud"
            )
        except AnchorError as exc:
            vote = scorer._vote
            record.update(
                {
                    "scores": None,
                    "error": str(exc),
                    "stable_by_objective": {
                        o: {"easy": [pool_rows[i] for i in e], "hard": [pool_rows[i] for i in h]}
                        for o, (e, h) in vote.by_objective.items()
                    }
                    if vote
                    else None,
                    "anchors": {"easy": [pool_rows[i] for i in vote.easy], "hard": [pool_rows[i] for i in vote.hard]}
                    if vote
                    else None,
                }
            )
            self.log(f"scoring {name}: no CUD scores: {exc}")
        else:
            meta = scorer.last_metadata or {}
            anchors = meta.get("anchors", {}).get("all", {})
            record.update(
                {
                    "scores": {str(i): r["score"] for i, r in zip(query_rows, rows)},
                    "s_E": {str(i): r["s_E"] for i, r in zip(query_rows, rows)},
                    "s_H": {str(i): r["s_H"] for i, r in zip(query_rows, rows)},
                    "anchors": {
                        kind: [pool_rows[a["pool_index"]] for a in anchors.get(kind, [])] for kind in ("easy", "hard")
                    },
                    "anchor_votes": {
                        kind: {
                            str(pool_rows[a["pool_index"]]): a.get("runs_by_objective") for a in anchors.get(kind, [])
                        }
                        for kind in ("easy", "hard")
                    },
                    "stable_by_objective": {
                        o: {kind: [pool_rows[a["pool_index"]] for a in v[kind]] for kind in ("easy", "hard")}
                        for o, v in meta.get("stable_by_objective", {}).items()
                    },
                    "k": meta.get("settings", {}).get("k"),
                    "seed_agreement": {o: v["mean_spearman"] for o, v in meta.get("seed_agreement", {}).items()},
                    "objective_agreement": meta.get("objective_agreement"),
                    "runs": [{k: v for k, v in r.items() if k != "checks"} for r in meta.get("runs", [])],
                    "settings": {k: v for k, v in meta.get("settings", {}).items() if k != "runner"},
                }
            )
            write_jsonl(self.cache / f"scores-{name}.jsonl", rows)  # the full rows (circuit placement), not recorded
        record["seconds"] = round(time.perf_counter() - started, 1)
        write_json(path, record)
        self.log(f"scoring {name}: recorded in {path} ({record['seconds']:.0f} s)")
        return record

    def run(self) -> dict:
        self.records.mkdir(parents=True, exist_ok=True)
        self.check_design()
        self.before()
        for name in DESIGN["phase1"]["scorings"]:
            self.scoring(name)
        return report_phase1(self.records)


def load_samples():
    from unlearn_plugins.data.qa import load_split

    return [s for spec in DESIGN["data"] for s in load_split(spec)]


def load(model: str, device: str | None):
    from unlearn_plugins.models import load_model

    return load_model(model, device=device)


def write_samples(path: Path, samples) -> str:
    from unlearn_plugins.files import write_jsonl

    write_jsonl(path, [s.to_record() for s in samples])
    return str(path)


def mean_nlls(model, tok, pairs, max_length: int, batch_size: int = 8) -> list[float]:
    """Mean answer-token NLL of each (question, answer) pair, as training encodes it."""
    from unlearn_plugins.data.qa import encode_qa
    from unlearn_plugins.likelihood import answer_nll

    encoded = [encode_qa(tok, q, a, max_length=max_length) for q, a in pairs]
    return [s / max(n, 1) for s, n in answer_nll(model, encoded, tok.pad_token_id, batch_size=batch_size)]


# ============================================================================= phase 2 (runs only when phase 1 passes)

#: pilot set j: ``random.Random(3400 + j).sample(query rows, 40)`` (j = 0, 1; never reused)
PILOT_SET_SEED = 3400
#: random set j: ``random.Random(3500 + j).sample(query rows, 40)``
RANDOM_SET_SEED = 3500
#: the run of set number n (random j: n = j; hard k: 24 + k; easy k: 28 + k): seed 100 + n; pilot j: 90 + j
RUN_SEED, PILOT_RUN_SEED = 100, 90
PILOT_EPOCHS = 10
BUDGET_BAND, BUDGET_AIM = (30.0, 70.0), 50.0


def set_plan(scores: dict[int, float], subpools: Sequence[Sequence[int]], query_rows: Sequence[int]) -> dict[str, dict]:
    """Phase 2's sets: per sub-pool k its 40 highest (``hard{k}``) and 40 lowest (``easy{k}``)
    scores; ``random{j}``: 40 QA of the whole query pool. Each with its set number and run seed."""
    p2 = DESIGN["phase2"]
    k, plan = p2["set_size"], {}
    for j in range(p2["random_sets"]):
        rows = sorted(random.Random(RANDOM_SET_SEED + j).sample(list(query_rows), k))
        plan[f"random{j}"] = {"kind": "random", "number": j, "rows": rows}
    base = p2["random_sets"]
    for kind, hardest, offset in (("hard", True, 0), ("easy", False, p2["hard_sets"])):
        for i, pool in enumerate(subpools):
            rows = top_rows({r: scores[r] for r in pool}, k, hardest=hardest)
            plan[f"{kind}{i}"] = {"kind": kind, "number": base + offset + i, "rows": rows}
    for entry in plan.values():
        entry["seed"] = RUN_SEED + entry["number"]
    return plan


def pilot_sets(query_rows: Sequence[int]) -> list[list[int]]:
    k = DESIGN["phase2"]["set_size"]
    return [sorted(random.Random(PILOT_SET_SEED + j).sample(list(query_rows), k)) for j in range(2)]


def choose_budget(pilots: Sequence[dict], heldout_before: Sequence[float]) -> dict:
    """The declared budget rule on the pilots' traces: per whole epoch e, the pilots' mean
    efficacy (points) and mean held-out answer probability; the epochs whose efficacy is within
    30-70 with held-out probability above half the target's qualify; the one nearest 50 is the
    budget (ties: fewer epochs). ``pilots``: {"before": set NLLs, "trace": [{"epoch", "set_nll",
    "heldout_nll"}, ...]}. None qualifies: ``epochs`` None and the reason."""
    target = sum(probs(heldout_before)) / len(heldout_before)
    epochs = sorted(set.intersection(*[{p["epoch"] for p in pilot["trace"]} for pilot in pilots]))
    table = []
    for e in epochs:
        points = [next(p for p in pilot["trace"] if p["epoch"] == e) for pilot in pilots]
        eff = sum(efficacy_points(pilot["before"], p["set_nll"]) for pilot, p in zip(pilots, points)) / len(pilots)
        kept = sum(sum(probs(p["heldout_nll"])) / len(p["heldout_nll"]) for p in points) / len(points)
        ok = BUDGET_BAND[0] <= eff <= BUDGET_BAND[1] and kept > target / 2
        table.append({"epoch": e, "efficacy": eff, "heldout_prob": kept, "qualifies": ok})
    good = [t for t in table if t["qualifies"]]
    if not good:
        return {
            "epochs": None,
            "table": table,
            "target_heldout_prob": target,
            "reason": "no epoch of the pilots reached 30-70% efficacy with held-out probability above half "
            "the target's",
        }
    best = min(good, key=lambda t: (abs(t["efficacy"] - BUDGET_AIM), t["epoch"]))
    return {
        "epochs": best["epoch"],
        "table": table,
        "target_heldout_prob": target,
        "reason": f"epoch {best['epoch']}: pilot efficacy {best['efficacy']:.1f} points, held-out probability "
        f"{best['heldout_prob']:.3f} (target {target:.3f})",
    }


def mdd_of(random_adjusted: Sequence[float]) -> dict:
    """The declared minimum detectable difference (80% power, n1 = 4, n2 = 24, alpha = 0.05 / 6)
    from the random sets' SD of the primary measure, t and normal."""
    p2 = DESIGN["phase2"]
    sd = _sd(random_adjusted)
    alpha = 0.05 / 6
    kw = dict(alpha=alpha, power=0.8)
    n1, n2 = p2["hard_sets"], p2["random_sets"]
    return {
        "sd": sd,
        "n_random": len(random_adjusted),
        "n1": n1,
        "n2": n2,
        "alpha": alpha,
        "t": minimum_detectable_difference(sd, n1, n2, **kw),
        "normal": minimum_detectable_difference(sd, n1, n2, method="normal", **kw),
    }


def analyse_phase2(
    before_nll: Sequence[float],
    heldout_rows: Sequence[int],
    runs: dict[str, dict[str, dict]],
    budgets: dict[str, dict],
    scores: dict[str, dict[int, float]],
) -> dict:
    """Phase 2's figures from its runs: per objective (with a budget) each set's raw and
    damage-adjusted efficacy, the MDD from the random sets, hard - random and easy - random
    (sets as units: Welch t, Welch and bootstrap intervals), Holm over every declared comparison;
    per scorer and objective the Spearman with the per-sample change (random sets' QA), Holm over
    those. ``runs``: objective -> set name -> {"kind", "rows", "nll_after", "heldout_nll_after"}."""
    held_before = [before_nll[i] for i in heldout_rows]
    objectives: dict[str, Any] = {}
    pvalues: dict[str, float] = {}
    for objective, budget in budgets.items():
        if budget.get("epochs") is None:
            objectives[objective] = {"left_out": budget.get("reason")}
            continue
        sets = {}
        for name, r in runs.get(objective, {}).items():
            m = damage_adjusted([before_nll[i] for i in r["rows"]], r["nll_after"], held_before, r["heldout_nll_after"])
            sets[name] = {"kind": r["kind"], **m}
        by_kind = {kind: [s for s in sets.values() if s["kind"] == kind] for kind in ("random", "hard", "easy")}
        entry: dict[str, Any] = {"budget_epochs": budget["epochs"], "sets": sets, "comparisons": {}}
        if len(by_kind["random"]) >= 2:
            entry["mdd"] = mdd_of([s["adjusted"] for s in by_kind["random"]])
        for kind in ("random", "hard", "easy"):
            for measure in ("adjusted", "efficacy"):
                vals = [s[measure] for s in by_kind[kind]]
                entry.setdefault("means", {}).setdefault(kind, {})[measure] = (
                    {"mean": sum(vals) / len(vals), "n": len(vals), "sd": _sd(vals) if len(vals) > 1 else None}
                    if vals
                    else None
                )
        for kind in ("hard", "easy"):
            if by_kind[kind] and by_kind["random"]:
                entry["comparisons"][f"{kind}_minus_random"] = {
                    m: compare_sets([s[m] for s in by_kind[kind]], [s[m] for s in by_kind["random"]])
                    for m in ("adjusted", "efficacy")
                }
                p = entry["comparisons"][f"{kind}_minus_random"]["adjusted"]["p"]
                if p is not None:
                    pvalues[f"{objective}: {kind} - random"] = p
        objectives[objective] = entry
    corrected = holm(pvalues) if pvalues else {}
    for key, p in corrected.items():
        objective, kind = key.split(": ")
        objectives[objective]["comparisons"][kind.replace(" - ", "_minus_")]["adjusted"]["holm_p"] = p
    correlations: dict[str, dict] = {}
    cp: dict[str, float] = {}
    for scorer, sc in scores.items():
        for objective, entry in objectives.items():
            if "left_out" in entry:
                continue
            after: dict[int, list[float]] = {}
            for r in runs.get(objective, {}).values():
                if r["kind"] == "random":
                    for i, x in zip(r["rows"], r["nll_after"]):
                        after.setdefault(i, []).append(x)
            c = change_correlation(sc, dict(enumerate(before_nll)), after)
            correlations.setdefault(scorer, {})[objective] = c
            if c["p"] is not None:
                cp[f"{scorer}/{objective}"] = c["p"]
    for key, p in (holm(cp) if cp else {}).items():
        scorer, objective = key.split("/")
        correlations[scorer][objective]["holm_p"] = p
    return {"objectives": objectives, "holm_family": sorted(pvalues), "correlations": correlations}


def epoch_probe(encoded_set, encoded_heldout, pad_token_id: int, batch_size: int = 8):
    """A Trainer callback: at the end of every epoch, the answer NLL of the set's and the
    held-out QA under the model being trained (eval mode, as the runs' anchor checks)."""
    from transformers import TrainerCallback

    from unlearn_plugins.likelihood import mean_answer_nlls_in_training

    class EpochProbe(TrainerCallback):
        def __init__(self):
            self.trace: list[dict] = []

        def on_epoch_end(self, args, state, control, model=None, **kwargs):
            point = {"epoch": int(round(state.epoch or 0)), "step": int(state.global_step)}
            for key, encoded in (("set_nll", encoded_set), ("heldout_nll", encoded_heldout)):
                point[key] = mean_answer_nlls_in_training(model, args, encoded, pad_token_id, batch_size=batch_size)
            self.trace.append(point)

    return EpochProbe()


class Phase2:
    """Phase 2 on phase 1's target, pools and A012 scores; every run recorded under
    ``RECORDS/phase2/`` as it finishes (a rerun skips what is recorded)."""

    def __init__(self, phase1: "Phase1", unlearn: dict | None = None, mrd: dict | None = None):
        self.p1 = phase1
        self.folder = phase1.records / "phase2"
        c = phase1.config
        self.unlearn = dict(
            unlearn or dict(lr=5e-4, batch_size=4, grad_accum=1, lora_r=16, lora_alpha=32.0, dtype="bf16")
        )
        self.unlearn.update(max_length=c.max_length, save_steps=0)
        self.mrd = dict(mrd or dict(perturbations=100))

    def log(self, msg: str) -> None:
        self.p1.log(msg)

    def gate(self) -> dict:
        """Phase 1's decision: phase 2 runs only when it is made and says go on."""
        d = report_phase1(self.p1.records)["decision"]
        if not d["decided"]:
            raise SystemExit(f"error: phase 1 is unfinished (pending: {', '.join(d['pending'])}); phase 2 waits for it")
        if d["stop"]:
            raise SystemExit("error: phase 1's stop rule fired (" + "; ".join(d["reasons"]) + "): the study ends there")
        return d

    def retain_file(self) -> str:
        path = self.p1.cache / "data" / "phase2_retain_anchor_pools.json"
        if not path.is_file():
            rows = self.p1.rows["anchor_A"] + self.p1.rows["anchor_B"]
            write_samples(path, [self.p1.samples[i] for i in rows])
        return str(path)

    def train(self, rows: list[int], objective: str, seed: int, epochs: int) -> list[dict]:
        """One unlearning run of ``rows``; returns the probe's trace (one point per epoch)."""
        import tempfile

        from unlearn_plugins.data.qa import encode_samples
        from unlearn_plugins.process import release_memory
        from unlearn_plugins.training.config import UnlearnConfig
        from unlearn_plugins.training.run import run_unlearning

        _, tok = self.p1.model()
        samples = [self.p1.samples[i] for i in rows]
        heldout = [self.p1.samples[i] for i in self.p1.rows["heldout"]]
        length = self.p1.config.max_length
        probe = epoch_probe(
            encode_samples(tok, samples, max_length=length),
            encode_samples(tok, heldout, max_length=length),
            tok.pad_token_id,
        )
        with tempfile.TemporaryDirectory(prefix="cud-v2-run-") as tmp:
            forget = write_samples(Path(tmp) / "forget.json", samples)
            config = UnlearnConfig(
                out=str(Path(tmp) / "run"),
                model=self.p1.target(),
                forget=forget,
                retain=self.retain_file(),
                objective=objective,
                seed=seed,
                epochs=float(epochs),
                device=self.p1.config.device,
                **self.unlearn,
            )
            run_unlearning(config, callbacks=[probe])
        release_memory()
        return probe.trace

    def pilot(self, objective: str) -> dict:
        from unlearn_plugins.files import write_json

        path = self.folder / f"pilot-{objective}.json"
        if path.is_file():
            return json.loads(path.read_text())
        before = self.p1.before()["nll"]
        pilots = []
        for j, rows in enumerate(pilot_sets(self.p1.rows["query"])):
            started = time.perf_counter()
            self.log(f"phase 2 pilot {objective} {j}: {PILOT_EPOCHS} epochs on {len(rows)} QA ...")
            trace = self.train(rows, objective, PILOT_RUN_SEED + j, PILOT_EPOCHS)
            pilots.append(
                {
                    "rows": rows,
                    "before": [before[i] for i in rows],
                    "trace": trace,
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
        budget = choose_budget(pilots, [before[i] for i in self.p1.rows["heldout"]])
        record = {"objective": objective, "pilots": pilots, "budget": budget}
        write_json(path, record)
        self.log(f"phase 2 budget {objective}: {budget['reason']}")
        return record

    def run_set(self, objective: str, name: str, entry: dict, epochs: int) -> dict:
        from unlearn_plugins.files import write_json

        path = self.folder / "runs" / objective / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
        started = time.perf_counter()
        trace = self.train(entry["rows"], objective, entry["seed"], epochs)
        last = trace[-1]
        record = {
            "objective": objective,
            "set": name,
            **entry,
            "epochs": epochs,
            "nll_after": last["set_nll"],
            "heldout_nll_after": last["heldout_nll"],
            "seconds": round(time.perf_counter() - started, 1),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, record)
        self.log(f"phase 2 {objective} {name}: {record['seconds']:.0f} s")
        return record

    def mrd_scores(self) -> dict[int, float]:
        from unlearn_plugins.files import write_json
        from unlearn_plugins.host import create
        from unlearn_plugins.scoring import score_samples

        path = self.folder / "scores-mrd.json"
        if not path.is_file():
            model, tok = self.p1.model()
            query = self.p1.rows["query"]
            scorer = create("difficulty_scorer", "mrd", max_length=self.p1.config.max_length, **self.mrd)
            started = time.perf_counter()
            rows = score_samples(
                scorer, [self.p1.samples[i] for i in query], model=model, tokenizer=tok, scorer_name="mrd"
            )
            write_json(
                path,
                {
                    "options": self.mrd,
                    "scores": {str(i): r["score"] for i, r in zip(query, rows)},
                    "seconds": round(time.perf_counter() - started, 1),
                },
            )
        return {int(r): v for r, v in json.loads(path.read_text())["scores"].items()}

    def run(self) -> dict:
        self.gate()
        self.folder.mkdir(parents=True, exist_ok=True)
        scoring = self.p1.scoring(DESIGN["phase1"]["primary_scoring"])
        scores = {int(r): v for r, v in scoring["scores"].items()}
        subpools = [self.p1.rows[f"subpool{j}"] for j in range(DESIGN["pools"]["query_subpools"])]
        plan = set_plan(scores, subpools, self.p1.rows["query"])
        before = self.p1.before()["nll"]
        for objective in DESIGN["phase2"]["objectives"]:
            epochs = self.pilot(objective)["budget"]["epochs"]
            if epochs is None:
                continue
            randoms = {n: e for n, e in plan.items() if e["kind"] == "random"}
            for name, entry in randoms.items():
                self.run_set(objective, name, entry, epochs)
            runs = [json.loads((self.folder / "runs" / objective / f"{n}.json").read_text()) for n in randoms]
            held = [before[i] for i in self.p1.rows["heldout"]]
            adjusted = [
                damage_adjusted([before[i] for i in r["rows"]], r["nll_after"], held, r["heldout_nll_after"])[
                    "adjusted"
                ]
                for r in runs
            ]
            mdd = mdd_of(adjusted)  # declared: stated before any stratified set is looked at
            from unlearn_plugins.files import write_json

            if not (self.folder / f"mdd-{objective}.json").is_file():
                write_json(self.folder / f"mdd-{objective}.json", mdd)
            self.log(
                f"phase 2 {objective}: minimum detectable difference at 80% power {mdd['t']:.1f} points "
                f"(t; normal {mdd['normal']:.1f}; random sets' SD {mdd['sd']:.1f})"
            )
            for name, entry in plan.items():
                if entry["kind"] != "random":
                    self.run_set(objective, name, entry, epochs)
        self.mrd_scores()
        return report_phase2(self.p1.records)


def read_phase2(records: Path) -> dict:
    from unlearn_plugins.study.records import unpacked

    folder = unpacked(records) / "phase2"
    out: dict[str, Any] = {"pilots": {}, "runs": {}, "mdd": {}}
    for path in sorted(folder.glob("pilot-*.json")):
        record = json.loads(path.read_text())
        out["pilots"][record["objective"]] = record
    for path in sorted(folder.glob("runs/*/*.json")):
        record = json.loads(path.read_text())
        out["runs"].setdefault(record["objective"], {})[record["set"]] = record
    for path in sorted(folder.glob("mdd-*.json")):
        out["mdd"][path.stem.removeprefix("mdd-")] = json.loads(path.read_text())
    mrd = folder / "scores-mrd.json"
    out["mrd"] = {int(r): v for r, v in json.loads(mrd.read_text())["scores"].items()} if mrd.is_file() else None
    return out


def report_phase2(records: Path) -> dict | None:
    """Phase 2's figures from the records alone (None before any pilot is recorded)."""
    rec = read_records(records)
    p2 = read_phase2(records)
    if not p2["pilots"] or rec["before"] is None:
        return None
    before = rec["before"]["nll"]
    heldout_rows = rows_of(rec["design"]["authors"]["heldout"])
    scoring = rec["scorings"].get(DESIGN["phase1"]["primary_scoring"]) or {}
    scores = {}
    if scoring.get("scores"):
        scores["cud"] = {int(r): v for r, v in scoring["scores"].items()}
        query = [int(r) for r in scoring["scores"]]
        scores["loss"] = {r: -before[r] for r in query}  # the loss scorer: negated answer NLL
    if p2["mrd"]:
        scores["mrd"] = p2["mrd"]
    budgets = {o: p["budget"] for o, p in p2["pilots"].items()}
    out = analyse_phase2(before, heldout_rows, p2["runs"], budgets, scores)
    for objective, mdd in p2["mdd"].items():  # the MDD as it was stated before the stratified runs
        if objective in out["objectives"]:
            out["objectives"][objective]["mdd_stated"] = mdd
    out["budgets"] = budgets
    n_sets = DESIGN["phase2"]["random_sets"] + DESIGN["phase2"]["hard_sets"] + DESIGN["phase2"]["easy_sets"]
    out["complete"] = all(
        len(p2["runs"].get(o, {})) == n_sets for o, b in budgets.items() if b.get("epochs") is not None
    ) and len(budgets) == len(DESIGN["phase2"]["objectives"])
    return out


# ============================================================================= report (records only)


V1_RECORDS = Path(__file__).resolve().parent / "results" / "cud_stratification"
V1_HELDOUT_ROWS = list(range(40, 80))  # v1's held-out authors 2 and 3 of forget10_perturbed


def reread_v1(v1_records: Path = V1_RECORDS) -> dict:
    """v1's committed records (bench/cud_stratification.py) read with v2's measures, no run
    needed: per objective and set, the raw and the damage-adjusted efficacy (mean over v1's two
    seeds) and each set's difference to the mean of v1's 3 random sets; per scorer and
    objective the Spearman of the score with the per-sample *change* in answer NLL on the random
    sets' QA (v1 correlated it with the post level, which holds the pre level). Descriptive: v1
    had 3 random sets and one hard and one easy set per scorer, too few units for a test."""
    from unlearn_plugins.study.records import unpacked

    source, v1_records = v1_records.name, unpacked(v1_records)  # packed or loose

    def one(pattern: str) -> Path:
        found = sorted(v1_records.glob(pattern))
        if len(found) != 1:
            raise SystemExit(f"error: {v1_records}: expected one {pattern}, found {len(found)}")
        return found[0]

    before = json.loads((one("before-*") / "before.json").read_text())["nll"]
    heldout_before = [before[i] for i in V1_HELDOUT_ROWS]
    runs: dict[tuple[str, str], list[dict]] = {}
    for folder in sorted(v1_records.glob("run-*")):
        result = json.loads((folder / "result.json").read_text())
        name = folder.name.split("-")
        set_name, objective = name[1], name[2]
        measure = damage_adjusted(
            [before[i] for i in result["rows"]], result["nll_after"], heldout_before, result["heldout_nll_after"]
        )
        runs.setdefault((objective, set_name), []).append(
            {**measure, "rows": result["rows"], "after": result["nll_after"]}
        )
    objectives = sorted({o for o, _ in runs})
    sets: dict[str, dict] = {}
    for objective in objectives:
        per_set = {
            name: {k: sum(r[k] for r in rs) / len(rs) for k in ("efficacy", "heldout_drop", "adjusted")}
            | {"runs": len(rs)}
            for (o, name), rs in sorted(runs.items())
            if o == objective
        }
        randoms = [v for name, v in per_set.items() if name.startswith("random")]
        base = {k: sum(v[k] for v in randoms) / len(randoms) for k in ("efficacy", "heldout_drop", "adjusted")}
        for name, v in per_set.items():
            if not name.startswith("random"):
                v["minus_random"] = {k: v[k] - base[k] for k in base}
        sets[objective] = {
            "random_mean": base,
            "random_sets": [v for n, v in per_set.items() if n.startswith("random")],
            "sets": per_set,
        }
    correlations: dict[str, dict] = {}
    for folder in sorted(v1_records.glob("scores-*")):
        scorer = folder.name.split("-")[1]
        scores = {}
        for line in (folder / "scores.jsonl").read_text().splitlines():
            row = json.loads(line)
            if not row.get("anchor"):
                scores[row["index"]] = float(row["score"])
        for objective in objectives:
            after: dict[int, list[float]] = {}
            for (o, name), rs in runs.items():
                if o == objective and name.startswith("random"):
                    for r in rs:
                        for i, x in zip(r["rows"], r["after"]):
                            after.setdefault(i, []).append(x)
            correlations.setdefault(scorer, {})[objective] = change_correlation(scores, dict(enumerate(before)), after)
    return {
        "source": source,
        "heldout_rows": [V1_HELDOUT_ROWS[0], V1_HELDOUT_ROWS[-1]],
        "objectives": sets,
        "change_correlations": correlations,
    }


def read_records(records: Path) -> dict:
    """Everything the report needs, from the records folder alone (packed or loose)."""
    from unlearn_plugins.study.records import unpacked

    records = unpacked(records)
    out: dict[str, Any] = {"scorings": {}, "anchor_runs": {}}
    design = records / "design.json"
    out["design"] = json.loads(design.read_text()) if design.is_file() else None
    before = records / "before.json"
    out["before"] = json.loads(before.read_text()) if before.is_file() else None
    for name in DESIGN["phase1"]["scorings"]:
        path = records / f"scoring-{name}.json"
        if path.is_file():
            out["scorings"][name] = json.loads(path.read_text())
        runs = sorted((records / "anchor_runs" / name).glob("*.json"))
        out["anchor_runs"][name] = [json.loads(p.read_text()) for p in runs]
    return out


def report_phase1(records: Path) -> dict:
    """Phase 1's figures and decision from the records."""
    from scipy.stats import spearmanr

    rec = read_records(records)
    p1 = DESIGN["phase1"]
    scores: dict[str, dict[int, float] | None] = {}
    for name, s in rec["scorings"].items():
        scores[name] = None if s.get("scores") is None else {int(r): v for r, v in s["scores"].items()}
    decision = stop_rule(scores, p1["comparisons"], k=p1["top_k"], threshold=p1["threshold"])
    shown = stop_rule(scores, p1["shown_not_judged"], k=p1["top_k"], threshold=p1["threshold"])
    per_scoring = {}
    authors_of = {}
    if rec["design"]:
        for name, authors in rec["design"]["authors"].items():
            authors_of[name] = authors
    for name, s in rec["scorings"].items():
        entry: dict[str, Any] = {"pool": s["pool"], "seeds": s["seeds"], "seconds": s.get("seconds")}
        anchors = s.get("anchors") or {"easy": [], "hard": []}
        entry["anchors"] = {kind: len(anchors[kind]) for kind in ("easy", "hard")}
        entry["anchor_rows"] = {kind: sorted(anchors[kind]) for kind in ("easy", "hard")}
        entry["anchor_authors"] = {
            kind: sorted({r // QA_PER_AUTHOR for r in anchors[kind]}) for kind in ("easy", "hard")
        }
        if s.get("scores") is None:
            entry["error"] = s.get("error")
        else:
            sim = [v for d in (s["s_E"], s["s_H"]) for v in d.values()]
            entry["ties"] = sum(1 for r, v in s["s_E"].items() if v == s["s_H"].get(r))
            vals = list(s["scores"].values())
            entry.update(
                {
                    "similarity_range": [min(sim), max(sim)],
                    "score_range": [min(vals), max(vals)],
                    "score_sd": float(_sd(vals)),
                    "seed_agreement": s.get("seed_agreement"),
                }
            )
            if rec["before"]:
                nll = rec["before"]["nll"]
                rows = sorted(int(r) for r in s["scores"])
                rho = spearmanr([s["scores"][str(r)] for r in rows], [nll[r] for r in rows]).statistic
                entry["spearman_with_loss_before"] = float(rho)
        runs = rec["anchor_runs"].get(name, [])
        entry["anchor_runs"] = [
            {
                "objective": r["objective"],
                "seed": r["seed"],
                "steps": r["info"].get("steps"),
                "pool_prob": r["info"].get("forget_prob"),
                "seconds": r["info"].get("seconds"),
            }
            for r in runs
        ]
        per_scoring[name] = entry
    return {
        "phase": 1,
        "complete": len(rec["scorings"]) == len(p1["scorings"]),
        "decision": decision,
        "shown_not_judged": shown["comparisons"],
        "scorings": per_scoring,
        "design": DESIGN,
    }


def _sd(values: Sequence[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / max(len(values) - 1, 1))


def markdown_phase1(out: dict) -> str:
    d = out["decision"]
    c = StudyConfig()
    run = c.anchor_unlearn
    if d["decided"]:
        verdict = (
            "**Stop rule fired: CUD is not stable at this scale; the study stops after phase 1.**"
            if d["stop"]
            else "**Stop rule did not fire: CUD's ranking is stable enough; phase 2 may run.**"
        )
    else:
        verdict = f"**Interim: phase 1 is unfinished (pending: {', '.join(d['pending'])}); no decision yet.**"
    lines = [
        "# CUD stratification v2: phase 1, reliability",
        "",
        verdict,
        "",
        "CUD with the paper's scoring (binary circuit masks, anchors voted by GradDiff, NPO, SimNPO, RMU and UNDIAL "
        f"x 3 seeds) but not its anchor runs (ours: LoRA r {run['lora_r']}, lr {run['lr']:g}, batch "
        f"{run['batch_size']}, at most {run['epochs']:g} epochs, stopped once the pool's mean answer probability "
        f"fell below {c.cud['stop_prob']}; the paper's code trains all weights for the whole budget, with each "
        "method's own settings) scored the 560-QA query pool three times: anchor pool A with anchor-run seeds 0-2 (A012) and "
        "3-5 (A345), and the disjoint anchor pool B with seeds 0-2 (B012). Stop rule (declared before running): "
        f"phase 2 needs, in both declared comparisons, Spearman >= {d['threshold']} and top-{d['k']} hard and easy "
        f"overlaps >= {d['threshold']} (fraction of {d['k']}; chance {d['k']}/560 = {d['k'] / 560:.2f}).",
        "",
        "| comparison | scorings | Spearman [95% interval] | top-40 hard overlap | top-40 easy overlap | passes |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for name, c in {**d["comparisons"], **{f"{k} (shown)": v for k, v in out["shown_not_judged"].items()}}.items():
        pair = " vs ".join(c["scorings"])
        if "undefined" in c:
            lines.append(f"| {name} | {pair} | {c['undefined']} | | | no |")
            continue
        ok = all(c[m] is not None and c[m] >= d["threshold"] for m in ("spearman", "hard_overlap", "easy_overlap"))
        rho = "n/a" if c["spearman"] is None else f"{c['spearman']:+.2f}"
        if c.get("spearman_ci"):
            rho += f" [{c['spearman_ci'][0]:+.2f}, {c['spearman_ci'][1]:+.2f}]"
        lines.append(
            f"| {name} | {pair} | {rho} | {c['hard_overlap']:.2f} ({c['hard_shared']}/{c['k']}) | "
            f"{c['easy_overlap']:.2f} ({c['easy_shared']}/{c['k']}) | "
            f"{'—' if name.endswith('(shown)') else ('yes' if ok else 'no')} |"
        )
    if d["reasons"]:
        lines += ["", "Why it stops: " + "; ".join(d["reasons"]) + "."]
    judged = [c for c in d["comparisons"].values() if c.get("spearman_ci")]
    if judged:
        widest = max(c["spearman_ci"][1] - c["spearman_ci"][0] for c in judged)
        highest = max(c["spearman_ci"][1] for c in judged)
        lines += [
            "",
            f"What the design could see: over {judged[0]['n']} QA a Spearman is known to within +-{widest / 2:.2f} "
            f"(95% Fisher-z interval, Bonett-Wright standard error), so a ranking as reliable as the threshold "
            f"({d['threshold']}) could not have been missed: the highest upper bound of the judged comparisons is "
            f"{highest:+.2f}. A top-{d['k']} overlap of {d['threshold']} is {d['threshold'] * d['k']:.0f} shared QA "
            f"where chance shares {d['k'] * d['k'] / judged[0]['n']:.1f}.",
        ]
    same_pool = []
    for c in d["comparisons"].values():
        x, y = c["scorings"]
        sx, sy = out["scorings"].get(x, {}), out["scorings"].get(y, {})
        if (
            sx.get("pool") is not None
            and sx.get("pool") == sy.get("pool")
            and "anchor_rows" in sx
            and "anchor_rows" in sy
        ):
            shared = {k: len(set(sx["anchor_rows"][k]) & set(sy["anchor_rows"][k])) for k in ("easy", "hard")}
            same_pool.append(
                f"{x} and {y} (the same anchor pool, other anchor-run seeds) share {shared['easy']} of "
                f"{sx['anchors']['easy']} / {sy['anchors']['easy']} easy and {shared['hard']} of "
                f"{sx['anchors']['hard']} / {sy['anchors']['hard']} hard anchors"
            )
    if same_pool:
        lines += [
            "",
            "Where it starts: the vote picks few anchors, and other seeds pick others: " + "; ".join(same_pool) + ".",
        ]
    lines += [
        "",
        "| scoring | pool | seeds | easy / hard anchors (authors) | anchor-run seed agreement (mean Spearman) "
        "| similarity range | score range (SD) | QA scored 0.5 (s_E = s_H) | Spearman with loss before | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | ---: | --- | ---: |",
    ]
    for name, s in out["scorings"].items():
        anchors = (
            f"{s['anchors']['easy']} ({', '.join(map(str, s['anchor_authors']['easy']))}) / "
            f"{s['anchors']['hard']} ({', '.join(map(str, s['anchor_authors']['hard']))})"
        )
        minutes = f"{s['seconds'] / 60:.0f}" if s.get("seconds") else ""
        if "error" in s:
            lines.append(
                f"| {name} | {s['pool']} | {s['seeds']} | {anchors} | no scores: {s['error']} | | | | | {minutes} |"
            )
            continue
        agree = ", ".join(f"{o} {v:.2f}" for o, v in (s.get("seed_agreement") or {}).items() if v is not None)
        lines.append(
            f"| {name} | {s['pool']} | {s['seeds']} | {anchors} | {agree} | {s['similarity_range'][0]:.3f}-"
            f"{s['similarity_range'][1]:.3f} | {s['score_range'][0]:.3f}-{s['score_range'][1]:.3f} "
            f"({s['score_sd']:.3f}) | {s.get('ties', '')} | {s.get('spearman_with_loss_before', float('nan')):+.2f} "
            f"| {minutes} |"
        )
    lines += ["", "Anchor runs (steps until the pool's mean answer probability fell below 0.1, at most 3 epochs):", ""]
    for name, s in out["scorings"].items():
        runs = ", ".join(f"{r['objective']}/{r['seed']}: {r['steps']}" for r in s["anchor_runs"])
        lines.append(f"- {name}: {runs}")
    return "\n".join(lines) + "\n"


# ============================================================================= main


def markdown_phase2(p2: dict) -> str:
    """Phase 2's section of the report."""
    lines = ["", "# Phase 2, stratification", ""]
    if not p2.get("complete"):
        lines += ["**Interim: not every phase-2 run is recorded yet.**", ""]
    lines += ["Budgets (declared rule on 2 random pilot sets; efficacy in points, held-out answer probability):", ""]
    for objective, b in p2["budgets"].items():
        reason = b.get("reason") or f"{b.get('epochs')} epochs"
        lines.append(f"- {objective}: " + (reason if b.get("epochs") else f"left out: {reason}"))
    lines += [
        "",
        "Minimum detectable difference of set means at 80% power (stated before the stratified sets were "
        "run; pooled t, n1 = 4, n2 = 24, alpha = 0.05/6, the random sets' SD of the damage-adjusted efficacy):",
        "",
    ]
    for objective, o in p2["objectives"].items():
        mdd = o.get("mdd_stated") or o.get("mdd")
        if mdd:
            lines.append(
                f"- {objective}: {mdd['t']:.1f} points (normal approximation {mdd['normal']:.1f}; SD "
                f"{mdd['sd']:.1f} over {mdd.get('n_random', mdd['n2'])} random sets)"
            )
    lines += [
        "",
        "| objective | set kind | sets | damage-adjusted efficacy (mean) | raw efficacy (mean) | minus random: "
        "damage-adjusted [95% Welch; bootstrap] | Welch p | Holm p | minus random: raw |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for objective, o in p2["objectives"].items():
        if "left_out" in o:
            lines.append(f"| {objective} | left out | | | | {o['left_out']} | | | |")
            continue
        for kind in ("random", "hard", "easy"):
            m = o["means"][kind]
            if not m["adjusted"]:
                continue
            row = f"| {objective} | {kind} | {m['adjusted']['n']} | {m['adjusted']['mean']:.1f} | {m['efficacy']['mean']:.1f} |"
            c = o["comparisons"].get(f"{kind}_minus_random")
            if c:
                a, raw = c["adjusted"], c["efficacy"]
                ci = f"[{a['ci'][0]:+.1f}, {a['ci'][1]:+.1f}]" if a.get("ci") else "n/a"
                boot = f"[{a['ci_boot'][0]:+.1f}, {a['ci_boot'][1]:+.1f}]" if a.get("ci_boot") else "n/a"
                p = "n/a" if a.get("p") is None else f"{a['p']:.3g}"
                hp = "n/a" if a.get("holm_p") is None else f"{a['holm_p']:.3g}"
                row += f" {a['diff']:+.1f} {ci}; {boot} | {p} | {hp} | {raw['diff']:+.1f} |"
            else:
                row += " | | | |"
            lines.append(row)
    lines += [
        "",
        "Per-sample Spearman of each score with the change in answer NLL (post - pre) on the random sets' "
        "QA (negative: QA scored hard lost less); Holm over scorer x objective:",
        "",
        "| scorer | " + " | ".join(o for o in p2["objectives"] if "left_out" not in p2["objectives"][o]) + " |",
        "| --- |" + " --- |" * sum("left_out" not in o for o in p2["objectives"].values()),
    ]
    for scorer, per in p2["correlations"].items():
        cells = []
        for c in per.values():
            cells.append(
                "n/a"
                if c["rho"] is None
                else f"{c['rho']:+.2f} (Holm p {c.get('holm_p', float('nan')):.2g}, n {c['n']})"
            )
        lines.append(f"| {scorer} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_report(out: dict, records: Path, path: Path) -> None:
    """Phase 2: each set's damage-adjusted efficacy per objective and kind (points: sets; bars:
    means). Before phase 2: phase 1's score agreement (one scatter per declared comparison)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p2 = out.get("phase2")
    if p2:
        objectives = [o for o, v in p2["objectives"].items() if "left_out" not in v]
        fig, axes = plt.subplots(1, max(len(objectives), 1), figsize=(4 * max(len(objectives), 1), 4), squeeze=False)
        for ax, objective in zip(axes[0], objectives):
            sets = p2["objectives"][objective]["sets"]
            for x, kind in enumerate(("random", "hard", "easy")):
                vals = [s["adjusted"] for s in sets.values() if s["kind"] == kind]
                ax.scatter([x + random.Random(i).uniform(-0.15, 0.15) for i in range(len(vals))], vals, s=12)
                if vals:
                    ax.hlines(sum(vals) / len(vals), x - 0.3, x + 0.3, color="black")
            ax.set_xticks([0, 1, 2], ["random", "hard", "easy"])
            ax.set_title(objective)
            ax.set_ylabel("damage-adjusted efficacy (points)")
    else:
        scorings = read_records(records)["scorings"]
        pairs = [tuple(v) for v in DESIGN["phase1"]["comparisons"].values()]
        fig, axes = plt.subplots(1, len(pairs), figsize=(4.5 * len(pairs), 4), squeeze=False)
        for ax, (x, y) in zip(axes[0], pairs):
            a = (scorings.get(x) or {}).get("scores")
            b = (scorings.get(y) or {}).get("scores")
            if a and b:
                rows = sorted(set(a) & set(b))
                ax.scatter([a[r] for r in rows], [b[r] for r in rows], s=5)
            else:
                ax.text(0.5, 0.5, "not scored yet", ha="center", transform=ax.transAxes)
            ax.set_xlabel(f"CUD score, {x}")
            ax.set_ylabel(f"CUD score, {y}")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "command",
        choices=("phase1", "phase2", "report", "design", "v1"),
        help="phase1: run (or resume) the reliability scorings; phase2: run (or resume) the stratification, "
        "only after phase 1 decided to go on; report: write the report from the records alone; design: print "
        "the declared design and the pools; v1: v1's records read with v2's measures (damage-adjusted "
        "efficacy, change correlations), as JSON",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="models, EAP-IG matrices (default $UNLEARN_CACHE_DIR/study/cud_stratification_v2)",
    )
    p.add_argument("--records", type=Path, default=RECORDS, help="the study's records (default: %(default)s)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "docs" / "study",
        help="report folder (default: %(default)s)",
    )
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)

    from unlearn_plugins.files import write_json

    if args.command == "v1":
        print(json.dumps(reread_v1(), indent=1))
        return 0
    if args.command == "design":
        print(json.dumps({"design": DESIGN, "authors": author_pools()}, indent=1))
        return 0
    if args.command in ("phase1", "phase2"):
        from unlearn_plugins.models import cache_dir
        from unlearn_plugins.process import quiet_libraries

        cache = args.cache or cache_dir() / "study" / "cud_stratification_v2"
        study = Phase1(StudyConfig(device=args.device), cache, args.records)
        with quiet_libraries():
            if args.command == "phase1":
                study.run()
            else:
                study.check_design()
                Phase2(study).run()
    out = report_phase1(args.records)
    out["phase2"] = report_phase2(args.records)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "cud_stratification_v2.json", out)
    text = markdown_phase1(out) + (markdown_phase2(out["phase2"]) if out["phase2"] else "")
    (args.out / "cud_stratification_v2.md").write_text(text)
    plot_report(out, args.records, args.out / "cud_stratification_v2.png")
    d = out["decision"]
    print(
        json.dumps(
            {
                "study": "cud_stratification_v2",
                "phase": 1,
                "complete": out["complete"],
                "decided": d["decided"],
                "stop": d["stop"],
                "reasons": d["reasons"],
                "comparisons": {
                    k: {m: v.get(m) for m in ("spearman", "hard_overlap", "easy_overlap")}
                    for k, v in d["comparisons"].items()
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
