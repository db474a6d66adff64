"""A method's operating-point cell: its sweep traces, Model Utility evaluated lazily
at the candidate points, and the ``[operating_point]`` rule's choice.

The points are every (run, epoch) of the method's traced sweep runs (:mod:`.trace`), each
with its setting (lr and the method's own sweep keys), its epoch and its trace measures. Model
Utility is a full evaluation, so it is taken only where the rule needs it:
:func:`.operating_point.next_to_evaluate` names the best-ranked point whose Model Utility could
still change the choice; it is evaluated (the adapter saved at that epoch, with the study's
evaluation), its paired difference to the target's Model Utility on the same QA computed
(:func:`.statistics.mu_paired_bootstrap`), and so on until the choice is final or
``max_evaluations`` are spent (then the best qualifying point so far is used and the result
says ``capped``). The cell writes ``operating_point.json``: the point to use, whether it
qualifies, the reason, the evaluations made and the whole trace.

This module does not import :mod:`.cells` (which names it as the ``operating_point`` builder):
the evaluation is handed in.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from unlearn_plugins.data.jsonl import json_lines

from ..metrics import MU_PARTS
from .operating_point import MEASURES, OperatingPointError, Rule, choose, next_to_evaluate
from .statistics import mu_paired_bootstrap
from .trace import EPOCH_DIR, read_trace

RESULT_FILE = "operating_point.json"


def sweep_points(runs: Sequence[dict]) -> list[dict[str, Any]]:
    """The trace points of a method's sweep runs, in the declared order (run, then epoch):
    ``runs`` is a list of {"folder": a sweep stage folder, "setting": {"lr": ..., ...}}. Each
    point is its setting, its epoch, its measures and its ``adapter`` folder."""
    points = []
    for run in runs:
        folder = Path(run["folder"])
        for p in read_trace(folder / "trace"):
            measures = {k: v for k, v in p.items() if k in MEASURES}
            points.append(
                {
                    **run["setting"],
                    "epoch": p["epoch"],
                    **measures,
                    "adapter": str(folder / "trace" / EPOCH_DIR.format(p["epoch"])),
                }
            )
    return points


def mu_samples(folder: str | Path) -> dict[str, list[dict]]:
    """Per Model Utility task, its sample rows (``doc_id`` and the metrics) of an evaluation."""
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    written = read_outputs(folder)
    tasks = {task for parts in MU_PARTS.values() for task, _ in parts}
    out = {}
    for task, path in written.samples.items():
        if task in tasks:
            out[task] = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return out


def _point_name(point: dict) -> str:
    return "-".join(f"{k}{v:g}" for k, v in point.items() if k not in MEASURES and k not in ("adapter", "index"))


def choose_operating_point(
    tmp: Path,
    p: dict,
    *,
    evaluate: Callable[[Path, dict], None],
    read_samples: Callable[[Path], dict] = mu_samples,
) -> dict[str, Any]:
    """Build the cell in ``tmp``. ``p``: runs (:func:`sweep_points`), target_evaluation (the
    target's evaluation folder on the reserved author), rule (the Rule's fields),
    max_evaluations, evaluation (the evaluate stage's params, less the adapter). ``evaluate``:
    builds one evaluation in a folder (:func:`.cells.build_evaluate`)."""
    rule = Rule(**p["rule"])
    points = sweep_points(p["runs"])
    target = read_samples(Path(p["target_evaluation"]))
    evaluations: list[dict] = []
    while len(evaluations) < p["max_evaluations"]:
        point = next_to_evaluate([_for_rule(q) for q in points], rule)
        if point is None:
            break
        chosen = points[point["index"]]
        folder = Path(tmp) / "evaluations" / _point_name(chosen)
        folder.mkdir(parents=True, exist_ok=True)
        evaluate(folder, {**p["evaluation"], "adapter": chosen["adapter"]})
        paired = mu_paired_bootstrap(read_samples(folder), target)
        chosen["model_utility_diff"] = paired["difference"]
        evaluations.append({"point": point["index"], "folder": folder.name, "model_utility_paired": paired})
    result = choose([_for_rule(q) for q in points], rule)
    use = result["use"]
    out = {
        "use": None if use is None else points[use["index"]] | {"index": use["index"]},
        "qualified": result["qualified"],
        "final": result["final"],
        "capped": not result["final"],
        "reason": result["reason"] + ("" if result["final"] else f" (capped at {p['max_evaluations']} evaluations)"),
        "rule": result["rule"],
        "evaluations": evaluations,
        "points": points,
    }
    (Path(tmp) / RESULT_FILE).write_text(json.dumps(out, indent=1))
    return out


def _for_rule(point: dict) -> dict:
    """A point as :mod:`.operating_point` reads it (no adapter path: it is not a setting)."""
    return {k: v for k, v in point.items() if k != "adapter"}


#: the range of each trace measure (None: unbounded on that side)
MEASURE_RANGES = {
    "forget_quality": (0.0, 1.0),
    "ks_statistic": (0.0, 1.0),
    "wasserstein_log": (0.0, None),
    "forget_prob": (0.0, 1.0),
    "heldout_prob": (0.0, 1.0),
    "retain_prob": (0.0, 1.0),
    "model_utility_diff": (-1.0, 1.0),
}


#: the range of each number of a point's paired Model Utility (statistics.mu_paired_bootstrap)
PAIRED_RANGES = {
    "difference": (-1.0, 1.0),
    "low": (-1.0, 1.0),
    "high": (-1.0, 1.0),
    "model": (0.0, 1.0),
    "target": (0.0, 1.0),
    "width": (0.0, 2.0),
    "level": (0.0, 1.0),
    "resamples": (1, 10**9),
}


def _checked_point(point: Any, where: str, grid: list[dict], epochs: int) -> dict:
    """A recorded trace point (or the point a cell uses): a setting of the sweep's grid, an
    epoch it traced, measures in their ranges; else OperatingPointError naming ``where``."""
    if not isinstance(point, dict):
        raise OperatingPointError(f"{where}: must be a JSON object, got {type(point).__name__}")
    setting = {k: v for k, v in point.items() if k not in MEASURES and k not in ("epoch", "adapter", "index")}
    if setting not in grid:
        shown = ", ".join(f"{k} {v!r}" for k, v in setting.items()) or "none"
        values: dict[str, list] = {}
        for s in grid:
            for k, v in s.items():
                if v not in values.setdefault(k, []):
                    values[k].append(v)
        known = "; ".join(f"{k} {', '.join(f'{v:g}' for v in vs)}" for k, vs in values.items())
        raise OperatingPointError(f"{where}: {shown} is not a setting of the sweep ({known})")
    epoch = point.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 1 <= epoch <= epochs:
        raise OperatingPointError(f"{where}.epoch: must be an epoch of the sweep (1 to {epochs}), got {epoch!r}")
    for key, (lo, hi) in MEASURE_RANGES.items():
        value = point.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise OperatingPointError(f"{where}.{key}: must be a finite number, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise OperatingPointError(
                f"{where}.{key}: {value!r} is outside its range [{lo}, {hi if hi is not None else 'inf'}]"
            )
    return point


def check_trace_file(folder: str | Path, epochs: int) -> None:
    """A traced run's recorded ``trace/trace.jsonl``: one JSON object per line, each epoch of the
    sweep at most once, measures in their ranges; else OperatingPointError naming the line."""
    path = Path(folder) / "trace" / "trace.jsonl"
    seen = set()
    for lineno, point in json_lines(path, lambda n, why: OperatingPointError(f"line {n}: {why}")):
        measures = {k: v for k, v in point.items() if k in MEASURES} if isinstance(point, dict) else point
        if isinstance(point, dict):
            measures["epoch"] = point.get("epoch")
        _checked_point(measures, f"line {lineno}", [{}], epochs)
        if point["epoch"] in seen:
            raise OperatingPointError(f"line {lineno}.epoch: epoch {point['epoch']} twice")
        seen.add(point["epoch"])


def check_result(result: Any, *, grid: list[dict], epochs: int, rule: dict, max_evaluations: int) -> None:
    """A recorded ``operating_point.json`` as a restored cell would be used: its points the
    sweep's (``grid``: the settings of its runs; ``epochs``), its Model Utility evaluations
    theirs, and ``use``, ``qualified`` and ``reason`` what the rule chooses from those points
    (an edited lr or epoch would key the test cells at a point the sweep never chose); else
    OperatingPointError naming the field."""
    if not isinstance(result, dict):
        raise OperatingPointError(f"must hold a JSON object, got {type(result).__name__}")
    points = result.get("points")
    if not isinstance(points, list):
        raise OperatingPointError(f"field 'points': must be a list, got {type(points).__name__}")
    for i, point in enumerate(points):
        _checked_point(point, f"field 'points[{i}]'", grid, epochs)
    evaluations = result.get("evaluations")
    if not isinstance(evaluations, list):
        raise OperatingPointError(f"field 'evaluations': must be a list, got {type(evaluations).__name__}")
    for i, e in enumerate(evaluations):
        where = f"field 'evaluations[{i}]'"
        index = e.get("point") if isinstance(e, dict) else None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(points):
            raise OperatingPointError(f"{where}.point: must be the index of a point (0 to {len(points) - 1})")
        paired = e.get("model_utility_paired")
        if not isinstance(paired, dict):
            raise OperatingPointError(f"{where}.model_utility_paired: must be a JSON object")
        for key, value in paired.items():
            lo, hi = PAIRED_RANGES.get(key, (None, None))
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or (lo is not None and not lo <= value <= hi)
            ):
                raise OperatingPointError(f"{where}.model_utility_paired.{key}: {value!r} is not a number in its range")
        diff = paired.get("difference")
        if diff is None or diff != points[index].get("model_utility_diff"):
            raise OperatingPointError(
                f"{where}.model_utility_paired.difference: {diff!r} is not point {index}'s model_utility_diff "
                f"({points[index].get('model_utility_diff')!r})"
            )
    evaluated = {e["point"] for e in evaluations}
    for i, point in enumerate(points):
        if point.get("model_utility_diff") is not None and i not in evaluated:
            raise OperatingPointError(
                f"field 'points[{i}]'.model_utility_diff: no Model Utility evaluation of the point"
            )
    try:
        chosen = choose([_for_rule(p) for p in points], Rule(**rule))
    except OperatingPointError as exc:
        raise OperatingPointError(f"field 'points': {exc}") from None
    use = result.get("use")
    if use is not None:
        _checked_point(use, "field 'use'", grid, epochs)
    expected = chosen["use"]
    same = (use is None and expected is None) or (
        use is not None
        and expected is not None
        and use.get("index") == expected["index"]
        and {k: v for k, v in use.items() if k not in ("adapter",)}
        == {k: v for k, v in points[expected["index"]].items() if k not in ("adapter",)} | {"index": expected["index"]}
    )
    if not same:
        shown = "none" if expected is None else _point_name(points[expected["index"]])
        got = "none" if use is None else _point_name(use)
        raise OperatingPointError(
            f"field 'use': {got} is not the point the rule chooses from the recorded points ({shown})"
        )
    if result.get("qualified") is not chosen["qualified"]:
        raise OperatingPointError(
            f"field 'qualified': {result.get('qualified')!r}, the rule says {chosen['qualified']}"
        )
    reason = result.get("reason")
    capped = f" (capped at {max_evaluations} evaluations)"
    if reason not in (chosen["reason"], chosen["reason"] + capped):
        raise OperatingPointError(f"field 'reason': {reason!r} is not the rule's ({chosen['reason']!r})")


def read_result(folder: str | Path) -> dict | None:
    """A finished operating-point cell's result, or None."""
    path = Path(folder) / RESULT_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = ["choose_operating_point", "sweep_points", "read_result", "check_result", "check_trace_file", "RESULT_FILE"]
