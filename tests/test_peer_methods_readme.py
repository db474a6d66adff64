"""docs/results.md's `peer_methods` table and sentences against the committed report
(docs/study/peer_methods/study.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study() -> dict:
    return json.loads((ROOT / "docs" / "study" / "peer_methods" / "study.json").read_text())


@pytest.fixture(scope="module")
def section() -> str:
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index("## Every method at its reference defaults (`peer_methods`)")
    return text[start : text.index("\n## ", start + 1)]


def test_the_table_is_the_report(study, section):
    labels = {"full": "full (target, before unlearning)", "retain": "retain (never saw the forget author)"}
    for r in study["references"]:
        row = f"| {labels[r['name']]} | {r['forget_prob']:.3f} | {r['forget_quality']:.3f} | {r['model_utility']:.3f} |"
        assert row in section, row
    for g in study["groups"]:
        m = g["metrics"]
        row = f"| {g['label']} | {m['forget_prob']['mean']:.3f} | {m['forget_quality']['mean']:.3f} | {m['model_utility']['mean']:.3f} |"  # fmt: skip
        assert row in section, row


def test_the_sentences_are_the_report(study, section):
    target = next(r for r in study["references"] if r["name"] == "full")["forget_prob"]
    prob = {g["method"]: g["metrics"]["forget_prob"]["mean"] for g in study["groups"]}
    unmoved = {m for m, p in prob.items() if abs(p - target) < 0.005}
    assert unmoved == {"sibl", "t3", "satimp", "simnpo"}
    assert f"**Sixteen of the twenty moved the forget probability** (target {target:.3f}" in section
    assert len(prob) == 20 and len(prob) - len(unmoved) == 16
    assert min(prob, key=prob.get) == "ceu" and f"CE-U furthest ({prob['ceu']:.3f})" in section
    fq = {g["method"]: g["metrics"]["forget_quality"]["mean"] for g in study["groups"]}
    assert [m for m, v in fq.items() if round(v, 3) > 0.081] == ["idk_dpo"]
