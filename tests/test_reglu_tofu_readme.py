"""The reglu_tofu results and verdict of docs/results.md against docs/study/reglu_tofu/study.json:
every number of the verdict is checked against the report it quotes; this test fails when the
two disagree (as a claim that IHL + RILA had the highest Forget Quality on every seed would,
while IHL + VILA had more on seed 1 of forget 1)."""

from __future__ import annotations

import json

import pytest
from support_checks import ROOT, report_fixtures

from unlearn_plugins.benchmarks.tofu.study.report import leader_tests

study, readme = report_fixtures("reglu_tofu", "## What `reglu_tofu` found", name="readme", one_line=True)


def _groups(study: dict, forget: int) -> dict[str, dict]:
    return {g["method"]: g for g in study["groups"] if g["forget"] == forget}


def _cell(stat: dict) -> str:
    if stat["spread"] is False:
        return f"{stat['mean']:.3f} (no spread)"
    return f"{stat['mean']:.3f} [{stat['low']:.3f}, {stat['high']:.3f}]"


def test_the_readme_table_is_the_report(study, readme):
    rows = {}
    for forget in (1, 2):
        for g in _groups(study, forget).values():
            rows.setdefault(g["label"], []).extend(
                [_cell(g["metrics"]["forget_quality"]), _cell(g["metrics"]["model_utility"])]
            )
        for r in (r for r in study["references"] if r["forget"] == forget):
            label = {"full": "full (target, before unlearning)", "retain": "retain (never saw the forget authors)"}
            rows.setdefault(label[r["name"]], []).extend([f"{r['forget_quality']:.3f}", f"{r['model_utility']:.3f}"])
    for label, cells in rows.items():
        assert f"| {label} | " + " | ".join(cells) + " |" in readme, label


def test_the_readme_verdict_is_the_report(study, readme):
    target = {r["forget"]: r for r in study["references"] if r["name"] == "full"}
    one, two = _groups(study, 1), _groups(study, 2)
    tests = {k: {r["method"]: r for r in leader_tests(list(g.values()), method="reglu")["against"]} for k, g in ((1, one), (2, two))}  # fmt: skip
    fq = {k: {m: g["metrics"]["forget_quality"] for m, g in groups.items()} for k, groups in ((1, one), (2, two))}

    # forget 1
    reglu_fq = fq[1]["reglu"]
    assert reglu_fq["spread"] is False and fq[1]["ihl_rila"]["spread"] is False
    mu = one["reglu"]["metrics"]["model_utility"]["mean"]
    assert f"(MU {mu:.3f} against {target[1]['model_utility']:.3f})" in readme
    assert f"Forget Quality ({reglu_fq['mean']:.3f} on every seed)" in readme
    gd, ihl, fila, rila = (tests[1][m] for m in ("grad_diff", "ihl", "ihl_fila", "ihl_rila"))
    assert (gd["permutation_p"], gd["holm_p"]) == pytest.approx((ihl["permutation_p"], ihl["holm_p"]))
    assert f"above GradDiff's and IHL's at p = {gd['permutation_p']:.2f} (Holm {gd['holm_p']:.2f}: not" in readme
    assert gd["holm_p"] > 0.05  # "not significant once corrected"
    assert (
        f"IHL + FILA's ({fq[1]['ihl_fila']['mean']:.3f}, p = {fila['permutation_p']:.2f}, Holm {fila['holm_p']:.2f})"
        in readme
    )
    assert f"IHL + RILA's ({fq[1]['ihl_rila']['mean']:.3f} on every seed, p = {rila['permutation_p']:.1f})" in readme
    assert fq[1]["ihl_rila"]["mean"] == reglu_fq["mean"]  # "equal to"

    # forget 2
    seeds = ", ".join(f"{v:.3f}" for v in fq[2]["reglu"]["values"])
    assert f"off the target's {target[2]['forget_quality']:.3f} (seeds {seeds})" in readme
    ps = [tests[2][m]["permutation_p"] for m in ("grad_diff", "ihl", "ihl_fila")]
    holms = {round(tests[2][m]["holm_p"], 6) for m in ("grad_diff", "ihl", "ihl_fila")}
    assert len(holms) == 1
    assert f"p = {ps[0]:.2f}, {ps[1]:.2f} and {ps[2]:.2f} (Holm {holms.pop():.1f} each)" in readme
    assert f"below IHL + RILA ({fq[2]['ihl_rila']['mean']:.3f})" in readme
    assert tests[2]["ihl_rila"]["difference"] < 0


def test_no_per_seed_leader_claim_the_records_contradict(study, readme):
    """A method "had the highest Forget Quality on every seed" only where it did."""
    for forget in (1, 2):
        groups = _groups(study, forget)
        for g in groups.values():
            values = dict(zip(g["seeds_done"], g["metrics"]["forget_quality"]["values"]))
            best_every_seed = all(
                values[s] >= max(dict(zip(o["seeds_done"], o["metrics"]["forget_quality"]["values"]))[s] for o in groups.values())
                for s in values
            )  # fmt: skip
            if not best_every_seed:
                assert f"{g['label']} had the highest Forget Quality on every seed" not in readme


def test_the_paired_model_utility_widths_quoted_are_the_reanalysis(readme):
    rows = json.loads((ROOT / "docs" / "study" / "reglu_tofu_v2" / "v1_reanalysis.json").read_text())
    cells = [r for r in rows.values() if r["seed"] is not None]
    vila = [r["paired_width"] for r in cells if r["method"] == "ihl_vila"]
    others = [r["paired_width"] for r in cells if r["method"] != "ihl_vila"]
    unpaired = [r["unpaired_width"] for r in cells]
    assert f"{min(others):.3f}-{max(others):.3f} wide (IHL + VILA {min(vila):.3f}-{max(vila):.3f};" in readme
    assert max(others) < min(unpaired) and max(unpaired) == pytest.approx(0.161, abs=5e-4)
