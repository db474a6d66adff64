"""A method's operating-point cell (unlearn_plugins/study/operating_cell.py): Model
Utility evaluated lazily, in the rule's order, until the choice is final or the cap is reached;
and the test cells keyed at the chosen point once it is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unlearn_plugins.benchmarks.tofu.metrics import MU_PARTS
from unlearn_plugins.benchmarks.tofu.study import operating_cell as oc


def write_run(folder: Path, lr: float, fqs: list[float]) -> dict:
    """A sweep stage folder with a trace (one point per epoch)."""
    (folder / "trace").mkdir(parents=True)
    lines = [
        json.dumps({"epoch": e, "step": 3 * e, "adapter": f"epoch{e}", "forget_quality": fq, "wasserstein_log": 1 - fq})
        for e, fq in enumerate(fqs, 1)
    ]
    (folder / "trace" / "trace.jsonl").write_text("\n".join(lines) + "\n")
    return {"folder": str(folder), "setting": {"lr": lr}}


def samples(value: float) -> dict:
    """MU sample rows whose every per-QA value is ``value`` (truth ratio 1 - value: the same part)."""
    out = {}
    for parts in MU_PARTS.values():
        for task, metric in parts:
            rows = out.setdefault(task, [{"doc_id": i} for i in range(4)])
            for row in rows:
                row[metric] = 1 - value if metric == "truth_ratio" else value
    return out


def run_cell(tmp_path, runs, utility: dict, max_evaluations=4):
    """The cell with a fake evaluation: an adapter's Model Utility is ``utility[adapter]``."""
    evaluated = []

    def evaluate(folder, params):
        evaluated.append(Path(params["adapter"]).relative_to(tmp_path).as_posix())
        (folder / "adapter.txt").write_text(params["adapter"])

    def read(folder):
        if folder.name == "target":
            return samples(0.5)
        return samples(utility[Path((folder / "adapter.txt").read_text()).relative_to(tmp_path).as_posix()])

    (tmp_path / "target").mkdir(exist_ok=True)
    out = tmp_path / "cell"
    out.mkdir(exist_ok=True)
    params = {
        "runs": runs,
        "target_evaluation": str(tmp_path / "target"),
        "rule": {"tolerance": 0.02, "band": "below", "on_none": "least_utility_loss"},
        "max_evaluations": max_evaluations,
        "evaluation": {"model": "target", "adapter": None},
    }
    result = oc.choose_operating_point(out, params, evaluate=evaluate, read_samples=read)
    assert json.loads((out / oc.RESULT_FILE).read_text()) == json.loads(json.dumps(result))
    return result, evaluated


def test_model_utility_is_evaluated_lazily_in_the_rules_order(tmp_path):
    runs = [write_run(tmp_path / "lr1", 1e-4, [0.2, 0.4, 0.6]), write_run(tmp_path / "lr2", 1e-3, [0.5, 0.9, 0.95])]
    # the best Forget Quality (lr 1e-3, epoch 3) loses too much utility, the next one does not
    utility = {"lr2/trace/epoch3": 0.40, "lr2/trace/epoch2": 0.49}
    result, evaluated = run_cell(tmp_path, runs, utility)
    assert evaluated == ["lr2/trace/epoch3", "lr2/trace/epoch2"]  # then nothing else could beat it
    assert result["qualified"] and result["final"] and not result["capped"]
    use = result["use"]
    assert (use["lr"], use["epoch"], use["forget_quality"]) == (1e-3, 2, 0.9)
    assert use["model_utility_diff"] == pytest.approx(-0.01)
    assert len(result["points"]) == 6 and len(result["evaluations"]) == 2


def test_the_cap_and_no_qualifying_point(tmp_path):
    runs = [write_run(tmp_path / "lr1", 1e-4, [0.3, 0.5, 0.7])]
    utility = {f"lr1/trace/epoch{e}": 0.3 + 0.01 * e for e in (1, 2, 3)}  # every point far below the target
    result, evaluated = run_cell(tmp_path, runs, utility, max_evaluations=2)
    assert evaluated == ["lr1/trace/epoch3", "lr1/trace/epoch2"]
    assert not result["qualified"] and result["capped"] and "capped at 2 evaluations" in result["reason"]
    assert result["use"]["epoch"] == 3  # the least utility lost among the evaluated points


def test_test_cells_are_keyed_at_the_chosen_point(tmp_path):
    from test_study_design import AUTHORS

    from unlearn_plugins.benchmarks.tofu.study.design_plan import plan_design
    from unlearn_plugins.stages import DONE
    from unlearn_plugins.study import load_study
    from unlearn_plugins.study.cells import WaitingCellPlan

    path = tmp_path / "study.toml"
    path.write_text(AUTHORS)
    study = load_study(str(path))
    cache = tmp_path / "cache"
    plan = plan_design(study, cache=cache, dry_run=True)
    assert isinstance(plan.cells["ihl/author18/seed0"], WaitingCellPlan)
    point = plan.cells["operating-point/ihl"].stages[0]
    assert point.params["max_evaluations"] == 4 and len(point.params["runs"]) == 2
    assert point.params["evaluation"]["references"] == plan.cells["eval-full/author14"].stages[0].params["references"]
    folder = Path(point.folder)
    folder.mkdir(parents=True)
    use = {"lr": 1e-3, "epoch": 2, "forget_quality": 0.9, "index": 3, "adapter": "x"}
    (folder / oc.RESULT_FILE).write_text(json.dumps({"use": use}))
    (folder / DONE).write_text("{}")
    plan = plan_design(study, cache=cache, dry_run=True)
    cell = plan.cells["ihl/author18/seed0"]
    assert not isinstance(cell, WaitingCellPlan)
    config = cell.stages[0].params["config"]
    assert (config["lr"], config["epochs"]) == (1e-3, 2.0)
    assert isinstance(plan.cells["reglu/author18/seed0"], WaitingCellPlan)  # its own point is not known


def test_every_traced_measure_is_kept_and_the_report_fills_in_what_an_older_cell_dropped(tmp_path):
    """heldout_prob is a measure, not a setting: the points keep it (the trace plot's right
    panel), the choice and the test cells' keys do not change with it; a cell chosen while it
    was dropped gets it back from the sweep traces, matched by setting and epoch."""
    from unlearn_plugins.benchmarks.tofu.study.author_report import _with_traced_measures

    run = write_run(tmp_path / "lr1", 1e-4, [0.2, 0.6])
    trace = tmp_path / "lr1" / "trace" / "trace.jsonl"
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    trace.write_text("".join(json.dumps({**r, "heldout_prob": 0.1 * r["epoch"]}) + "\n" for r in rows))
    points = oc.sweep_points([run])
    assert [p["heldout_prob"] for p in points] == [0.1, 0.2]
    assert oc._point_name(points[1]) == "lr0.0001-epoch2"
    older = [{k: v for k, v in p.items() if k not in ("heldout_prob", "adapter")} for p in points]
    older[1]["model_utility_diff"] = -0.01
    filled = _with_traced_measures(older, points)
    assert [p["heldout_prob"] for p in filled] == [0.1, 0.2]
    assert filled[1]["model_utility_diff"] == -0.01 and "adapter" not in filled[0]
    assert _with_traced_measures(older, []) == older  # no traces at hand: the cell's own points
