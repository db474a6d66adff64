"""The MovieLens recommender benchmark: prompts, the chronological split, the forget request,
the files, P(Yes) from a model, the lm-eval tasks (AUC / LogLoss / accuracy / JSD) against
independent computations, and the per-user CUD aggregation behind `unlearn stratify --group-by`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from unlearn_plugins.benchmarks.movielens.benchmark import (
    FILES,
    BenchmarkSettings,
    build_benchmark,
    load_part,
    read_info,
)
from unlearn_plugins.benchmarks.movielens.data import Movie, MovieLens, Rating
from unlearn_plugins.benchmarks.movielens.forget import choose_anchor_users, choose_forget_users
from unlearn_plugins.benchmarks.movielens.prompts import build_prompt
from unlearn_plugins.benchmarks.movielens.split import chronological_split, split_sizes, user_timelines
from unlearn_plugins.errors import DataError

pytestmark = pytest.mark.usefixtures("single_thread")

N_USERS, N_MOVIES = 6, 10


def toy_movielens() -> MovieLens:
    """6 made-up users who each rate 10 made-up movies, the rating times shuffled per user."""
    movies = {i: Movie(i, f"Movie {chr(64 + i)}", 1990 + i) for i in range(1, N_MOVIES + 1)}
    ratings = []
    for u in range(1, N_USERS + 1):
        for i in range(1, N_MOVIES + 1):
            stamp = 1000 * u + ((i * (u + 2)) % 11) * 10  # time order differs from file order, per user
            ratings.append(Rating(u, i, float((u + i * i + u * i) % 5 + 1), stamp, "toy", len(ratings) + 1))
    return MovieLens(ratings, movies, "toy", "<memory>")


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    bench = build_benchmark(toy_movielens(), BenchmarkSettings(history=3, forget_fraction=1 / 3, anchor_users=1))
    return bench.write(tmp_path_factory.mktemp("bench"))


# ----------------------------------------------------------------------------- prompts and splits


def test_prompt_lists_liked_and_disliked_movies_with_years_in_rating_order():
    a, b, c, t = (
        Movie(1, "Alpha", 1991),
        Movie(2, "Beta", None),
        Movie(3, "Gamma, The", 1993),
        Movie(4, "Target", 2001),
    )
    prompt = build_prompt([(a, 5.0), (b, 3.0), (c, 4.0)], t)
    lines = prompt.split("\n")
    assert lines[0].startswith("Given the user's preference and unpreference") and '"Yes" or "No"' in lines[0]
    assert lines[1] == 'User Preference: "Alpha (1991)", "Gamma, The (1993)"'  # rating > 3
    assert lines[2] == 'User Unpreference: "Beta"'  # 3 stars is not liked; no year known
    assert lines[3] == 'Whether the user will like the target movie "Target (2001)"?'
    assert build_prompt([(a, 1.0)], t).split("\n")[1] == "User Preference: none"


@pytest.mark.parametrize(
    "n, fractions, expected",
    [
        (10, (0.1, 0.1), (8, 1, 1)),
        (20, (0.1, 0.1), (16, 2, 2)),
        (3, (0.1, 0.1), (1, 1, 1)),
        (2, (0.1, 0.1), (1, 0, 1)),
        (1, (0.1, 0.1), (1, 0, 0)),
        (25, (0.1, 0.08), (20, 3, 2)),
        (10, (0.0, 0.2), (8, 0, 2)),
    ],
)
def test_split_sizes(n, fractions, expected):
    assert split_sizes(n, *fractions) == expected


def test_chronological_split_per_user():
    ml = toy_movielens()
    timelines = user_timelines(ml.ratings)
    for timeline in timelines.values():
        stamps = [r.timestamp for r in timeline]
        assert stamps == sorted(stamps)
        parts = chronological_split(timeline)
        assert parts == ["train"] * 8 + ["valid", "test"]
        # every training rating is earlier than every test rating of the same user
        assert max(r.timestamp for r, p in zip(timeline, parts) if p == "train") < timeline[-1].timestamp


def test_forget_request_is_a_seeded_set_of_users_and_anchors_are_disjoint():
    users = list(range(1, 101))
    forget = choose_forget_users(users, 0.1, seed=3)
    assert len(forget) == 10 and forget == choose_forget_users(users, 0.1, seed=3)
    assert forget != choose_forget_users(users, 0.1, seed=4)
    anchors = choose_anchor_users(users, forget, 10, seed=3)
    assert len(anchors) == 10 and not set(anchors) & set(forget)
    with pytest.raises(DataError, match="forget_fraction must be between 0 and 1"):
        choose_forget_users(users, 1.5)


def test_benchmark_parts_and_files(bench_dir):
    info = read_info(bench_dir)
    forget, anchors = set(info["forget_users"]), set(info["anchor_users"])
    assert len(forget) == 2 and len(anchors) == 1 and not forget & anchors
    parts = {name: load_part(bench_dir, name) for name in FILES}
    users = lambda name: {s.extra["user_id"] for s in parts[name]}  # noqa: E731
    assert users("train_forget") == forget and not users("train_retain") & forget
    assert users("test_forget") == forget and not users("test_retain") & forget
    assert users("anchor_pool") == anchors and not users("anchor_retain") & (anchors | forget)
    assert len(parts["train"]) == len(parts["train_retain"]) + len(parts["train_forget"]) == N_USERS * 5
    assert len(parts["test_retain"]) == 4 and len(parts["test_forget"]) == 2
    for s in parts["train"]:
        assert s.answer == ("Yes" if s.extra["rating"] > 3 else "No") and s.extra["label"] == int(s.answer == "Yes")
    # a test prompt's history is the user's three ratings just before it, oldest first
    ml = toy_movielens()
    sample = parts["test_retain"][0]
    timeline = user_timelines(ml.ratings)[sample.extra["user_id"]]
    history = [(ml.movies[r.item_id], r.rating) for r in timeline[-4:-1]]
    assert sample.question == build_prompt(history, ml.movies[timeline[-1].item_id])
    # the files are TOFU JSON-lines records that unlearn's loaders take as they are
    from unlearn_plugins.data.qa import load_split

    assert [s.question for s in load_split(str(bench_dir / "train_forget.json"))] == [
        s.question for s in parts["train_forget"]
    ]


def test_budget_settings_keep_recent_prompts_of_a_user_sample():
    bench = build_benchmark(
        toy_movielens(),
        BenchmarkSettings(
            history=3, min_history=2, users=4, max_train_per_user=2, forget_fraction=0.25, anchor_users=1
        ),
    )
    assert len(bench.users) == 4 and len(bench.parts["train"]) == 8
    for user in bench.users:
        rows = [s for s in bench.parts["train"] if s.extra["user_id"] == user]
        assert len(rows) == 2 and rows[0].extra["timestamp"] < rows[1].extra["timestamp"]
    with pytest.raises(DataError, match="benchmark setting 'history' must be an integer >= 1"):
        build_benchmark(toy_movielens(), BenchmarkSettings(history=0))


# ----------------------------------------------------------------------------- P(Yes), metrics, tasks


def direct_p_yes(model, tok, question: str) -> float:
    """P(Yes) / (P(Yes) + P(No)) by plain forwards of prompt + each answer's tokens."""
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    lls = []
    for answer in ("Yes", "No"):
        a = tok(answer, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([p + a])).logits[0, len(p) - 1 : -1].float()
        lls.append(float(torch.log_softmax(logits, -1)[torch.arange(len(a)), torch.tensor(a)].sum()))
    return 1.0 / (1.0 + math.exp(lls[1] - lls[0]))


