"""The analysis of an author-unit study: the declared comparison families over the
test authors, each method's paired Model Utility against the target, the noise ceiling, and
the verdict of ``[verdict]``, with its sentences generated from the numbers.

Pure functions of per-author values (no files, no models), so the README's verdict can be
regenerated from, and checked against, ``study.json``:

- :func:`families`: every ``[[comparisons]]`` family through :func:`.statistics.compare_paired`
  (exact paired permutation test, Wilcoxon beside it, Holm over the family); the post hoc
  ``leader`` family picks the method with the best mean over the test authors first;
- :func:`utility`: per method the mean paired Model Utility difference to the target over the
  authors, with its 95% t interval (or "no spread");
- :func:`verdict`: the claim holds when the verdict method's utility interval lies above
  ``-utility_margin`` and every comparison of the verdict family rejects with the verdict
  method the better (higher, or lower for :data:`.design.LOWER_IS_BETTER` metrics); otherwise the
  sentences name each part that fails.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .design import LEADER, LOWER_IS_BETTER, Comparison, Design
from .statistics import compare_paired, group_summary, noise_ceiling

#: comparison metrics in [0, 1]: a paired difference lies in [-1, 1], and its interval is cut to it
UNIT_RANGE = frozenset({"forget_quality", "ks_statistic", "model_utility", "forget_prob"})

Values = Mapping[str, Mapping[str, Mapping[int, float | None]]]  # metric -> method -> author -> value


def _means(values: Mapping[str, Mapping[int, float | None]], authors: Sequence[int]) -> dict[str, float]:
    out = {}
    for method, per_author in values.items():
        vals = [per_author.get(a) for a in authors]
        vals = [v for v in vals if v is not None]
        if vals:
            out[method] = sum(vals) / len(vals)
    return out


def leader(values: Mapping[str, Mapping[int, float | None]], authors: Sequence[int], metric: str) -> str:
    """The method with the best mean over ``authors`` (ties: the first declared)."""
    means = _means(values, authors)
    if not means:
        raise ValueError(f"no values of {metric} to pick a leader from")
    sign = -1 if metric in LOWER_IS_BETTER else 1
    return max(means, key=lambda m: sign * means[m])


def family_pairs(comparison: Comparison, values: Values, authors: Sequence[int], methods: Sequence[str]) -> list:
    if comparison.method == LEADER:
        best = leader(values[comparison.metric], authors, comparison.metric)
        return [(best, m) for m in methods if m != best]
    return list(comparison.pairs)


def families(design: Design, values: Values, methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Every declared family, tested over the test authors."""
    stats = design.statistics
    authors = list(design.test_authors)
    out = {}
    for comparison in design.comparisons:
        per_method = {m: {a: values[comparison.metric].get(m, {}).get(a) for a in authors} for m in methods}
        pairs = family_pairs(comparison, values, authors, methods)
        lower = comparison.metric in LOWER_IS_BETTER
        rows = compare_paired(
            per_method, pairs, alternative=stats["alternative"], alpha=stats["alpha"], lower_is_better=lower
        )
        if comparison.metric in UNIT_RANGE:
            for row in rows:
                row["interval"] = _cut(row.get("interval"))
        out[comparison.family] = {
            "metric": comparison.metric,
            "post_hoc": comparison.post_hoc,
            "lower_is_better": lower,
            "rows": rows,
        }
    return out


def _cut(interval: dict | None) -> dict | None:
    """A paired difference's interval cut to [-1, 1] (the text too); None and no interval stay."""
    if not interval or interval.get("low") is None:
        return interval
    low, high = max(interval["low"], -1.0), min(interval["high"], 1.0)
    if (low, high) == (interval["low"], interval["high"]):
        return interval
    return {**interval, "low": low, "high": high, "text": f"{interval['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"}


def utility(design: Design, mu_diffs: Mapping[str, Mapping[int, float | None]]) -> dict[str, dict[str, Any]]:
    """Per method: its paired Model Utility differences to the target over the test authors,
    their mean and 95% t interval (no interval when they do not spread)."""
    out = {}
    for method, per_author in mu_diffs.items():
        vals = [per_author.get(a) for a in design.test_authors]
        out[method] = group_summary([v for v in vals if v is not None], method="t", bounds=(-1.0, 1.0))
    return out


