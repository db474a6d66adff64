"""Recommendation-unlearning methods on the tiny model and a few made-up users: E2URec and
the bad teacher through `run_unlearning`, RecEraser / SISA (balanced partition, one adapter
per shard, unlearning retrains only the affected shard), and CUD scored per user
(`unlearn stratify --group-by user_id`)."""

from __future__ import annotations

import hashlib
import json

import pytest
from test_recommendation import hand_auc, hand_logloss, toy_movielens

from unlearn_plugins.benchmarks.movielens.benchmark import BenchmarkSettings, build_benchmark, load_part, read_info

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    bench = build_benchmark(toy_movielens(), BenchmarkSettings(history=3, forget_fraction=1 / 3, anchor_users=1))
    return bench.write(tmp_path_factory.mktemp("bench"))


def unlearn_config(tiny_model_dir, bench_dir, out, objective, **options):
    from unlearn_plugins.training.config import UnlearnConfig

    data = {"forget": str(bench_dir / "train_forget.json"), "retain": str(bench_dir / "train_retain.json")}
    sizes = {"epochs": 2.0, "batch_size": 5, "grad_accum": 1, "lr": 1e-3, "lora_r": 4, "lora_alpha": 8.0}
    sizes.update(max_length=512, save_steps=0, device="cpu")
    method = {"objective": objective, "objective_options": options}
    return UnlearnConfig(out=str(out), model=str(tiny_model_dir), **data, **sizes, **method)


def stratify(scores, bench_dir, group_by, out) -> int:
    """`unlearn stratify` of the forget prompts by ``group_by``: 1 easy and 1 hard group."""
    from unlearn_plugins.cli import main

    groups = ["--group-by", group_by, "--easy", "1", "--hard", "1"]
    return main(["stratify", str(scores), "--data", str(bench_dir / "train_forget.json"), *groups, "--out", str(out)])


def test_e2urec_trains_its_augmented_teacher_then_forgets_first(tiny_model_dir, bench_dir, tmp_path):
    from unlearn_plugins.training.run import run_unlearning

    result = run_unlearning(
        unlearn_config(
            tiny_model_dir, bench_dir, tmp_path / "e2urec", "e2urec", teacher_batch_size=4, teacher_epochs=1.0
        )
    )
    record = json.loads((tmp_path / "e2urec" / "run.json").read_text())
    assert record["status"] == "completed" and result.record["steps"] == 4  # 10 forget prompts, batch 5, 2 epochs
    assert record["context"]["e2urec_augmented"]["trained"]["epochs"] == 1.0
    by_step = {entry["step"]: entry for entry in record["losses"]}
    assert "loss_retain" not in by_step[1] and "loss_retain" not in by_step[2]  # epoch 0: forget term alone
    assert "loss_retain" in by_step[3] and "loss_retain" in by_step[4]


def test_bad_teacher_runs_through_run_unlearning(tiny_model_dir, bench_dir, tmp_path):
    from unlearn_plugins.training.run import run_unlearning

    run_unlearning(unlearn_config(tiny_model_dir, bench_dir, tmp_path / "bad", "bad_teacher"))
    losses = json.loads((tmp_path / "bad" / "run.json").read_text())["losses"]
    assert {"loss_forget_flipped", "loss_retain"} <= set(losses[0])


# ----------------------------------------------------------------------------- RecEraser / SISA