def hand_auc(labels, probs) -> float:
    pos = [p for y, p in zip(labels, probs) if y == 1]
    neg = [p for y, p in zip(labels, probs) if y == 0]
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def hand_logloss(labels, probs) -> float:
    return -sum(y * math.log(p) + (1 - y) * math.log(1 - p) for y, p in zip(labels, probs)) / len(labels)


def hand_jsd(p, q) -> float:
    def kl(a, b):
        return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)

    a, b = [p, 1 - p], [q, 1 - q]
    m = [(x + y) / 2 for x, y in zip(a, b)]
    return 0.5 * kl(a, m) + 0.5 * kl(b, m)


def test_metrics_against_hand_computations():
    from unlearn_plugins.benchmarks.movielens.tasks import metrics as rm

    labels = [1, 0, 1, 1, 0, 0, 1]
    probs = [0.9, 0.3, 0.35, 0.8, 0.35, 0.1, 0.6]
    items = list(zip(labels, probs))
    assert rm.auc(items) == pytest.approx(hand_auc(labels, probs), abs=1e-12)
    assert rm.logloss(items) == pytest.approx(hand_logloss(labels, probs), abs=1e-12)
    assert rm.accuracy(items) == pytest.approx(6 / 7)
    assert rm.bernoulli_jsd(0.9, 0.2) == pytest.approx(hand_jsd(0.9, 0.2), abs=1e-12)
    assert rm.bernoulli_jsd(0.4, 0.4) == pytest.approx(0.0, abs=1e-12)
    assert rm.bernoulli_jsd(1.0, 0.0) == pytest.approx(math.log(2), abs=1e-12)
    assert rm.p_yes(-2.0, -0.5) == pytest.approx(math.exp(-2) / (math.exp(-2) + math.exp(-0.5)))
    assert rm.p_yes(-1e4, 0.0) == pytest.approx(0.0, abs=1e-300)
    with pytest.warns(RuntimeWarning, match="AUC is undefined"):
        assert math.isnan(rm.auc([(1, 0.3), (1, 0.8)]))


