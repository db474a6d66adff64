"""`unlearn demo --benchmark movielens`: every stage end to end on the tiny model (--fast) and a
small folder in MovieLens-100K's layout; the report's numbers against independent
computations (direct forwards, hand AUC and JSD, the shards that held the forget users) and
against the numbers recorded before the demo became a study; the stage cache; the option
checks. The demo is a study (unlearn_plugins/benchmarks/movielens/demo.toml, built-in "demo-movielens"):
its cells are built by the study's runner, one after the other in this process."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
from test_recommendation import direct_p_yes, hand_auc, hand_jsd

from unlearn_plugins.cli import main

pytestmark = pytest.mark.usefixtures("single_thread")

MODELS = ["target", "retrain", "e2urec", "neggrad", "bad_teacher", "receraser"]
#: the MovieLens demo study's cells (`unlearn study demo-movielens --dry-run`)
CELLS = [
    "target",
    "retrain",
    "cud",
    "eval-retrain",
    "eval-target",
    "e2urec/seed0",
    "neggrad/seed0",
    "bad_teacher/seed0",
    "receraser/shards",
    "receraser",
]
STUDY_FILE = Path(__file__).resolve().parent.parent / "unlearn_plugins" / "benchmarks" / "movielens" / "demo.toml"


def cells_said(err: str, word: str) -> list[str]:
    """The cells the study's progress lines say are ``word`` (cached, done), in order."""
    return re.findall(rf"^\[ *\d+/{len(CELLS)}\] {word:<7} (\S+)", err, re.M)