def test_balanced_partition_is_capped_deterministic_and_follows_the_embeddings():
    from unlearn_plugins.benchmarks.movielens.partition import balanced_partition, random_partition

    # two clear clusters of users: the partition separates them
    emb = {u: [10.0 + 0.1 * u, 0.0] for u in range(6)} | {u: [-10.0 - 0.1 * u, 0.0] for u in range(6, 12)}
    shards = balanced_partition(emb, 2, iterations=5, seed=1)
    assert sorted(map(tuple, shards)) == [tuple(range(6)), tuple(range(6, 12))]
    emb = {u: [float(u % 5), float(u % 3)] for u in range(40)}
    shards = balanced_partition(emb, 4, seed=3)
    assert shards == balanced_partition(emb, 4, seed=3)
    assert sorted(u for s in shards for u in s) == list(range(40))
    assert max(len(s) for s in shards) <= 1.2 * 40 / 4
    assert sorted(u for s in random_partition(range(10), 3) for u in s) == list(range(10))


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("aggregator", ["attention", "average"])
def test_sharded_unlearning_retrains_only_the_affected_shard(tiny_model_dir, bench_dir, tmp_path, aggregator):
    from unlearn_plugins.benchmarks.movielens.sharded import ShardedRecommender, copy_sharded, train_sharded

    sizes = {"epochs": 1.0, "max_length": 512, "lora_r": 4, "lora_alpha": 8.0, "batch_size": 4, "device": "cpu"}
    aggregation = {"aggregator": aggregator, "aggregator_prompts": 12}
    aggregation["aggregator_options"] = {"epochs": 5} if aggregator == "attention" else None
    sharded = train_sharded(
        bench_dir, tmp_path / "sharded", model=str(tiny_model_dir), shards=3, **aggregation, **sizes
    )
    assert sorted(u for s in sharded.shards for u in s["users"]) == read_info(bench_dir)["users"]
    test = load_part(bench_dir, "test_retain")
    before = sharded.predict(test, device="cpu")
    assert all(0.0 < p < 1.0 for p in before.p_yes) and len(before.p_yes) == len(test)

    if aggregator == "average":  # the ensemble through the lm-eval tasks gives the same P(Yes)
        metrics = evaluate_sharded(sharded, bench_dir, tiny_model_dir)
        labels = [int(s.answer == "Yes") for s in test]
        assert metrics["auc"] == pytest.approx(hand_auc(labels, before.p_yes), abs=1e-9)
        assert metrics["logloss"] == pytest.approx(hand_logloss(labels, before.p_yes), abs=1e-6)

    user = read_info(bench_dir)["forget_users"][0]
    affected = sharded.shard_of(user)
    weights = {
        s["id"]: sha(tmp_path / "sharded" / "shards" / f"shard-{s['id']}" / "adapter_model.safetensors")
        for s in sharded.shards
    }
    copy = copy_sharded(tmp_path / "sharded", tmp_path / "unlearned")
    report = copy.unlearn([user], device="cpu")
    assert report.shards_retrained == [affected] and report.shards_total == 3 and report.shards_removed == []
    assert report.retrain_seconds > 0 and report.seconds >= report.retrain_seconds
    after = {
        s["id"]: sha(tmp_path / "unlearned" / "shards" / f"shard-{s['id']}" / "adapter_model.safetensors")
        for s in copy.shards
    }
    assert {k for k in after if after[k] != weights[k]} == {affected}  # only that shard's adapter changed
    reloaded = ShardedRecommender(tmp_path / "unlearned")
    assert reloaded.shard_of(user) is None and reloaded.info["unlearning"][0]["shards_retrained"] == [affected]
    shard_rows = load_part_file(tmp_path / "unlearned" / "shards" / f"shard-{affected}.json")
    assert user not in {s.extra["user_id"] for s in shard_rows}
    agg_rows = load_part_file(tmp_path / "unlearned" / "aggregator_data.json")
    assert user not in {s.extra["user_id"] for s in agg_rows}
    assert len(reloaded.predict(test, device="cpu").p_yes) == len(test)
    with pytest.raises(Exception, match=r"user\(s\) \[" + str(user) + r"\] are in no shard"):
        reloaded.unlearn([user])