def test_predict_matches_direct_forwards(tiny, bench_dir):
    from unlearn_plugins.benchmarks.movielens.predict import predict

    model, tok = tiny
    samples = load_part(bench_dir, "test_retain")
    out = predict(model, tok, samples, batch_size=3, hidden=True)
    assert out.p_yes == pytest.approx([direct_p_yes(model, tok, s.question) for s in samples], abs=1e-5)
    assert out.hidden.shape == (len(samples), model.config.hidden_size)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def run_tasks(model, tok, tasks, metadata):
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from unlearn_plugins.benchmarks.movielens.plugin import MOVIELENS

    manager = TaskManager(include_path=[str(d) for d in MOVIELENS.task_dirs], include_defaults=False, metadata=metadata)
    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=model, tokenizer=tok, batch_size=4),
        tasks=tasks,
        task_manager=manager,
        log_samples=True,
        bootstrap_iters=0,
    )
    metrics = {
        t: {k.split(",")[0]: v for k, v in row.items() if "," in k and "stderr" not in k}
        for t, row in out["results"].items()
    }
    return metrics, out["samples"]


def test_lm_eval_tasks_match_independent_computation(tiny, tiny_model_dir, bench_dir, tmp_path):
    from unlearn_plugins.benchmarks.movielens.tasks.metrics import read_prediction_reference, reference_from_samples
    from unlearn_plugins.testing import tiny_llama

    model, tok = tiny
    meta = {"tokenizer": str(tiny_model_dir), "rec_dir": str(bench_dir)}
    metrics, samples = run_tasks(model, tok, ["movielens_rec", "movielens_rec_forget"], meta)
    for task, part in (("movielens_rec", "test_retain"), ("movielens_rec_forget", "train_forget")):
        rows = load_part(bench_dir, part)
        labels = [int(s.answer == "Yes") for s in rows]
        probs = [direct_p_yes(model, tok, s.question) for s in rows]
        assert metrics[task]["auc"] == pytest.approx(hand_auc(labels, probs), abs=1e-6)
        assert metrics[task]["logloss"] == pytest.approx(hand_logloss(labels, probs), abs=1e-5)
        assert metrics[task]["acc"] == pytest.approx(sum((p > 0.5) == y for y, p in zip(labels, probs)) / len(rows))
    assert metrics["movielens_rec_forget"]["jsd"] is None or math.isnan(metrics["movielens_rec_forget"]["jsd"])

    # the "retrained" model (another random tiny model) as the reference; JSD against it
    retrain = tiny_llama(len(tok), seed=7)
    _, retrain_samples = run_tasks(retrain, tok, ["movielens_rec_forget"], meta)
    ref = tmp_path / "retrain_ref.json"
    reference_from_samples(retrain_samples["movielens_rec_forget"], ref, task="movielens_rec_forget")
    assert read_prediction_reference(ref).split == "train_forget"
    metrics, _ = run_tasks(model, tok, ["movielens_rec_forget"], {**meta, "retrain_reference": str(ref)})
    rows = load_part(bench_dir, "train_forget")
    expected = sum(
        hand_jsd(direct_p_yes(model, tok, s.question), direct_p_yes(retrain, tok, s.question)) for s in rows
    ) / len(rows)
    assert metrics["movielens_rec_forget"]["jsd"] == pytest.approx(expected, abs=1e-6)

    # a subset of the forget prompts (e.g. CUD-easy users' prompts, a file) takes its share of the reference
    from unlearn_plugins.files import write_jsonl

    subset = tmp_path / "easy.json"
    write_jsonl(subset, [s.to_record() for s in rows[:3]])
    with pytest.warns(RuntimeWarning, match="AUC is undefined: all 3 labels are 0"):  # these three are all "No"
        metrics, _ = run_tasks(
            model, tok, ["movielens_rec_forget"], {**meta, "forget_part": str(subset), "retrain_reference": str(ref)}
        )
    expected = (
        sum(hand_jsd(direct_p_yes(model, tok, s.question), direct_p_yes(retrain, tok, s.question)) for s in rows[:3])
        / 3
    )
    assert metrics["movielens_rec_forget"]["jsd"] == pytest.approx(expected, abs=1e-6)

    # a reference made on other samples is refused, naming the file
    metrics_test = {**meta, "forget_part": "test_forget", "retrain_reference": str(ref)}
    with pytest.raises(DataError, match=r"evaluates 'test_forget' \(2 samples\) but no prediction reference was made"):
        run_tasks(model, tok, ["movielens_rec_forget"], metrics_test)


