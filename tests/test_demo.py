"""`unlearn demo`: every stage end to end on the tiny model (--fast), the report's files and
ranges, the stage cache (rerun, Ctrl-C), the benchmark folder and the generated data; and the
same demo with its cells on two worker processes: the same numbers, a warm rerun that starts
none, a Ctrl-C'd run that resumes. The demo is a study (unlearn_plugins/benchmarks/tofu/demo.toml):
its cells are built by the study's runner, one after the other in this process with --workers 1."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

from unlearn_plugins.cli import main
from unlearn_plugins.study import builtin_studies

pytestmark = pytest.mark.usefixtures("single_thread")

MODELS = ["full", "retain", "reglu", "grad_diff", "ihl_fila"]
#: the demo study's cells (`unlearn study demo --dry-run`)
CELLS = [
    "target",
    "retain/forget1",
    "cud/forget1",
    "eval-retain/forget1",
    "eval-full/forget1",
    "reglu/forget1/seed0",
    "grad_diff/forget1/seed0",
    "ihl_fila/forget1/seed0",
]


#: the methods --methods may name, in the peer_methods study's order
PEERS = ", ".join(m["name"] for m in tomllib.loads(builtin_studies()["peer_methods"].read_text())["methods"])


def cells_said(err: str, word: str) -> list[str]:
    """The cells the study's progress lines say are ``word`` (cached, done), in order."""
    return re.findall(rf"^\[ *\d+/{len(CELLS)}\] {word:<7} (\S+)", err, re.M)


