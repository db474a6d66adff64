"""docs/study/reglu_tofu_v2 and the built-in study reglu_tofu_v2: the study file declares what design.md says, and its choices
are ones the statistics can decide (enough authors for Holm over the primary comparisons)."""

from __future__ import annotations

import sys
from pathlib import Path

from unlearn_plugins.benchmarks.tofu.study.operating_point import Rule
from unlearn_plugins.benchmarks.tofu.study.statistics import holm_family, minimum_units, smallest_p

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the study spec's own fallback
    import tomli as tomllib

HERE = Path(__file__).resolve().parents[1] / "docs" / "study" / "reglu_tofu_v2"
#: the study file, built in since the runner reads its tables (it was the draft beside design.md)
STUDY = Path(__file__).resolve().parents[1] / "unlearn_plugins" / "study" / "studies" / "reglu_tofu_v2.toml"


def test_the_study_declares_a_study_that_can_decide():
    study = tomllib.loads(STUDY.read_text())
    bench = study["benchmark"]
    tests, reserved = bench["test_authors"], bench["reserved_author"]
    tofu = range(180, 200)  # forget10_perturbed: TOFU authors 180-199
    assert len(set(tests)) == len(tests) and all(a in tofu for a in tests) and reserved in tofu
    assert reserved not in tests and study["sweep"]["author"] == reserved
    assert set(study["noise_ceiling"]["authors"]) <= {reserved, *tests}
    methods = {m["name"] for m in study["methods"]}
    primary = next(c for c in study["comparisons"] if c["family"] == "primary")
    assert primary["method"] == "reglu" and set(primary["rivals"]) == methods - {"reglu", "ihl_random_residual"}
    alpha, m = study["statistics"]["alpha"], len(primary["rivals"])
    # Holm's first step multiplies the smallest p by m: with fewer authors nothing can pass
    assert minimum_units(m, alpha) == 8 <= len(tests)
    assert m * smallest_p(len(tests)) <= alpha < m * smallest_p(minimum_units(m, alpha) - 1)
    # the declared families name only the study's methods, each comparison once
    for family in study["comparisons"]:
        pairs = [(family["method"], r) for r in family.get("rivals", [])] + [tuple(p) for p in family.get("pairs", [])]
        assert all(a in methods | {"leader"} and b in methods for a, b in pairs)
        holm_family([f"{a} vs {b}" for a, b in pairs], {})  # refuses a comparison declared twice
    assert study["sweep"]["lr"] == [1e-4, 3e-4, 1e-3] and study["sweep"]["epochs"] == 10
    assert Rule.from_mapping(study["operating_point"]) == Rule(0.02, "below", "least_utility_loss")
    assert "lr" not in study["budget"] and "epochs" not in study["budget"]  # the operating point's


def test_the_design_states_the_declared_numbers():
    design = " ".join((HERE / "design.md").read_text().split())
    study = tomllib.loads(STUDY.read_text())
    tests = study["benchmark"]["test_authors"]
    assert ", ".join(map(str, tests)) in design and f"**{study['benchmark']['reserved_author']}**" in design
    assert "n >= 8** (`statistics.minimum_units(5) == 8`)" in design
    assert f"| **{len(tests)}** | {2 ** len(tests):,} | {smallest_p(len(tests)):.4f} |" in design
