"""CUD scorer: anchor voting, leave-one-out anchors, the formula per row, caching, CLI output."""

from __future__ import annotations

import json

import pytest
import torch

from unlearn_plugins.circuits.circuit import select
from unlearn_plugins.circuits.similarity import circuit_similarity, cud
from unlearn_plugins.interfaces import QASample
from unlearn_plugins.scorers.cud import AnchorError, CUDScorer, select_anchors

QA = [
    ("Who are the parents of the author?", "Her father was a doctor."),
    ("What awards has the author won?", "He won the International Booker Prize."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
    ("What is the full name of the author born in Kuwait City?", "The author is Basil Mahfouz Al-Kuwaiti."),
    ("Who are the parents of the painter?", "Her mother was a painter."),
    ("What is the capital of France?", "The capital of France is Paris."),
]
SAMPLES = [QASample(q, a, i) for i, (q, a) in enumerate(QA)]


def test_select_anchors_votes_and_drops_overlap():
    runs = [[5, 4, 3, 2, 1, 0], [0, 4, 5, 2, 1, 3], [5, 0, 4, 3, 2, 1]]
    # k = 2, votes >= 2 of 3: easy tops {0,1}, {2,1}, {0,2}; hard bottoms {5,4}, {0,4}, {1,5}
    assert select_anchors(runs, 2) == ([0, 1, 2], [4, 5])
    # with one vote enough, sample 0 and 1 are both easy and hard somewhere: dropped from both
    assert select_anchors(runs, 2, min_votes=1) == ([2], [4, 5])
    assert select_anchors([[1.0, 1.0, 0.0, 0.0]], 2) == ([0, 1], [2, 3])
    with pytest.raises(AnchorError, match="k = 9"):
        select_anchors(runs, 9)
    with pytest.raises(AnchorError, match="one loss per sample"):
        select_anchors([[1, 2], [1]], 1)


class FakeRunner:
    """Deterministic post-unlearning losses; counts calls (to see the cache work)."""

    def __init__(self):
        self.calls = []

    def describe(self):
        return {"runner": "fake"}

    def losses(self, samples, *, model, tokenizer, objective, seed):
        self.calls.append((objective, seed))
        base = [3.0, 2.5, 0.2, 0.1, 2.0, 0.3]
        return [b + 0.01 * seed for b in base][: len(samples)]


def test_cud_rows_follow_the_formula_with_leave_one_out(tiny_model, tiny_tokenizer, tmp_path):
    runner = FakeRunner()
    scorer = CUDScorer(runner=runner, objectives=["grad_diff", "npo"], seeds=[0], k=2, steps=2,
                       n_edges=20, cache_dir=str(tmp_path))
    rows = scorer.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert runner.calls == [("grad_diff", 0), ("npo", 0)]
    assert scorer.last_anchors["easy"] == [0, 1] and scorer.last_anchors["hard"] == [2, 3]
    assert [r["anchor"] for r in rows] == ["easy", "easy", "hard", "hard", None, None]
    for r in rows:
        assert r["score"] == pytest.approx(cud(r["s_E"], r["s_H"]))
        assert 0.0 <= r["score"] <= 1.0 and -1.0 <= r["s_E"] <= 1.0
    # recompute sample 0 (an easy anchor) by hand: its easy anchor is sample 1 alone
    matrices, graph = scorer.score_matrices(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer,
                                            model_fp="unused-key")
    q = select(matrices[0], graph, n=20)
    s_e = circuit_similarity(q, select(matrices[1], graph, n=20))
    s_h = circuit_similarity(q, select((matrices[2] + matrices[3]) / 2, graph, n=20))
    assert rows[0]["s_E"] == pytest.approx(s_e, abs=1e-6) and rows[0]["s_H"] == pytest.approx(s_h, abs=1e-6)
    # a non-anchor sample sees both full anchors
    q = select(matrices[4], graph, n=20)
    assert rows[4]["s_E"] == pytest.approx(circuit_similarity(q, select(matrices[:2].mean(0), graph, n=20)), abs=1e-6)
    assert rows[4]["circuit_edges"] == q.n_edges and len(rows[4]["circuit_by_layer"]) == graph.n_layers + 1


def test_second_scoring_uses_the_caches(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    runner = FakeRunner()
    kwargs = dict(runner=runner, objectives=["grad_diff"], seeds=[0, 1], k=2, steps=2, cache_dir=str(tmp_path))
    first = CUDScorer(**kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert len(runner.calls) == 2
    assert len(list((tmp_path / "matrices").glob("*.pt"))) == len(SAMPLES)

    from unlearn_plugins.circuits import eap_ig

    def boom(*args, **kwargs):
        raise AssertionError("EAP-IG should not run: the matrices are cached")

    monkeypatch.setattr(eap_ig.EAPIG, "iter_scores", boom)
    second = CUDScorer(**kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert len(runner.calls) == 2 and second == first
    # other weights: a new fingerprint, so the cache does not apply
    with torch.no_grad():
        tiny_model.model.norm.weight.mul_(1.5)
    with pytest.raises(AssertionError, match="cached"):
        CUDScorer(**kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)


def test_too_few_anchors_and_bad_options_are_reported(tiny_model, tiny_tokenizer, tmp_path):
    scorer = CUDScorer(anchors={"easy": [0], "hard": [2, 3]}, cache_dir=str(tmp_path))
    with pytest.raises(AnchorError, match="only 1 common easy"):
        scorer.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    with pytest.raises(AnchorError, match="both easy and hard"):
        CUDScorer(anchors={"easy": [0, 1], "hard": [1, 2]}, cache_dir=str(tmp_path)).score(
            SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    from unlearn_plugins.errors import UnlearnError

    with pytest.raises(UnlearnError, match="similarity"):
        CUDScorer(similarity="euclid")


def test_cli_score_with_cud_writes_s_e_and_s_h(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.cli import main

    out = tmp_path / "cud.jsonl"
    anchors = json.dumps({"easy": [0, 1], "hard": [2, 3]})
    assert main(["score", "--scorer", "cud", "--model", str(tiny_model_dir), "--tofu-dir", str(tofu_dir),
                 "--data", "tofu:forget01[0:6]", "--option", f"anchors={anchors}", "--option", "steps=1",
                 "--option", f"cache_dir={tmp_path / 'cache'}", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(6))
    assert all({"score", "s_E", "s_H", "anchor"} <= set(r) for r in rows)
    assert rows[0]["anchor"] == "easy" and rows[5]["anchor"] is None


@pytest.mark.slow
def test_anchor_run_through_run_unlearning(tiny_model_dir, tofu_dir, tmp_path):
    """The default anchor runner: a real (tiny, 2-step) LoRA unlearning run per objective."""
    from unlearn_plugins.data.tofu import load_split
    from unlearn_plugins.models import load_model

    model, tok = load_model(str(tiny_model_dir), device="cpu")
    samples = load_split("tofu:forget01[0:6]", tofu_dir)
    options = {"max_steps": 2, "retain": "tofu:retain99[0:8]", "tofu_dir": str(tofu_dir), "batch_size": 2,
               "grad_accum": 1, "lr": 1e-2}
    scorer = CUDScorer(objectives=["grad_diff"], seeds=[0], k=2, steps=1, unlearn_options=options,
                       cache_dir=str(tmp_path))
    rows = scorer.score(samples, model=model, tokenizer=tok)
    assert len(rows) == 6 and all(0 <= r["score"] <= 1 for r in rows)
    (cached,) = list((tmp_path / "anchors").glob("*.json"))
    losses = json.loads(cached.read_text())["losses"]
    assert len(losses) == 6 and all(x > 0 for x in losses)
    order = sorted(range(6), key=lambda i: (-losses[i], i))
    assert scorer.last_anchors["easy"] == sorted(order[:2]) and scorer.last_anchors["hard"] == sorted(order[-2:])
