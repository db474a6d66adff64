"""An operating point per method: the rule, written in the study file before it runs,
that picks each method's (lr, epochs) from its sweep trace on the reserved author.

A trace is a list of points, one per (setting, epoch) of the sweep: ``lr`` and ``epoch`` (the
setting: any other key that is not a measure, ``rol_weight`` say, belongs to it too) and the
measures ``forget_quality`` (the KS p-value of the forget truth ratios against the retain
model's), ``model_utility_diff`` (the point's Model Utility minus the target's, both on the
same QA: a paired difference; None where Model Utility was not evaluated at that point) and,
optionally, ``wasserstein_log`` (the 1-Wasserstein distance of the log truth ratios to the
retain model's), ``forget_prob`` and ``retain_prob``.

The rule (:class:`Rule`, defaults = the issue's): **the best Forget Quality among the points
whose paired Model Utility is at most ``tolerance`` (0.02) below the target's** (``band =
"both"``: also at most 0.02 above). Ties, in this order:

1. the higher Forget Quality;
2. the smaller Wasserstein distance of the log truth ratios (Forget Quality is a KS p-value
   that takes few values, so ties are common; a point without it ranks after one with it);
3. the higher paired Model Utility difference (less utility lost);
4. the fewer epochs (less training, less drift);
5. the smaller learning rate;
6. the earlier point of the trace (the sweep's declared order), so the choice is unique.

Model Utility is a full evaluation and the trace's cheap measures are not: a point without it
never qualifies, and every such point that could still beat the choice (its Forget Quality and
Wasserstein distance at least as good) is ``pending``: the choice is ``final`` only when
nothing is pending (:func:`next_to_evaluate` says which point to evaluate next).

No point qualifies: ``chosen`` is None and ``reason`` says why; ``use`` is then, by ``on_none``,
the point that loses the least utility (``"least_utility_loss"``: the highest Model Utility
difference; ties by the order above) flagged ``qualified: False``, or None (``"exclude"``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

#: the keys of a trace point that are measures, not its setting
MEASURES = frozenset(
    {
        "forget_quality",
        "model_utility_diff",
        "wasserstein_log",
        "ks_statistic",
        "forget_prob",
        "heldout_prob",
        "retain_prob",
    }
)
BANDS = ("below", "both")
ON_NONE = ("least_utility_loss", "exclude")
TIE_BREAK = (
    "higher forget_quality",
    "smaller wasserstein_log (missing last)",
    "higher model_utility_diff",
    "fewer epochs",
    "smaller lr",
    "earlier in the trace",
)


class OperatingPointError(ValueError):
    """A trace or rule the rule cannot be applied to; the message names the point and key."""


@dataclass(frozen=True)
class Rule:
    """The operating-point rule of a study file (``[operating_point]``)."""

    tolerance: float = 0.02
    band: str = "below"
    on_none: str = "least_utility_loss"

    def __post_init__(self):
        if not (isinstance(self.tolerance, (int, float)) and math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise OperatingPointError(f"tolerance must be a finite number >= 0, got {self.tolerance!r}")
        if self.band not in BANDS:
            raise OperatingPointError(f"band must be one of {', '.join(BANDS)}, got {self.band!r}")
        if self.on_none not in ON_NONE:
            raise OperatingPointError(f"on_none must be one of {', '.join(ON_NONE)}, got {self.on_none!r}")

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> Rule:
        """The rule from a study file's table; an unknown key is an error."""
        unknown = sorted(set(table) - {"tolerance", "band", "on_none"})
        if unknown:
            raise OperatingPointError(f"unknown key(s) of the operating-point rule: {', '.join(unknown)}")
        return cls(**dict(table))

    def near_target(self, diff: float | None) -> bool:
        """Whether a paired Model Utility difference is within the rule's band."""
        if diff is None:
            return False
        if self.band == "both":
            return abs(diff) <= self.tolerance + 1e-12
        return diff >= -self.tolerance - 1e-12

    def describe(self) -> str:
        side = "at most" if self.band == "below" else "within"
        where = "below" if self.band == "below" else "of"
        return (
            f"the best Forget Quality among the points whose paired Model Utility is {side} "
            f"{self.tolerance:g} {where} the target's; ties: " + ", then ".join(TIE_BREAK)
        )


def _number(point: Mapping, key: str, i: int, *, optional: bool = False, low: float | None = None) -> float | None:
    value = point.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise OperatingPointError(f"trace point {i}: {key} must be a finite number, got {value!r}")
    if low is not None and value < low:
        raise OperatingPointError(f"trace point {i}: {key} must be >= {low:g}, got {value!r}")
    return float(value)


def point_key(point: Mapping[str, Any]) -> tuple:
    """A trace point's setting and epoch (every key but its measures, its adapter folder and its
    position), hashable: what names one point across a sweep's trace and a chosen cell."""
    return tuple(sorted((k, repr(v)) for k, v in point.items() if k not in MEASURES and k not in ("adapter", "index")))


