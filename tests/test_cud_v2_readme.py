"""The docs' sentences about cud_stratification_v2 (docs/results.md, and docs/cli.md beside the
cud scorer's options) against its committed records (bench/results/cud_stratification_v2/): pool
sizes, what the anchor runs were, their seed agreement, and where phase 1's time went. Each
assertion fails when the docs and the records disagree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unlearn_plugins.study.records import unpacked

ROOT = Path(__file__).resolve().parents[1]
RECORDS = unpacked(ROOT / "bench" / "results" / "cud_stratification_v2")  # the committed records are packed
SCORINGS = ("A012", "A345", "B012")


@pytest.fixture(scope="module")
def readme() -> str:
    pages = [ROOT / "docs" / "results.md", ROOT / "docs" / "cli.md"]
    return " ".join(" ".join(page.read_text().split()) for page in pages)


@pytest.fixture(scope="module")
def v2() -> dict:
    return {
        "design": json.loads((RECORDS / "design.json").read_text()),
        "before": json.loads((RECORDS / "before.json").read_text()),
        **{n: json.loads((RECORDS / f"scoring-{n}.json").read_text()) for n in SCORINGS},
    }


def _range(values) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def test_anchor_pools_hold_80_qa(readme, v2):
    sizes = {len(v2[n]["pool_rows"]) for n in SCORINGS}
    per_author = len(v2["A012"]["pool_rows"]) // v2["design"]["design"]["pools"]["anchor_A"]
    assert sizes == {v2["design"]["design"]["pools"]["anchor_A"] * per_author} == {80}
    assert "one 135M model, 80-QA anchor pools," in readme and "40-QA anchor pools" not in readme
    assert "on the 80-QA pools of `cud_stratification_v2`" in readme


def test_the_anchor_runs_were_not_the_papers(readme, v2):
    config = v2["design"]["config"]
    assert (config["anchor_unlearn"]["lr"], config["anchor_unlearn"]["batch_size"]) == (1e-3, 2)
    assert config["cud"]["stop_prob"] == 0.1 and "lora_r" in config["anchor_unlearn"]
    assert (
        "but not its anchor runs (ours: LoRA at lr 1e-3, batch 2, stopped once the pool's mean answer probability "
        "fell below 0.1; SimNPO's hardly moved the pool)" in readme
    )
    assert "CUD as the paper defines it" not in readme
    # SimNPO: never stopped, and its pool kept at least 90% of its answer probability
    for name in SCORINGS:
        for path in (RECORDS / "anchor_runs" / name).glob("simnpo-*.json"):
            info = json.loads(path.read_text())["info"]
            assert info["stopped_at_step"] is None
            assert info["forget_prob"] >= 0.9 * info["checks"][0]["forget_prob"], path


def test_seed_agreement_ranges(readme, v2):
    agreement = {o: [v2[n]["seed_agreement"][o] for n in SCORINGS] for o in v2["A012"]["seed_agreement"]}
    three = [x for o in ("grad_diff", "npo", "rmu") for x in agreement[o]]
    assert (
        f"the seed-to-seed Spearman was {_range(three)} for grad_diff, npo and rmu, {_range(agreement['undial'])} "
        f"for undial, {_range(agreement['simnpo'])} for simnpo, which never reached the stop" in readme
    )


def test_phase_one_time_is_the_records(readme, v2):
    runs = {n: v2[n]["runs"] for n in SCORINGS}
    anchor_runs = sum(r["seconds"] for n in SCORINGS for r in runs[n])
    # a scoring's own time: its anchor runs done in that process (not read back from a record) and the rest
    rest = {n: v2[n]["seconds"] - sum(r["seconds"] for r in runs[n] if not r.get("recorded")) for n in SCORINGS}
    total = v2["before"]["seconds"] + anchor_runs + sum(rest.values())
    assert (
        f"Phase 1's recorded times add up to about {total / 3600:.1f} hours at 2 threads: the target and the 800 "
        f"answer NLLs {v2['before']['seconds'] / 3600:.1f} h, the 45 anchor runs {anchor_runs / 3600:.1f} h, the "
        f"EAP-IG matrices of the query QA and A012's anchors about {round(rest['A012'] / 300) * 5} minutes (in "
        f"A012); A345 and B012 added {rest['A345']:.0f} s each beyond their anchor runs" in readme
    )
    assert round(rest["A345"]) == round(rest["B012"]) and sum(len(r) for r in runs.values()) == 45
    assert v2["design"]["config"]["target_threads"] == 2


def test_the_report_says_the_anchor_runs_were_not_the_papers(v2):
    text = (ROOT / "docs" / "study" / "cud_stratification_v2.md").read_text()
    run, cud = v2["design"]["config"]["anchor_unlearn"], v2["design"]["config"]["cud"]
    assert "CUD as the paper defines it" not in text
    assert (
        f"but not its anchor runs (ours: LoRA r {run['lora_r']}, lr {run['lr']:g}, batch {run['batch_size']}, at "
        f"most {run['epochs']:g} epochs, stopped once the pool's mean answer probability fell below "
        f"{cud['stop_prob']};" in text
    )