def run_main(args) -> tuple[int, str, str]:
    """``unlearn ARGS`` here, its exit code, stdout and stderr (for module-scoped fixtures: no capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def fast_demo_args(model: Path, root: Path, *, workers: int) -> list[str]:
    """`unlearn demo --fast` on the tiny model and generated data, its caches and report in ``root``."""
    return [
        "demo",
        "--fast",
        "--model",
        str(model),
        "--data",
        "generated",
        "--workers",
        str(workers),
        "--cache-dir",
        str(root / "cache"),
        "--out",
        str(root / "report"),
    ]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, tiny_model_dir, single_thread):
    """One cold --fast run on generated data (no TOFU, no hub), every stage in this process one
    after the other (--workers 1, one torch thread), shared by the tests below."""
    root = tmp_path_factory.mktemp("demo")
    args = fast_demo_args(tiny_model_dir, root, workers=1)
    code, out, err = run_main(args)
    return SimpleNamespace(root=root, args=args, code=code, out=out, err=err)


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_fast_demo_writes_a_complete_report(demo_run):
    root, code, out, err = demo_run.root, demo_run.code, demo_run.out, demo_run.err
    assert code == 0, err[-2000:]
    assert "notice: --data generated: using generated fictitious authors" in err
    # --workers 1: every cell in this process, one after the other; each cell's output in its log
    assert f"executor: inline: this process (pid {os.getpid()}), one cell after the other" in err
    assert cells_said(err, "done") == CELLS
    assert {p.name for p in (root / "report" / "logs").iterdir()} == {c.replace("/", "_") + ".log" for c in CELLS}
    report = root / "report"
    for name in ("results.json", "summary.md", "cud_scores.jsonl", "cud_easy.json", "cud_hard.json"):
        assert (report / name).stat().st_size > 0, name
    for name in ("fq_vs_mu.png", "cud_histogram.png", "circuit_depth.png"):
        data = (report / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name

    results = json.loads((report / "results.json").read_text())
    rows = {r["name"]: r for r in results["models"]}
    assert list(rows) == MODELS
    for name, r in rows.items():
        assert 0 <= r["forget_quality"] <= 1, name
        assert 0 <= r["model_utility"] <= 1, name
        assert 0 < r["forget_prob"] < 1 and 0 <= r["forget_rougeL_recall"] <= 1, name
        assert len(r["forget_prob_per_sample"]) == 20 and all(0 < p < 1 for p in r["forget_prob_per_sample"])
        assert set(r["model_utility_parts"]) and all(
            0 <= v <= 1 or "truth_ratio" in k for k, v in r["model_utility_parts"].items()
        )
    assert rows["retain"]["forget_quality"] == pytest.approx(1.0)  # its own reference
    # unlearning changed the full model's answers (each method its own way)
    full = rows["full"]["forget_prob_per_sample"]
    for name in ("reglu", "grad_diff", "ihl_fila"):
        assert max(abs(a - b) for a, b in zip(rows[name]["forget_prob_per_sample"], full)) > 1e-6, name

    cud = results["cud"]
    scores = {s["index"]: s["score"] for s in cud["scores"]}
    assert sorted(scores) == list(range(20)) and all(0 <= v <= 1 for v in scores.values())
    assert len(cud["easy"]) == len(cud["hard"]) == 3 and not set(cud["easy"]) & set(cud["hard"])
    assert max(scores[i] for i in cud["easy"]) <= min(scores[i] for i in cud["hard"])
    # CUD's anchors come from a pool of retain QA: no scored forget sample is an anchor; every
    # anchor's votes, every anchor run (3 seeds x 2 objectives, stopped by stop_prob) are recorded
    assert cud["anchor_pool"]["size"] == 10 and not cud["anchor_pool"]["in_sample"]
    assert all(s["anchor"] is None for s in cud["scores"])
    forget = {json.loads(line)["question"] for line in (report / "cud_scores.jsonl").read_text().splitlines()}
    votes = cud["anchor_votes"]["all"]
    assert votes["easy"] and votes["hard"] and all(e["runs"] >= 2 for e in votes["easy"] + votes["hard"])
    assert not {e["question"] for e in votes["easy"] + votes["hard"]} & forget
    assert [(r["objective"], r["seed"]) for r in cud["anchor_runs"]] == [
        (o, s) for o in ("grad_diff", "npo") for s in (0, 1, 2)
    ]
    assert all(r["stopped_at_step"] == r["steps"] for r in cud["anchor_runs"])  # the tiny model: first check
    assert set(cud["seed_agreement"]) == {"grad_diff", "npo"}
    assert results["benchmark"]["source"] == "generated" and results["benchmark"]["sizes"]["forget"] == 20
    # the dtypes that ran, as this machine resolved --train-dtype / --eval-dtype auto
    from unlearn_plugins.models import native_dtype

    native = native_dtype("auto", "cpu") or "library default"
    assert results["train_dtype"] == native and results["evaluation"]["dtype"] == native
    # CUD's anchor runs are unlearning runs: trained in the same dtype as the demo's others
    assert cud["anchor_unlearn"]["lr"] == results["budget"]["anchor_unlearn"]["lr"]
    assert cud["anchor_unlearn"].get("dtype", "library default") == native

    # the terminal table and the Markdown summary show the same five models
    table = [line for line in out.splitlines() if line.startswith(("full", "retain", "ReGLU", "GradDiff", "IHL"))]
    assert len(table) == 5
    summary = (report / "summary.md").read_text()
    assert "generated fictitious authors" in summary and summary.count("\n| ") == 6
    assert f"| {rows['reglu']['label']} | {rows['reglu']['forget_quality']:.3f} |" in summary


def test_the_demo_gives_the_numbers_recorded_before_it_became_a_study(demo_run):
    """The demo's table (and every other number of results.json) is the one the demo
    gave before its pipeline moved into the study's stages (tests/demo_baseline.py)."""
    from demo_baseline import check

    assert demo_run.code == 0, demo_run.err[-2000:]
    check(demo_run.root / "report" / "results.json", "tofu")


def test_rerun_uses_the_cache_and_gives_the_same_report(demo_run, capsys):
    root, args = demo_run.root, demo_run.args
    before = json.loads((root / "report" / "results.json").read_text())["models"]
    code, _, err = _run(args, capsys)
    assert code == 0
    assert cells_said(err, "cached") == CELLS and "executor:" not in err  # nothing built
    after = json.loads((root / "report" / "results.json").read_text())["models"]
    assert after == before


def test_methods_adds_the_peer_methods_rows_to_the_demos_table(demo_run, tmp_path, capsys):
    root, args = demo_run.root, demo_run.args
    before = json.loads((root / "report" / "results.json").read_text())["models"]
    out = tmp_path / "report"
    code, stdout, err = _run([*args[:-1], str(out), "--methods", "task_vector,grad_diff"], capsys)
    assert code == 0, err[-3000:]
    said = {cell: word for word, cell in re.findall(rf"^\[ *\d+/{len(CELLS) + 1}\] (cached|done) +(\S+)", err, re.M)}
    # the demo's own cells are not built again; grad_diff is the demo's own method
    assert said == {**{cell: "cached" for cell in CELLS}, "task_vector/forget1/seed0": "done"}
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["models"]}
    assert [r for r in rows.values() if r["name"] != "task_vector"] == before
    assert 0 <= rows["task_vector"]["forget_quality"] <= 1
    assert "Task Vector" in stdout


