"""Statistics for a study whose unit of replication is the forget author.

Each method is run once per unit (a forget author, with its own retain model), so two methods
are compared *paired*: per unit the difference of their values, then a test over the units.

- :func:`paired_permutation_test`: the exact paired (sign-flip) permutation test of the mean
  difference, every one of the 2^n sign patterns for n <= :data:`EXACT_MAX_UNITS` units
  (scipy's ``permutation_test`` with ``permutation_type="samples"``), Monte Carlo beyond.
  Its smallest possible p-value is :func:`smallest_p`: 2 / 2^n two-sided, 1 / 2^n one-sided.
- :func:`wilcoxon_signed_rank`: scipy's Wilcoxon signed-rank test over the same differences.
- :func:`holm` and :func:`holm_family`: Holm's step-down correction over a list of comparisons
  declared before the study ran (a comparison not in the list is refused).
- :func:`paired_interval`: the mean paired difference and its interval (Student-t over the
  differences, or a percentile bootstrap of them).
- :func:`has_spread`, :func:`group_summary` and :func:`welch_test`: a group whose values are all
  equal has **no spread**: it gets no interval (a zero-width "interval" is no estimate of
  precision) and no Welch test (its p-value against such a group is an artifact of the zero
  variance), and says so.
- :func:`truth_ratio_distances`: Forget Quality (the KS p-value), the KS statistic and the
  1-Wasserstein distance of the log truth ratios of a model against the retain model's;
  :func:`noise_ceiling`: the same for other retain-model seeds against the first.
- :func:`compare_paired`: the declared comparisons of a study over its units, each with its
  paired difference, interval, permutation and Wilcoxon p-values, and Holm-corrected p.
- :func:`mu_paired_bootstrap`: Model Utility of a model minus the target's on the same QA, with
  a paired percentile bootstrap over the QA (both models resampled with the same indices).
- :func:`minimum_units`: the fewest units with which a Holm-corrected exact permutation test
  over ``m`` comparisons can reach ``alpha`` at all.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

#: up to this many units the permutation test enumerates every sign pattern (2^16 = 65,536)
EXACT_MAX_UNITS = 16
#: random sign patterns beyond EXACT_MAX_UNITS (fixed seed: the same p-value on every run)
MONTE_CARLO_RESAMPLES = 100_000
ALTERNATIVES = ("two-sided", "greater", "less")
#: a group's interval text when it has none
NO_SPREAD = "no spread"


class StatisticsError(ValueError):
    """Values a test cannot be run on (unequal pairs, non-finite numbers, an undeclared
    comparison); the message says which."""


def _seeded(func) -> dict[str, int]:
    """A fixed seed for ``func``: ``rng=0`` (scipy >= 1.15), else ``random_state=0``."""
    import inspect

    return {"rng": 0} if "rng" in inspect.signature(func).parameters else {"random_state": 0}


def _finite(values: Iterable[Any], what: str) -> list[float]:
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise StatisticsError(f"{what}: {value!r} is not a finite number")
        out.append(float(value))
    return out


def _alternative(alternative: str) -> str:
    if alternative not in ALTERNATIVES:
        raise StatisticsError(f"alternative must be one of {', '.join(ALTERNATIVES)}, got {alternative!r}")
    return alternative


def differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``a[i] - b[i]`` per unit; the two sequences must pair up (same length, at least one)."""
    a, b = _finite(a, "a"), _finite(b, "b")
    if len(a) != len(b):
        raise StatisticsError(f"paired values must pair up: {len(a)} against {len(b)}")
    if not a:
        raise StatisticsError("no paired values")
    return [x - y for x, y in zip(a, b)]


# ----------------------------------------------------------------------------- spread


def has_spread(values: Sequence[float]) -> bool:
    """Whether at least two values differ (one value, or all equal: no spread). Equal means
    equal up to float rounding (relative 1e-9, absolute 1e-12): 0.7 - 0.6 and 0.6 - 0.5 are
    the same difference, whatever the last bit says."""
    vals = _finite(values, "values")
    return len(vals) >= 2 and not math.isclose(max(vals), min(vals), rel_tol=1e-9, abs_tol=1e-12)


