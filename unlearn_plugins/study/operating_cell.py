"""A method's operating-point cell (issue 34): its sweep traces, Model Utility evaluated lazily
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
from pathlib import Path
from typing import Any, Callable, Sequence

from ..evaluation.tofu_metrics import MU_PARTS
from .operating_point import MEASURES, Rule, choose, next_to_evaluate
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
    from ..evaluation.lm_eval_runner import read_outputs

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


def read_result(folder: str | Path) -> dict | None:
    """A finished operating-point cell's result, or None."""
    path = Path(folder) / RESULT_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


__all__ = ["choose_operating_point", "sweep_points", "read_result", "RESULT_FILE"]