def test_a_truncated_cached_evaluation_is_rebuilt(demo_run, tmp_path, capsys):
    """A truncated results_*.json in the stage cache was a traceback (the report
    read it); the evaluation is now rebuilt, with a warning naming it, and the report is the same."""
    import shutil

    root = demo_run.root
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    (stage,) = cache.glob("eval-grad_diff-*")
    (results,) = stage.rglob("results_*.json")
    results.write_text(results.read_text()[:100])
    args = [*demo_run.args[:-4], "--cache-dir", str(cache), "--out", str(tmp_path / "report")]
    code, _, err = _run(args, capsys)
    assert code == 0 and "Traceback" not in err, err[-3000:]
    assert f"warning: the cached evaluation of grad_diff/forget1/seed0 ({stage}) is unreadable (" in err
    assert cells_said(err, "cached") == [c for c in CELLS if c != "grad_diff/forget1/seed0"]  # everything else
    before = json.loads((root / "report" / "results.json").read_text())["models"]
    after = json.loads((tmp_path / "report" / "results.json").read_text())["models"]
    assert [{k: v for k, v in r.items() if k != "eval_seconds"} for r in after] == [
        {k: v for k, v in r.items() if k != "eval_seconds"} for r in before
    ]


def test_robustness_adds_membership_inference_and_attacks_for_every_model(demo_run, capsys):
    """--robustness on the cached demo: the models (targets, unlearning runs) and CUD are cached;
    every evaluation is made again with its `unlearn eval --mia --robustness` beside it (the
    study's [evaluation] robustness, against a holdout author), and reported: a table row and
    plot per model."""
    root = demo_run.root
    args = [*demo_run.args[:-1], str(root / "robust"), "--robustness"]
    code, out, err = _run(args, capsys)
    assert code == 0, err[-3000:]
    assert cells_said(err, "cached") == ["target", "retain/forget1", "cud/forget1"]
    for cell in CELLS[3:]:  # the evaluations only: the unlearning runs were cached
        assert cell in cells_said(err, "done")
    report = root / "robust"
    from demo_baseline import check

    check(report / "results.json", "tofu_robustness")  # the numbers recorded before the demo became a study
    results = json.loads((report / "results.json").read_text())
    rows = {r["name"]: r for r in results["really_forgotten"]}
    assert list(rows) == ["retain", "full", "reglu", "grad_diff", "ihl_fila"]
    plain = {r["name"]: r for r in results["models"]}
    for name, r in rows.items():
        for attack in ("loss", "zlib", "min_k", "min_k++", "gradnorm"):
            assert 0 <= r[f"auc_{attack}"] <= 1, (name, attack)
        assert 0 <= r["exact_memorization"] <= 1
        for label in ("plain", "paraphrase", "format", "relearn", "quantize"):
            assert 0 < r[f"prob:{label}"] < 1, (name, label)
        assert r["prob:worst"] == max(r[f"prob:{k}"] for k in ("paraphrase", "format", "relearn", "quantize"))
        assert 0 < r["prob:relearn:plain_same_samples"] < 1
        # the plain forget probability and ROUGE-L are the demo's own (same split, same dtype,
        # generations capped as the demo's evaluation caps them)
        assert r["prob:plain"] == pytest.approx(plain[name]["forget_prob"], abs=2e-3), name
        assert r["rougeL_recall:plain"] == pytest.approx(plain[name]["forget_rougeL_recall"], abs=1e-6), name
    # the measurement generates as the demo's evaluation does (its cap, not lm-eval's 200 tokens)
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    def cap(folder):
        return read_outputs(folder).results["configs"]["tofu_forget_rouge"]["generation_kwargs"]["max_gen_toks"]

    cache = root / "cache"
    for name in ("retain", "grad_diff"):
        (evaluated,) = [p for p in cache.glob(f"eval-{name}-*") if (p / "really_forgotten").is_dir()]
        assert cap(evaluated / "really_forgotten") == cap(evaluated) < 200, name
    assert rows["retain"]["privleak"] is None  # the reference itself
    assert all(isinstance(rows[n]["privleak"], float) for n in ("full", "reglu", "grad_diff", "ihl_fila"))
    assert rows["retain"]["auc_reference"] is None and 0 <= rows["full"]["auc_reference"] <= 1
    summary = (report / "summary.md").read_text()
    assert "## Is it really forgotten?" in summary and "| IHL + FILA | " in summary
    assert (report / "forget_prob_under_attack.png").read_bytes()[:4] == b"\x89PNG"
    code, _, err = _run(args, capsys)  # warm: every cell cached, the same rows
    assert code == 0 and cells_said(err, "cached") == CELLS
    assert json.loads((report / "results.json").read_text())["really_forgotten"] == results["really_forgotten"]


