"""The analysis of an author-unit study (unlearn_plugins/study/design_report.py) on the declared
reglu_tofu_v2 design with synthetic per-author values: the families, Holm, the leader, the
utility intervals, and verdict sentences generated from the numbers."""

from __future__ import annotations

import pytest

from unlearn_plugins.benchmarks.tofu.study import design_report as dr
from unlearn_plugins.study import load_study

STUDY = load_study("reglu_tofu_v2")
DESIGN = STUDY.design
METHODS = [m.name for m in STUDY.methods]
AUTHORS = DESIGN.test_authors


def values(fq: dict[str, list[float]], w: dict[str, list[float]] | None = None) -> dict:
    w = w or {m: [1 - x for x in v] for m, v in fq.items()}
    return {
        "forget_quality": {m: dict(zip(AUTHORS, v)) for m, v in fq.items()},
        "wasserstein_log": {m: dict(zip(AUTHORS, v)) for m, v in w.items()},
    }


def base_fq(offset: float) -> list[float]:
    return [round(0.3 + 0.03 * i + offset, 4) for i in range(10)]


def mu(diffs: dict[str, list[float]]) -> dict:
    return {m: dict(zip(AUTHORS, v)) for m, v in diffs.items()}


SMALL_LOSS = [-0.004, -0.006, -0.003, -0.005, -0.007, -0.002, -0.006, -0.004, -0.005, -0.003]


def test_reglu_better_on_every_author_and_near_target_utility_holds():
    fq = {m: base_fq(0.0) for m in METHODS}
    fq["reglu"] = base_fq(0.1)
    fq["ihl_random_residual"] = base_fq(-0.05)
    result = dr.analyse(DESIGN, values(fq), mu({m: SMALL_LOSS for m in METHODS}), METHODS)
    primary = result["families"]["primary"]["rows"]
    assert [r["rival"] for r in primary] == ["grad_diff", "ihl", "ihl_fila", "ihl_vila", "ihl_rila"]
    for row in primary:  # 10 wins of 10: p = 2 / 2^10; Holm over 5: 5 x p
        assert row["permutation_p"] == pytest.approx(2 / 1024)
        assert row["holm_p"] == pytest.approx(5 * 2 / 1024) and row["reject"]
        assert (row["wins"], row["ties"], row["losses"]) == (10, 0, 0)
    # the wasserstein family: lower is better, and ReGLU is the lower
    assert result["families"]["wasserstein"]["lower_is_better"]
    assert all(r["difference"] < 0 and r["reject"] for r in result["families"]["wasserstein"]["rows"])
    # ... so those are wins: counted on the better side, not on the larger value
    assert all((r["wins"], r["losses"]) == (10, 0) for r in result["families"]["wasserstein"]["rows"])
    # the leader family is post hoc: ReGLU has the best mean, against the six others
    leader = result["families"]["leader"]
    assert leader["post_hoc"] and [r["method"] for r in leader["rows"]] == ["reglu"] * 6
    verdict = result["verdict"]
    assert verdict["holds"] and verdict["failures"] == []
    assert verdict["sentences"][0].startswith("The claim holds: reglu reaches a significantly higher forget quality")
    assert "95% interval [" in verdict["sentences"][1] and ": above -0.02." in verdict["sentences"][1]
    assert "Holm p 0.0098: reglu's forget quality is significantly higher." in verdict["sentences"][2]


def test_the_verdict_names_each_part_that_fails():
    fq = {m: base_fq(0.0) for m in METHODS}
    fq["reglu"] = base_fq(0.1)
    fq["ihl_rila"] = [x + (0.2 if i % 2 else 0.0) for i, x in enumerate(base_fq(0.1))]  # ReGLU never better
    fq["grad_diff"] = base_fq(0.2)  # better than ReGLU on every author
    losses = [-0.03, -0.01, -0.04, -0.02, -0.035, -0.015, -0.025, -0.03, -0.02, -0.04]
    result = dr.analyse(DESIGN, values(fq), mu({m: losses for m in METHODS}), METHODS)
    verdict = result["verdict"]
    assert not verdict["holds"]
    assert verdict["failures"] == ["utility", "reglu vs grad_diff", "reglu vs ihl_rila"]
    text = " ".join(verdict["sentences"])
    assert verdict["sentences"][0] == (
        "The claim does not hold: utility, reglu vs grad_diff, reglu vs ihl_rila fail the verdict rule."
    )
    assert ": it reaches below -0.02." in text
    assert "reglu vs grad_diff: mean forget quality difference -0.100 (0 wins, 0 ties, 10 losses)" in text
    assert "significant, but reglu's forget quality is the lower." in text
    assert "reglu vs ihl_rila: mean forget quality difference -0.100 (0 wins, 5 ties, 5 losses)" in text
    assert "not significant at 0.05." in text
    assert dr.leader(values(fq)["forget_quality"], AUTHORS, "forget_quality") in ("grad_diff", "ihl_rila")