def group_summary(
    values: Sequence[float],
    method: str = "t",
    level: float = 0.95,
    bounds: tuple[float | None, float | None] = (None, None),
) -> dict[str, Any]:
    """Mean of a group and its interval (``t``: Student-t, n - 1 degrees of freedom;
    ``bootstrap``: percentile, 10,000 resamples), cut to ``bounds``. A group whose values are
    all equal gets ``spread: False``, no interval and the text "no spread"; one value gets no
    interval either. ``text`` is what a report prints."""
    import numpy as np

    vals = _finite(values, "values")
    out: dict[str, Any] = {"mean": None, "low": None, "high": None, "n": len(vals), "values": vals, "spread": None}
    if not vals:
        out["text"] = "n/a"
        return out
    mean = float(np.mean(vals))
    out["mean"] = mean
    if len(vals) < 2:
        out["text"] = f"{mean:.3f} (n=1)"
        return out
    out["spread"] = has_spread(vals)
    if not out["spread"]:
        out["text"] = f"{mean:.3f} ({NO_SPREAD}, n={len(vals)})"
        return out
    if method == "t":
        from scipy.stats import t

        half = float(t.ppf(0.5 + level / 2, len(vals) - 1)) * float(np.std(vals, ddof=1)) / math.sqrt(len(vals))
        low, high = mean - half, mean + half
    elif method == "bootstrap":
        from scipy.stats import bootstrap

        ci = bootstrap(
            (np.asarray(vals),),
            np.mean,
            confidence_level=level,
            n_resamples=10_000,
            method="percentile",
            **_seeded(bootstrap),
        ).confidence_interval
        low, high = float(ci.low), float(ci.high)
    else:
        raise StatisticsError(f"interval method must be 't' or 'bootstrap', got {method!r}")
    lo, hi = bounds
    out["low"] = low if lo is None else max(low, lo)
    out["high"] = high if hi is None else min(high, hi)
    out["text"] = f"{mean:.3f} [{out['low']:.3f}, {out['high']:.3f}]"
    return out