def test_interrupted_stage_is_redone_and_nothing_else(demo_run, capsys, monkeypatch):
    """Ctrl-C while an evaluation is built (here, in this process): it leaves neither its
    folder nor a temporary one, and the rerun builds that evaluation only."""
    from unlearn_plugins.benchmarks.tofu.study import cells

    root, args = demo_run.root, demo_run.args
    cache = root / "cache"
    # (the robustness test's evaluation, with its measurement, is another folder)
    evals = [p for p in cache.glob("eval-grad_diff-*") if not (p / "really_forgotten").exists()]
    assert len(evals) == 1
    import shutil

    shutil.rmtree(evals[0])

    def interrupted(tmp, params):
        (tmp / "summary.json").write_text("{half")  # a half-written stage...
        raise KeyboardInterrupt

    monkeypatch.setattr(cells, "build_evaluate", interrupted)  # TOFU's "evaluate" stage kind
    code, _, err = _run(args, capsys)
    assert code == 130 and "interrupted" in err
    # ...leaves neither a finished folder nor its temporary one
    assert not evals[0].exists() and not list(cache.glob(f"{evals[0].name}.tmp-*"))
    monkeypatch.undo()
    code, _, err = _run(args, capsys)
    assert code == 0
    assert cells_said(err, "cached") == [c for c in CELLS if c != "grad_diff/forget1/seed0"]
    assert cells_said(err, "done") == ["grad_diff/forget1/seed0"]
    assert json.loads((root / "report" / "results.json").read_text())["models"][3]["name"] == "grad_diff"


# ----------------------------------------------------------------------------- two worker processes


def _table(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("full", "retain", "ReGLU", "GradDiff", "IHL"))]


def _numbers(report) -> dict:
    """What results.json says about the models and CUD, less what differs between two runs by
    nature (folders, timings)."""
    results = json.loads((report / "results.json").read_text())
    # (the anchor pool's spec and the anchor runs' retain split name the cache folder)
    cud = {k: v for k, v in results["cud"].items() if k not in ("anchor_pool", "anchor_unlearn")}
    return {"models": [{k: v for k, v in r.items() if k != "eval_seconds"} for r in results["models"]], "cud": cud}


@pytest.fixture(scope="module")
def sequential_numbers(demo_run):
    assert demo_run.code == 0, demo_run.err[-2000:]
    return _numbers(demo_run.root / "report")


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory, tiny_model_dir, sequential_numbers):
    """The demo above with two worker processes, each pinned to one thread as this process is
    (so the numbers are identical, not just close), with caches of its own (its CUD cache too:
    nothing is reused from the run above). Built cold in a process of its own that Ctrl-C stops
    (SIGINT to the process group, as a terminal sends it) once an unlearning run has finished
    while the workers build the other stages, then resumed in this process: ``first`` is the
    stopped run (its exit code, stderr, the stages it finished and the temporary folders it
    left), the rest is the resumed run."""
    import signal
    import subprocess
    import sys
    import time

    root = tmp_path_factory.mktemp("demo-parallel")
    args = fast_demo_args(tiny_model_dir, root, workers=2)
    env = {"OMP_NUM_THREADS": "1", "UNLEARN_CACHE_DIR": str(root / "unlearn-cache")}
    cache = root / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-m", "unlearn_plugins.cli", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # a terminal's Ctrl-C: SIGINT handled, even where pytest itself runs with it ignored (a
        # background job, as CI may start it), which the demo would inherit
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 900
    while not any((p / "stage.json").is_file() for p in cache.glob("run-*")):  # one run finished, others building
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _, first_err = proc.communicate(timeout=300)
    first = SimpleNamespace(
        code=proc.returncode,
        err=first_err,
        finished={p: (p / "stage.json").stat().st_mtime_ns for p in cache.iterdir() if (p / "stage.json").is_file()},
        temporary=list(cache.glob("*.tmp-*")),
    )
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        code, out, err = run_main(args)
    return SimpleNamespace(root=root, args=args, env=env, code=code, out=out, err=err, first=first)