def write_grouplens(folder, *, users: int = 10, per_user: int = 14, movies: int = 40, seed: int = 0):
    """u.item + u.data of made-up users who each rate ``per_user`` of ``movies`` made-up films."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    flags = "|".join(["0"] * 19)
    (folder / "u.item").write_text(
        "".join(
            f"{i}|Film {i} ({1980 + i % 20})|01-Jan-{1980 + i % 20}||http://x|{flags}\n" for i in range(1, movies + 1)
        ),
        encoding="latin-1",
    )
    rows = [
        f"{u}\t{i}\t{rng.randint(1, 5)}\t{880000000 + 1000 * u + t}\n"
        for u in range(1, users + 1)
        for t, i in enumerate(rng.sample(range(1, movies + 1), per_user))
    ]
    (folder / "u.data").write_text("".join(rows))
    return folder


@pytest.fixture(scope="module")
def rec_demo(tmp_path_factory, tiny_model_dir):
    """One cold --fast run, shared by the tests below (the first one runs it)."""
    root = tmp_path_factory.mktemp("recdemo")
    data = write_grouplens(root / "ml")
    args = [
        "demo",
        "--benchmark",
        "movielens",
        "--fast",
        "--model",
        str(tiny_model_dir),
        "--movielens-dir",
        str(data),
        "--device",
        "cpu",
        "--cache-dir",
        str(root / "cache"),
        "--out",
        str(root / "report"),
    ]
    return root, args


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_fast_movielens_demo_writes_a_complete_report(rec_demo, capsys):
    from unlearn_plugins.models import load_model

    root, args = rec_demo
    code, out, err = _run(args, capsys)
    assert code == 0, err[-2000:]
    report = root / "report"
    files = ("results.json", "summary.md", "cud_scores.jsonl", "cud_easy.json", "cud_hard.json")
    empty = [name for name in files if not (report / name).stat().st_size]
    assert not empty, empty
    plots = {name: (report / name).read_bytes() for name in ("auc.png", "jsd_vs_time.png", "cud_users.png")}
    not_plots = [name for name, data in plots.items() if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) <= 5000]
    assert not not_plots, not_plots  # each a PNG of more than 5 kB

    from demo_baseline import check

    check(report / "results.json", "movielens")  # the numbers recorded before the demo became a study
    results = json.loads((report / "results.json").read_text())
    rows = {r["name"]: r for r in results["models"]}
    assert list(rows) == MODELS
    bench = results["benchmark"]
    forget_users = bench["forget_users"]
    assert len(bench["users"]) == 8 and len(forget_users) == 2 and bench["counts"]["train_forget"] == 8
    for name, r in rows.items():
        for key in ("test_auc", "forget_auc", "forget_auc_cud_easy", "forget_auc_cud_hard"):
            assert r[key] is None or 0 <= r[key] <= 1, (name, key)
        assert 0 <= r["jsd_to_retrain"] <= math.log(2), name
        assert len(r["forget_p_yes"]) == 8 and all(0 < p < 1 for p in r["forget_p_yes"]), name
        assert (r["seconds"] is None) == (name == "target") and (name == "target" or r["seconds"] > 0), name
    assert rows["retrain"]["jsd_to_retrain"] == 0.0  # its own reference

    # the JSD column: the mean Bernoulli JSD of each model's forget predictions to the retrain model's
    retrain_p = rows["retrain"]["forget_p_yes"]
    for name in ("target", "e2urec", "neggrad", "bad_teacher", "receraser"):
        expected = sum(hand_jsd(p, q) for p, q in zip(rows[name]["forget_p_yes"], retrain_p)) / len(retrain_p)
        assert rows[name]["jsd_to_retrain"] == pytest.approx(expected, rel=1e-6, abs=1e-12), name
    # every unlearning method changed the target's forget predictions
    for name in ("e2urec", "neggrad", "bad_teacher", "receraser"):
        assert max(abs(a - b) for a, b in zip(rows[name]["forget_p_yes"], rows["target"]["forget_p_yes"])) > 1e-6

    # CUD: users ranked by their mean score; the easy / hard users' prompts are in the report
    cud = results["cud"]
    easy, hard = cud["easy_users"], cud["hard_users"]
    assert len(easy) == len(hard) == 1 and sorted(easy + hard) == sorted(forget_users)
    by_user = {g["group"]: g["score"] for g in cud["users"]}
    assert by_user[easy[0]] <= by_user[hard[0]]
    scores = _jsonl(report / "cud_scores.jsonl")
    assert len(scores) == 8 and all(0 <= s["score"] <= 1 for s in scores)
    easy_rows = _jsonl(report / "cud_easy.json")
    assert {r["user_id"] for r in easy_rows} == set(easy) and len(easy_rows) == 4
    assert {r["user_id"] for r in _jsonl(report / "cud_hard.json")} == set(hard)
    assert cud["anchor_pool"]["size"] == 4 and not cud["anchor_pool"]["in_sample"]
    assert not set(bench["anchor_users"]) & set(forget_users)

    # the CUD-easy and forget AUC of the target, from direct forwards of its merged model
    model, tok = load_model(results["targets"]["target"]["model"], device="cpu")
    labels = [int(r["answer"] == "Yes") for r in easy_rows]
    probs = [direct_p_yes(model, tok, r["question"]) for r in easy_rows]
    got = rows["target"]["forget_auc_cud_easy"]
    assert (got is None and len(set(labels)) == 1) or got == pytest.approx(hand_auc(labels, probs), abs=1e-6)
    forget = _jsonl(next((root / "cache").glob("bench-movielens-*")) / "train_forget.json")
    labels = [int(r["answer"] == "Yes") for r in forget]
    probs = [direct_p_yes(model, tok, r["question"]) for r in forget]
    assert rows["target"]["forget_auc"] == pytest.approx(hand_auc(labels, probs), abs=1e-6)

    # RecEraser retrained exactly the shards that held a forget user
    trained = json.loads(next((root / "cache").glob("recshards-trained-*/sharded/sharded.json")).read_text())
    holding = sorted(s["id"] for s in trained["shards"] if set(s["users"]) & set(forget_users))
    unlearning = results["receraser"]["unlearning"]
    assert unlearning["shards_retrained"] == holding and unlearning["shards_total"] == 2
    assert rows["receraser"]["seconds"] == unlearning["seconds"]

    # the terminal table and the Markdown summary show the same six models
    table = [
        line
        for line in out.splitlines()
        if line.startswith(("original", "retrain", "E2URec", "NegGrad", "Bad-T", "RecEraser"))
    ]
    assert len(table) == 6
    summary = (report / "summary.md").read_text()
    assert summary.count("\n| ") == 7 and "| forget AUC CUD-easy |" in summary


def test_rerun_uses_the_cache_and_gives_the_same_report(rec_demo, capsys):
    root, args = rec_demo
    before = json.loads((root / "report" / "results.json").read_text())["models"]
    code, _, err = _run(args, capsys)
    assert code == 0, err[-2000:]
    assert cells_said(err, "cached") == CELLS and "executor:" not in err  # nothing built
    after = json.loads((root / "report" / "results.json").read_text())["models"]
    assert [{k: v for k, v in r.items() if k != "eval_seconds"} for r in after] == [
        {k: v for k, v in r.items() if k != "eval_seconds"} for r in before
    ]


def test_a_truncated_cached_evaluation_is_rebuilt(rec_demo, tmp_path, capsys):
    """A truncated results_*.json in the stage cache was a traceback; the
    evaluation is now rebuilt, with a warning naming it, and the report is the same."""
    import shutil

    root, args = rec_demo
    if not (root / "report" / "results.json").is_file():
        assert main(args) == 0
        capsys.readouterr()
    cache = tmp_path / "cache"
    shutil.copytree(root / "cache", cache)
    (stage,) = cache.glob("receval-neggrad-*")
    (results,) = stage.rglob("results_*.json")
    results.write_text(results.read_text()[:100])
    args = [*args[: args.index("--cache-dir")], "--cache-dir", str(cache), "--out", str(tmp_path / "report")]
    code, _, err = _run(args, capsys)
    assert code == 0 and "Traceback" not in err, err[-3000:]
    assert (
        f"warning: the cached evaluation of neggrad/seed0 ({stage}) is unreadable ({results.relative_to(stage)}: "
        in err
    )
    assert cells_said(err, "cached") == [c for c in CELLS if c != "neggrad/seed0"]  # everything else
    before = json.loads((root / "report" / "results.json").read_text())["models"]
    after = json.loads((tmp_path / "report" / "results.json").read_text())["models"]
    assert [{k: v for k, v in r.items() if k != "eval_seconds"} for r in after] == [
        {k: v for k, v in r.items() if k != "eval_seconds"} for r in before
    ]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--authors", "3"], "--authors: not an option of --benchmark movielens"),
        (
            ["--users", "10", "--forget-fraction", "0.1"],
            "--forget-fraction 0.1 of --users 10 forgets 1 user; CUD-easy vs CUD-hard needs at least 2",
        ),
        (["--forget-fraction", "1.5"], "--forget-fraction 1.5: must be between 0 and 1"),
        (["--shards", "0"], "--shards must be an integer >= 1, got 0"),
        (["--shards", "17"], "--shards 17: must be between 1 and the 16 retained users"),
        (["--train-per-user", "1"], "--train-per-user 1: CUD's anchor pool (2 user(s) x 1 prompts) needs at least 4"),
        (["--movielens-dir", "/nonexistent/ml"], "MovieLens folder not found: /nonexistent/ml (from --movielens-dir)"),
    ],
)
def test_movielens_demo_options_are_checked_before_any_stage(extra, message, tmp_path, capsys):
    code = main(
        [
            "demo",
            "--benchmark",
            "movielens",
            "--model",
            str(tmp_path / "no-model"),  # (never loaded)
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "report"),
            *extra,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith(f"error: {message}"), err
    assert not (tmp_path / "report").exists() and not (tmp_path / "cache").exists()


def test_tofu_demo_refuses_movielens_options(tmp_path, capsys):
    code = main(["demo", "--users", "5", "--out", str(tmp_path / "report")])
    assert code == 1 and capsys.readouterr().err.strip() == "error: --users: not an option of --benchmark tofu"


def fast_study_file(tmp_path, model_dir, data) -> Path:
    """The demo's study file, its fast variant on ``model_dir`` and the MovieLens folder ``data``."""
    text = STUDY_FILE.read_text()
    text = text.replace('[variants.fast.model]\nbase = "smollm2-135m"', f'[variants.fast.model]\nbase = "{model_dir}"')
    text = text.replace(
        '[variants.fast.benchmark]\nsource = "movielens"',
        f'[variants.fast.benchmark]\nsource = "movielens"\nmovielens_dir = "{data}"',
    )
    path = tmp_path / "movielens.toml"
    path.write_text(text)
    return path