def welch_test(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> dict[str, Any]:
    """Welch's t-test of two independent groups; refused (``pvalue`` None, ``why`` says which)
    when a group has fewer than 2 values or no spread: against a group of equal values the
    t statistic rests on the other group's variance alone, and a KS p-value that takes few
    values ties often, so the p-value would be an artifact."""
    import warnings

    from scipy import stats

    a, b = _finite(a, "a"), _finite(b, "b")
    alternative = _alternative(alternative)
    for name, vals in (("a", a), ("b", b)):
        if len(vals) < 2:
            return {"pvalue": None, "statistic": None, "why": f"{name}: fewer than 2 values"}
        if not has_spread(vals):
            return {"pvalue": None, "statistic": None, "why": f"{name}: {NO_SPREAD}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_ind(a, b, equal_var=False, alternative=alternative)
    return {"pvalue": float(res.pvalue), "statistic": float(res.statistic), "why": None}


# ----------------------------------------------------------------------------- paired tests


def smallest_p(n: int, alternative: str = "two-sided") -> float:
    """The smallest p-value the exact sign-flip permutation test over ``n`` units can give:
    only the observed sign pattern (and, two-sided, its mirror) is as extreme."""
    _alternative(alternative)
    if n < 1:
        return 1.0
    return min(1.0, (2.0 if alternative == "two-sided" else 1.0) / 2**n)


def minimum_units(comparisons: int, alpha: float = 0.05, alternative: str = "two-sided") -> int:
    """The fewest units with which Holm's correction over ``comparisons`` tests can reject at
    ``alpha`` at all: Holm's first step multiplies the smallest p by the number of tests, so
    ``comparisons * smallest_p(n) <= alpha`` is needed."""
    if comparisons < 1 or not 0 < alpha < 1:
        raise StatisticsError("comparisons must be >= 1 and alpha in (0, 1)")
    n = 1
    while comparisons * smallest_p(n, alternative) > alpha:
        n += 1
    return n


def paired_permutation_test(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> dict[str, Any]:
    """The paired permutation test of the mean of ``a - b`` over the units: under the null a
    unit's two values are exchangeable, so each difference's sign is flipped. Exact (all 2^n
    sign patterns) for n <= :data:`EXACT_MAX_UNITS`, else :data:`MONTE_CARLO_RESAMPLES` random
    patterns with a fixed seed. Two-sided: the null distribution is symmetric, so
    scipy's 2 x min(one-sided) equals the share of patterns with |mean| >= the observed one.
    All differences zero: p = 1."""
    import numpy as np
    from scipy import stats

    d = differences(a, b)
    alternative = _alternative(alternative)
    n = len(d)
    exact = n <= EXACT_MAX_UNITS
    out = {"difference": float(np.mean(d)), "n": n, "alternative": alternative, "exact": exact}
    out.update(patterns=2**n if exact else MONTE_CARLO_RESAMPLES, smallest_p=smallest_p(n, alternative))
    if n == 1:  # scipy wants two units; the two sign patterns of one: +d and -d
        more = {"two-sided": 2, "greater": 2 if d[0] <= 0 else 1, "less": 2 if d[0] >= 0 else 1}[alternative]
        return {**out, "pvalue": more / 2}
    result = stats.permutation_test(
        (np.asarray(_finite(a, "a")), np.asarray(_finite(b, "b"))),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=np.inf if exact else MONTE_CARLO_RESAMPLES,
        alternative=alternative,
        **_seeded(stats.permutation_test),
    )
    return {**out, "pvalue": float(min(1.0, result.pvalue))}


def wilcoxon_signed_rank(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> dict[str, Any]:
    """scipy's Wilcoxon signed-rank test of ``a - b`` (zero differences dropped, as Wilcoxon
    did). Up to :data:`EXACT_MAX_UNITS` non-zero differences its p-value is exact, over every
    sign pattern of the ranks (ties in |difference| get mid-ranks, which scipy's own exact table
    does not allow). Every difference zero: p = 1 (no evidence either way), ``why`` says so."""
    import numpy as np
    from scipy import stats

    d = differences(a, b)
    alternative = _alternative(alternative)
    nonzero = [x for x in d if x != 0]
    out: dict[str, Any] = {"n": len(d), "n_nonzero": len(nonzero), "alternative": alternative, "why": None}
    if not nonzero:
        return {**out, "statistic": None, "pvalue": 1.0, "why": "every difference is zero", "exact": True}
    exact = len(nonzero) <= EXACT_MAX_UNITS and hasattr(stats, "PermutationMethod")
    method: Any = stats.PermutationMethod(n_resamples=np.inf) if exact else "auto"
    try:
        res = stats.wilcoxon(nonzero, alternative=alternative, method=method)
    except (TypeError, ValueError):  # a scipy whose wilcoxon takes no PermutationMethod (< 1.12)
        exact, res = False, stats.wilcoxon(nonzero, alternative=alternative)
    return {**out, "statistic": float(res.statistic), "pvalue": float(min(1.0, res.pvalue)), "exact": exact}


def paired_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95, method: str = "t") -> dict[str, Any]:
    """The mean of ``a - b`` over the units and its interval: ``t`` (mean +- t(n - 1) x sd /
    sqrt(n) of the differences) or ``bootstrap`` (percentile, 10,000 resamples of the units).
    Differences all equal: ``spread`` False and no interval ("no spread"); one unit: none."""
    out = group_summary(differences(a, b), method=method, level=level)
    return {
        "difference": out["mean"],
        "low": out["low"],
        "high": out["high"],
        "n": out["n"],
        "spread": out["spread"],
        "method": method,
        "level": level,
        "text": _difference_text(out),
    }


def _difference_text(out: dict[str, Any]) -> str:
    if out["mean"] is None:
        return "n/a"
    if out["low"] is not None:
        return f"{out['mean']:+.3f} [{out['low']:+.3f}, {out['high']:+.3f}]"
    return f"{out['mean']:+.3f} ({NO_SPREAD if out['spread'] is False else 'one unit'}, n={out['n']})"


# ----------------------------------------------------------------------------- Holm


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the given order: sorted ascending, the i-th
    smallest (from 0) times (m - i), made non-decreasing, capped at 1. A comparison that could
    not be tested (None) still counts in m, as p = 1, and stays None."""
    m = len(pvalues)
    filled = []
    for i, p in enumerate(pvalues):
        if p is None:
            filled.append(1.0)
            continue
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= float(p) <= 1:
            raise StatisticsError(f"p-value {i} must be in [0, 1], got {p!r}")
        filled.append(float(p))
    order = sorted(range(m), key=lambda i: filled[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * filled[i]))
        adjusted[i] = running
    return [None if p is None else adjusted[i] for i, p in enumerate(pvalues)]


def holm_family(
    declared: Sequence[str], pvalues: Mapping[str, float | None], alpha: float = 0.05
) -> list[dict[str, Any]]:
    """Holm over a family of comparisons declared before the study ran, in the declared order:
    per comparison its raw p, its Holm p and whether it is rejected at ``alpha``. A p-value for
    a comparison not in the list is refused (adding comparisons after seeing the results is
    what the correction is for); a declared one without a p-value counts as untested (p = 1)."""
    extra = [name for name in pvalues if name not in declared]
    if extra:
        raise StatisticsError(f"comparison(s) not declared before the study ran: {', '.join(map(str, extra))}")
    if len(set(declared)) != len(declared):
        raise StatisticsError("a comparison is declared twice")
    raw = [pvalues.get(name) for name in declared]
    adjusted = holm(raw)
    return [
        {"comparison": name, "p": p, "holm_p": h, "reject": h is not None and h <= alpha, "m": len(declared)}
        for name, p, h in zip(declared, raw, adjusted)
    ]


# ----------------------------------------------------------------------------- truth ratios


def _log_ratios(ratios: Sequence[float], what: str):
    import numpy as np

    vals = _finite(ratios, what)
    if not vals:
        raise StatisticsError(f"{what}: no truth ratios")
    if min(vals) <= 0:
        raise StatisticsError(f"{what}: a truth ratio is <= 0 ({min(vals)!r}); it has no logarithm")
    return np.log(np.asarray(vals))


def truth_ratio_distances(model_ratios: Sequence[float], reference_ratios: Sequence[float]) -> dict[str, float]:
    """A model's forget truth ratios against the retain model's: Forget Quality (the two-sample
    KS test's p-value, as TOFU computes it), the KS statistic (the largest gap of the two
    empirical distributions, in steps of 1/n) and the 1-Wasserstein distance of the log truth
    ratios (the mean shift of the whole distribution; 0 = the same distribution). The KS numbers
    do not change under the log (it is monotone); the Wasserstein distance does, and the log
    makes it symmetric in ratio and 1 / ratio."""
    from scipy import stats

    x = _log_ratios(model_ratios, "model truth ratios")
    y = _log_ratios(reference_ratios, "reference truth ratios")
    ks = stats.ks_2samp(x, y)
    return {
        "forget_quality": float(ks.pvalue),
        "ks_statistic": float(ks.statistic),
        "wasserstein_log": float(stats.wasserstein_distance(x, y)),
        "n": [len(x), len(y)],
    }


def noise_ceiling(reference_ratios: Sequence[float], other_seeds: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """How close two retain models of the same author get: each other retain seed's forget
    truth ratios against the first seed's (the reference the study's Forget Quality uses). An
    unlearned model cannot be expected to come closer to the retain model than another retain
    model does: the Forget Quality of these seeds is the ceiling, their KS statistic and
    Wasserstein distance the floor."""
    seeds = {name: truth_ratio_distances(r, reference_ratios) for name, r in other_seeds.items()}
    if not seeds:
        raise StatisticsError("a noise ceiling needs at least one other retain seed")
    summary = {}
    for key in ("forget_quality", "ks_statistic", "wasserstein_log"):
        vals = [s[key] for s in seeds.values()]
        summary[key] = {"min": min(vals), "max": max(vals), "mean": sum(vals) / len(vals)}
    return {"seeds": seeds, **summary}


# ----------------------------------------------------------------------------- a study's comparisons


def compare_paired(
    values: Mapping[str, Mapping[Any, float | None]],
    comparisons: Sequence[tuple[str, str]],
    *,
    alternative: str = "two-sided",
    alpha: float = 0.05,
    interval: str = "t",
    lower_is_better: bool = False,
) -> list[dict[str, Any]]:
    """The declared ``comparisons`` ((method, rival) pairs, fixed before the study ran) of
    ``values`` (method -> unit -> value), each over the units both methods have a value for:
    the mean difference method - rival with its paired interval, the exact paired permutation
    p, the Wilcoxon signed-rank p, and the permutation p Holm-corrected over the whole list.
    Wins are the units where method is the better: its value higher, or lower with
    ``lower_is_better`` (a distance), so that "8 wins" never means 8 authors where it is worse.
    Units one side lacks are named in ``missing_units``; a comparison with no common unit is
    untested (p None; it still counts in Holm's m)."""
    rows = []
    for method, rival in comparisons:
        if method not in values or rival not in values:
            raise StatisticsError(
                f"comparison {method} vs {rival}: no values for {method if method not in values else rival}"
            )
        mine = {u: v for u, v in values[method].items() if v is not None}
        theirs = {u: v for u, v in values[rival].items() if v is not None}
        units = [u for u in mine if u in theirs]
        missing = sorted({*mine, *theirs} - set(units), key=str)
        row: dict[str, Any] = {"method": method, "rival": rival, "units": units, "missing_units": missing}
        if units:
            a, b = [mine[u] for u in units], [theirs[u] for u in units]
            perm = paired_permutation_test(a, b, alternative)
            row.update(
                difference=perm["difference"],
                interval=paired_interval(a, b, method=interval),
                permutation_p=perm["pvalue"],
                smallest_p=perm["smallest_p"],
                exact=perm["exact"],
                wilcoxon_p=wilcoxon_signed_rank(a, b, alternative)["pvalue"],
                wins=sum((x < y) if lower_is_better else (x > y) for x, y in zip(a, b)),
                ties=sum(x == y for x, y in zip(a, b)),
                losses=sum((x > y) if lower_is_better else (x < y) for x, y in zip(a, b)),
            )
        else:
            row.update(difference=None, interval=None, permutation_p=None, smallest_p=None, wilcoxon_p=None)
        rows.append(row)
    names = [f"{r['method']} vs {r['rival']}" for r in rows]
    family = holm_family(names, {n: r["permutation_p"] for n, r in zip(names, rows)}, alpha)
    for row, corrected in zip(rows, family):
        row.update(holm_p=corrected["holm_p"], reject=corrected["reject"], m=corrected["m"], alternative=alternative)
    return rows


# ----------------------------------------------------------------------------- Model Utility, paired


def mu_paired_bootstrap(
    model: Mapping[str, list[dict]],
    target: Mapping[str, list[dict]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any]:
    """Model Utility of ``model`` minus the target's, both evaluated on the same QA, with a
    paired percentile bootstrap: each part's QA resampled once and the same indices used for
    both models, so the sampling error of the QA that both share cancels (an unpaired interval
    of each model's own Model Utility is several times wider). ``model`` and ``target``: per
    task the samples rows (``doc_id`` and the metric) of the report's nine Model Utility parts;
    the two must hold the same ``doc_id`` per task."""
    import numpy as np

    from ..metrics import MU_PARTS

    def column(samples, task, metric, who):
        rows = sorted(samples.get(task, []), key=lambda r: r["doc_id"])
        values = np.asarray(_finite([r[metric] for r in rows], f"{who} {task}:{metric}"))
        if metric == "truth_ratio":  # true-better aggregate, as TOFU: mean(max(0, 1 - tr))
            values = np.maximum(0.0, 1.0 - values)
        return [r["doc_id"] for r in rows], values

    rng = np.random.default_rng(seed)
    points = {"model": [], "target": []}
    draws = {"model": [], "target": []}
    for parts in MU_PARTS.values():
        idx = None
        for task, metric in parts:
            ids_m, col_m = column(model, task, metric, "model")
            ids_t, col_t = column(target, task, metric, "target")
            if ids_m != ids_t:
                raise StatisticsError(f"{task}: the two evaluations did not score the same QA; no pairing")
            if not ids_m:
                raise StatisticsError(f"{task}: no samples")
            if idx is None:
                idx = rng.integers(0, len(ids_m), size=(resamples, len(ids_m)))
            elif idx.shape[1] != len(ids_m):
                raise StatisticsError(f"{task}: a part's three metrics must score the same QA")
            for who, col in (("model", col_m), ("target", col_t)):
                points[who].append(float(col.mean()))
                draws[who].append(col[idx].mean(axis=1))

    def harmonic(stacked):
        with np.errstate(divide="ignore"):
            return np.where((stacked > 0).all(axis=0), stacked.shape[0] / (1.0 / stacked).sum(axis=0), 0.0)

    point = {who: float(harmonic(np.asarray(v)[:, None])[0]) for who, v in points.items()}
    diff = harmonic(np.stack(draws["model"])) - harmonic(np.stack(draws["target"]))
    low, high = np.percentile(diff, [50 * (1 - level), 50 * (1 + level)])
    return {
        "difference": point["model"] - point["target"],
        "model": point["model"],
        "target": point["target"],
        "low": float(low),
        "high": float(high),
        "width": float(high - low),
        "resamples": resamples,
        "level": level,
    }
