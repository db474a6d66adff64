"""docs/results.md's `peer_methods` table and sentences against the committed report
(docs/study/peer_methods/study.json)."""

from __future__ import annotations

from support_checks import ROOT, committed_study, report_fixtures

study, section = report_fixtures("peer_methods", "## Every method at its reference defaults (`peer_methods`)")


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
    target = next(r for r in study["references"] if r["name"] == "full")
    retain = next(r for r in study["references"] if r["name"] == "retain")
    metrics = {g["method"]: g["metrics"] for g in study["groups"]}
    prob = {m: g["forget_prob"]["mean"] for m, g in metrics.items()}
    unmoved = {m for m, p in prob.items() if abs(p - target["forget_prob"]) < 0.005}
    assert unmoved == {"sibl", "t3", "satimp", "simnpo"} and len(prob) == 21
    assert (
        f"**Seventeen of the twenty-one moved the forget probability** (target {target['forget_prob']:.3f}" in section
    )
    others = {m: p for m, p in prob.items() if m != "lmcleaner"}
    assert min(others, key=others.get) == "ceu" and f"CE-U furthest of the others ({prob['ceu']:.3f})" in section
    fq = {m: g["forget_quality"]["mean"] for m, g in metrics.items()}
    assert [m for m, v in fq.items() if round(v, 3) > 0.081] == ["idk_dpo", "lmcleaner"]
    lmc = metrics["lmcleaner"]
    assert (
        f"probability {lmc['forget_prob']['mean']:.3f} (the retain model's {retain['forget_prob']:.3f}) and Forget "
        f"Quality {lmc['forget_quality']['mean']:.3f}, but the retain probability {lmc['retain_prob']['mean']:.3f} "
        f"(target {target['retain_prob']:.3f}) and Model Utility {lmc['model_utility']['mean']:.3f}"
    ) in " ".join(section.split())


def test_t3_on_its_own_recipe_is_its_report(section):
    t3 = committed_study("peer_methods", "t3_recipe")
    m = t3["groups"][0]["metrics"]
    text = " ".join(section.split())
    assert (
        f"forget probability {m['forget_prob']['mean']:.1e}, but the retain probability "
        f"{m['retain_prob']['mean']:.3f} and Model Utility {m['model_utility']['mean']:.3f}"
    ) in text


def test_the_readme_line_is_the_report(study):
    readme = " ".join((ROOT / "README.md").read_text().split())
    target = next(r for r in study["references"] if r["name"] == "full")["forget_prob"]
    moved = [g for g in study["groups"] if abs(g["metrics"]["forget_prob"]["mean"] - target) >= 0.005]
    assert f"{len(moved)} of {len(study['groups'])} moved the forget probability" in readme
