"""MUSE's scalability and sustainability grids in the WMDP study: the forget corpus's parts
(nested fractions, disjoint folds), the study file's checks, the chained stages (request k starts
from request k-1's model), the grid tables of the report, and the one-forget-set report unchanged
(the committed docs/study/wmdp_synthetic regenerates byte for byte)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_wmdp import STUDY_FILE, real_corpus_dry_run, write_mmlu

from unlearn_plugins.benchmarks.wmdp import parts, synthetic
from unlearn_plugins.cli import main
from unlearn_plugins.errors import DataError

pytestmark = pytest.mark.usefixtures("single_thread")

COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "study" / "wmdp_synthetic"


# ------------------------------------------------------------------------ the parts


@pytest.mark.parametrize("n", [3, 12, 37])
def test_fractions_are_nested_and_folds_disjoint(n):
    fractions: tuple[float, ...] = ()
    for f in (0.1, 0.25, 0.5, 0.8, 1.0):  # those of distinct sizes
        if parts.check(n, (*fractions, f)) is None:
            fractions += (f,)
    chosen = parts.select(n, parts.SEED, fractions)
    sets = [set(chosen[parts.fraction_name(f)]) for f in fractions]
    for smaller, larger in zip(sets, sets[1:]):
        assert smaller < larger  # the smaller part inside the larger
    assert sets[-1] == set(range(n)) and [len(s) for s in sets] == [parts.size(f, n) for f in fractions]
    for k in (2, 3, min(4, n)):
        folds = parts.select(n, parts.SEED, folds=k)
        cut = [set(folds[parts.fold_name(j)]) for j in range(1, k + 1)]
        assert sum(len(c) for c in cut) == n and set().union(*cut) == set(range(n))  # disjoint, covering
        assert max(map(len, cut)) - min(map(len, cut)) <= 1
    assert parts.select(n, parts.SEED, fractions) == chosen  # deterministic
    assert parts.size(0.1, 30) == 3 and parts.size(0.01, 3) == 1


def test_bad_grids_are_named():
    assert parts.check(3, folds=4) == "4 folds of 3 forget documents: at most one fold per document"
    assert parts.check(12, (0.2, 0.25)) == "0.2 and 0.25 both select 3 of the 12 forget documents"
    assert parts.check(12, (0.25, 0.5), 0) is None


def test_parts_are_written_in_corpus_order(tmp_path):
    folder = synthetic.write(tmp_path / "syn", synthetic.Settings(pathogens=3, compounds=2, retain_documents=1))
    spec = f"text:{folder / synthetic.FORGET}"
    info = parts.write(tmp_path / "parts", spec, parts.SEED, folds=2)
    documents = synthetic.generate(synthetic.Settings(pathogens=3, compounds=2, retain_documents=1))["forget"]
    assert info["documents"] == 5
    for k in (1, 2):
        rows = [
            json.loads(line)["text"] for line in (tmp_path / "parts" / f"request{k}.jsonl").read_text().splitlines()
        ]
        assert rows == [documents[i] for i in info["parts"][f"request{k}"]]  # sorted indices: the corpus's order
    with pytest.raises(DataError, match=r"forget corpus text:.*: 6 folds of 5 forget documents"):
        parts.write(tmp_path / "more", spec, parts.SEED, folds=6)


def test_each_question_belongs_to_its_entitys_document():
    settings = synthetic.Settings()
    data = synthetic.generate(settings)
    owners = synthetic.question_documents(settings)
    assert len(owners) == len(data["questions"]) == 56 and set(owners) == set(range(12))
    for q, d in zip(data["questions"], owners):
        assert data["forget"][d].startswith(q["entity"])


# ------------------------------------------------------------------------ the study file


@pytest.mark.parametrize(
    "added,message",
    [
        ("forget_fractions = [0.0, 1.0]", r"each must be a number in \(0, 1\], got 0.0"),
        ("forget_fractions = [0.5, 1.5]", r"each must be a number in \(0, 1\], got 1.5"),
        ("forget_fractions = [true]", r"each must be a number in \(0, 1\], got True"),
        ("forget_fractions = 0.5", r"must be a non-empty list of numbers, got 0.5"),
        ("forget_fractions = []", r"must be a non-empty list of numbers"),
        ("forget_fractions = [1.0, 0.5]", r"must be increasing, got \[1.0, 0.5\]"),
        ("forget_fractions = [0.2, 0.25]", r"0.2 and 0.25 both select 3 of the 12"),
        ("sequential_folds = 1", r"must be >= 2, got 1"),
        ("sequential_folds = 2.5", r"must be an integer"),
        ("sequential_folds = 13", r"13 folds of 12 forget documents"),
        ("sequential_folds = 2\nforget_fractions = [1.0]", r"one grid at a time"),
    ],
)
def test_grid_errors_name_the_file_and_key(added, message, tmp_path):
    """The error names the file and the first key of ``added``."""
    from unlearn_plugins.study import StudyError, load_study

    key = added.split(" = ")[0]
    text = STUDY_FILE.read_text().replace("mmlu_per_subject = 20\n", f"mmlu_per_subject = 20\n{added}\n", 1)
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(StudyError) as info:
        load_study(str(path))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"{path}: [benchmark] {key}: ")
    assert re.search(message, str(info.value))


def test_the_grid_variants_plan_and_the_one_forget_set_study_keeps_its_digest(tmp_path, capsys):
    from unlearn_plugins.study import expand, load_study

    committed = json.loads((COMMITTED / "study.json").read_text())
    assert load_study("wmdp_synthetic").digest() == committed["digest"]
    scal, sust = load_study("wmdp_synthetic", "scalability"), load_study("wmdp_synthetic", "sustainability")
    assert scal.model == sust.model == "smollm2-135m" and scal.benchmark.forget_fractions == (0.25, 0.5, 0.75, 1.0)
    ids = [c.id for c in expand(sust)]
    assert ids[3:7] == [f"grad_diff/seed0/request{k}" for k in range(1, 5)]
    code = main(["study", "wmdp_synthetic", "--variant", "sustainability", "--dry-run", "--cache-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "grad_diff/seed0/request4  grad_diff/seed0/request3" in out and "7 cells" in out
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_a_real_corpus_grid_is_checked_against_its_documents_when_planned(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("UNLEARN_WMDP_DIR", raising=False)
    folder = tmp_path / "wmdp"
    folder.mkdir()
    for name, texts in (("bio-forget-corpus", ["one", "two"]), ("bio-retain-corpus", ["three"])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    question = {"question": "q?", "choices": ["a", "b", "c", "d"], "answer": 0}
    for name in ("wmdp-bio.jsonl", "wmdp-chem.jsonl", "wmdp-cyber.jsonl"):
        (folder / name).write_text(json.dumps(question) + "\n")
    corpus = f'corpus = "real"\nwmdp_dir = "{folder}"\nsequential_folds = 3\n'
    path, code, err = real_corpus_dry_run(tmp_path, capsys, corpus)
    spec = f"text:{folder / 'bio-forget-corpus.jsonl'}"
    assert code != 0 and err[-1] == (
        f"error: {path}: [benchmark] sequential_folds: 3 folds of 2 forget documents: at most one fold per "
        f"document (forget corpus {spec})"
    )


# ------------------------------------------------------------------------ the report, unchanged


@pytest.mark.parametrize("variant", [None, *sorted(p.name for p in COMMITTED.iterdir() if p.is_dir())])
def test_the_committed_report_regenerates_byte_for_byte(variant, tmp_path):
    """Each committed report (the one-forget-set study's, and each variant's in its subfolder)
    from its committed rows: the grids change nothing in the first."""
    from unlearn_plugins.benchmarks.wmdp.cells import plan_wmdp_study
    from unlearn_plugins.benchmarks.wmdp.report import write_report
    from unlearn_plugins.study import load_study

    folder = COMMITTED / variant if variant else COMMITTED
    committed = json.loads((folder / "study.json").read_text())
    plan = plan_wmdp_study(load_study("wmdp_synthetic", variant), cache=tmp_path / "cache", dry_run=True)
    for row in committed["rows"]:
        cell = plan.cells[row["cell"]]
        Path(cell.result).mkdir(parents=True)
        (Path(cell.result) / "wmdp_summary.json").write_text(json.dumps({"tasks": row["tasks"]}))
        (Path(cell.result) / "resources.json").write_text(json.dumps({"seconds": row["seconds"]}))
        if row["teach_seconds"] is not None:
            teach = Path(plan.cells["target"].result)
            teach.mkdir(parents=True)
            (teach / "resources.json").write_text(json.dumps({"seconds": row["teach_seconds"]}))
    write_report(tmp_path / "out", plan, committed["cells"], wall_s=committed["wall_s"])
    for name in ("summary.md", "study.json"):
        assert (tmp_path / "out" / name).read_text() == (folder / name).read_text(), name


# ------------------------------------------------------------------------ the tiny grids, run


@pytest.fixture(scope="module")
def grids(tmp_path_factory):
    """tiny_scalability, then tiny_sustainability on the same cache (the base, the target and
    its evaluation built once)."""
    root = tmp_path_factory.mktemp("grids")
    mp = pytest.MonkeyPatch()
    from unlearn_plugins.benchmarks.wmdp.tasks import utils as task_utils

    mp.setenv("UNLEARN_MMLU_DIR", str(write_mmlu(root / "mmlu", task_utils.MMLU_SUBJECTS)))
    done = {}
    for variant in ("tiny_scalability", "tiny_sustainability"):
        out = root / variant
        args = ["study", "wmdp_synthetic", "--variant", variant, "--out", str(out), "--cache-dir", str(root / "cache")]
        code = main([*args, "--workers", "1", "--threads", "1"])
        assert code == 0, (out / "logs").exists() and sorted(p.read_text()[-2000:] for p in (out / "logs").iterdir())
        done[variant] = out
    yield root, done
    mp.undo()


def _plan(root: Path, variant: str):
    from unlearn_plugins.benchmarks.wmdp.cells import plan_wmdp_study
    from unlearn_plugins.study import load_study

    return plan_wmdp_study(load_study("wmdp_synthetic", variant), cache=root / "cache", dry_run=True)


def test_scalability_runs_each_fraction_from_the_target(grids):
    root, done = grids
    plan = _plan(root, "tiny_scalability")
    target = plan.models["target"]
    half, whole = plan.cells["grad_diff/seed0/fraction0.5"], plan.cells["grad_diff/seed0/fraction1"]
    assert half.stages[0].params["model"] == whole.stages[0].params["model"] == target
    assert whole.stages[0].params["forget"] == plan.benches[0]["forget"]  # fraction 1: the whole corpus
    # ... so its stages are the one-forget-set study's (the tiny variant's grad_diff/seed0)
    tiny = _plan(root, "tiny").cells["grad_diff/seed0"]
    assert [s.folder for s in tiny.stages] == [s.folder for s in whole.stages]
    written = json.loads((Path(half.stages[0].params["forget"][5:]).parent / parts.INFO).read_text())
    assert written["documents"] == 3 and len(written["parts"]["fraction0.5"]) == 2
    report = json.loads((done["tiny_scalability"] / "study.json").read_text())
    rows = {r["row"]: r for r in report["rows"]}
    assert report["benchmark"]["forget_fractions"] == [0.5, 1.0]
    assert set(rows["grad_diff/seed0/fraction0.5"]["part"]["documents"]) < set(
        rows["grad_diff/seed0/fraction1"]["part"]["documents"]
    )
    for name in ("grad_diff/seed0/fraction0.5", "grad_diff/seed0/fraction1"):
        split = rows[name]["split"]
        n = rows[name]["tasks"]["wmdp_synthetic_cloze"]["n"]
        assert split["forgotten"]["n"] + (split["rest"]["n"] if split["rest"] else 0) == n == 14
    assert rows["grad_diff/seed0/fraction1"]["split"]["rest"] is None  # nothing left
    summary = (done["tiny_scalability"] / "summary.md").read_text()
    assert "## Scalability" in summary and "| grad_diff/seed0 | 0.5 (2 of 3) |" in summary
    assert "| grad_diff/seed0 | 1 (3 of 3) |" in summary and "no questions" in summary
    main_table = summary.split("## Scalability")[0]
    assert "| target |" in main_table and "grad_diff" not in main_table


def test_sustainability_chains_each_request_on_the_one_before(grids):
    root, done = grids
    plan = _plan(root, "tiny_sustainability")
    for method, made in (("rmu", ""), ("grad_diff", "merged")):
        first, second = plan.cells[f"{method}/seed0/request1"], plan.cells[f"{method}/seed0/request2"]
        assert first.stages[0].params["model"] == plan.models["target"]
        # request 2 unlearns fold 2 from the model request 1 left (a LoRA run's merged model)
        assert second.stages[0].params["model"] == first.model == str(Path(first.stages[0].folder) / "run" / made)
        assert second.cell.deps == (first.cell.id,) and Path(first.model, "config.json").is_file()
        assert first.stages[1].params["model"] == first.model and first.stages[1].params["adapter"] is None
        f1, f2 = (plan.benches[0]["parts"][f"request{k}"]["indices"] for k in (1, 2))
        assert not set(f1) & set(f2) and sorted(f1 + f2) == [0, 1, 2]
    # a rerun builds nothing: each request's stages are cached (resuming starts where it stopped)
    assert all(cp.cached for cp in plan.cells.values())
    report = json.loads((done["tiny_sustainability"] / "study.json").read_text())
    rows = {r["row"]: r for r in report["rows"]}
    assert [rows[f"rmu/seed0/request{k}"]["part"]["request"] for k in (1, 2)] == [1, 2]
    assert rows["rmu/seed0/request2"]["part"]["documents"] == [0, 1, 2]  # forgotten so far: both folds
    summary = (done["tiny_sustainability"] / "summary.md").read_text()
    assert "## Sustainability: the forget documents in 2 folds" in summary
    assert "| rmu/seed0 | 2 (3 of 3 documents so far) |" in summary
