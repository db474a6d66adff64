"""A study's records carry no machine path in their file names: lm-eval names
an evaluation's folder after the model's path (``__work__cache__studies__run-...__run``), and the
records named theirs so; new records name it after the cell and the stage. Old records are read as
they are: the committed reglu_tofu records still regenerate docs/study/reglu_tofu byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unlearn_plugins.cli import main
from unlearn_plugins.study import builtin_studies
from unlearn_plugins.study import records as ledger
from unlearn_plugins.study.cells import CellPlan, Plan, Stage
from unlearn_plugins.study.spec import Cell

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_RECORDS = ROOT / "bench" / "results" / "reglu_tofu"
COMMITTED_REPORT = ROOT / "docs" / "study" / "reglu_tofu"
#: where the committed report was made: its cache, the built-in study's folder and the TOFU folder
#: (study.json names them; summary.md and pareto.png name no path)
REPORT_PATHS = {
    "cache": "/tmp/emptycache4",
    "studies": "/work/main/unlearn_plugins/study/studies",
    "tofu": "/work/shared/data/tofu",
}


def _evaluation(folder: Path, model_dir: str, date: str = "2026-01-01T00-00-00.000001") -> None:
    """An evaluation's files in lm-eval's layout, as write_outputs leaves them."""
    (folder / model_dir).mkdir(parents=True)
    (folder / model_dir / f"results_{date}.json").write_text(json.dumps({"results": {}, "unlearn_summary": {}}))
    (folder / model_dir / f"samples_tofu_forget_prob_{date}.jsonl").write_text(
        json.dumps({"doc_id": 0, "prob": 0.5, "doc": {"question": "Q?"}}) + "\n"
    )


def test_new_records_name_the_evaluation_after_the_cell_and_stage(tmp_path):
    cache = tmp_path / "work" / "cache" / "studies"
    stage = cache / "eval-grad_diff-forget1-seed0-abc123"
    machine = str(cache / "run-grad_diff-forget1-seed0-def456" / "run").replace("/", "__")
    _evaluation(stage, machine)
    # the robustness measurement and an attack's evaluation of it, named after temporary folders
    _evaluation(stage / "really_forgotten", machine)
    _evaluation(stage / "really_forgotten" / "attacks" / "quantize", f"{machine}.tmp-host-123__eval__model")
    (stage / "really_forgotten" / "attacks" / "quantize" / "model").mkdir()
    (stage / "really_forgotten" / "attacks" / "quantize" / "model" / "attack.json").write_text("{}")
    (stage / "resources.json").write_text("{}")
    (stage / "stage.json").write_text("{}")
    cell = Cell("grad_diff/forget1/seed0", "method", "grad_diff, forget 1, seed 0", forget=1)
    cp = CellPlan(cell, [Stage("evaluate", str(stage), "evaluate", {})], result=str(stage))
    records = tmp_path / "records"

    assert ledger.save(cp, records) == [stage.name]
    names = sorted(str(p.relative_to(records)) for p in records.rglob("*") if p.is_file())
    name = "grad_diff-forget1-seed0-evaluate"
    date = "2026-01-01T00-00-00.000001"
    assert names == sorted(
        f"{stage.name}/{f}"
        for f in (
            "resources.json",
            "stage.json",
            f"{name}/results_{date}.json",
            f"{name}/samples_tofu_forget_prob_{date}.jsonl",
            f"really_forgotten/{name}/results_{date}.json",
            f"really_forgotten/{name}/samples_tofu_forget_prob_{date}.jsonl",
            f"really_forgotten/attacks/quantize/{name}/results_{date}.json",
            f"really_forgotten/attacks/quantize/{name}/samples_tofu_forget_prob_{date}.jsonl",
            "really_forgotten/attacks/quantize/model/attack.json",
        )
    )
    assert not [n for n in names if "work" in n or "tmp" in n or "__" in n]

    # restored into another machine's cache, the evaluation reads as it was written
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    other = tmp_path / "elsewhere" / stage.name
    cp.stages[0].folder = str(other)
    plan = Plan(study=None, cache=other.parent, device=None, benches={}, cells={cell.id: cp})
    assert ledger.restore(plan, records) == [stage.name]
    for where in (other, other / "really_forgotten", other / "really_forgotten" / "attacks" / "quantize"):
        written = read_outputs(where)
        assert written.summary == {} and set(written.samples) == {"tofu_forget_prob"}


def test_two_evaluations_in_one_folder_keep_apart(tmp_path):
    stage = tmp_path / "eval-x"
    _evaluation(stage, "__a__model", "2026-01-01T00-00-00.000001")
    _evaluation(stage, "__b__model", "2026-01-02T00-00-00.000001")
    (stage / "stage.json").write_text("{}")
    cp = CellPlan(Cell("eval-full/forget1", "eval_full", "x", forget=1), [Stage("e", str(stage), "evaluate", {})])
    ledger.save(cp, tmp_path / "records")
    folders = sorted(p.name for p in (tmp_path / "records" / "eval-x").iterdir() if p.is_dir())
    assert folders == ["eval-full-forget1-evaluate", "eval-full-forget1-evaluate-2"]


@pytest.mark.slow
def test_the_committed_records_regenerate_the_committed_report_byte_for_byte(tmp_path, tofu_dir, monkeypatch):
    """`unlearn study reglu_tofu --report-only --records bench/results/reglu_tofu` (records in the
    old layout, folders named after the machine's cache) rebuilds docs/study/reglu_tofu: summary.md
    and pareto.png byte for byte, study.json too once the paths it names (the cache given, the
    built-in study file) are those of the machine that made it."""
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    cache, out = tmp_path / "cache", tmp_path / "report"
    code = main(
        ["study", "reglu_tofu", "--report-only", "--records", str(COMMITTED_RECORDS)]
        + ["--out", str(out), "--cache-dir", str(cache)]
    )
    assert code == 0
    for name in ("summary.md", "pareto.png"):
        assert (out / name).read_bytes() == (COMMITTED_REPORT / name).read_bytes(), name
    here = {"cache": str(cache), "studies": str(builtin_studies()["reglu_tofu"].parent), "tofu": str(tofu_dir)}
    made_here = (out / "study.json").read_text()
    for key, path in here.items():
        made_here = made_here.replace(path, REPORT_PATHS[key])
    assert made_here == (COMMITTED_REPORT / "study.json").read_text()