def test_two_workers_build_stages_side_by_side_and_give_the_same_numbers(parallel_run, demo_run, sequential_numbers):
    run = parallel_run
    assert run.code == 0, run.err[-3000:]
    logs = run.root / "report" / "logs"
    # (the cold run, before its Ctrl-C)
    assert "executor: local: 2 worker process(es), 1 thread(s) each" in run.first.err
    # full || retain: the retain model started before the full model was done, in another process
    assert run.first.err.index("start   retain/forget1 on worker") < run.first.err.index("done    target in")
    cache = run.root / "cache"
    pids = [json.loads(p.read_text())["pid"] for p in cache.glob("*/resources.json")]
    assert len(pids) == 11  # every stage but the benchmark (built here: every other stage reads it)
    # two workers at a time (a worker whose memory grew retires and a fresh one takes its slot)
    assert len(set(pids)) >= 2 and os.getpid() not in pids
    assert not list(cache.glob("*.tmp-*"))
    # the sequential run's cells (the resumed run builds those the stopped one left), each cell's output in its log
    assert sorted(cells_said(run.err, "cached") + cells_said(run.err, "done")) == sorted(CELLS)
    assert {p.name for p in logs.iterdir()} == {c.replace("/", "_") + ".log" for c in CELLS}
    # the same table and numbers as one stage after the other
    assert _table(run.out) == _table(demo_run.out) and len(_table(run.out)) == 5
    assert _numbers(run.root / "report") == sequential_numbers
    assert json.loads((run.root / "report" / "results.json").read_text())["config"]["workers"] == 2


def test_a_warm_parallel_rerun_starts_no_worker(parallel_run, capsys, monkeypatch):
    run = parallel_run
    for name, value in run.env.items():
        monkeypatch.setenv(name, value)
    before = _numbers(run.root / "report")
    code, out, err = _run(run.args, capsys)
    assert code == 0, err[-2000:]
    assert cells_said(err, "cached") == CELLS and "executor:" not in err  # nothing built, no worker
    assert _numbers(run.root / "report") == before and _table(out) == _table(run.out)


