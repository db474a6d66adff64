"""Running an author-unit study through ``unlearn study``: the sweep on the reserved
author, the operating points, a second planning pass that keys the test cells at their points,
the author-unit report (comparisons over the authors, paired Model Utility, noise ceiling,
traces), and the records: the report regenerates from them alone and a rerun builds nothing."""

from __future__ import annotations

import json
import shutil

import pytest
from support_checks import author_study_toml

from unlearn_plugins.benchmarks.tofu.study.design_plan import plan_design
from unlearn_plugins.benchmarks.tofu.study.statistics import compare_paired
from unlearn_plugins.cli import main
from unlearn_plugins.study import load_study
from unlearn_plugins.study.cells import WaitingCellPlan

#: two methods, one swept setting each, 2 epochs, 2 test authors, a noise ceiling on the reserved one
STUDY = author_study_toml(
    "tiny_author_run",
    5,
    [18, 19],
    17,
    ceiling="[noise_ceiling]\nauthors = [17]\nseeds = [1]\n\n",
    rol_weights="[0.1]",
    rest="""
[sweep]
author = 17
lr = [1e-3]
epochs = 2
trace = ["forget_quality", "wasserstein_log", "heldout_prob"]
heldout = { real_authors = 4, world_facts = 4, retain_authors = 4 }
model_utility_evaluations_max = 1

[operating_point]
tolerance = 0.05

[[comparisons]]
family = "wasserstein"
metric = "wasserstein_log"
method = "reglu"
rivals = ["ihl"]

[evaluation]
mu_size = 4
batch_size = 8
gen_margin = 4
""",
)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    root = tmp_path_factory.mktemp("author_study")
    path = root / "study.toml"
    path.write_text(STUDY)
    cache, out, records = root / "cache", root / "out", root / "records"
    code = main(["study", str(path), "--cache-dir", str(cache), "--out", str(out), "--records", str(records)])
    return {"root": root, "path": path, "cache": cache, "out": out, "records": records, "code": code}


def test_every_cell_runs_and_the_test_cells_use_the_chosen_points(ran):
    assert ran["code"] == 0
    report = json.loads((ran["out"] / "study.json").read_text())
    assert report["failed"] == [] and report["not_run"] == []
    assert all(c["status"] == "done" for c in report["cells"].values())
    plan = plan_design(load_study(str(ran["path"])), cache=ran["cache"], dry_run=True)
    assert not any(isinstance(cp, WaitingCellPlan) for cp in plan.cells.values())
    for method in ("ihl", "reglu"):
        use = report["operating_points"][method]["use"]
        assert use["lr"] == 1e-3 and use["epoch"] in (1, 2)
        for author in (18, 19):
            config = plan.cells[f"{method}/author{author}/seed0"].stages[0].params["config"]
            assert config["lr"] == use["lr"] and config["epochs"] == float(use["epoch"])
            if method == "reglu":
                assert config["regularizer_options"]["weight"] == 0.1
    # the sweep's trace, one plot per method
    assert [p["epoch"] for p in report["operating_points"]["reglu"]["points"]] == [1, 2]
    assert (ran["out"] / "trace-reglu.png").stat().st_size > 1000


def test_the_report_tests_the_declared_families_over_the_authors(ran):
    report = json.loads((ran["out"] / "study.json").read_text())
    per = report["per_author"]
    values = {m: {a: per[m][str(a)]["forget_quality"] for a in (18, 19)} for m in ("ihl", "reglu")}
    expected = compare_paired(values, [("reglu", "ihl")])[0]
    row = report["analysis"]["families"]["primary"]["rows"][0]
    assert row["difference"] == pytest.approx(expected["difference"])
    assert row["holm_p"] == pytest.approx(expected["holm_p"])
    for m in ("ihl", "reglu"):
        for a in ("18", "19"):
            numbers = per[m][a]
            assert 0 <= numbers["ks_statistic"] <= 1 and numbers["wasserstein_log"] >= 0
            paired = numbers["model_utility_paired"]
            assert numbers["model_utility_diff"] == paired["difference"]
    assert "verdict" not in report["analysis"]  # 2 authors cannot reach alpha: the parser refuses a [verdict]
    ceiling = report["noise_ceiling"]["17"]
    assert set(ceiling["seeds"]) == {"seed1"} and 0 <= ceiling["forget_quality"]["min"] <= 1
    summary = (ran["out"] / "summary.md").read_text()
    assert "## Comparisons: primary" in summary and "## Noise ceiling" in summary and "## Operating points" in summary


def test_the_report_regenerates_from_the_records_and_a_rerun_builds_nothing(ran, capsys):
    capsys.readouterr()
    root = ran["root"]
    common = ["study", str(ran["path"]), "--records", str(ran["records"])]
    assert main([*common, "--cache-dir", str(root / "fresh"), "--out", str(root / "again"), "--report-only"]) == 0
    assert (root / "again" / "summary.md").read_text() == (ran["out"] / "summary.md").read_text()
    first = json.loads((ran["out"] / "study.json").read_text())
    again = json.loads((root / "again" / "study.json").read_text())
    for key in ("per_author", "analysis", "noise_ceiling", "operating_points", "references"):
        assert again[key] == first[key], key
    # a run on a fresh cache restores every cell and builds none (no model is trained)
    assert main([*common, "--cache-dir", str(root / "fresh2"), "--out", str(root / "again2")]) == 0
    err = capsys.readouterr().err
    assert " start " not in err and "done" in err
    assert not list((root / "fresh2").glob("target-*/run/merged"))


