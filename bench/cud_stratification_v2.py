"""CUD stratification v2 (issue 35): a study that can decide whether CUD's hard and easy sets unlearn
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

**Phase 1, reliability** (this file runs it). The query pool is scored three times with CUD as
the paper defines it, the scorer's defaults: binary circuit masks (cosine of 0/1 edge masks),
anchors voted by the five methods (GradDiff, NPO, SimNPO, RMU, UNDIAL x 3 seeds; kept by 2 of 3
seeds, then 3 of 5 methods), k = pool/8 = 10, greedy 75-edge circuits, EAP-IG inputs mode with 5
steps. Anchor runs as v1 (LoRA r 16, lr 1e-3, batch 2, at most 3 epochs, stopped when the pool's
mean answer probability falls below 0.1, checked every 2 steps):

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

**Phase 2, stratification** (declared now; runs only if phase 1 passes; not yet implemented):

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
    python bench/cud_stratification_v2.py report --out docs/study
    python bench/cud_stratification_v2.py v1     # v1's records read with these measures (README)
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


def agreement(a: dict[int, float], b: dict[int, float], k: int) -> dict:
    """How two scorings of the same rows agree: Spearman, and the overlap of their top-k hard and
    top-k easy sets as a fraction of k (``chance``: the expected overlap of random sets, k / n)."""
    from scipy.stats import spearmanr

    rows = sorted(set(a) & set(b))
    if len(rows) != len(a) or len(rows) != len(b):
        raise ValueError("the two scorings cover different rows")
    rho = float(spearmanr([a[r] for r in rows], [b[r] for r in rows]).statistic)
    out = {"spearman": None if math.isnan(rho) else rho, "n": len(rows), "k": k, "chance": k / len(rows)}
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
    # CUD as the paper defines it: everything not given here is the scorer's default
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
    from unlearn_plugins.data.tofu import load_split

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
    from unlearn_plugins.data.tofu import encode_qa
    from unlearn_plugins.likelihood import answer_nll

    encoded = [encode_qa(tok, q, a, max_length=max_length) for q, a in pairs]
    return [s / max(n, 1) for s, n in answer_nll(model, encoded, tok.pad_token_id, batch_size=batch_size)]


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
        "source": str(v1_records.name),
        "heldout_rows": [V1_HELDOUT_ROWS[0], V1_HELDOUT_ROWS[-1]],
        "objectives": sets,
        "change_correlations": correlations,
    }


def read_records(records: Path) -> dict:
    """Everything the report needs, from the records folder alone."""
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
        entry["anchor_authors"] = {
            kind: sorted({r // QA_PER_AUTHOR for r in anchors[kind]}) for kind in ("easy", "hard")
        }
        if s.get("scores") is None:
            entry["error"] = s.get("error")
        else:
            sim = [v for d in (s["s_E"], s["s_H"]) for v in d.values()]
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
        "CUD as the paper defines it (binary circuit masks, anchors voted by GradDiff, NPO, SimNPO, RMU and UNDIAL "
        "x 3 seeds) scored the 560-QA query pool three times: anchor pool A with anchor-run seeds 0-2 (A012) and "
        "3-5 (A345), and the disjoint anchor pool B with seeds 0-2 (B012). Stop rule (declared before running): "
        f"phase 2 needs, in both declared comparisons, Spearman >= {d['threshold']} and top-{d['k']} hard and easy "
        f"overlaps >= {d['threshold']} (fraction of {d['k']}; chance {d['k']}/560 = {d['k'] / 560:.2f}).",
        "",
        "| comparison | scorings | Spearman | top-40 hard overlap | top-40 easy overlap | passes |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for name, c in {**d["comparisons"], **{f"{k} (shown)": v for k, v in out["shown_not_judged"].items()}}.items():
        pair = " vs ".join(c["scorings"])
        if "undefined" in c:
            lines.append(f"| {name} | {pair} | {c['undefined']} | | | no |")
            continue
        ok = all(c[m] is not None and c[m] >= d["threshold"] for m in ("spearman", "hard_overlap", "easy_overlap"))
        rho = "n/a" if c["spearman"] is None else f"{c['spearman']:+.2f}"
        lines.append(
            f"| {name} | {pair} | {rho} | {c['hard_overlap']:.2f} ({c['hard_shared']}/{c['k']}) | "
            f"{c['easy_overlap']:.2f} ({c['easy_shared']}/{c['k']}) | "
            f"{'—' if name.endswith('(shown)') else ('yes' if ok else 'no')} |"
        )
    if d["reasons"]:
        lines += ["", "Why it stops: " + "; ".join(d["reasons"]) + "."]
    lines += [
        "",
        "| scoring | pool | seeds | easy / hard anchors (authors) | anchor-run seed agreement (mean Spearman) "
        "| similarity range | score range (SD) | Spearman with loss before | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | ---: |",
    ]
    for name, s in out["scorings"].items():
        anchors = (
            f"{s['anchors']['easy']} ({', '.join(map(str, s['anchor_authors']['easy']))}) / "
            f"{s['anchors']['hard']} ({', '.join(map(str, s['anchor_authors']['hard']))})"
        )
        minutes = f"{s['seconds'] / 60:.0f}" if s.get("seconds") else ""
        if "error" in s:
            lines.append(
                f"| {name} | {s['pool']} | {s['seeds']} | {anchors} | no scores: {s['error']} | | | | {minutes} |"
            )
            continue
        agree = ", ".join(f"{o} {v:.2f}" for o, v in (s.get("seed_agreement") or {}).items() if v is not None)
        lines.append(
            f"| {name} | {s['pool']} | {s['seeds']} | {anchors} | {agree} | {s['similarity_range'][0]:.3f}-"
            f"{s['similarity_range'][1]:.3f} | {s['score_range'][0]:.3f}-{s['score_range'][1]:.3f} "
            f"({s['score_sd']:.3f}) | {s.get('spearman_with_loss_before', float('nan')):+.2f} | {minutes} |"
        )
    lines += ["", "Anchor runs (steps until the pool's mean answer probability fell below 0.1, at most 3 epochs):", ""]
    for name, s in out["scorings"].items():
        runs = ", ".join(f"{r['objective']}/{r['seed']}: {r['steps']}" for r in s["anchor_runs"])
        lines.append(f"- {name}: {runs}")
    return "\n".join(lines) + "\n"


# ============================================================================= main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "command",
        choices=("phase1", "report", "design", "v1"),
        help="phase1: run (or resume) the reliability scorings; report: write the report from the "
        "records alone; design: print the declared design and the pools; v1: v1's records read "
        "with v2's measures (damage-adjusted efficacy, change correlations), as JSON",
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
    if args.command == "phase1":
        from unlearn_plugins.models import cache_dir

        cache = args.cache or cache_dir() / "study" / "cud_stratification_v2"
        study = Phase1(StudyConfig(device=args.device), cache, args.records)
        from unlearn_plugins.process import quiet_libraries

        with quiet_libraries():
            out = study.run()
    else:
        out = report_phase1(args.records)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "cud_stratification_v2.json", out)
    (args.out / "cud_stratification_v2.md").write_text(markdown_phase1(out))
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
