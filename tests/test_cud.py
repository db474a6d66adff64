"""CUD scorer: anchor pools disjoint from the scored samples, two-level anchor votes (and
their record), per-objective scores, anchors by loss increase, the stop criterion of the
anchor runs, leave-one-out anchors, the formula per row, caching, CLI output.

Reference formulas are restated here, independently of the package: the paper code's
common-anchor vote (find_easy_hard_samples.py), CUD = d_E / (d_E + d_H) with
d = max(1 - s, 0), TOFU's forget probability = mean over samples of exp(-mean answer NLL),
Spearman = Pearson correlation of ranks."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from unlearn_plugins.circuits.circuit import select
from unlearn_plugins.circuits.similarity import circuit_similarity
from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.interfaces import QASample
from unlearn_plugins.scorers.cud import (
    AnchorError,
    CUDScorer,
    default_anchor_pool,
    forget_prob_watch,
    select_anchors,
    vote_anchors,
)

QA = [
    ("Who are the parents of the author?", "Her father was a doctor."),
    ("What awards has the author won?", "He won the International Booker Prize."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
    ("What is the full name of the author born in Kuwait City?", "The author is Basil Mahfouz Al-Kuwaiti."),
    ("Who are the parents of the painter?", "Her mother was a painter."),
    ("What is the capital of France?", "The capital of France is Paris."),
]
SAMPLES = [QASample(q, a, i) for i, (q, a) in enumerate(QA)]
POOL_QA = [
    ("Where was the poet born?", "The poet was born in Lagos."),
    ("What did the novelist study?", "He studied marine biology."),
    ("Which city does the playwright live in?", "She lives in Montreal."),
    ("What is the title of her first book?", "Her first book is The Salt Road."),
    ("Who influenced the essayist?", "His grandmother, a storyteller."),
    ("What language does the author write in?", "She writes in Portuguese."),
    ("How many novels has he published?", "He has published seven novels."),
    ("What prize did the poet receive?", "The poet received the Golden Quill."),
]
POOL = [QASample(q, a, i) for i, (q, a) in enumerate(POOL_QA)]
POST = [3.0, 2.5, 0.2, 0.1, 2.0, 0.3, 1.0, 1.5]  # per pool sample: 0, 1 forgotten; 2, 3 kept


# ----------------------------------------------------------------------------- reference restatements


def ref_cud(s_e: float, s_h: float) -> float:
    d_e, d_h = max(1 - s_e, 0.0), max(1 - s_h, 0.0)
    return d_e / (d_e + d_h) if d_e + d_h > 1e-12 else 0.5


def ref_spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))  # no ties in the tests' values
    return float(np.corrcoef(ra, rb)[0, 1])


def ref_common_anchors(losses_by_method, size, min_appearance):
    """The paper code's vote: per method, argsort of the post-unlearning losses; the last
    `size` (highest loss) are easy, the first `size` hard; kept when >= min_appearance methods agree."""
    order = np.stack([np.argsort(np.asarray(l)) for l in losses_by_method])
    values, counts = np.unique(order[:, -size:], return_counts=True)
    easy = sorted(int(v) for v in values[counts >= min_appearance])
    values, counts = np.unique(order[:, :size], return_counts=True)
    hard = sorted(int(v) for v in values[counts >= min_appearance])
    return easy, hard


def ref_two_level(runs_by_objective, k):
    """Majority (>= ceil(runs/2)) of each objective's seeds, then >= ceil(objectives/2) objectives;
    a sample in both sets is dropped from both at each level."""

    def top(values, k, highest):
        return set(sorted(range(len(values)), key=lambda i: (-values[i] if highest else values[i], i))[:k])

    def keep(votes_easy, votes_hard, threshold, n):
        easy = {i for i in range(n) if votes_easy[i] >= threshold}
        hard = {i for i in range(n) if votes_hard[i] >= threshold}
        return easy - hard, hard - easy

    n = len(next(iter(runs_by_objective.values()))[0])
    per = {}
    for o, runs in runs_by_objective.items():
        ve = [sum(i in top(r, k, True) for r in runs) for i in range(n)]
        vh = [sum(i in top(r, k, False) for r in runs) for i in range(n)]
        per[o] = keep(ve, vh, math.ceil(len(runs) / 2), n)
    ve = [sum(i in e for e, _ in per.values()) for i in range(n)]
    vh = [sum(i in h for _, h in per.values()) for i in range(n)]
    easy, hard = keep(ve, vh, math.ceil(len(per) / 2), n)
    return sorted(easy), sorted(hard), {o: (sorted(e), sorted(h)) for o, (e, h) in per.items()}


# ----------------------------------------------------------------------------- anchor votes


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


def test_vote_matches_the_paper_code_for_one_run_per_method():
    """5 methods x 1 run, 50 of 400 in the paper; here 6 of 48, >= 3 of 5 methods."""
    rng = np.random.default_rng(0)
    for trial in range(5):
        base = rng.normal(size=48)
        losses = {
            m: (base + rng.normal(scale=0.8, size=48)).tolist() for m in ("GradDiff", "NPO", "SimNPO", "RMU", "UNDIAL")
        }
        vote = vote_anchors({m: [l] for m, l in losses.items()}, 6)
        assert (vote.easy, vote.hard) == ref_common_anchors(list(losses.values()), 6, 3), trial
        assert vote.min_objectives == 3 and set(vote.min_votes.values()) == {1}


def test_two_level_vote_with_seeds_and_the_recorded_counts():
    gd = [[9, 5, 4, 3, 2, 1], [9, 5, 4, 3, 1, 2], [5, 9, 4, 3, 2, 1]]  # easy 0,0,1; hard 5,4,5
    npo = [[1, 9, 4, 3, 2, 5], [1, 5, 9, 3, 2, 4], [2, 5, 4, 9, 1, 3]]  # easy 1,2,3; hard 0,0,4
    vote = vote_anchors({"grad_diff": gd, "npo": npo}, 1)
    easy, hard, per = ref_two_level({"grad_diff": gd, "npo": npo}, 1)
    assert (vote.easy, vote.hard) == (easy, hard) == ([], [5])  # 0: easy for grad_diff, hard for npo -> dropped
    assert {o: tuple(v) for o, v in vote.by_objective.items()} == per == {"grad_diff": ([0], [5]), "npo": ([], [0])}
    assert vote.min_votes == {"grad_diff": 2, "npo": 2} and vote.min_objectives == 1
    # how many runs chose each sample, per objective
    assert vote.easy_runs[0] == {"grad_diff": 2} and vote.easy_runs[1] == {"grad_diff": 1, "npo": 1}
    assert vote.hard_runs[5] == {"grad_diff": 2} and vote.hard_runs[0] == {"npo": 2}
    # the old flat vote (>= 3 of the 6 runs) finds no anchor at all here
    assert select_anchors(gd + npo, 1) == ([], [])
    assert vote_anchors({"grad_diff": gd, "npo": npo}, 1, min_objectives=2).hard == []


# ----------------------------------------------------------------------------- anchor pools


def test_default_tofu_pool_is_disjoint_from_the_scored_split(tofu_dir):
    from unlearn_plugins.data.qa import load_split

    keys = lambda samples: {(s.question, s.answer) for s in samples}  # noqa: E731
    forget = load_split("tofu:forget01[0:4]", tofu_dir)  # inside forget10: the second pool
    pool = default_anchor_pool(forget)
    assert pool.spec == "tofu:retain90[3200:3600]" and len(pool.samples) == 400
    assert pool.run_options == {"retain": "tofu:retain90[0:3200]", "tofu_dir": str(tofu_dir)}
    assert not keys(pool.samples) & keys(forget)
    assert not keys(pool.samples) & keys(load_split(pool.run_options["retain"], tofu_dir))
    retain = load_split("tofu:retain90[0:4]", tofu_dir)  # the paper's setting: anchors on forget10
    pool = default_anchor_pool(retain)
    assert pool.spec == "tofu:forget10" and pool.run_options["retain"] == "tofu:retain90"
    assert not keys(pool.samples) & keys(retain)
    with pytest.raises(UnlearnError, match="overlap every default TOFU anchor pool"):
        default_anchor_pool(load_split("tofu:full", tofu_dir))
    with pytest.raises(UnlearnError, match="give anchor_data"):
        default_anchor_pool(SAMPLES)  # not read from a TOFU folder


def test_anchor_data_overlapping_the_scored_samples_is_left_out():
    scorer = CUDScorer(anchor_data=SAMPLES[:3] + POOL)
    pool = scorer.anchor_pool(SAMPLES)
    assert [s.question for s in pool.samples] == [q for q, _ in POOL_QA] and pool.dropped == 3
    too_small = CUDScorer(anchor_data=SAMPLES[:3] + POOL[:3])
    with pytest.raises(UnlearnError, match="has 3 samples .3 more were left out"):
        too_small._check_counts(SAMPLES, too_small.anchor_pool(SAMPLES))
    assert CUDScorer(anchor_data="self").anchor_pool(SAMPLES).in_sample


def test_anchor_runs_must_not_retain_their_pool(tiny_model, tiny_tokenizer, tofu_dir, tmp_path):
    scorer = CUDScorer(
        anchor_data="tofu:forget10[0:8]",
        tofu_dir=str(tofu_dir),
        cache_dir=str(tmp_path),
        unlearn_options={"tofu_dir": str(tofu_dir)},
    )  # retain: UnlearnConfig's tofu:retain99
    from unlearn_plugins.data.qa import load_split

    with pytest.raises(UnlearnError, match="retain set tofu:retain99 holds 8 of the 8 anchor-pool samples"):
        scorer.score(load_split("tofu:forget01[0:4]", tofu_dir), model=tiny_model, tokenizer=tiny_tokenizer)


# ----------------------------------------------------------------------------- scoring


def pool_options(tmp_path, **options) -> dict:
    """CUDScorer options of the fake-runner tests: anchors from POOL, 3 seeds, k 2, 2 steps, caches
    under ``tmp_path``; ``options`` override or add."""
    return {"anchor_data": POOL, "seeds": [0, 1, 2], "k": 2, "steps": 2, "cache_dir": str(tmp_path), **options}


class FakeRunner:
    """Deterministic post-unlearning losses per (objective, seed); records what it unlearned."""

    def __init__(self, losses=None):
        self.calls, self.unlearned = [], []
        self.table = losses or (lambda objective, seed, n: [POST[i] + 0.01 * seed for i in range(n)])
        self.last_info = None

    def describe(self):
        return {"runner": "fake"}

    def losses(self, samples, *, model, tokenizer, objective, seed):
        self.calls.append((objective, seed))
        self.unlearned.append([s.question for s in samples])
        self.last_info = {"steps": 3 + seed}
        return self.table(objective, seed, len(samples))


def noisy(objective, seed, n):
    """Seed-dependent ranks (so the seed agreement is not trivially 1)."""
    rng = np.random.default_rng([seed, len(objective)])
    return [POST[i] + float(rng.normal(scale=0.4)) for i in range(n)]


def test_disjoint_pool_scores_against_pool_anchors_and_records_votes(tiny_model, tiny_tokenizer, tmp_path):
    runner = FakeRunner(noisy)
    scorer = CUDScorer(**pool_options(tmp_path, runner=runner, objectives=["grad_diff", "npo"], n_edges=20))
    rows = scorer.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    runs = [(o, s) for o in ("grad_diff", "npo") for s in (0, 1, 2)]
    assert runner.calls == runs
    assert all(u == [q for q, _ in POOL_QA] for u in runner.unlearned)  # the runs never see a scored sample
    by_objective = {o: [noisy(o, s, 8) for s in (0, 1, 2)] for o in ("grad_diff", "npo")}
    easy, hard, _ = ref_two_level(by_objective, 2)
    assert (scorer.last_anchors["easy"], scorer.last_anchors["hard"]) == (easy, hard)
    assert len(easy) >= 1 and len(hard) >= 1
    assert all(r["anchor"] is None for r in rows)
    # every row: its circuit against the circuits of the mean pool-anchor matrices, then the formula
    pool_m, graph = scorer.score_matrices(POOL, model=tiny_model, tokenizer=tiny_tokenizer, model_fp="any")
    query_m, _ = scorer.score_matrices(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer, model_fp="any")
    e_circuit, h_circuit = select(pool_m[easy].mean(0), graph, n=20), select(pool_m[hard].mean(0), graph, n=20)
    for i, r in enumerate(rows):
        q = select(query_m[i], graph, n=20)
        s_e, s_h = circuit_similarity(q, e_circuit), circuit_similarity(q, h_circuit)
        assert r["s_E"] == pytest.approx(s_e, abs=1e-6) and r["s_H"] == pytest.approx(s_h, abs=1e-6)
        assert r["score"] == pytest.approx(ref_cud(s_e, s_h), rel=1e-5, abs=1e-7)

    meta = scorer.last_metadata
    assert meta["anchor_pool"]["size"] == 8 and not meta["anchor_pool"]["in_sample"]
    assert [e["question"] for e in meta["anchors"]["all"]["easy"]] == [POOL_QA[i][0] for i in easy]
    for kind in ("easy", "hard"):
        for entry in meta["anchors"]["all"][kind]:
            i = entry["pool_index"]
            expected = {
                o: sum(i in ref_two_level({o: [r]}, 2)[0 if kind == "easy" else 1] for r in by_objective[o])
                for o in by_objective
            }
            assert entry["runs_by_objective"] == {o: v for o, v in expected.items() if v}
            assert entry["runs"] == sum(expected.values())
    assert [(r["objective"], r["seed"], r["steps"]) for r in meta["runs"]] == [(o, s, 3 + s) for o, s in runs]
    for o, agreement in meta["seed_agreement"].items():
        pairs = [ref_spearman(by_objective[o][a], by_objective[o][b]) for a, b in ((0, 1), (0, 2), (1, 2))]
        assert [p[2] for p in agreement["pairs"]] == pytest.approx(pairs)
        assert agreement["mean_spearman"] == pytest.approx(sum(pairs) / 3)
    gd_mean = np.mean(by_objective["grad_diff"], axis=0)
    npo_mean = np.mean(by_objective["npo"], axis=0)
    assert meta["objective_agreement"][0][2] == pytest.approx(ref_spearman(gd_mean, npo_mean))


def test_per_objective_scores_use_each_objectives_anchors(tiny_model, tiny_tokenizer, tmp_path):
    def opposed(objective, seed, n):  # npo forgets what grad_diff keeps
        return [POST[i] if objective == "grad_diff" else -POST[i] for i in range(n)]

    kwargs = pool_options(tmp_path, objectives=["grad_diff", "npo"], n_edges=20)
    with pytest.raises(AnchorError, match="the objectives agree on only 0 easy.*per_objective=true"):
        CUDScorer(runner=FakeRunner(opposed), **kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    scorer = CUDScorer(runner=FakeRunner(opposed), per_objective=True, **kwargs)
    rows = scorer.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert scorer.last_anchors["by_objective"] == {
        "grad_diff": {"easy": [0, 1], "hard": [2, 3]},
        "npo": {"easy": [2, 3], "hard": [0, 1]},
    }
    pool_m, graph = scorer.score_matrices(POOL, model=tiny_model, tokenizer=tiny_tokenizer, model_fp="any")
    query_m, _ = scorer.score_matrices(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer, model_fp="any")
    a, b = select(pool_m[[0, 1]].mean(0), graph, n=20), select(pool_m[[2, 3]].mean(0), graph, n=20)
    for i, r in enumerate(rows):
        q = select(query_m[i], graph, n=20)
        s_a, s_b = circuit_similarity(q, a), circuit_similarity(q, b)
        assert r["score_by_objective"]["grad_diff"] == pytest.approx(ref_cud(s_a, s_b), rel=1e-5, abs=1e-7)
        assert r["score_by_objective"]["npo"] == pytest.approx(ref_cud(s_b, s_a), rel=1e-5, abs=1e-7)
        assert r["score"] == pytest.approx((ref_cud(s_a, s_b) + ref_cud(s_b, s_a)) / 2, rel=1e-5)
        assert r["s_E_by_objective"] == pytest.approx({"grad_diff": s_a, "npo": s_b}, abs=1e-6)
    assert set(scorer.last_metadata["anchors"]) == {"grad_diff", "npo"}


def test_anchors_by_loss_increase(tiny_model, tiny_tokenizer, tmp_path):
    increase = [0.3, 0.02, 0.15, 0.04, 1.9, 0.07, 0.9, 1.4]
    pre = [p - d for p, d in zip(POST, increase)]
    runner = FakeRunner()
    runner.reference_losses = lambda samples, *, model, tokenizer: pre[: len(samples)]
    kwargs = pool_options(tmp_path, runner=runner, objectives=["npo"], steps=1, n_edges=20)
    by_loss = CUDScorer(**kwargs)
    by_loss.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert (by_loss.last_anchors["easy"], by_loss.last_anchors["hard"]) == ([0, 1], [2, 3])
    by_increase = CUDScorer(anchor_by="increase", **kwargs)
    by_increase.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    ranked = sorted(range(8), key=lambda i: increase[i])
    assert by_increase.last_anchors["easy"] == sorted(ranked[-2:]) == [4, 7]
    assert by_increase.last_anchors["hard"] == sorted(ranked[:2]) == [1, 3]
    assert by_increase.last_metadata["seed_agreement"]["npo"]["of"] == "increase"


def test_in_sample_anchors_leave_the_query_out(tiny_model, tiny_tokenizer, tmp_path):
    """anchor_data=self: the old in-sample anchors, kept as an explicit option (rows are marked)."""
    scorer = CUDScorer(
        anchor_data="self",
        runner=FakeRunner(),
        objectives=["grad_diff", "npo"],
        seeds=[0],
        k=2,
        steps=2,
        n_edges=20,
        cache_dir=str(tmp_path),
    )
    rows = scorer.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert scorer.last_anchors["easy"] == [0, 1] and scorer.last_anchors["hard"] == [2, 3]
    assert [r["anchor"] for r in rows] == ["easy", "easy", "hard", "hard", None, None]
    matrices, graph = scorer.score_matrices(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer, model_fp="any")
    q = select(matrices[0], graph, n=20)  # sample 0 is an easy anchor: its easy anchor is sample 1 alone
    s_e = circuit_similarity(q, select(matrices[1], graph, n=20))
    s_h = circuit_similarity(q, select((matrices[2] + matrices[3]) / 2, graph, n=20))
    assert rows[0]["s_E"] == pytest.approx(s_e, abs=1e-6) and rows[0]["s_H"] == pytest.approx(s_h, abs=1e-6)
    assert rows[0]["score"] == pytest.approx(ref_cud(s_e, s_h), rel=1e-5)
    q = select(matrices[4], graph, n=20)  # a non-anchor sample sees both full anchors
    assert rows[4]["s_E"] == pytest.approx(circuit_similarity(q, select(matrices[:2].mean(0), graph, n=20)), abs=1e-6)
    assert rows[4]["circuit_edges"] == q.n_edges and len(rows[4]["circuit_by_layer"]) == graph.n_layers + 1
    assert scorer.last_metadata["anchor_pool"]["in_sample"]


def test_second_scoring_uses_the_caches(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    runner = FakeRunner()
    kwargs = pool_options(tmp_path, runner=runner, objectives=["grad_diff"])
    first = CUDScorer(**kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert len(runner.calls) == 3
    assert len(list((tmp_path / "matrices").glob("*.pt"))) == len(SAMPLES) + 4  # the queries + 4 anchors

    from unlearn_plugins.circuits import eap_ig

    def boom(*args, **kwargs):
        raise AssertionError("EAP-IG should not run: the matrices are cached")

    monkeypatch.setattr(eap_ig.EAPIG, "iter_scores", boom)
    second_scorer = CUDScorer(**kwargs)
    second = second_scorer.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert len(runner.calls) == 3 and second == first
    assert all(r["cached"] and r["steps"] == 3 + r["seed"] for r in second_scorer.last_metadata["runs"])
    # other weights: a new fingerprint, so the cache does not apply
    with torch.no_grad():
        tiny_model.model.norm.weight.mul_(1.5)
    with pytest.raises(AssertionError, match="cached"):
        CUDScorer(**kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)


def test_damaged_cache_entries_are_recomputed_and_rewritten(tiny_model, tiny_tokenizer, tmp_path):
    """A process killed while writing, or a full disk, can leave a cache entry damaged: it is
    recomputed (same scores) and rewritten, never used and never an error."""
    runner = FakeRunner()
    kwargs = pool_options(tmp_path, runner=runner, objectives=["grad_diff"])
    first = CUDScorer(**kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    matrices = sorted((tmp_path / "matrices").glob("*.pt"))
    runs = sorted((tmp_path / "anchors").glob("*.json"))
    good = torch.load(matrices[2], weights_only=True)
    matrices[0].write_bytes(matrices[0].read_bytes()[:40])  # truncated
    torch.save(torch.zeros(3), matrices[1])  # not this graph's edges
    runs[0].write_text('{"losses": [0.5, ')  # truncated JSON
    second = CUDScorer(**kwargs).score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    assert len(runner.calls) == 4  # the damaged anchor run only
    assert [r["score"] for r in second] == pytest.approx([r["score"] for r in first], abs=1e-6)
    assert [r["anchor"] for r in second] == [r["anchor"] for r in first]
    for path in matrices[:2]:
        assert torch.load(path, weights_only=True).shape == good.shape
    assert len(json.loads(runs[0].read_text())["losses"]) == len(POOL)


def test_too_few_anchors_and_bad_options_are_reported(tiny_model, tiny_tokenizer, tmp_path):
    scorer = CUDScorer(anchor_data="self", anchors={"easy": [0], "hard": [2, 3]}, cache_dir=str(tmp_path))
    with pytest.raises(AnchorError, match="only 1 easy anchor.s. given .need 2 for leave-one-out"):
        scorer.score(SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer)
    with pytest.raises(AnchorError, match="both easy and hard"):
        CUDScorer(anchor_data="self", anchors={"easy": [0, 1], "hard": [1, 2]}, cache_dir=str(tmp_path)).score(
            SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer
        )
    with pytest.raises(UnlearnError, match="similarity"):
        CUDScorer(similarity="euclid")
    with pytest.raises(UnlearnError, match="anchor_by='gain'"):
        CUDScorer(anchor_by="gain")
    with pytest.raises(UnlearnError, match="stop_prob=1.5"):
        CUDScorer(stop_prob=1.5)
    with pytest.raises(UnlearnError, match="seeds=.0, 0. must be a non-empty list without repeats"):
        CUDScorer(seeds=[0, 0])
    with pytest.raises(UnlearnError, match="per_objective=true .* cannot be combined with fixed anchors"):
        CUDScorer(per_objective=True, anchors={"easy": [0], "hard": [1]})
    assert CUDScorer(stop_prob="none").stop_prob is None


# ----------------------------------------------------------------------------- the stop criterion


def test_forget_prob_watch_stops_at_the_first_check_below_stop_prob(tiny_model, tiny_tokenizer):
    from transformers import TrainerControl

    from unlearn_plugins.data.qa import encode_samples

    encoded = encode_samples(tiny_tokenizer, SAMPLES, max_length=64)
    with torch.no_grad():  # the reference: mean over samples of exp(-mean answer-token NLL)
        probs = []
        for e in encoded:
            ids = torch.tensor([e["input_ids"]])
            logits = tiny_model(input_ids=ids).logits[0, :-1]
            labels = torch.tensor(e["labels"][1:])
            mask = labels != -100
            nll = torch.nn.functional.cross_entropy(logits[mask], labels[mask])
            probs.append(math.exp(-float(nll)))
    reference = sum(probs) / len(probs)
    args = SimpleNamespace(device=torch.device("cpu"), bf16=False)

    def steps(watch, upto):
        control = TrainerControl()
        watch.on_train_begin(args, SimpleNamespace(global_step=0), control, model=tiny_model)
        for step in range(1, upto + 1):
            control = watch.on_step_end(args, SimpleNamespace(global_step=step), control, model=tiny_model)
            if control.should_training_stop:
                return control, step
        return control, None

    watch = forget_prob_watch(encoded, tiny_tokenizer.pad_token_id, every=2, stop_prob=reference * 1.01)
    control, stopped = steps(watch, 5)
    assert stopped == 2 and watch.stopped_at == 2  # checks at steps 0 and 2 only; the first at a step stops
    assert [c["step"] for c in watch.checks] == [0, 2]
    assert watch.checks[0]["forget_prob"] == pytest.approx(reference, rel=1e-5)
    assert tiny_model.training is False  # left as it was
    watch = forget_prob_watch(encoded, tiny_tokenizer.pad_token_id, every=2, stop_prob=reference * 0.99, trace=True)
    control, stopped = steps(watch, 5)
    assert stopped is None and [c["step"] for c in watch.checks] == [0, 2, 4]
    assert len(watch.checks[1]["losses"]) == len(SAMPLES)


# ----------------------------------------------------------------------------- CLI and real runs


def test_cli_score_with_cud_writes_scores_and_metadata(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.cli import main

    out = tmp_path / "cud.jsonl"
    anchors = json.dumps({"easy": [0, 1], "hard": [2, 3]})
    base = ["score", "--scorer", "cud", "--model", str(tiny_model_dir), "--tofu-dir", str(tofu_dir)]
    base += ["--data", "tofu:forget01[0:6]", "--option", f"anchors={anchors}"]
    base += ["--option", "steps=1", "--option", f"cache_dir={tmp_path / 'cache'}"]
    assert main(base + ["--anchor-data", "tofu:forget10[0:6]", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(6))
    assert all({"score", "s_E", "s_H", "anchor"} <= set(r) and r["anchor"] is None for r in rows)
    meta = json.loads((tmp_path / "cud.jsonl.meta.json").read_text())
    assert meta["scorer"] == "cud" and meta["data"] == "tofu:forget01[0:6]" and meta["rows"] == 6
    assert meta["anchor_pool"]["spec"] == "tofu:forget10[0:6]"
    from unlearn_plugins.data.qa import load_split

    pool = load_split("tofu:forget10[0:6]", tofu_dir)
    assert [e["question"] for e in meta["anchors"]["all"]["easy"]] == [pool[0].question, pool[1].question]
    # the old in-sample anchors, on request: rows are marked
    assert main(base + ["--anchor-data", "self", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["anchor"] == "easy" and rows[5]["anchor"] is None


def test_cli_anchor_data_needs_a_scorer_with_an_anchor_pool(tofu_dir, tmp_path, capsys):
    from unlearn_plugins.cli import main

    assert (
        main(
            [
                "score",
                "--scorer",
                "loss",
                "--anchor-data",
                "tofu:forget10",
                "--tofu-dir",
                str(tofu_dir),
                "--out",
                str(tmp_path / "x.jsonl"),
            ]
        )
        == 1
    )
    assert "--anchor-data: scorer 'loss' has no anchor pool" in capsys.readouterr().err


@pytest.mark.slow
def test_anchor_runs_through_run_unlearning_stop_early(tiny_model_dir, tofu_dir, tmp_path):
    """The default runner: real (tiny) LoRA unlearning runs, stopped by stop_prob before max_steps."""
    from unlearn_plugins.data.qa import load_split
    from unlearn_plugins.models import load_model

    model, tok = load_model(str(tiny_model_dir), device="cpu")
    samples = load_split("tofu:forget01[0:4]", tofu_dir)
    options = {
        "max_steps": 3,
        "retain": "tofu:retain99[0:8]",
        "tofu_dir": str(tofu_dir),
        "batch_size": 2,
        "grad_accum": 1,
        "lr": 1e-2,
    }
    # the untrained model gives every answer a probability far below 0.5: each run stops at its first check
    anchor_runs = {"objectives": ["grad_diff"], "seeds": [0, 1], "k": 2, "steps": 1, "stop_prob": 0.5, "check_steps": 1}
    pool = {"anchor_data": "tofu:forget10[0:6]", "tofu_dir": str(tofu_dir)}
    scorer = CUDScorer(**pool, **anchor_runs, unlearn_options=options, cache_dir=str(tmp_path))
    rows = scorer.score(samples, model=model, tokenizer=tok)
    assert len(rows) == 4 and all(0 <= r["score"] <= 1 and r["anchor"] is None for r in rows)
    runs = scorer.last_metadata["runs"]
    assert [(r["steps"], r["stopped_at_step"]) for r in runs] == [(1, 1), (1, 1)]
    assert [c["step"] for c in runs[0]["checks"]] == [0, 1] and runs[0]["checks"][1]["forget_prob"] < 0.5
    cached = sorted((tmp_path / "anchors").glob("*.json"))
    assert len(cached) == 2
    losses = [json.loads(p.read_text())["losses"] for p in cached]
    assert all(len(run) == 6 and all(x > 0 for x in run) for run in losses)
    assert runs[0]["forget_prob"] == pytest.approx(
        sum(math.exp(-x) for x in scorer.last_anchors["loss_runs"][0]) / 6, rel=1e-6
    )