def test_a_parallel_demo_stopped_by_ctrl_c_resumes(parallel_run, sequential_numbers):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while both workers build:
    each removes its stage's temporary folder, the run exits 130, and the rerun builds only
    the stages that had not finished (the others are left as they were), giving the numbers
    of one stage after the other."""
    run, first = parallel_run, parallel_run.first
    assert first.code == 130 and "interrupted" in first.err.splitlines(), first.err[-3000:]
    assert first.temporary == []  # the interrupted stages left no temporary folder
    finished = first.finished
    assert any(p.name.startswith("run-") for p in finished) and any(p.name.startswith("target-full-") for p in finished)
    assert len(finished) < 12  # the benchmark, the target, an unlearning run, ...: not all 12 stages

    assert run.code == 0, run.err[-3000:]
    cached, built = cells_said(run.err, "cached"), cells_said(run.err, "done")
    assert "target" in cached and built and sorted(cached + built) == sorted(CELLS)
    assert set(cells_said(first.err, "done")) <= set(cached)  # the cells the stopped run finished
    assert {p: (p / "stage.json").stat().st_mtime_ns for p in finished} == finished  # not built again
    assert _numbers(run.root / "report") == sequential_numbers


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--workers", "0"], "--workers must be an integer >= 1, got 0"),
        (["--workers", "2", "--benchmark", "movielens"], "--workers: not an option of --benchmark movielens"),
        (["--eval-dtype", "bf16", "--benchmark", "movielens"], "--eval-dtype: not an option of --benchmark movielens"),
        (["--methods", "npo,nop"], f"--methods: no method 'nop' in the peer_methods study; known: {PEERS} (or 'all')"),
        (["--methods", "npo,"], "--methods 'npo,': give method names separated by commas, or 'all'"),
        (["--methods", "npo", "--benchmark", "movielens"], "--methods: not an option of --benchmark movielens"),
    ],
)
def test_bad_workers_are_refused_before_any_stage(extra, message, tiny_model_dir, tmp_path, capsys):
    code, _, err = _run(
        [
            "demo",
            "--model",
            str(tiny_model_dir),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "report"),
            *extra,
        ],
        capsys,
    )
    assert code == 1 and err.strip().splitlines() == [f"error: {message}"]
    assert list(tmp_path.iterdir()) == []


def test_benchmark_from_tofu_takes_the_last_authors(tofu_dir, tmp_path):
    from unlearn_plugins.benchmarks.tofu.data import build_benchmark, find_tofu
    from unlearn_plugins.data.qa import read_jsonl

    bench = build_benchmark(tmp_path / "b", tofu=find_tofu("tofu", str(tofu_dir)), n_authors=3, n_forget=1, eval_size=7)
    assert bench.authors == [197, 198, 199] and bench.forget_authors == [199] and bench.retain_authors == [197, 198]
    forget = read_jsonl(bench.forget, require=("question", "answer", "paraphrased_answer", "perturbed_answer"))
    tofu_forget01 = read_jsonl(tofu_dir / "forget01.json")
    assert [s.question for s in forget] == [s.question for s in tofu_forget01[20:]]  # author 199
    assert bench.sizes == {
        "full": 60,
        "retain": 40,
        "forget": 20,
        "retain_perturbed": 7,
        "real_authors_perturbed": 7,
        "world_facts_perturbed": 7,
    }
    retain_eval = {s.question for s in read_jsonl(bench.folder / "retain_perturbed.json")}
    assert retain_eval <= {s.question for s in read_jsonl(bench.retain)}


def test_the_holdout_author_is_in_no_demo_models_data(tofu_dir, tmp_path):
    """--robustness's holdout: the author just before the benchmark's N, from a TOFU folder, the
    shipped subset (author 196 ships for this) or the generated authors; none left is an error."""
    import json as json_module

    from unlearn_plugins.benchmarks.tofu.data import SHIPPED_TOFU, build_holdout, find_tofu
    from unlearn_plugins.data.qa import read_jsonl
    from unlearn_plugins.data.synthetic import N_AUTHORS, generate_authors
    from unlearn_plugins.errors import UnlearnError

    tofu_196 = [s.question for s in read_jsonl(tofu_dir / "forget10_perturbed.json")[320:340]]
    for source, authors, expected in ((find_tofu("tofu", str(tofu_dir)), 3, 196), (SHIPPED_TOFU, 3, 196)):
        info = build_holdout(tmp_path / "h.json", tofu=source, n_authors=authors)
        assert info == {"author": expected, "size": 20}
        assert [s.question for s in read_jsonl(tmp_path / "h.json")] == tofu_196
    info = build_holdout(tmp_path / "s.json", tofu=SHIPPED_TOFU, n_authors=2)  # 197 is unused then
    first = json_module.loads((tmp_path / "s.json").read_text().splitlines()[0])
    assert info["author"] == 197 and "Edward Patrick Sullivan" in first["answer"]
    info = build_holdout(tmp_path / "g.json", tofu=None, n_authors=2)
    generated = generate_authors(N_AUTHORS)
    assert info["author"] == N_AUTHORS - 3
    assert [s.question for s in read_jsonl(tmp_path / "g.json")] == [
        r["question"] for r in generated if r["author"] == N_AUTHORS - 3
    ]
    with pytest.raises(UnlearnError, match="needs one more as the holdout"):
        build_holdout(tmp_path / "x.json", tofu=None, n_authors=N_AUTHORS)
    # a 20-author TOFU benchmark (the studies'): TOFU's author 179, the last of retain90
    info = build_holdout(tmp_path / "t.json", tofu=find_tofu("tofu", str(tofu_dir)), n_authors=20)
    assert info == {"author": 179, "size": 20}
    retain90 = [s.question for s in read_jsonl(tofu_dir / "retain90.json")]
    assert [s.question for s in read_jsonl(tmp_path / "t.json")] == retain90[-20:]


def test_benchmark_rejects_bad_sizes(tmp_path):
    from unlearn_plugins.benchmarks.tofu.data import build_benchmark
    from unlearn_plugins.errors import UnlearnError

    with pytest.raises(UnlearnError, match="at least 2 authors"):
        build_benchmark(tmp_path, tofu=None, n_authors=1, n_forget=1, eval_size=4)
    with pytest.raises(UnlearnError, match="forget authors must be between 1 and"):
        build_benchmark(tmp_path, tofu=None, n_authors=3, n_forget=3, eval_size=4)
    with pytest.raises(UnlearnError, match="has 20 authors"):
        build_benchmark(tmp_path, tofu=None, n_authors=21, n_forget=1, eval_size=4)


def test_demo_runs_on_the_shipped_tofu_subset_when_nothing_is_configured(tmp_path, monkeypatch):
    """No --tofu-dir, no UNLEARN_TOFU_DIR, no hub: the 3 TOFU authors shipped in the package, with
    TOFU's licence beside them; more authors than that need TOFU itself."""
    from unlearn_plugins.benchmarks.tofu import data as benchmark
    from unlearn_plugins.benchmarks.tofu.data import SHIPPED_TOFU, build_benchmark, find_tofu, source_fingerprint
    from unlearn_plugins.data.qa import read_jsonl
    from unlearn_plugins.errors import DataError

    def offline(tofu_dir):  # the hub copy, on a machine without the hub
        assert tofu_dir is None
        raise DataError("no TOFU folder given and the hub dataset locuslab/TOFU could not be fetched")

    monkeypatch.setattr(benchmark, "resolve_tofu_dir", offline)
    monkeypatch.delenv("UNLEARN_TOFU_DIR", raising=False)
    for data in ("auto", "tofu"):
        assert find_tofu(data, None, 3) == SHIPPED_TOFU and find_tofu(data, None) == SHIPPED_TOFU
    assert find_tofu("generated", None, 3) is None
    assert (
        "MIT License" in (SHIPPED_TOFU / "LICENSE").read_text()
        and "locuslab/TOFU" in (SHIPPED_TOFU / "LICENSE").read_text()
    )
    assert find_tofu("auto", None, 4) is None  # offline: generated authors, with a notice
    with pytest.raises(DataError, match="--authors 4: the TOFU subset shipped with the package has 3 authors"):
        find_tofu("tofu", None, 4)

    bench = build_benchmark(tmp_path / "b", tofu=SHIPPED_TOFU, n_authors=3, n_forget=1, eval_size=8)
    assert bench.authors == [197, 198, 199] and bench.forget_authors == [199]
    assert "shipped with unlearn-plugins" in bench.describe()["description"]
    forget = read_jsonl(bench.forget, require=("question", "answer", "paraphrased_answer", "perturbed_answer"))
    assert len(forget) == 20 and forget[0].question.startswith("Who is the notable author born in Astana")
    assert source_fingerprint(SHIPPED_TOFU).startswith("tofu-")