def test_reference_file_errors_name_file_and_field(tmp_path):
    from unlearn_plugins.benchmarks.movielens.tasks.metrics import read_prediction_reference, write_prediction_reference

    path = tmp_path / "ref.json"
    write_prediction_reference(path, task="t", split="s", keys=["a", "b"], p_yes=[0.2, 0.9])
    assert read_prediction_reference(path).p_yes == (0.2, 0.9)
    data = json.loads(path.read_text())
    data["samples"][1]["p_yes"] = 1.5
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"ref.json: samples\[1\]: field 'p_yes' must be a number in \[0, 1\]"):
        read_prediction_reference(path)


def test_unlearn_movielens_writes_the_benchmark_from_a_grouplens_folder(tmp_path, capsys):
    """The CLI end to end on the toy ratings written in GroupLens' ML-100K layout."""
    from unlearn_plugins.cli import main

    ml = toy_movielens()
    folder = tmp_path / "ml-100k"
    folder.mkdir()
    genres = "|".join(["0"] * 19)
    (folder / "u.item").write_text(
        "".join(f"{m.item_id}|{m.label}|01-Jan-{m.year}||http://x|{genres}\n" for m in ml.movies.values())
    )
    (folder / "u.data").write_text(
        "".join(f"{r.user_id}\t{r.item_id}\t{int(r.rating)}\t{r.timestamp}\n" for r in ml.ratings)
    )
    out = tmp_path / "bench"
    assert (
        main(
            [
                "movielens",
                "--out",
                str(out),
                "--movielens-dir",
                str(folder),
                "--history",
                "3",
                "--forget-fraction",
                "0.34",
                "--anchor-users",
                "1",
            ]
        )
        == 0
    )
    assert "6 users, 2 forgotten" in capsys.readouterr().out
    info = read_info(out)
    assert info["source"]["layout"] == "grouplens-100k" and info["settings"]["history"] == 3
    expected = build_benchmark(ml, BenchmarkSettings(history=3, forget_fraction=0.34, anchor_users=1))
    assert [s.question for s in load_part(out, "test_forget")] == [s.question for s in expected.parts["test_forget"]]
    assert main(["movielens", "--out", str(out), "--movielens-dir", str(folder)]) == 1
    assert "already holds a benchmark" in capsys.readouterr().err