def test_utility_without_spread_is_said_so():
    fq = {m: base_fq(0.0) for m in METHODS}
    fq["reglu"] = base_fq(0.1)
    result = dr.analyse(DESIGN, values(fq), mu({m: [-0.01] * 10 for m in METHODS}), METHODS)
    assert result["utility"]["reglu"]["spread"] is False and result["utility"]["reglu"]["low"] is None
    assert "on every one of the 10 authors (no spread): above -0.02." in result["verdict"]["sentences"][1]
    assert result["verdict"]["holds"]


def test_noise_ceiling_of_an_author():
    reference = [0.5, 0.6, 0.7, 0.8, 0.9]
    out = dr.ceiling(reference, {"seed1": reference, "seed2": [r * 2 for r in reference]})
    assert out["seeds"]["seed1"]["forget_quality"] == 1.0 and out["seeds"]["seed1"]["wasserstein_log"] == 0.0
    assert out["seeds"]["seed2"]["wasserstein_log"] == pytest.approx(0.6931, abs=1e-4)  # log 2


# ----------------------------------------------------------------------------- the README's verdict

from pathlib import Path  # noqa: E402

from unlearn_plugins.benchmarks.tofu.study import author_report as ar  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def report_json(analysis: dict) -> dict:
    """study.json as the author-unit report writes it, the parts verdict_block reads."""
    return {
        "study": {"name": "reglu_tofu_v2", "design": {"verdict": dict(DESIGN.verdict)}},
        "methods": [{"name": m.name, "label": m.label} for m in STUDY.methods],
        "design": {"test_authors": list(AUTHORS)},
        "cells": {f"{m}/author{a}/seed0": {"kind": "method", "status": "done"} for m in METHODS for a in AUTHORS},
        "analysis": analysis,
    }


def test_the_verdict_block_is_generated_from_study_json_and_a_changed_readme_fails():
    fq = {m: base_fq(0.0) for m in METHODS}
    fq["reglu"] = base_fq(0.1)
    report = report_json(dr.analyse(DESIGN, values(fq), mu({m: SMALL_LOSS for m in METHODS}), METHODS))
    block = ar.verdict_block(report)
    assert block.splitlines()[2].startswith("**The claim holds: ")
    assert "- control (forget_quality): IHL + RILA vs IHL + random residual (control): difference +0.000" in block
    assert "(10 test authors; 70 of 70 test cells finished.)" in block
    # a family whose metric is better lower says so (a negative W1 difference is ReGLU ahead)
    assert "- wasserstein (wasserstein_log, lower is better): " in block
    readme = f"# x\n\nintro\n\n{block}\n\nmore\n"
    assert ar.readme_verdict(readme, "reglu_tofu_v2") == block
    # a README whose verdict says what the numbers do not is caught
    edited = readme.replace("Holm p 0.0098", "Holm p 0.0010", 1)
    assert ar.readme_verdict(edited, "reglu_tofu_v2") != block
    assert ar.readme_verdict("no verdict here", "reglu_tofu_v2") is None
    with pytest.raises(ValueError, match="no end marker"):
        ar.readme_verdict(block.rsplit("\n", 1)[0], "reglu_tofu_v2")
    # an unfinished run's verdict says it is interim, in its first line
    report["cells"]["reglu/author199/seed0"]["status"] = "pending"
    interim = ar.verdict_block(report)
    assert interim.splitlines()[2].startswith("**Interim, not final (69 of 70 test cells finished): The claim holds: ")
    assert "(10 test authors; 69 of 70 test cells finished.)" in interim


def test_the_readme_verdict_of_reglu_tofu_v2_is_its_study_json():
    """docs/study/reglu_tofu_v2/study.json and docs/results.md agree: the page quotes the verdict
    block generated from it, word for word; before the study has a report, the page gives no
    verdict of it."""
    readme = (ROOT / "docs" / "results.md").read_text()
    quoted = ar.readme_verdict(readme, "reglu_tofu_v2")
    path = ROOT / "docs" / "study" / "reglu_tofu_v2" / "study.json"
    if not path.is_file():
        assert quoted is None, "docs/results.md gives a verdict of reglu_tofu_v2, which has no report yet"
        return
    import json

    assert quoted == ar.verdict_block(json.loads(path.read_text()))


def test_verdict_counts_are_in_the_right_number():
    """ "1 win, 1 tie, 1 loss", not "1 wins, 1 ties, 1 losses"."""
    counted = [dr._counted(n, noun) for n, noun in ((1, "win"), (1, "tie"), (1, "loss"), (0, "win"), (2, "loss"))]
    assert counted == ["1 win", "1 tie", "1 loss", "0 wins", "2 losses"]