def test_configured_tofu_wins_and_gives_the_shipped_subsets_benchmark(tofu_dir, tmp_path, monkeypatch):
    """A configured TOFU folder is used instead of the shipped subset; both give byte-identical
    benchmark files (the subset is TOFU's own lines), so the demo's numbers do not depend on which."""
    from unlearn_plugins.benchmarks.tofu.data import SHIPPED_OPTIONS_FILES, SHIPPED_TOFU, build_benchmark, find_tofu
    from unlearn_plugins.errors import DataError

    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    assert find_tofu("auto", None, 3) == tofu_dir
    monkeypatch.delenv("UNLEARN_TOFU_DIR")
    assert find_tofu("auto", str(tofu_dir), 3) == tofu_dir
    full = build_benchmark(tmp_path / "full", tofu=tofu_dir, n_authors=3, n_forget=1, eval_size=8)
    shipped = build_benchmark(tmp_path / "shipped", tofu=SHIPPED_TOFU, n_authors=3, n_forget=1, eval_size=8)
    assert full.authors == shipped.authors and full.sizes == shipped.sizes
    for name in full.sizes:
        assert (full.folder / f"{name}.json").read_bytes() == (shipped.folder / f"{name}.json").read_bytes(), name
    for name, shipped_name in SHIPPED_OPTIONS_FILES.items():  # TOFU's first 20 lines
        head = b"".join((tofu_dir / f"{name}.json").read_bytes().splitlines(keepends=True)[:20])
        assert (SHIPPED_TOFU / shipped_name).read_bytes() == head
    with pytest.raises(DataError, match=r"real_authors_1-20_perturbed.json: 20 QA, fewer than the 21"):
        build_benchmark(tmp_path / "big", tofu=SHIPPED_TOFU, n_authors=3, n_forget=1, eval_size=21)
    # a full TOFU folder's files are capped at what they have (the study's mu_size 400 asks for all)
    capped = build_benchmark(tmp_path / "capped", tofu=tofu_dir, n_authors=3, n_forget=1, eval_size=10_000)
    for name in SHIPPED_OPTIONS_FILES:
        have = len((tofu_dir / f"{name}.json").read_bytes().splitlines())
        assert len((capped.folder / f"{name}.json").read_bytes().splitlines()) == have