def test_the_movielens_demo_is_a_built_in_study(tmp_path, tiny_model_dir, capsys):
    """`unlearn demo --benchmark movielens` runs the built-in study demo-movielens; its
    --fast variant's cells (`unlearn study ... --dry-run`), nothing built."""
    from unlearn_plugins.study import builtin_studies, expand, load_study

    assert builtin_studies()["demo-movielens"] == STUDY_FILE
    study = load_study("demo-movielens")
    assert [c.id for c in expand(study)] == CELLS
    assert study.movielens.users == 20 and study.sharded.shards == 3 and study.cud.strata == 2
    assert [m.name for m in study.methods] == MODELS[2:5]
    assert study.method("neggrad").settings == {"objective": "grad_ascent", "retain": False}
    fast = load_study("demo-movielens", variant="fast")
    assert fast.movielens.users == 8 and fast.max_length == 512 and fast.sharded.aggregator_options == {"epochs": 5}

    data = write_grouplens(tmp_path / "ml")
    path = fast_study_file(tmp_path, tiny_model_dir, data)
    cache = tmp_path / "cache"
    code, out, err = _run(["study", str(path), "--variant", "fast", "--dry-run", "--cache-dir", str(cache)], capsys)
    assert code == 0, err
    lines = out.splitlines()
    for cell in CELLS:
        assert any(line.split()[:1] == [cell] for line in lines), (cell, out)
    assert "rec_finetune" in out and "sharded_train" in out and "sharded_unlearn + rec_evaluate" in out
    assert "cud_users" in out and "unlearn + rec_evaluate" in out
    assert not cache.exists()  # a dry run writes nothing


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("users = 8\n", "users = 3\n", r"\[benchmark\] users: must be >= 4, got 3"),
        ("shards = 2\n", "shards = 7\n", r"\[sharded\] shards: must be between 1 and the 6 retained users, got 7"),
        ('aggregator = "attention"', 'aggregator = "median"', r"\[sharded\] aggregator: must be one of"),
        ("forget_fraction = 0.25", "forget_fraction = 0.1", r"\[benchmark\] forget_fraction: 0.1 of 8 users forgets 1"),
        ('objective = "grad_ascent"\nretain = false', 'objective = "grad_ascent"\nretain = "x"', r"retain: is set by"),
        ("[variants.fast.cud]\n", "[variants.fast.cud]\nanchor_pool = 4\n", r"\[cud\] anchor_pool: a MovieLens"),
    ],
)
def test_movielens_study_errors_name_the_table_and_key(old, new, message, tmp_path, tiny_model_dir):
    from unlearn_plugins.study import StudyError, load_study

    path = fast_study_file(tmp_path, tiny_model_dir, tmp_path / "ml")
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    with pytest.raises(StudyError, match=message):
        load_study(str(path), variant="fast")