def check_trace(trace: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The trace's points, each checked (lr > 0, epoch >= 1, Forget Quality in [0, 1], the other
    measures finite or None), each with its position ``index``; a setting and epoch twice is
    an error."""
    points, seen = [], set()
    for i, point in enumerate(trace):
        if not isinstance(point, Mapping):
            raise OperatingPointError(f"trace point {i}: must be a mapping, got {type(point).__name__}")
        lr = _number(point, "lr", i)
        if lr <= 0:
            raise OperatingPointError(f"trace point {i}: lr must be > 0, got {lr!r}")
        epoch = _number(point, "epoch", i, low=1)
        fq = _number(point, "forget_quality", i, low=0)
        if fq > 1:
            raise OperatingPointError(f"trace point {i}: forget_quality must be <= 1, got {fq!r}")
        for key in ("model_utility_diff", "wasserstein_log"):
            _number(point, key, i, optional=True, low=0 if key == "wasserstein_log" else None)
        key = point_key(point)
        if key in seen:
            raise OperatingPointError(f"trace point {i}: the same setting and epoch twice ({dict(key)})")
        seen.add(key)
        points.append({**point, "lr": lr, "epoch": epoch, "forget_quality": fq, "index": i})
    return points


def _forget_key(p: dict) -> tuple:
    """What ranks a point before its Model Utility is known (higher first)."""
    w = p.get("wasserstein_log")
    return (p["forget_quality"], -math.inf if w is None else -w)


def _rank_key(p: dict) -> tuple:
    """The rule's order, best first when sorted ascending."""
    fq, neg_w = _forget_key(p)
    mu = p.get("model_utility_diff")
    return (-fq, -neg_w, -(mu if mu is not None else -math.inf), p["epoch"], p["lr"], p["index"])


def _fallback_key(p: dict) -> tuple:
    return (-p["model_utility_diff"],) + _rank_key(p)


def choose(trace: Sequence[Mapping[str, Any]], rule: Rule | None = None) -> dict[str, Any]:
    """Apply ``rule`` (default: the issue's) to one method's trace. Returns ``chosen`` (the
    qualifying point the rule picks, or None), ``use`` (what the study runs: ``chosen``, else
    the fallback of ``on_none``), ``qualified``, ``final`` (no pending point could still beat
    the choice), ``pending``, ``qualifying`` (how many points qualify), ``reason`` and the
    ``rule``. Points are returned as given plus their trace ``index``."""
    rule = rule or Rule()
    points = check_trace(trace)
    out: dict[str, Any] = {"rule": {**asdict(rule), "text": rule.describe()}, "points": len(points)}
    if not points:
        return {**out, "chosen": None, "use": None, "qualified": False, "final": True, "pending": [],
                "qualifying": 0, "reason": "the trace is empty"}  # fmt: skip
    qualifying = sorted((p for p in points if rule.near_target(p.get("model_utility_diff"))), key=_rank_key)
    chosen = qualifying[0] if qualifying else None
    unknown = [p for p in points if p.get("model_utility_diff") is None]
    if chosen is None:
        pending = sorted(unknown, key=_rank_key)
    else:
        pending = sorted((p for p in unknown if _forget_key(p) >= _forget_key(chosen)), key=_rank_key)
    out.update(chosen=chosen, qualifying=len(qualifying), pending=pending, final=not pending)
    if chosen is not None:
        reason = (
            f"lr {chosen['lr']:g}, epoch {chosen['epoch']:g}: Forget Quality {chosen['forget_quality']:.3g}, "
            f"Model Utility {chosen['model_utility_diff']:+.3f} against the target's "
            f"({len(qualifying)} of {len(points)} points qualify)"
        )
        return {**out, "use": chosen, "qualified": True, "reason": reason}
    measured = [p for p in points if p.get("model_utility_diff") is not None]
    if not measured:
        reason = "no point has a Model Utility evaluation yet"
    else:
        worst = "below" if rule.band == "below" else "away from"
        reason = (
            f"no point qualifies: every one of the {len(measured)} evaluated point(s) has Model Utility more "
            f"than {rule.tolerance:g} {worst} the target's (best: "
            f"{max(p['model_utility_diff'] for p in measured):+.3f})"
        )
    fallback = min(measured, key=_fallback_key) if measured and rule.on_none == "least_utility_loss" else None
    return {**out, "use": fallback, "qualified": False, "reason": reason}


def next_to_evaluate(trace: Sequence[Mapping[str, Any]], rule: Rule | None = None) -> dict[str, Any] | None:
    """The point whose Model Utility to evaluate next (the best-ranked pending one), or None
    when the choice is final. Evaluating in this order reaches the rule's choice with the
    fewest full evaluations."""
    result = choose(trace, rule)
    return result["pending"][0] if result["pending"] else None


def choose_all(traces: Mapping[str, Sequence[Mapping[str, Any]]], rule: Rule | None = None) -> dict[str, dict]:
    """:func:`choose` per method."""
    return {method: choose(trace, rule) for method, trace in traces.items()}