def test_a_fresh_machine_rebuilds_the_sweeps_reference_retain_model(ran, tmp_path, capsys):
    """Records holding the retain evaluations but not the sweeps (a session that ended between
    them): the traced runs compute their reference truth ratios from the reserved author's retain
    model, so a fresh machine rebuilds that model (and no other retain model) instead of failing
    on a missing folder."""
    records = tmp_path / "records"
    shutil.copytree(ran["records"], records)
    removed = [d.name for d in records.iterdir() if d.name.startswith(("sweep-", "point-"))]
    assert removed, sorted(d.name for d in records.iterdir())
    for name in removed:
        shutil.rmtree(records / name)
    capsys.readouterr()
    common = ["--records", str(records), "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    code = main(["study", str(ran["path"]), *common])
    err = capsys.readouterr().err
    assert code == 0, err
    started = [line.split()[1] for line in err.splitlines() if line.split()[:1] == ["start"]]
    assert "retain/author17" in started and not any(
        c.startswith("retain/author1") and c != "retain/author17" for c in started
    )
    assert any(c.startswith("sweep/") for c in started) and not any(c.startswith("eval-") for c in started)


class FakeExecutor:
    """Runs nothing: each submitted cell finishes at once, failing when its id is in ``fail``."""

    def __init__(self, fail: set[str], ran: list[str]):
        self.fail, self.ran, self.queue = fail, ran, []

    def describe(self) -> str:
        return "fake"

    def free(self) -> int:
        return 1

    def submit(self, task) -> None:
        self.queue.append(task.plan.cell.id)

    def events(self, timeout):
        while self.queue:
            cell = self.queue.pop(0)
            self.ran.append(cell)
            status = {"status": "failed", "error": "boom"} if cell in self.fail else {"status": "done"}
            yield ("done", cell, {**status, "sources": ["built"]})

    def close(self, interrupted: bool = False) -> None:
        pass


@pytest.mark.parametrize("fail", [set(), {"operating-point/m"}])
def test_the_runner_plans_again_once_an_operating_point_is_chosen(fail, tmp_path, monkeypatch):
    """Pass 1 runs the operating point, not the test cell waiting for it; pass 2 (planned again)
    runs the test cell keyed at the point. A failed operating point ends the passes: the test
    cell is not run, and nothing is retried."""
    from unlearn_plugins.study import executors, runner
    from unlearn_plugins.study.cells import CellPlan, Plan, Stage
    from unlearn_plugins.study.spec import Cell

    done: set[str] = set()
    plans: list[Plan] = []

    class Study:
        design = object()
        movielens = None
        workers_per_gpu = 1
        prompt_format = None

    def plan_cells(study, *, cache, device=None, dry_run=False, stream=None):
        op = Cell("operating-point/m", "operating_point", "op", method="m")
        test = Cell("m/author1/seed0", "method", "test", method="m", deps=("operating-point/m",))
        stage = Stage("op", str(tmp_path / "op"), "operating_point", {})
        plan = Plan(study, tmp_path, None, {})
        plan.cells[op.id] = CellPlan(op, [stage], result=stage.folder)
        if "operating-point/m" in done:
            (tmp_path / "op").mkdir(exist_ok=True)
            (tmp_path / "op" / "stage.json").write_text("{}")
            plan.cells[test.id] = CellPlan(test, [Stage("t", str(tmp_path / "t"), "evaluate", {})])
        else:
            plan.cells[test.id] = WaitingCellPlan(test, [Stage("t", "pending", "evaluate", {})], waiting=op.id)
        plans.append(plan)
        return plan

    ran: list[str] = []

    class Tracking(FakeExecutor):
        def events(self, timeout):
            for event in super().events(timeout):
                if event[2]["status"] == "done":
                    done.add(event[1])
                yield event

    monkeypatch.setattr(runner, "plan_cells", plan_cells)
    monkeypatch.setattr(executors, "make_executor", lambda *a, **k: Tracking(fail, ran))
    plan, results = runner.run_plan(Study(), out=tmp_path / "out", cache=tmp_path)
    if not fail:
        assert ran == ["operating-point/m", "m/author1/seed0"] and len(plans) == 2
        assert results["m/author1/seed0"]["status"] == "done" and not isinstance(
            plan.cells["m/author1/seed0"], WaitingCellPlan
        )
    else:
        assert ran == ["operating-point/m"] and len(plans) == 1
        assert results["operating-point/m"]["status"] == "failed"
        assert results["m/author1/seed0"] == {
            "status": "failed",
            "sources": [],
            "error": "not run: it needs operating-point/m, which failed",
        }