def ceiling(reference: Sequence[float], seeds: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """The noise ceiling of one author: :func:`.statistics.noise_ceiling`."""
    return noise_ceiling(reference, seeds)


def _better(row: dict, lower: bool) -> bool:
    diff = row.get("difference")
    return diff is not None and (diff < 0 if lower else diff > 0)


def verdict(design: Design, tested: Mapping[str, dict], utilities: Mapping[str, dict], labels=None) -> dict:
    """The verdict of ``[verdict]`` from :func:`families` and :func:`utility`: ``holds`` and the
    sentences that say why (each generated from the numbers)."""
    if design.verdict is None:
        raise ValueError("the study declares no [verdict]")
    labels = labels or {}
    method, family, margin = design.verdict["method"], design.verdict["family"], design.verdict["utility_margin"]
    name = labels.get(method, method)
    result = tested[family]
    lower = result["lower_is_better"]
    metric = result["metric"].replace("_", " ")
    failures: list[str] = []
    sentences: list[str] = []
    mu = utilities.get(method) or {}
    if mu.get("low") is not None:
        near = mu["low"] > -margin
        sentences.append(
            f"{name}'s paired Model Utility difference to the target over {mu['n']} authors is {mu['mean']:+.3f}, "
            f"95% interval [{mu['low']:+.3f}, {mu['high']:+.3f}]"
            + (f": above -{margin:g}." if near else f": it reaches below -{margin:g}.")
        )
    elif mu.get("spread") is False:
        near = mu["mean"] > -margin
        sentences.append(
            f"{name}'s paired Model Utility difference to the target is {mu['mean']:+.3f} on every one of the "
            f"{mu['n']} authors (no spread)" + (f": above -{margin:g}." if near else f": not above -{margin:g}.")
        )
    else:
        near = False
        sentences.append(f"{name}'s paired Model Utility difference has no interval (fewer than two authors).")
    if not near:
        failures.append("utility")
    for row in result["rows"]:
        rival = labels.get(row["rival"], row["rival"])
        if row.get("holm_p") is None:
            failures.append(f"{row['method']} vs {row['rival']}")
            sentences.append(f"{name} vs {rival}: untested (no common authors).")
            continue
        better = _better(row, lower)
        side = "lower" if lower else "higher"
        text = (
            f"{name} vs {rival}: mean {metric} difference {row['difference']:+.3f} "
            f"({_counted(row['wins'], 'win')}, {_counted(row['ties'], 'tie')}, {_counted(row['losses'], 'loss')}), "
            f"permutation p {row['permutation_p']:.4f}, "
            f"Holm p {row['holm_p']:.4f}"
        )
        if row["reject"] and better:
            sentences.append(text + f": {name}'s {metric} is significantly {side}.")
        elif row["reject"]:
            failures.append(f"{row['method']} vs {row['rival']}")
            sentences.append(text + f": significant, but {name}'s {metric} is the {'higher' if lower else 'lower'}.")
        else:
            failures.append(f"{row['method']} vs {row['rival']}")
            sentences.append(text + f": not significant at {design.statistics['alpha']:g}.")
    holds = not failures
    head = (
        f"The claim holds: {name} reaches a significantly {'lower' if lower else 'higher'} {metric} than every "
        f"rival of the {family!r} family at near-target utility."
        if holds
        else f"The claim does not hold: {', '.join(failures)} "
        f"{'fails' if len(failures) == 1 else 'fail'} the verdict rule."
    )
    return {"holds": holds, "failures": failures, "sentences": [head, *sentences]}


def analyse(
    design: Design,
    values: Values,
    mu_diffs: Mapping[str, Mapping[int, float | None]],
    methods: Sequence[str],
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Families, utilities and (with a ``[verdict]``) the verdict, as study.json holds them."""
    tested = families(design, values, methods)
    utilities = utility(design, mu_diffs)
    out: dict[str, Any] = {"families": tested, "utility": utilities}
    if design.verdict is not None:
        out["verdict"] = verdict(design, tested, utilities, labels)
    return out


def _counted(n: int, noun: str) -> str:
    """``1 win``, ``3 losses``: the count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


__all__ = ["analyse", "families", "utility", "verdict", "leader", "ceiling"]
