"""bench/cud_stratification.py: the sets come only from the query pool, and the statistics say
what the report claims (a clearly harder set gets an interval below 0, equal groups one around 0)."""

from __future__ import annotations

import math
import random

import pytest
from support_checks import load_bench_script


@pytest.fixture(scope="module")
def study_module():
    return load_bench_script("cud_stratification")


def test_sets_never_hold_anchor_pool_or_held_out_rows(study_module, tofu_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    study = study_module.Study(study_module.StudyConfig(), tmp_path)
    assert len(study.query) == 320 and not set(study.query) & (set(study.anchor) | set(study.heldout))
    # scores that would put the anchor pool and the held-out rows first if they were ranked
    rng = random.Random(0)
    scores = {
        name: [{"row": i, "index": i, "score": rng.random() + (10 if i < 80 else 0)} for i in study.query]
        for name in ("cud", "mrd", "loss")
    }
    sets = study.sets(scores)
    assert sorted(sets) == sorted(
        [f"{s}_{k}" for s in scores for k in ("easy", "hard")] + ["random0", "random1", "random2"]
    )
    allowed = set(study.query)
    for name, rows in sets.items():
        assert len(rows) == 40 and set(rows) <= allowed, name
    randoms = [set(sets[f"random{k}"]) for k in range(3)]
    assert not (randoms[0] & randoms[1] or randoms[0] & randoms[2] or randoms[1] & randoms[2])
    by_row = {r["row"]: r["score"] for r in scores["mrd"]}
    assert max(by_row[i] for i in sets["mrd_easy"]) <= min(by_row[i] for i in sets["mrd_hard"])


def test_sets_refuse_scores_that_mark_anchors(study_module, tofu_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    study = study_module.Study(study_module.StudyConfig(), tmp_path)
    rows = [{"row": i, "index": i, "score": float(i), "anchor": i == study.query[0]} for i in study.query]
    with pytest.raises(SystemExit, match="anchors"):
        study.sets({"cud": rows})


def test_efficacy_and_sample_interval(study_module):
    rng = random.Random(1)
    before = [rng.uniform(0.3, 0.6) for _ in range(80)]
    # group a keeps 70% of its probability, group b 40%: efficacy 30 vs 60 points
    a = (before[:40], [p * 0.7 * rng.uniform(0.95, 1.05) for p in before[:40]])
    b = (before[40:], [p * 0.4 * rng.uniform(0.95, 1.05) for p in before[40:]])
    out = study_module.sample_ci(a, b)
    assert out["diff"] == pytest.approx(-30, abs=2)
    assert out["ci"][0] < out["diff"] < out["ci"][1] < 0
    same = study_module.sample_ci(a, a)
    assert same["diff"] == 0 and same["ci"][0] <= 0 <= same["ci"][1]

    nll_before = [-math.log(p) for p in before]
    result = {"rows": list(range(40)), "nll_after": [-math.log(p) for p in a[1]]}
    expected = 100 * (1 - sum(a[1]) / sum(a[0]))
    assert study_module.efficacy(result, nll_before) == pytest.approx(expected, rel=1e-9)


def test_run_interval_covers_the_difference(study_module):
    hard = [20.0, 24.0]
    rnd = [50.0, 55.0, 47.0, 52.0, 49.0, 51.0]
    out = study_module.diff_ci(hard, rnd)
    assert out["diff"] == pytest.approx(22 - 50.666, abs=0.01)
    assert out["ci"][0] <= out["diff"] <= out["ci"][1] < 0


def test_budget_is_the_whole_epoch_nearest_the_pilots_halving(study_module):
    config = study_module.StudyConfig()
    pilot = {"steps_per_epoch": 10, "crossing_step": 22}
    assert study_module.budget_steps(pilot, config) == 20
    assert study_module.budget_steps({**pilot, "crossing_step": 26}, config) == 30
    assert study_module.budget_steps({**pilot, "crossing_step": 4}, config) == 10  # at least one epoch
    assert study_module.budget_steps({**pilot, "crossing_step": None}, config) == config.pilot_max_steps
    assert study_module.budget_steps({**pilot, "crossing_step": 48}, config) == config.pilot_max_steps


def test_records_restore_a_finished_stage_into_an_empty_cache(study_module, tmp_path):
    """The ledger kept in the repository brings a finished stage's results (not its model
    files or inputs) back into a fresh machine's empty cache, so the study resumes there."""
    from unlearn_plugins.stages import DONE, Stages

    records = study_module.Records(tmp_path / "records")
    first = Stages(tmp_path / "cache-a", total=1)
    folder = first.folder("run", "random0-npo-s3", "abc123")

    def build(tmp):
        (tmp / "result.json").write_text('{"nll_after": [1.5]}')
        (tmp / "forget.json").write_text("inputs, derivable")
        (tmp / "run").mkdir()
        (tmp / "run" / "adapter_model.safetensors").write_bytes(b"x" * 1000)

    records.save(first.run("a run", folder, build))
    fresh = tmp_path / "cache-b" / folder.name
    assert records.restore(fresh)
    assert sorted(p.name for p in fresh.iterdir()) == sorted([DONE, "result.json"])
    assert (fresh / "result.json").read_text() == '{"nll_after": [1.5]}'
    built = []
    Stages(tmp_path / "cache-b", total=1).run("a run", fresh, built.append)
    assert built == []  # cached: nothing rebuilt
    assert not records.restore(tmp_path / "cache-b" / "run-other-000")  # no record, nothing restored
    assert not list((tmp_path / "records").glob("*.tmp-*"))


def test_records_never_restore_the_target(study_module, tmp_path):
    """The target is a model, rebuilt from its recipe; only its fingerprint is recorded."""
    records = study_module.Records(tmp_path)
    (tmp_path / "target-target-abc").mkdir()
    (tmp_path / "target-target-abc" / "stage.json").write_text("{}")
    (tmp_path / "target-target-abc" / "fingerprint.json").write_text('{"heldout_nll": [1.0]}')
    assert not records.restore(tmp_path / "cache" / "target-target-abc")
    assert records.fingerprint(tmp_path / "cache" / "target-target-abc") == {"heldout_nll": [1.0]}


def test_a_rebuilt_target_must_match_its_fingerprint(study_module):
    recorded = {"heldout_nll": [1.0, 2.0, 3.0]}
    assert study_module.fingerprint_gap(recorded, {"heldout_nll": [1.0, 2.0004, 3.0]}, 1e-3, "rec") == pytest.approx(
        4e-4
    )
    with pytest.raises(SystemExit, match=r"differs from the recorded one \(max \|NLL difference\| 5.00e-02"):
        study_module.fingerprint_gap(recorded, {"heldout_nll": [1.0, 2.05, 3.0]}, 1e-3, "rec")
    with pytest.raises(SystemExit, match="differs"):
        study_module.fingerprint_gap(recorded, {"heldout_nll": [1.0, float("nan"), 3.0]}, 1e-3, "rec")


def test_all_objectives_interval_is_stratified_by_objective(study_module):
    """Objectives far apart in efficacy (here 20 vs 80 points) must not widen the interval of a
    set that is 5 points harder than random under each of them."""
    strata = [
        ([15.0, 15.5, 14.5, 15.2], [20.0, 20.3, 19.8, 19.9, 20.1, 20.2]),
        ([75.0, 75.4, 74.8, 75.1], [80.0, 80.2, 79.9, 79.8, 80.1, 80.3]),
    ]
    out = study_module.stratified_diff_ci(strata)
    assert out["diff"] == pytest.approx(-4.95, abs=0.1)
    assert -6 < out["ci"][0] < out["ci"][1] < -4
    pooled = study_module.diff_ci(strata[0][0] + strata[1][0], strata[0][1] + strata[1][1])
    assert pooled["ci"][1] - pooled["ci"][0] > 10 * (out["ci"][1] - out["ci"][0])