def test_sharded_needs_a_movielens_benchmark(tmp_path):
    from unlearn_plugins.study import StudyError, load_study

    demo = (
        Path(__file__).resolve().parent.parent / "unlearn_plugins" / "benchmarks" / "tofu" / "demo.toml"
    ).read_text()
    path = tmp_path / "s.toml"
    path.write_text(demo.replace("[evaluation]\n", "[sharded]\nshards = 2\n\n[evaluation]\n", 1))
    with pytest.raises(
        StudyError, match=r"\[sharded\]: a sharded recommender needs \[benchmark\] source = 'movielens'"
    ):
        load_study(str(path))


def test_unlearn_study_runs_the_movielens_study_and_writes_its_report(tmp_path, tiny_model_dir, capsys):
    """`unlearn study` on a MovieLens study (the demo's --fast variant on the tiny model): its cells
    on a worker, then the MovieLens report; --list shows it; --report-only is refused."""
    code, out, _ = _run(["study", "--list"], capsys)
    assert code == 0 and "demo-movielens " in out and "(3 methods x 1 seeds = 3 runs, and RecEraser)" in out

    path = fast_study_file(tmp_path, tiny_model_dir, write_grouplens(tmp_path / "ml"))
    args = ["study", str(path), "--variant", "fast", "--device", "cpu", "--cache-dir", str(tmp_path / "cache")]
    args += ["--out", str(tmp_path / "report")]
    code, out, err = _run(args, capsys)
    assert code == 0, err[-3000:]
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert [r["name"] for r in results["models"]] == MODELS
    assert results["config"]["study"] == "demo-movielens" and results["budget"]["shards"] == 2
    assert "RecEraser (2 shards, attention)" in out

    code, _, err = _run([*args, "--report-only"], capsys)
    assert code == 1 and "--report-only: not available for a MovieLens study" in err

    # a failed cell: its line points at the logs, and no report is written (it needs every cell)
    diverge = (
        '[[variants.fast.methods]]\nname = "diverge"\nobjective = "grad_diff"\nobjective_options = { gamma = 1e308 }\n'
    )
    path.write_text(path.read_text().replace("[variants.fast.cud]\n", diverge + "\n[variants.fast.cud]\n", 1))
    bad = tmp_path / "bad"
    code, out, err = _run([*args[:-1], str(bad)], capsys)
    assert code == 1 and out == "" and not (bad / "results.json").exists()
    assert err.strip().splitlines()[-1] == f"error: 1 of 11 cells failed: diverge/seed0 (logs: {bad}/logs)"
