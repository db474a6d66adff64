"""`unlearn score` under `accelerate launch`: one shard per process, one merged output, the
same scores as one process.

The launches are real: 2 CPU processes joined over gloo (accelerate's `--multi_gpu` launcher is
torchrun; on a machine without visible GPUs accelerate's PartialState makes it a CPU group).
`accelerate launch --cpu --num_processes 2` would start ONE process unless mpirun is set up.

Tolerances: the processes run the model on other batches (other padding lengths) and with one
thread each (the launcher sets OMP_NUM_THREADS=1), so values agree to fp32 rounding, not
bitwise: answer NLLs to ~1e-7 relative (float32 eps 1.2e-7; measured 8e-8), EAP-IG matrices to
~1e-7 of their largest entry, which keeps every circuit identical and CUD's similarities within
~1e-7 (measured 1e-7; we allow 1e-6).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support_training import launch_command, score_args

from unlearn_plugins.sharding import shard_indices, single_process_env

DATA = "tofu:forget01[0:7]"  # 7 samples: shards of 4 and 3


def _launch(args: list[str], tmp_path: Path, processes: int = 2) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    cmd = launch_command("-m", "unlearn_plugins.cli", *args, processes=processes)
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _score_args(scorer: str, model_dir, tofu_dir, out, *options: str) -> list[str]:
    return score_args(scorer, model_dir, tofu_dir, DATA, out, *options)


def _one_and_launched(scorer, model_dir, tofu_dir, tmp_path, *options):
    """The same scoring in this process (cache c1) and launched over 2 processes (cache c2):
    (rows of one process, the launch, rows of the launch)."""
    from unlearn_plugins.cli import main

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main(_score_args(scorer, model_dir, tofu_dir, one, *options, f"cache_dir={tmp_path / 'c1'}")) == 0
    done = _launch(_score_args(scorer, model_dir, tofu_dir, two, *options, f"cache_dir={tmp_path / 'c2'}"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return _rows(one), done, _rows(two)


# ----------------------------------------------------------------------------- no processes


def test_shards_are_contiguous_ordered_and_cover_everything():
    for n in range(0, 12):
        for count in range(1, 5):
            shards = [shard_indices(n, i, count) for i in range(count)]
            assert [i for s in shards for i in s] == list(range(n))
            sizes = [len(s) for s in shards]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert shard_indices(7, 0, 2) == [0, 1, 2, 3] and shard_indices(7, 1, 2) == [4, 5, 6]
    with pytest.raises(ValueError):
        shard_indices(4, 2, 2)


def test_anchor_run_children_leave_the_launchers_group():
    env = single_process_env(
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "1",
            "MASTER_PORT": "1",
            "MASTER_ADDR": "x",
            "ACCELERATE_USE_CPU": "1",
            "TORCHELASTIC_RUN_ID": "r",
            "PATH": "/bin",
            "CUDA_VISIBLE_DEVICES": "3",
        }
    )
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "3"}


# ----------------------------------------------------------------------------- real launches


def test_loss_scores_over_two_processes_equal_one_process(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.cli import main

    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main(_score_args("loss", tiny_model_dir, tofu_dir, one)) == 0
    done = _launch(_score_args("loss", tiny_model_dir, tofu_dir, two), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(2 processes)" in done.stdout and done.stdout.count("scored 7 samples") == 1  # the main process only
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".jsonl") or ".tmp" in p.name) == [
        "one.jsonl",
        "two.jsonl",
    ]  # no temp files
    a, b = _rows(one), _rows(two)
    assert [r["index"] for r in b] == list(range(7)) and [r["question"] for r in b] == [r["question"] for r in a]
    for x, y in zip(a, b):
        assert y["score"] == pytest.approx(x["score"], rel=1e-6)
    assert len({r["score"] for r in b}) > 1  # real, per-sample values


def test_cud_shares_matrices_through_the_cache_and_matches_one_process(tiny_model_dir, tofu_dir, tmp_path):
    options = ["anchor_data=self", 'anchors={"easy": [0, 1], "hard": [2, 3]}', "steps=2", "baseline=other"]
    a, done, b = _one_and_launched("cud", tiny_model_dir, tofu_dir, tmp_path, *options)
    # each process computed the matrices of its own shard; the main process found them all cached
    assert "process 0 of 2: anchor runs [], score matrices of samples 0..3" in done.stderr
    assert "process 1 of 2: anchor runs [], score matrices of samples 4..6" in done.stderr
    assert len(list((tmp_path / "c2" / "matrices").glob("*.pt"))) == 7
    assert not list((tmp_path / "c2" / "shards").glob("*"))  # the consistency markers are cleaned up
    assert [r["index"] for r in b] == list(range(7))
    for x, y in zip(a, b):
        assert (y["anchor"], y["circuit_edges"], y["circuit_by_layer"]) == (
            x["anchor"],
            x["circuit_edges"],
            x["circuit_by_layer"],
        )
        for key in ("score", "s_E", "s_H"):
            assert y[key] == pytest.approx(x[key], abs=1e-6)


def test_sharded_cud_without_cache_fails_on_every_process(tiny_model_dir, tofu_dir, tmp_path):
    out = tmp_path / "cud.jsonl"
    done = _launch(
        _score_args("cud", tiny_model_dir, tofu_dir, out, 'anchors={"easy": [0, 1], "hard": [2, 3]}', "cache=false"),
        tmp_path,
    )
    assert done.returncode != 0 and not out.exists()
    assert done.stderr.count("needs cache=true") == 2, done.stderr  # both processes stop with the message
    assert "unlearn_plugins/" not in done.stderr  # no traceback through our code (the launcher prints its own)


@pytest.mark.slow
def test_anchor_runs_are_split_over_processes(tiny_model_dir, tofu_dir, tmp_path):
    """Real LoRA anchor runs (2 steps each): grad_diff on process 0, npo on process 1, each in a
    single-process child (an in-process Trainer would join the launcher's group); anchors,
    losses and scores as in one process."""
    unlearn = {
        "max_steps": 2,
        "retain": "tofu:retain99[0:8]",
        "tofu_dir": str(tofu_dir),
        "batch_size": 2,
        "grad_accum": 1,
        "lr": 1e-2,
    }
    options = [
        "anchor_data=self",
        'objectives=["grad_diff", "npo"]',
        "seeds=[0]",
        "k=2",
        "min_votes=1",
        "steps=1",
        f"unlearn_options={json.dumps(unlearn)}",
    ]
    a, done, b = _one_and_launched("cud", tiny_model_dir, tofu_dir, tmp_path, *options)
    assert "process 0 of 2: anchor runs ['grad_diff/0']" in done.stderr
    assert "process 1 of 2: anchor runs ['npo/0']" in done.stderr

    def losses(folder):
        records = [json.loads(p.read_text()) for p in (folder / "anchors").glob("*.json")]
        return {r["objective"]: r["losses"] for r in records}

    l1, l2 = losses(tmp_path / "c1"), losses(tmp_path / "c2")
    assert set(l1) == set(l2) == {"grad_diff", "npo"}
    for objective in l1:  # measured: equal; 2 training steps may add some fp32 rounding elsewhere
        assert l2[objective] == pytest.approx(l1[objective], rel=1e-5)
    assert [r["anchor"] for r in b] == [r["anchor"] for r in a]
    for x, y in zip(a, b):
        assert y["score"] == pytest.approx(x["score"], abs=1e-6)


# ----------------------------------------------------------------------------- CUD's hand-over, in one process


class _Group:
    """What prepare_shard sees of a launch (sharding.Group), without processes."""

    def __init__(self, index: int, count: int = 2):
        self.index, self.count, self.is_main, self.run_id = index, count, index == 0, "run-1"


class _Runner:
    def __init__(self):
        self.calls = []

    def describe(self):
        return {"runner": "fixed"}

    def losses(self, samples, *, model, tokenizer, objective, seed):
        self.calls.append(objective)
        base = {"grad_diff": [3.0, 2.5, 0.2, 0.1, 2.0, 0.3], "npo": [2.9, 2.6, 0.3, 0.2, 1.0, 0.1]}[objective]
        return base[: len(samples)]


def test_cud_processes_split_runs_and_matrices_and_main_scores_from_the_cache(
    tiny_model, tiny_tokenizer, tmp_path, monkeypatch
):
    from unlearn_plugins.circuits import eap_ig
    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.interfaces import QASample, ShardedScorer
    from unlearn_plugins.scorers.cud import CUDScorer

    samples = [
        QASample(q, a, i)
        for i, (q, a) in enumerate(
            [
                ("Who are the parents of the author?", "Her father was a doctor."),
                ("What awards has the author won?", "He won the International Booker Prize."),
                ("Which genre does the author write in?", "She writes fantasy novels."),
                ("What is the full name of the author?", "The author is Basil Mahfouz Al-Kuwaiti."),
                ("Who are the parents of the painter?", "Her mother was a painter."),
                ("What is the capital of France?", "The capital of France is Paris."),
            ]
        )
    ]
    kwargs = dict(anchor_data="self", objectives=["grad_diff", "npo"], seeds=[0], k=2, steps=1, n_edges=20)
    expected = CUDScorer(runner=_Runner(), cache_dir=str(tmp_path / "one"), **kwargs).score(
        samples, model=tiny_model, tokenizer=tiny_tokenizer
    )

    runners = [_Runner(), _Runner()]
    scorers = [CUDScorer(runner=r, cache_dir=str(tmp_path / "two"), **kwargs) for r in runners]
    assert isinstance(scorers[0], ShardedScorer)
    for i, shard in ((1, [3, 4, 5]), (0, [0, 1, 2])):
        scorers[i].prepare_shard(samples, shard, model=tiny_model, tokenizer=tiny_tokenizer, group=_Group(i))
    assert [r.calls for r in runners] == [["grad_diff"], ["npo"]]
    assert len(list((tmp_path / "two" / "matrices").glob("*.pt"))) == 6

    def boom(*args, **kwargs):
        raise AssertionError("EAP-IG should not run on the main process: the shards are cached")

    monkeypatch.setattr(eap_ig.EAPIG, "iter_scores", boom)
    rows = scorers[0].score(samples, model=tiny_model, tokenizer=tiny_tokenizer)
    assert runners[0].calls == ["grad_diff"]  # npo's losses came from process 1, through the cache
    assert [r["anchor"] for r in rows] == [r["anchor"] for r in expected]
    for x, y in zip(expected, rows):
        assert y["score"] == pytest.approx(x["score"], abs=1e-6)
    monkeypatch.undo()

    # process 1 wrote to another cache folder: the main process says so instead of redoing its share
    lost = [CUDScorer(runner=_Runner(), cache_dir=str(tmp_path / f"c{i}"), **kwargs) for i in range(2)]
    for i, shard in ((0, [0, 1, 2]), (1, [3, 4, 5])):
        lost[i].prepare_shard(samples, shard, model=tiny_model, tokenizer=tiny_tokenizer, group=_Group(i))
    with pytest.raises(UnlearnError, match="process 1 did not write to the cache folder"):
        lost[0].score(samples, model=tiny_model, tokenizer=tiny_tokenizer)
    with pytest.raises(UnlearnError, match="needs cache=true"):
        CUDScorer(runner=_Runner(), cache=False, **kwargs).prepare_shard(
            samples, [0], model=tiny_model, tokenizer=tiny_tokenizer, group=_Group(0)
        )