def evaluate_sharded(sharded, bench_dir, tiny_model_dir) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from unlearn_plugins.benchmarks.movielens.plugin import MOVIELENS
    from unlearn_plugins.benchmarks.movielens.sharded_lm import ShardedRecommenderLM

    manager = TaskManager(
        include_path=[str(d) for d in MOVIELENS.task_dirs],
        include_defaults=False,
        metadata={"tokenizer": str(tiny_model_dir), "rec_dir": str(bench_dir)},
    )
    out = lm_eval.simple_evaluate(
        model=ShardedRecommenderLM(sharded, device="cpu"),
        tasks=["movielens_rec"],
        task_manager=manager,
        bootstrap_iters=0,
    )
    return {k.split(",")[0]: v for k, v in out["results"]["movielens_rec"].items() if "," in k}


def load_part_file(path):
    from unlearn_plugins.data.qa import read_jsonl

    return read_jsonl(path)


# ----------------------------------------------------------------------------- CUD per user


def test_stratify_groups_users_by_their_mean_score(bench_dir, tmp_path, capsys):

    forget = load_part(bench_dir, "train_forget")
    users = sorted({s.extra["user_id"] for s in forget})
    assert len(users) == 2
    # user A's samples score 0.1, 0.9, 0.2, ...: mean below user B's constant 0.6
    scores = {users[0]: [0.1, 0.9, 0.2, 0.3, 0.1], users[1]: [0.6] * 5}
    rows, seen = [], {u: 0 for u in users}
    for s in forget:
        u = s.extra["user_id"]
        rows.append({"index": s.index, "question": s.question, "score": scores[u][seen[u]]})
        seen[u] += 1
    path = tmp_path / "scores.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "strata"
    assert stratify(path, bench_dir, "user_id", out) == 0
    info = json.loads((out / "stratify.json").read_text())
    assert info["aggregation"] == "mean"
    assert [g["group"] for g in info["easy"]] == [users[0]] and [g["group"] for g in info["hard"]] == [users[1]]
    assert info["easy"][0]["score"] == pytest.approx(sum(scores[users[0]]) / 5)
    easy = load_part_file(out / "easy.json")
    assert {s.extra["user_id"] for s in easy} == {users[0]} and len(easy) == 5  # all of the user's samples
    assert stratify(path, bench_dir, "genre", out) != 0
    assert "field 'genre' (--group-by) is missing" in capsys.readouterr().err


def test_cud_scores_recommendation_prompts_on_the_answer_token(tiny_model_dir, bench_dir, tmp_path):
    """CUD with anchors from other users (fixed here, so no anchor runs), the EAP-IG metric on the
    Yes/No token only, then per-user means."""
    from unlearn_plugins.data.qa import encode_samples
    from unlearn_plugins.models import load_model
    from unlearn_plugins.scorers.cud import CUDScorer, first_answer_tokens
    from unlearn_plugins.stratify import group_scores

    model, tok = load_model(str(tiny_model_dir), device="cpu")
    forget = load_part(bench_dir, "train_forget")
    encoded = first_answer_tokens(encode_samples(tok, forget[:2]), 1)
    assert all(sum(x != -100 for x in e["labels"]) == 1 for e in encoded)

    pool = load_part(bench_dir, "anchor_pool")
    assert not {s.extra["user_id"] for s in pool} & {s.extra["user_id"] for s in forget}
    scorer = CUDScorer(
        anchor_data=pool,
        anchors={"easy": [0, 1], "hard": [2, 3]},
        answer_tokens=1,
        n_edges=10,
        steps=2,
        cache_dir=str(tmp_path / "cache"),
    )
    rows = scorer.score(forget, model=model, tokenizer=tok)
    assert len(rows) == len(forget) and all(0.0 <= r["score"] <= 1.0 for r in rows)
    assert scorer.last_metadata["settings"]["answer_tokens"] == 1
    groups = group_scores([{"index": s.index, "score": r["score"]} for s, r in zip(forget, rows)], forget, "user_id")
    for g in groups:
        mine = [r["score"] for s, r in zip(forget, rows) if s.extra["user_id"] == g["group"]]
        assert g["score"] == pytest.approx(sum(mine) / len(mine))