def test_missing_tofu_falls_back_only_in_auto_mode(tmp_path, monkeypatch):
    from unlearn_plugins.benchmarks.tofu.data import find_tofu
    from unlearn_plugins.errors import DataError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("UNLEARN_TOFU_DIR", raising=False)
    assert find_tofu("generated", None) is None
    assert find_tofu("auto", str(tmp_path / "nowhere")) is None
    with pytest.raises(DataError, match="TOFU folder not found"):
        find_tofu("tofu", str(tmp_path / "nowhere"))


def test_generated_authors_look_like_tofu():
    from unlearn_plugins.data.synthetic import generate_authors

    rows = generate_authors(4, seed=3)
    assert rows == generate_authors(4, seed=3) and rows != generate_authors(4, seed=4)
    assert len(rows) == 80 and [r["author"] for r in rows[::20]] == [0, 1, 2, 3]
    names = set()
    for r in rows:
        assert r["question"].endswith("?") and r["answer"] and r["paraphrased_answer"] != r["answer"]
        wrong = r["perturbed_answer"]
        assert len(wrong) == 5 and len(set(wrong)) == 5 and r["paraphrased_answer"] not in wrong
        if r["question"].startswith("What is the full name"):
            names.add(r["answer"].split(" is ")[-1])
    assert len(names) == 4  # one distinct author per profile


def test_orphaned_temporary_stage_folders_are_removed(tmp_path):
    import os

    from unlearn_plugins.stages import Stages, host_name, temporary_folder

    gone = tmp_path / "run-x-abc.tmp-99999999"  # no such process (the old name: this host's)
    mine = tmp_path / f"run-y-abc.tmp-{os.getpid()}"
    done = tmp_path / "run-z-abc"
    gone_here = tmp_path / f"run-v-abc.tmp-{host_name()}-99999999"
    mine_here = temporary_folder(tmp_path / "run-w-abc")
    # a cache shared by several machines: another host's folder may be work in progress there
    elsewhere = tmp_path / "run-u-abc.tmp-another-host.example-99999999"
    for folder in (gone, mine, done, gone_here, mine_here, elsewhere):
        folder.mkdir()
    Stages(tmp_path, total=1)
    assert not gone.exists() and mine.exists() and done.exists()
    assert not gone_here.exists() and mine_here.exists() and elsewhere.exists()


def test_an_interrupted_worker_removes_its_own_temporary_folders(tmp_path):
    """The backstop of an interrupted worker (a second SIGINT can cut its stage's clean-up short):
    its own temporary stage folders go, another process's and finished stages stay."""
    from unlearn_plugins.stages import host_name, remove_own_temporaries, temporary_folder

    mine = temporary_folder(tmp_path / "eval-full-abc")
    (mine / "partial").mkdir(parents=True)
    other = tmp_path / f"eval-full-def.tmp-{host_name()}-1"
    done = tmp_path / "eval-full-ghi"
    other.mkdir()
    done.mkdir()
    assert remove_own_temporaries(tmp_path) == [mine.name]
    assert not mine.exists() and other.exists() and done.exists()
