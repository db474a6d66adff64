"""`unlearn study` end to end on the tiny model and generated authors: two local workers, a
fully cached rerun, a failed cell, a worker killed with SIGKILL and the resumed run, and the
Dask executor on a LocalCluster (a study stopped from outside and two concurrent runs of one
study: test_study_signals.py).

The tests share one stage cache (module scope), so the target and retain models are built
once; each test that must build method cells uses seeds of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unlearn_plugins.benchmarks.tofu.study.report import REQUIRED_METRICS
from unlearn_plugins.cli import main
from unlearn_plugins.study import builtin_studies

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = builtin_studies()["tiny"].read_text()
CELLS = [
    "target",
    "retain/forget1",
    "eval-retain/forget1",
    "eval-full/forget1",
    "grad_diff/forget1/seed0",  # seed-major: every method at seed 0 first
    "ihl_fila/forget1/seed0",
    "grad_diff/forget1/seed1",
    "ihl_fila/forget1/seed1",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("study-cache")


def study_file(folder: Path, seeds: list[int], methods=("grad_diff", "ihl_fila"), extra: str = "") -> Path:
    """The tiny study with other seeds, some of its methods, and more text at the end."""
    head, rest = TINY.split("[[methods]]", 1)
    blocks = ["[[methods]]" + b for b in rest.split("[[methods]]")]
    blocks[-1], evaluation = blocks[-1].split("[evaluation]")
    kept = [b for b in blocks if any(f'name = "{m}"' in b for m in methods)]
    text = head.replace("seeds = [0, 1]", f"seeds = {list(seeds)}") + "".join(kept) + "[evaluation]" + evaluation
    path = folder / "study.toml"
    path.write_text(text + extra)
    return path


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["study", *map(str, args), "--threads", "1"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def report(out: Path) -> dict:
    return json.loads((out / "study.json").read_text())


def run_cli(*args, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "unlearn_plugins.cli", "study", *map(str, args), "--threads", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_tiny_study_with_two_workers_then_fully_cached(cache, tmp_path, capsys):
    from unlearn_plugins.benchmarks.tofu.study.report import read_evaluation

    out = tmp_path / "report"
    code, stdout, err = run(capsys, "tiny", "--workers", "2", "--out", out, "--cache-dir", cache)
    assert code == 0, err[-3000:]
    assert "executor: local: 2 worker process(es), 1 thread(s) each" in err
    workers = {line.split(" on ")[1].split(" (pid")[0] for line in err.splitlines() if " start " in line}
    assert workers == {"worker 0", "worker 1"}  # both workers built cells
    for name in ("study.json", "summary.md", "pareto.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    data = report(out)
    assert list(data["cells"]) == CELLS
    assert all(c["status"] == "done" and c["source"] == "built" for c in data["cells"].values())
    assert data["failed"] == [] and data["ci"] == {"method": "t", "level": 0.95}
    groups = {g["method"]: g for g in data["groups"]}
    assert set(groups) == {"grad_diff", "ihl_fila"}
    for name, g in groups.items():
        m = g["metrics"]
        assert g["seeds_done"] == [0, 1]
        for key in REQUIRED_METRICS:  # every number each evaluation must have
            assert m[key]["n"] == 2 and 0 <= m[key]["mean"] <= 1, (name, key)
            if m[key]["spread"] is False:  # both seeds gave one value: no interval ("no spread")
                assert m[key]["low"] is None and m[key]["high"] is None, (name, key)
            else:
                assert m[key]["low"] <= m[key]["mean"] <= m[key]["high"], (name, key)
        assert m["wall_s"]["mean"] > 0 and m["peak_rss_mb"]["mean"] > 50
    refs = {r["name"]: r for r in data["references"]}
    assert refs["retain"]["forget_quality"] == pytest.approx(1.0)  # its own reference
    assert 0 <= refs["full"]["forget_quality"] <= 1
    # each seed's unlearning changed the target's answers, differently per seed
    cells = data["cells"]
    _, full_samples = read_evaluation(Path(cells["eval-full/forget1"]["stages"][0]))
    before = [r["prob"] for r in sorted(full_samples["tofu_forget_prob"], key=lambda r: r["doc_id"])]
    after = {}
    for seed in (0, 1):
        _, samples = read_evaluation(Path(cells[f"grad_diff/forget1/seed{seed}"]["stages"][1]))
        after[seed] = [r["prob"] for r in sorted(samples["tofu_forget_prob"], key=lambda r: r["doc_id"])]
        assert max(abs(a - b) for a, b in zip(after[seed], before)) > 1e-6
    assert after[0] != after[1]
    summary = (out / "summary.md").read_text()
    assert "| GradDiff | 2/2 |" in summary and "| IHL + FILA | 2/2 |" in summary
    assert "Student-t" in summary and "8 cells: 8 built in this run, 0 cached" in summary
    # the Forget Quality leader tested against the other method over the two seeds
    test = data["comparisons"]["1"]
    assert {test["leader"], test["against"][0]["method"]} == {"grad_diff", "ihl_fila"}
    assert 0 < test["against"][0]["permutation_p"] <= 1 and "exact permutation test" in summary
    assert "GradDiff" in stdout and f"report -> {out}/" in stdout

    # the rerun builds nothing, starts no worker, and reports the same numbers
    code, _, err = run(capsys, "tiny", "--workers", "2", "--out", out, "--cache-dir", cache)
    assert code == 0
    assert sum(" cached  " in line for line in err.splitlines()) == 8 and "executor:" not in err
    again = report(out)
    assert all(c["source"] == "cached" for c in again["cells"].values())
    assert again["groups"] == data["groups"] and again["references"] == data["references"]

    code, stdout, _ = run(capsys, "tiny", "--dry-run", "--cache-dir", cache)
    assert code == 0 and stdout.splitlines()[-1] == f"8 cells: 8 cached, 0 to build (cache {cache})"

    # --report-only: the finished cells' report, building nothing; a grid with one more seed
    # reports its new cells as not run, and the finished seeds' numbers as they are
    code, _, err = run(capsys, "tiny", "--report-only", "--out", tmp_path / "again", "--cache-dir", cache)
    assert code == 0 and "start" not in err and "executor:" not in err
    assert report(tmp_path / "again")["groups"] == data["groups"]
    before = sorted(p.name for p in cache.iterdir())
    bigger = study_file(tmp_path, [0, 1, 2])
    code, _, err = run(capsys, bigger, "--report-only", "--out", tmp_path / "partial", "--cache-dir", cache)
    assert code == 0, err[-2000:]
    assert sorted(p.name for p in cache.iterdir()) == before  # nothing built
    partial = report(tmp_path / "partial")
    assert partial["not_run"] == ["grad_diff/forget1/seed2", "ihl_fila/forget1/seed2"] and partial["failed"] == []
    groups = {g["method"]: g for g in partial["groups"]}
    assert groups["grad_diff"]["seeds_done"] == [0, 1]
    assert groups["grad_diff"]["metrics"] == {g["method"]: g for g in data["groups"]}["grad_diff"]["metrics"]
    summary = (tmp_path / "partial" / "summary.md").read_text()
    assert "| GradDiff | 2/3 |" in summary and "Not run yet (2): `grad_diff/forget1/seed2`" in summary
    assert "0 failed, 2 not run; report only (nothing built)." in summary


def test_dry_run_lists_the_grid_and_builds_nothing(tmp_path, capsys):
    code, stdout, _ = run(capsys, "tiny", "--dry-run", "--cache-dir", tmp_path / "cache")
    assert code == 0
    lines = stdout.splitlines()
    assert lines[0].split() == ["cell", "needs", "stages", "state"]
    assert [line.split()[0] for line in lines[2:-1]] == CELLS
    assert lines[6].split() == [
        "grad_diff/forget1/seed0",
        "target,",
        "eval-retain/forget1",
        "unlearn",
        "+",
        "evaluate",
        "to",
        "build",
    ]
    assert lines[-1] == f"8 cells: 0 cached, 8 to build (cache {tmp_path / 'cache'})"
    assert not (tmp_path / "cache").exists()


def test_a_misspelt_task_fails_the_dry_run_before_any_work(tmp_path, capsys):
    """A misspelt task passed --dry-run (exit 0), then the real run fine-tuned
    the target and retain models and failed 6 of 8 cells with `unknown lm-eval task(s)`."""
    tasks = '["tofu_forget_prob", "tofu_forget_rouge", "tofu_forget_truth_ratio", "tofu_model_utility", "tofu_forget_rouge_l"]'
    path = study_file(tmp_path, [0], extra=f"tasks = {tasks}\n")
    for extra in (["--dry-run"], ["--out", tmp_path / "out"]):
        code, stdout, err = run(capsys, path, *extra, "--cache-dir", tmp_path / "cache")
        assert code == 1 and stdout == ""
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"error: {path}: [evaluation] tasks: unknown lm-eval task(s): tofu_forget_rouge_l")
        assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_a_failed_cell_is_reported_and_the_others_go_on(cache, tmp_path, capsys):
    # a method whose training diverges (its forget loss overflows): that cell fails, the rest finish
    path = study_file(
        tmp_path,
        [0],
        extra=('\n[[methods]]\nname = "diverge"\nobjective = "grad_diff"\nobjective_options = { gamma = 1e308 }\n'),
    )
    out = tmp_path / "report"
    code, _, err = run(capsys, path, "--workers", "2", "--out", out, "--cache-dir", cache)
    assert code == 1
    failed = [line for line in err.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "diverge/forget1/seed0: training stopped: " in failed[0]
    assert err.splitlines()[-1].startswith("error: 1 of 7 cells failed: diverge/forget1/seed0 (see ")
    data = report(out)
    assert data["failed"] == ["diverge/forget1/seed0"]
    cell = data["cells"]["diverge/forget1/seed0"]
    assert cell["error"].startswith("training stopped: ") and "\n" not in cell["error"]
    assert Path(cell["log"]).is_file() and "training stopped" in Path(cell["log"]).read_text()
    assert all(c["status"] == "done" for cid, c in data["cells"].items() if cid != "diverge/forget1/seed0")
    groups = {g["method"]: g for g in data["groups"]}
    assert groups["diverge"]["seeds_done"] == [] and groups["grad_diff"]["metrics"]["forget_quality"]["n"] == 1
    summary = (out / "summary.md").read_text()
    assert "## Failed cells (1)" in summary and "- `diverge/forget1/seed0`: training stopped: " in summary


def _wait_for(predicate, timeout: float, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"not seen within {timeout} s; the study said: {err[-3000:]}")


def test_a_worker_whose_memory_grew_retires_and_a_fresh_one_takes_the_next_cell(cache, tmp_path, capsys, monkeypatch):
    """UNLEARN_WORKER_GROWTH_MB: a worker that holds more after a cell than after its first one
    (here: any growth at all) hands its slot to a fresh process; every cell is still built. One
    slot and four cells: its second or third cell retires it, so a fresh process builds a later one."""
    monkeypatch.setenv("UNLEARN_WORKER_GROWTH_MB", "0.001")
    out = tmp_path / "report"
    study = study_file(tmp_path, seeds=[20, 21, 22, 23], methods=("grad_diff",))
    code, _, err = run(capsys, study, "--workers", "1", "--out", out, "--cache-dir", cache)
    assert code == 0, err[-3000:]
    starts = [line.split(" on ")[1] for line in err.splitlines() if " start " in line]
    slots = {w.split(" (pid")[0] for w in starts}
    assert slots == {"worker 0"} and len(set(starts)) > len(slots)  # fresh processes
    assert all(c["status"] == "done" for c in report(out)["cells"].values())


def test_a_bad_worker_growth_limit_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("UNLEARN_WORKER_GROWTH_MB", "lots")
    code, _, err = run(capsys, "tiny", "--workers", "2", "--out", tmp_path / "r", "--cache-dir", tmp_path / "c")
    assert code != 0 and "UNLEARN_WORKER_GROWTH_MB='lots': not a number of MB" in err
    assert "Traceback" not in err


def test_a_killed_worker_fails_its_cell_and_the_rerun_resumes(cache, tmp_path):
    path = study_file(tmp_path, [5, 6], methods=["grad_diff"])
    out = tmp_path / "report"
    args = (path, "--workers", "1", "--out", out, "--cache-dir", cache)
    proc = run_cli(*args)
    # one worker builds the seeds in order: kill it (SIGKILL) while it builds the first one
    building = _wait_for(lambda: next(iter(cache.glob("*-grad_diff-forget1-seed5-*.tmp-*")), None), 600, proc)
    pid = int(building.name.rsplit("-", 1)[1])  # <folder>.tmp-<host>-<pid>
    assert pid != proc.pid
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err[-3000:]
    assert f"FAILED  grad_diff/forget1/seed5: worker 0 (pid {pid}) died: killed by signal 9 (SIGKILL)" in err
    # the study's own line is the last one, not multiprocessing's resource_tracker warning
    assert err.strip().splitlines()[-1].startswith("error: 1 of "), err[-1000:]
    assert "resource_tracker" not in err
    first = report(out)
    assert first["failed"] == ["grad_diff/forget1/seed5"]
    assert first["cells"]["grad_diff/forget1/seed6"]["status"] == "done"  # a new worker went on

    proc = run_cli(*args)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    sources = {cid: c["source"] for cid, c in report(out)["cells"].items()}
    assert sources.pop("grad_diff/forget1/seed5") == "built"
    assert set(sources.values()) == {"cached"}  # nothing that had finished was built again
    assert not list(cache.glob("*.tmp-*"))  # the killed stage's temporary folder is gone


def test_dask_executor_runs_a_grid_on_a_local_cluster(cache, tmp_path, capsys):
    pytest.importorskip("distributed")
    path = study_file(tmp_path, [11, 12], methods=["grad_diff"])
    out = tmp_path / "report"
    code, _, err = run(capsys, path, "--executor", "dask", "--workers", "2", "--out", out, "--cache-dir", cache)
    assert code == 0, err[-3000:]
    assert "executor: dask: LocalCluster tcp://127.0.0.1:" in err and ", 2 worker(s)" in err
    data = report(out)
    built = [cid for cid, c in data["cells"].items() if c["source"] == "built"]
    assert built == ["grad_diff/forget1/seed11", "grad_diff/forget1/seed12"]
    assert {line.split(" on ")[1].split(":")[0] for line in err.splitlines() if " start " in line} == {
        "dask worker tcp"
    }
    for g in data["groups"]:
        assert g["seeds_done"] == [11, 12] and g["metrics"]["model_utility"]["n"] == 2


def test_records_let_a_study_resume_with_an_empty_cache(cache, tmp_path, capsys):
    """--records keeps the finished cells' results (no models, samples slimmed to numbers); on
    another machine (an empty cache) they are restored, nothing is rebuilt for them, the report
    has the same numbers, and a new seed rebuilds the target it needs."""
    out, records = tmp_path / "report", tmp_path / "records"
    code, _, err = run(capsys, "tiny", "--out", out, "--cache-dir", cache, "--records", records)
    assert code == 0, err[-3000:]
    first = report(out)
    recorded = list(records.rglob("*"))
    assert not [p for p in recorded if p.suffix in (".safetensors", ".bin", ".pt")]
    sample_rows = [json.loads(line) for p in recorded if p.suffix == ".jsonl" for line in p.read_text().splitlines()]
    assert sample_rows and all("doc" not in r and "arguments" not in r and "doc_id" in r for r in sample_rows)
    assert sum(p.stat().st_size for p in recorded if p.is_file()) < 2_000_000
    # file names carry no machine path (lm-eval names its folder after the model's): the cell and stage
    assert not [p for p in recorded if "__" in str(p.relative_to(records)) or str(cache) in str(p)]
    stage = Path(first["cells"]["grad_diff/forget1/seed0"]["stages"][1]).name
    assert list((records / stage / "grad_diff-forget1-seed0-evaluate").glob("results_*.json"))

    empty = tmp_path / "empty-cache"
    code, stdout, _ = run(capsys, "tiny", "--dry-run", "--cache-dir", empty, "--records", records)
    assert code == 0 and stdout.splitlines()[-1] == (  # what the run below does: it builds nothing
        f"8 cells: 0 cached, 6 recorded, 2 not needed (only cached or recorded cells need them), 0 to build "
        f"(cache {empty})"
    )
    code, _, err = run(capsys, "tiny", "--out", tmp_path / "again", "--cache-dir", empty, "--records", records)
    assert code == 0, err[-3000:]
    assert "executor:" not in err  # no model built: every cell that needs one is recorded
    again = report(tmp_path / "again")
    assert {c["source"] for c in again["cells"].values()} == {"cached", "recorded"}
    assert again["groups"] == first["groups"] and again["references"] == first["references"]

    # a new seed needs the target: it is built (its hollow restored folder replaced), the rest restored
    path = study_file(tmp_path, [0, 1, 2], methods=("grad_diff",))
    code, _, err = run(capsys, path, "--out", tmp_path / "more", "--cache-dir", empty, "--records", records)
    assert code == 0, err[-3000:]
    more = report(tmp_path / "more")["cells"]
    assert more["target"]["source"] == "built" and more["grad_diff/forget1/seed2"]["source"] == "built"
    assert more["grad_diff/forget1/seed0"]["source"] == "cached"
    assert (records / Path(more["grad_diff/forget1/seed2"]["stages"][1]).name / "stage.json").is_file()


def test_robustness_puts_membership_inference_and_attacks_in_the_report(cache, tmp_path, capsys):
    """[evaluation] robustness = true: every evaluation also runs `unlearn eval --mia --robustness`
    (a holdout author, the retain model's MIA reference for privleak), the report gains privleak,
    the Min-K% AUC, exact memorization and the attack-aware forget probability per method, and
    the records keep them."""
    path = study_file(tmp_path, [7], methods=("grad_diff",), extra="robustness = true\n")
    out, records = tmp_path / "report", tmp_path / "records"
    code, _, err = run(capsys, path, "--out", out, "--cache-dir", cache, "--records", records, "--workers", "1")
    assert code == 0, err[-3000:]
    data = report(out)
    refs = {r["name"]: r for r in data["references"]}
    assert refs["retain"]["privleak"] is None and isinstance(refs["full"]["privleak"], float)
    for row in refs.values():
        assert 0 <= row["auc_min_k"] <= 1 and 0 <= row["exact_memorization"] <= 1
        assert row["forget_prob"] <= row["forget_prob_worst"] < 1
    group = data["groups"][0]["metrics"]
    cell = data["cells"]["grad_diff/forget1/seed7"]["metrics"]
    assert group["privleak"]["values"] == [cell["privleak"]] and cell["privleak"] >= -100
    assert cell["forget_prob_worst_attack"] in ("paraphrase", "format", "relearn", "quantize")
    # its plain forget ROUGE-L is the evaluation's own: its generations are capped alike
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    stage = Path(data["cells"]["grad_diff/forget1/seed7"]["stages"][1])
    measured = read_outputs(stage / "really_forgotten")
    rouge = measured.summary["robustness"]["metrics"]["rougeL_recall"]
    assert rouge["plain"] == pytest.approx(cell["forget_rougeL"], abs=1e-6)

    def cap(results):
        return results["configs"]["tofu_forget_rouge"]["generation_kwargs"]["max_gen_toks"]

    assert cap(measured.results) == cap(read_outputs(stage).results) < 200  # not lm-eval's default
    summary = (out / "summary.md").read_text()
    assert "| privleak | MIA AUC (Min-K%) | exact memorization | forget prob, worst attack |" in summary
    recorded = {p.name for p in records.rglob("*") if p.is_file()}
    assert "mia_reference.json" in recorded
    # the measurement's and its attacks' evaluations too are named after the cell and stage
    folders = {str(p.relative_to(records)).split("/", 1)[-1] for p in records.rglob("results_*.json")}
    assert "really_forgotten/attacks/quantize/grad_diff-forget1-seed7-evaluate" in {
        str(Path(f).parent) for f in folders
    }
    assert not [f for f in folders if "__" in f]


def test_a_study_with_cud_reports_the_forget_probability_per_stratum(cache, tmp_path, capsys):
    """[cud] (the demo's CUD stage as a stage kind of studies): one more cell per forget
    size scores the forget set on the target and writes its CUD-easy / CUD-hard strata; the report
    gives every model's forget probability on each, with its interval over the seeds."""
    extra = (
        '\n[cud]\nstrata = 3\n\n[cud.scorer]\nsteps = 2\nn_edges = 20\nobjectives = ["grad_diff"]\n'
        "seeds = [0, 1]\nk = 2\n\n[cud.unlearn]\nlr = 1e-3\nepochs = 1.0\nbatch_size = 4\nlora_r = 8\n"
    )
    path = study_file(tmp_path, [0], methods=("grad_diff",), extra=extra)
    out = tmp_path / "report"
    code, _, err = run(capsys, path, "--out", out, "--cache-dir", cache, "--workers", "1")
    assert code == 0, err[-3000:]
    data = report(out)
    cud = data["cells"]["cud/forget1"]
    assert cud["status"] == "done" and cud["kind"] == "cud" and "metrics" not in cud
    folder = Path(cud["stages"][0])
    assert [
        len(json.loads("[" + ",".join((folder / f).read_text().splitlines()) + "]")) for f in ("easy.json", "hard.json")
    ] == [3, 3]
    assert data["extra_metrics"] == ["cud_easy:forget_prob", "cud_hard:forget_prob"]
    for row in data["references"]:
        assert 0 < row["cud_easy:forget_prob"] < 1 and 0 < row["cud_hard:forget_prob"] < 1
    (group,) = data["groups"]
    assert group["metrics"]["cud_easy:forget_prob"]["n"] == 1
    assert "CUD strata ([cud]): the forget probability on the CUD-easy" in (out / "summary.md").read_text()


def test_report_only_from_committed_records_with_a_one_seed_method(tmp_path, capsys, tofu_dir, monkeypatch):
    """One method with a single finished seed beside others with three. The
    leader test cannot test against it (scipy refuses a one-value sample), so that row is n/a and
    the report (summary.md and study.json) is still written."""
    import shutil

    from unlearn_plugins.study.records import unpacked

    records = tmp_path / "records"
    shutil.copytree(unpacked(Path(__file__).resolve().parents[1] / "bench" / "results" / "reglu_tofu"), records)
    for seed in (1, 2):
        for folder in records.glob(f"eval-grad_diff-forget1-seed{seed}-*"):
            shutil.rmtree(folder)
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    out = tmp_path / "report"
    code, _, err = run(
        capsys, "reglu_tofu", "--report-only", "--records", records, "--out", out, "--cache-dir", tmp_path / "c"
    )
    assert "Traceback" not in err
    assert (out / "summary.md").is_file() and (out / "study.json").is_file(), err[-2000:]
    data = json.loads((out / "study.json").read_text())
    rows = [r for t in data["comparisons"].values() if t for r in t["against"] if r["method"] == "grad_diff"]
    one = [r for r in rows if r["n"][1] == 1]
    assert one and all(r["permutation_p"] is None for r in one)
    assert "n/a (one seed)" in (out / "summary.md").read_text()
    assert code in (0, 1)


def test_a_corrupt_cached_or_recorded_evaluation_is_rebuilt_or_named(cache, tmp_path, capsys):
    """A truncated results_*.json was shown as "failed (unreadable)" in
    summary.md only, the exit status was 0 and no rerun rebuilt it. Now --report-only exits 1,
    a run rebuilds the cached evaluation, and a corrupt record is an error naming it."""
    out, records = tmp_path / "report", tmp_path / "records"
    code, _, err = run(capsys, "tiny", "--out", out, "--cache-dir", cache, "--records", records)
    assert code == 0, err[-3000:]
    cell = "grad_diff/forget1/seed1"
    folder = Path(report(out)["cells"][cell]["stages"][1])
    (results,) = folder.rglob("results_*.json")
    results.write_text(results.read_text()[:100])

    code, _, err = run(capsys, "tiny", "--report-only", "--out", tmp_path / "partial", "--cache-dir", cache)
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: 1 finished cell(s) cannot be read: {cell}")
    assert report(tmp_path / "partial")["cells"][cell]["status"] == "failed"

    code, _, err = run(capsys, "tiny", "--out", tmp_path / "rebuilt", "--cache-dir", cache)
    assert code == 0, err[-3000:]
    assert f"warning: the cached evaluation of {cell} ({folder}) is unreadable (" in err
    rebuilt = report(tmp_path / "rebuilt")
    assert rebuilt["cells"][cell]["status"] == "done" and rebuilt["failed"] == []

    (recorded,) = (records / folder.name).rglob("results_*.json")
    recorded.write_text("{")
    code, _, err = run(
        capsys,
        "tiny",
        "--report-only",
        "--out",
        tmp_path / "r",
        "--cache-dir",
        tmp_path / "empty",
        "--records",
        records,
    )
    assert code == 1 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(
        f"error: --records {records}: the recorded evaluation of {cell}, {records / folder.name}, is unreadable ("
    )
    assert line.endswith("remove that folder to rebuild the cell")


PLUGIN = '''
from unlearn_plugins import hookimpl
from unlearn_plugins.objectives.gradient import GradDiff


class MyDiff(GradDiff):
    """GradDiff under another name: a third-party objective."""

    name = "my_diff"


@hookimpl
def register_unlearning_objectives(register):
    register("my_diff", MyDiff)
'''


def test_a_plugins_new_code_or_version_rebuilds_the_cells_it_touches(cache, tmp_path, capsys, monkeypatch):
    """A study's stage keys ignored the code that produced a cell, so a
    plugin's fix or new version still read `cached`. Now a plugin component's distribution,
    version and source digest are part of its cells' keys."""
    from unlearn_plugins.host import reset_host

    site = tmp_path / "site"
    site.mkdir()
    (site / "my_plugin.py").write_text(PLUGIN)

    def install(version: str) -> None:
        for old in site.glob("my-plugin-*.dist-info"):
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
        info = site / f"my-plugin-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: my-plugin\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("[unlearn_plugins]\nmy-plugin = my_plugin\n")
        reset_host()

    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    install("1.0")
    extra = '\n[[methods]]\nname = "mine"\nlabel = "Mine"\nobjective = "my_diff"\ninitializer = "kaiming"\n'
    path = study_file(tmp_path, [0], methods=(), extra="")
    text = path.read_text().replace("[evaluation]", extra + "\n[evaluation]")
    path.write_text(text)
    try:
        code, _, err = run(capsys, path, "--out", tmp_path / "one", "--cache-dir", cache)
        assert code == 0, err[-3000:]

        def state() -> str:
            code, stdout, err = run(capsys, path, "--dry-run", "--cache-dir", cache)
            assert code == 0, err
            return next(line for line in stdout.splitlines() if line.startswith("mine/forget1/seed0")).split()[-1]

        assert state() == "cached"
        (site / "my_plugin.py").write_text(PLUGIN + "\n# a fix that changes the numbers\n")
        sys.modules.pop("my_plugin", None)
        reset_host()
        assert state() == "build"  # "to build"
        (site / "my_plugin.py").write_text(PLUGIN)
        sys.modules.pop("my_plugin", None)
        install("1.1")
        assert state() == "build"
    finally:
        sys.modules.pop("my_plugin", None)
        monkeypatch.undo()
        reset_host()


def test_a_study_on_a_real_dask_cluster_survives_a_killed_worker(cache, tmp_path, capsys):
    """A scheduler and two workers started as separate processes (`dask
    scheduler`, `dask worker`) sharing one cache folder; one worker is killed (SIGKILL) while it
    builds a cell. The study finishes, every cell is built once, and the report's numbers equal
    the local executor's."""
    pytest.importorskip("distributed")
    code, _, err = run(capsys, "tiny", "--out", tmp_path / "local", "--cache-dir", cache)  # the local reference
    assert code == 0, err[-3000:]
    local = report(tmp_path / "local")

    dask = Path(sys.executable).parent / "dask"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    info = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                str(dask),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(info),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    shared = tmp_path / "shared-cache"
    study = None
    try:
        deadline = time.monotonic() + 60
        while not (info.is_file() and info.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(info.read_text())["address"]
        for k in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        str(dask),
                        "worker",
                        address,
                        "--nthreads",
                        "1",
                        "--no-nanny",
                        "--no-dashboard",
                        "--name",
                        f"w{k}",
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        args = ["study", "tiny", "--executor", "dask", "--scheduler", address, "--out", tmp_path / "dask"]
        study = subprocess.Popen(
            [sys.executable, "-m", "unlearn_plugins.cli", *map(str, args), "--cache-dir", str(shared)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        workers = {p.pid for p in procs[1:]}
        # kill the worker building an unlearning cell (its pid names the stage's temporary folder)
        building = _wait_for(
            lambda: next(
                (
                    p
                    for p in shared.glob("run-*.tmp-*")
                    if p.name.rsplit("-", 1)[1].isdigit() and int(p.name.rsplit("-", 1)[1]) in workers
                ),
                None,
            ),
            600,
            study,
        )
        victim = next(p for p in procs[1:] if p.pid == int(building.name.rsplit("-", 1)[1]))
        victim.kill()  # SIGKILL
        victim.wait(30)  # reaped, as a shell or a nanny would (a zombie still answers kill -0)
        stdout, stderr = study.communicate(timeout=900)
        assert study.returncode == 0, stderr[-3000:]
    finally:
        for proc in [*([study] if study else []), *procs]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    data = report(tmp_path / "dask")
    assert data["failed"] == [] and all(c["status"] == "done" for c in data["cells"].values())
    assert all(c["source"] == "built" for c in data["cells"].values())  # each built once, none read twice
    # the same numbers (wall time and memory aside)
    keys = ("forget_quality", "model_utility", "forget_prob", "forget_rougeL", "extraction_strength", "retain_prob")

    def numbers(d):
        groups = {(g["method"], g["forget"]): [g["metrics"][k]["values"] for k in keys] for g in d["groups"]}
        refs = {(r["name"], r["forget"]): [r.get(k) for k in keys] for r in d["references"]}
        return groups, refs

    assert numbers(data) == numbers(local)
    assert not list(shared.glob("*.tmp-*"))  # the killed stage's temporary folder was cleaned up


EXTRA_TASK_PLUGIN = """
from pathlib import Path

from unlearn_plugins import hookimpl


@hookimpl
def register_lm_eval_task_dirs(register):
    register("extra-tasks", Path(__file__).parent / "extra_tasks")


def docs(**_metadata):
    import datasets

    rows = [{"prompt": "The capital of France is", "answer": " Paris"}, {"prompt": "Two and two make", "answer": " four"}]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
"""

EXTRA_TASK = """task: extra_recall
custom_dataset: !function extra_task_plugin.docs
test_split: test
output_type: loglikelihood
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def test_a_studys_extra_task_is_in_its_report(cache, tmp_path, capsys, monkeypatch):
    """A task beyond the required ones ran on every evaluation, but its metrics
    appeared in neither summary.md nor study.json. Now each of its numbers is reported per cell
    and per method, with its interval over the seeds."""
    from unlearn_plugins.host import reset_host

    site = tmp_path / "site"
    (site / "extra_tasks").mkdir(parents=True)
    (site / "extra_task_plugin.py").write_text(EXTRA_TASK_PLUGIN)
    (site / "extra_tasks" / "extra_recall.yaml").write_text(EXTRA_TASK)
    info = site / "extra-task-plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-task-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[unlearn_plugins]\nextra-task-plugin = extra_task_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    reset_host()
    tasks = '["tofu_forget_prob", "tofu_forget_rouge", "tofu_forget_truth_ratio", "tofu_model_utility", "extra_recall"]'
    path = study_file(tmp_path, [0], methods=("grad_diff",), extra=f"tasks = {tasks}\n")
    try:
        code, _, err = run(capsys, path, "--out", tmp_path / "out", "--cache-dir", cache)
        assert code == 0, err[-3000:]
    finally:
        sys.modules.pop("extra_task_plugin", None)
        monkeypatch.undo()
        reset_host()
    data = report(tmp_path / "out")
    assert data["extra_metrics"] == ["extra_recall:acc"]
    (group,) = data["groups"]
    assert group["metrics"]["extra_recall:acc"]["n"] == 1 and group["metrics"]["extra_recall:acc"]["mean"] in (
        0.0,
        0.5,
        1.0,
    )
    assert all("extra_recall:acc" in r for r in data["references"])
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "Other tasks of the study" in summary and "| model | extra_recall:acc |" in summary
