"""bench/cud_stratification_v2.py: the analysis functions on constructed inputs (damage-adjusted
efficacy, the change-based per-sample correlation, the minimum detectable difference against hand
computations, Holm, the set comparison), the reliability stop rule, the pools, and the phase-1
report made from records alone."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from support_checks import load_bench_script


@pytest.fixture(scope="module")
def v2():
    return load_bench_script("cud_stratification_v2")


def nll(p: float) -> float:
    return -math.log(p)


# ----------------------------------------------------------------------------- the primary measure


def test_damage_adjusted_efficacy_of_constructed_runs(v2):
    # a clean run: the set's probability halves, the held-out QA lose a quarter
    clean = v2.damage_adjusted([nll(0.5)] * 4, [nll(0.25)] * 4, [nll(0.4)] * 3, [nll(0.3)] * 3)
    assert clean["efficacy"] == pytest.approx(50.0)
    assert clean["heldout_drop"] == pytest.approx(25.0)
    assert clean["adjusted"] == pytest.approx(25.0)
    # a collapsed run (v1's npo): everything gone counts as no selective forgetting, not as 100
    collapsed = v2.damage_adjusted([nll(0.5)] * 4, [nll(1e-9)] * 4, [nll(0.4)] * 3, [nll(1e-9)] * 3)
    assert collapsed["efficacy"] == pytest.approx(100.0, abs=1e-6)
    assert collapsed["adjusted"] == pytest.approx(0.0, abs=1e-6)
    # held-out probability that rises is a negative drop: it adds to the adjusted efficacy
    better = v2.damage_adjusted([nll(0.5)], [nll(0.4)], [nll(0.4)], [nll(0.44)])
    assert better["heldout_drop"] == pytest.approx(-10.0)
    assert better["adjusted"] == pytest.approx(30.0)
    # the mean of probabilities, not of NLLs: (0.8 + 0.2) / 2 before, (0.4 + 0.2) / 2 after
    mixed = v2.efficacy_points([nll(0.8), nll(0.2)], [nll(0.4), nll(0.2)])
    assert mixed == pytest.approx(40.0)
    with pytest.raises(ValueError):
        v2.efficacy_points([1.0], [1.0, 2.0])


def test_the_v1_reversal_is_what_the_adjustment_shows(v2):
    """v1's grad_diff: CUD-easy +27.9 points more efficacy than random, with a far larger held-out
    drop; the damage-adjusted measure puts it below the random sets (the issue's 24.7 vs 29-37)."""
    target_heldout = [nll(0.486)] * 10
    easy = v2.damage_adjusted([nll(0.5)] * 10, [nll(0.5 * (1 - 0.796))] * 10, target_heldout, [nll(0.219)] * 10)
    rnd = v2.damage_adjusted([nll(0.5)] * 10, [nll(0.5 * (1 - 0.517))] * 10, target_heldout, [nll(0.412)] * 10)
    assert easy["efficacy"] > rnd["efficacy"] + 25
    assert easy["adjusted"] < rnd["adjusted"]


# ----------------------------------------------------------------------------- per-sample correlation


def test_change_correlation_is_not_fooled_by_the_post_level(v2):
    from scipy.stats import spearmanr

    rng = random.Random(0)
    rows = list(range(200))
    pre = {r: rng.uniform(0.2, 3.0) for r in rows}
    # the loss scorer's score is the pre-unlearning loss; unlearning adds a change unrelated to it
    score = dict(pre)
    post = {r: [pre[r] + rng.uniform(0.0, 1.0), pre[r] + rng.uniform(0.0, 1.0)] for r in rows}
    level = spearmanr([score[r] for r in rows], [sum(post[r]) / 2 for r in rows]).statistic
    assert level > 0.8  # v1's target: a correlation by construction
    change = v2.change_correlation(score, pre, post)
    assert abs(change["rho"]) < 0.2 and change["n"] == 200
    # a score that orders the changes: rho 1; one that reverses them: -1
    by_change = {r: sum(post[r]) / 2 - pre[r] for r in rows}
    assert v2.change_correlation(by_change, pre, post)["rho"] == pytest.approx(1.0)
    assert v2.change_correlation({r: -v for r, v in by_change.items()}, pre, post)["rho"] == pytest.approx(-1.0)


def test_change_correlation_uses_only_rows_with_all_three(v2):
    pre = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    post = {0: [1.5], 1: [2.0], 2: [3.0], 5: [9.0]}
    out = v2.change_correlation({0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 5: 0.5}, pre, post)
    assert out["n"] == 3 and out["rho"] == pytest.approx(1.0)
    assert v2.change_correlation({0: 1.0}, pre, post) == {"rho": None, "p": None, "n": 1}


# ----------------------------------------------------------------------------- power and tests


def test_minimum_detectable_difference_by_hand(v2):
    # normal formula by hand: (z_.975 + z_.80) * sd * sqrt(1/n1 + 1/n2)
    # = (1.959964 + 0.841621) * 10 * sqrt(1/4 + 1/20) = 2.801585 * 10 * 0.547723 = 15.345
    assert v2.minimum_detectable_difference(10, 4, 20, method="normal") == pytest.approx(15.345, abs=1e-3)
    # the exact t value for 20 + 20 units: d = 0.9091 (G*Power's sensitivity analysis, two tails,
    # alpha 0.05, power 0.80); the normal formula gives 0.886
    assert v2.minimum_detectable_difference(1, 20, 20) == pytest.approx(0.9091, abs=5e-4)
    assert v2.minimum_detectable_difference(1, 20, 20, method="normal") == pytest.approx(0.8859, abs=5e-4)
    # the t value is where the test's power is 0.80, and it scales with the SD
    d = v2.minimum_detectable_difference(7.0, 4, 24, alpha=0.05 / 6)
    assert v2._two_sample_power(d, 7.0, 4, 24, 0.05 / 6) == pytest.approx(0.8, abs=1e-6)
    assert d == pytest.approx(7.0 * v2.minimum_detectable_difference(1.0, 4, 24, alpha=0.05 / 6), rel=1e-6)
    assert d > v2.minimum_detectable_difference(7.0, 4, 24, alpha=0.05 / 6, method="normal")
    assert v2.minimum_detectable_difference(0.0, 4, 24) == 0.0
    with pytest.raises(ValueError):
        v2.minimum_detectable_difference(1.0, 4, 24, power=1.0)


def test_holm_by_hand(v2):
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone: 0.06
    adjusted = v2.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02})
    assert v2.holm({"x": 0.6, "y": 0.7}) == pytest.approx({"x": 1.0, "y": 1.0})


def test_compare_sets_with_sets_as_units(v2):
    rnd = [40.0 + x for x in (-6, -3, -1, 0, 1, 3, 6, -2, 2, 0)]
    far = v2.compare_sets([10.0, 12.0, 8.0, 11.0], rnd)
    assert far["diff"] == pytest.approx(10.25 - 40.0)
    assert far["p"] < 0.001 and far["ci"][1] < 0 and far["ci_boot"][1] < 0
    same = v2.compare_sets([38.0, 42.0, 40.0, 41.0], rnd)
    assert same["p"] > 0.3 and same["ci"][0] < 0 < same["ci"][1]
    one = v2.compare_sets([10.0], rnd)
    assert one["p"] is None and one["ci"] is None


# ----------------------------------------------------------------------------- the stop rule


def ranked(values):
    return {row: float(v) for row, v in enumerate(values)}


def test_agreement_counts_top_k_overlap(v2):
    n, k = 200, 40
    a = ranked(range(n))
    # b keeps the 20 hardest of a among its 40 hardest, and the 30 easiest among its 40 easiest
    b_values = list(range(n))
    for i in range(20):  # swap a's hardest 160+i with mid-pool rows
        b_values[180 + i], b_values[100 + i] = b_values[100 + i], b_values[180 + i]
    for i in range(10):
        b_values[30 + i], b_values[90 + i] = b_values[90 + i], b_values[30 + i]
    out = v2.agreement(a, ranked(b_values), k)
    assert out["hard_shared"] == 20 and out["hard_overlap"] == 0.5
    assert out["easy_shared"] == 30 and out["easy_overlap"] == 0.75
    assert out["chance"] == pytest.approx(0.2)
    assert v2.agreement(a, a, k)["spearman"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        v2.agreement(a, ranked(range(n - 1)), k)


def test_stop_rule(v2):
    rng = random.Random(1)
    n = 560
    base = [rng.random() for _ in range(n)]
    same = ranked(base)
    close = ranked([v + rng.gauss(0, 0.01) for v in base])  # nearly the same ranking
    noise = ranked([rng.random() for _ in range(n)])  # an unrelated one
    comparisons = {"seeds": ["A012", "A345"], "pools": ["A012", "B012"]}

    ok = v2.stop_rule({"A012": same, "A345": close, "B012": close}, comparisons)
    assert ok["decided"] and ok["stop"] is False and not ok["reasons"]

    # one unstable comparison stops the study, whatever the other says
    bad = v2.stop_rule({"A012": same, "A345": close, "B012": noise}, comparisons)
    assert bad["decided"] and bad["stop"] is True
    assert all(r.startswith("pools") for r in bad["reasons"]) and len(bad["reasons"]) == 3

    # a scoring the vote could not make (no hard anchor) stops it too
    failed = v2.stop_rule({"A012": same, "A345": close, "B012": None}, comparisons)
    assert failed["stop"] is True and "undefined" in failed["comparisons"]["pools"]

    # pending scorings: no decision, unless what is there already stops it
    pending = v2.stop_rule({"A012": same, "A345": close}, comparisons)
    assert pending["decided"] is False and pending["stop"] is None and pending["pending"] == ["pools"]
    early = v2.stop_rule({"A012": same, "A345": noise}, comparisons)
    assert early["decided"] and early["stop"] is True


def test_stop_rule_threshold_is_inclusive_and_needs_every_measure(v2):
    n, k = 200, 40
    a = ranked(range(n))
    # Spearman high, but only half of each top-40 set shared: exactly 0.5 passes
    b = list(range(n))
    for i in range(20):
        b[180 + i], b[140 + i] = b[140 + i], b[180 + i]
        b[i], b[40 + i] = b[40 + i], b[i]
    out = v2.stop_rule({"x": a, "y": ranked(b)}, {"c": ["x", "y"]}, k=k)
    assert out["comparisons"]["c"]["hard_overlap"] == 0.5 and out["comparisons"]["c"]["easy_overlap"] == 0.5
    assert out["comparisons"]["c"]["spearman"] > 0.9 and out["stop"] is False
    # one more hard row lost: 19/40 < 0.5 stops it although the Spearman is still high
    b[179], b[139] = b[139], b[179]
    out = v2.stop_rule({"x": a, "y": ranked(b)}, {"c": ["x", "y"]}, k=k)
    assert out["comparisons"]["c"]["hard_shared"] == 19 and out["stop"] is True
    assert out["reasons"] == ["c (x vs y): hard overlap 0.47 < 0.5"]


# ----------------------------------------------------------------------------- pools and records


def test_author_pools_are_disjoint_and_cover_the_authors(v2):
    pools = v2.author_pools()
    main = [pools[name] for name in ("anchor_A", "anchor_B", "heldout", "query")]
    assert [len(p) for p in main] == [4, 4, 4, 28]
    assert sorted(a for p in main for a in p) == list(range(40))
    subs = [pools[f"subpool{j}"] for j in range(4)]
    assert sorted(a for s in subs for a in s) == pools["query"] and all(len(s) == 7 for s in subs)
    assert v2.rows_of([2]) == list(range(40, 60))
    assert pools == v2.author_pools()  # fixed


def test_phase1_report_from_records_alone(v2, tmp_path):
    """Three recorded scorings (made up) -> the decision, the json and the markdown, without a model."""
    pools = v2.author_pools()
    query = v2.rows_of(pools["query"])
    rng = random.Random(2)
    base = {r: rng.random() for r in query}

    def scoring(name, pool, seeds, scores):
        return {
            "name": name,
            "pool": pool,
            "seeds": seeds,
            "scores": {str(r): v for r, v in scores.items()} if scores else None,
            "s_E": {str(r): 0.9 for r in query} if scores else None,
            "s_H": {str(r): 0.95 for r in query} if scores else None,
            "anchors": {"easy": [80, 81], "hard": [120]},
            "seed_agreement": {"grad_diff": 0.4},
            "seconds": 600.0,
            **({} if scores else {"error": "CUD: the objectives agree on only 0 hard anchor(s)"}),
        }

    (tmp_path / "design.json").write_text(json.dumps({"authors": pools}))
    (tmp_path / "before.json").write_text(json.dumps({"nll": [rng.random() for _ in range(800)]}))
    (tmp_path / "scoring-A012.json").write_text(json.dumps(scoring("A012", "A", [0, 1, 2], base)))
    (tmp_path / "scoring-A345.json").write_text(
        json.dumps(scoring("A345", "A", [3, 4, 5], {r: v + rng.gauss(0, 0.01) for r, v in base.items()}))
    )
    runs = tmp_path / "anchor_runs" / "A012"
    runs.mkdir(parents=True)
    (runs / "npo-s0.json").write_text(
        json.dumps({"objective": "npo", "seed": 0, "n": 80, "losses": [1.0] * 80, "info": {"steps": 12}})
    )
    interim = v2.report_phase1(tmp_path)
    assert interim["decision"]["decided"] is False and interim["complete"] is False
    assert "Interim" in v2.markdown_phase1(interim)
    assert interim["scorings"]["A012"]["anchor_runs"] == [
        {"objective": "npo", "seed": 0, "steps": 12, "pool_prob": None, "seconds": None}
    ]

    (tmp_path / "scoring-B012.json").write_text(json.dumps(scoring("B012", "B", [0, 1, 2], None)))
    out = v2.report_phase1(tmp_path)
    assert out["complete"] and out["decision"]["stop"] is True
    assert out["decision"]["comparisons"]["seeds"]["spearman"] > 0.99
    assert out["scorings"]["A012"]["anchor_authors"] == {"easy": [4], "hard": [6]}
    text = v2.markdown_phase1(out)
    assert "Stop rule fired" in text and "no scores" in text
    json.dumps(out)  # the report's json
    assert v2.main(["report", "--records", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "cud_stratification_v2.md").read_text() == text


# ----------------------------------------------------------------------------- v1 re-read


def test_v1_reread_from_its_records_and_the_readme_says_what_it_found(v2):
    """v1's committed records read with v2's measures (`bench/cud_stratification_v2.py v1`):
    docs/results.md's sentences about v1 quote these numbers; a page that says CUD's easy set unlearned
    better, or that the plain loss predicts it, contradicts them."""
    out = v2.reread_v1()
    gd = out["objectives"]["grad_diff"]
    easy = gd["sets"]["cud_easy"]
    randoms = sorted(r["adjusted"] for r in gd["random_sets"])
    assert easy["minus_random"]["efficacy"] > 25  # v1's +27.9 raw ...
    assert easy["adjusted"] < randoms[0]  # ... below every random set once the damage is taken off
    corr = out["change_correlations"]
    assert corr["loss"]["grad_diff"]["rho"] < -0.4 and corr["loss"]["grad_diff"]["p"] < 0.001
    assert abs(corr["loss"]["npo"]["rho"]) < 0.1 and all(abs(c["rho"]) < 0.2 for c in corr["cud"].values())
    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text().split())
    quoted = (
        f"the easy set scored {easy['adjusted']:.1f} against the random sets' "
        f"{randoms[0]:.1f}, {randoms[1]:.1f} and {randoms[2]:.1f} ({easy['minus_random']['adjusted']:+.1f} "
        "against their mean)",
        f"held-out probability drop of {easy['heldout_drop']:.1f} points (random sets: "
        f"{gd['random_mean']['heldout_drop']:.1f})",
        f"the loss scorer gives rho {corr['loss']['grad_diff']['rho']:.2f} under grad_diff",
        f"{corr['loss']['npo']['rho']:.2f} under npo (p {corr['loss']['npo']['p']:.2f})",
        f"CUD {corr['cud']['grad_diff']['rho']:+.2f}, {corr['cud']['npo']['rho']:+.2f}, "
        f"{corr['cud']['simnpo']['rho']:+.2f}",
    )
    for text in quoted:
        assert text in readme, text
    for contradicted in ("easy set unlearned better than random", "while the plain answer loss does"):
        assert contradicted not in readme


def test_spearman_interval_by_hand(v2):
    """Fisher z with Bonett-Wright's standard error: rho 0.5 over 103 rows -> se sqrt(1.125 / 100)."""
    lo, hi = v2.spearman_interval(0.5, 103)
    half = 1.959964 * math.sqrt(1.125 / 100)
    assert lo == pytest.approx(math.tanh(math.atanh(0.5) - half), abs=1e-6)
    assert hi == pytest.approx(math.tanh(math.atanh(0.5) + half), abs=1e-6)
    assert v2.spearman_interval(0.2, 3) == [0.2, 0.2]


def test_the_committed_phase1_decides_and_the_readme_says_what_it_found(v2):
    """The committed records stop the study, and docs/results.md's verdict quotes their numbers (a
    page that disagrees with the records fails here)."""
    out = v2.report_phase1(v2.RECORDS)
    d = out["decision"]
    assert out["complete"] and d["decided"] and d["stop"] is True
    seeds, pools = d["comparisons"]["seeds"], d["comparisons"]["pools"]
    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text().split())

    def rho(c):
        return f"{c['spearman']:+.2f} [{c['spearman_ci'][0]:+.2f}, {c['spearman_ci'][1]:+.2f}]"

    quoted = (
        "**It fired: CUD is not stable at this scale, and the study stopped after phase 1.**",
        f"Between anchor-run seeds the Spearman was {rho(seeds)} (95%), the top-40 hard and easy sets shared "
        f"{seeds['hard_shared']}/40 and {seeds['easy_shared']}/40 QA; between anchor pools {rho(pools)}, "
        f"{pools['hard_shared']}/40 and {pools['easy_shared']}/40 (chance shares {40 * 40 / seeds['n']:.1f})",
    )
    for text in quoted:
        assert text in readme, text
    a, b = out["scorings"]["A012"], out["scorings"]["A345"]
    shared = {k: len(set(a["anchor_rows"][k]) & set(b["anchor_rows"][k])) for k in ("easy", "hard")}
    assert (
        f"share {shared['easy']} of {a['anchors']['easy']} easy and {shared['hard']} of "
        f"{a['anchors']['hard']} / {b['anchors']['hard']} hard anchors" in readme
    )
    assert "v2 is designed so that it can be" not in readme


# ----------------------------------------------------------------------------- phase 2


def test_the_phase2_sets_are_as_declared(v2):
    pools = v2.author_pools()
    subpools = [v2.rows_of(pools[f"subpool{j}"]) for j in range(4)]
    query = v2.rows_of(pools["query"])
    scores = {r: math.sin(r) for r in query}
    plan = v2.set_plan(scores, subpools, query)
    kinds = [e["kind"] for e in plan.values()]
    assert kinds.count("random") == 24 and kinds.count("hard") == 4 and kinds.count("easy") == 4
    assert sorted(e["number"] for e in plan.values()) == list(range(32))
    assert all(e["seed"] == 100 + e["number"] and len(e["rows"]) == 40 for e in plan.values())
    for k, pool in enumerate(subpools):  # hard: the sub-pool's 40 highest; easy: its 40 lowest
        ranked = sorted(pool, key=lambda r: -scores[r])
        assert plan[f"hard{k}"]["rows"] == sorted(ranked[:40]) and plan[f"easy{k}"]["rows"] == sorted(ranked[-40:])
    hard = [set(plan[f"hard{k}"]["rows"]) for k in range(4)]
    assert all(not (a & b) for i, a in enumerate(hard) for b in hard[i + 1 :])  # disjoint sub-pools
    assert plan["random3"]["rows"] == sorted(random.Random(3503).sample(query, 40))
    pilots = v2.pilot_sets(query)
    assert len(pilots) == 2 and all(len(p) == 40 and set(p) <= set(query) for p in pilots)


def pilot(before_p: float, set_ps: list[float], held_ps: list[float]) -> dict:
    return {
        "before": [nll(before_p)] * 4,
        "trace": [
            {"epoch": e, "set_nll": [nll(p)] * 4, "heldout_nll": [nll(h)] * 3}
            for e, (p, h) in enumerate(zip(set_ps, held_ps), 1)
        ],
    }


def test_the_budget_rule_on_synthetic_pilot_traces(v2):
    held_before = [nll(0.4)] * 3
    # efficacy per epoch 20, 40, 55, 80 (mean of two identical pilots); held-out kept above 0.2 until epoch 3
    pilots = [pilot(0.5, [0.4, 0.3, 0.225, 0.1], [0.38, 0.3, 0.21, 0.1])] * 2
    out = v2.choose_budget(pilots, held_before)
    assert out["epochs"] == 3  # 55 is nearest 50 among 40 (epoch 2) and 55 (epoch 3)
    assert [round(t["efficacy"]) for t in out["table"]] == [20, 40, 55, 80]
    # epoch 3's held-out probability at half the target's: not above half, so epoch 2
    pilots = [pilot(0.5, [0.4, 0.3, 0.225, 0.1], [0.38, 0.3, 0.2, 0.1])] * 2
    assert v2.choose_budget(pilots, held_before)["epochs"] == 2
    # ties (45 and 55): fewer epochs
    assert v2.choose_budget([pilot(0.5, [0.275, 0.225], [0.4, 0.4])] * 2, held_before)["epochs"] == 1
    # nothing in 30-70: left out, with the reason
    none = v2.choose_budget([pilot(0.5, [0.49, 0.48], [0.4, 0.4])] * 2, held_before)
    assert none["epochs"] is None and "no epoch" in none["reason"]


def run_record(kind: str, rows: list[int], after_p: float, held_p: float) -> dict:
    return {"kind": kind, "rows": rows, "nll_after": [nll(after_p)] * len(rows), "heldout_nll_after": [nll(held_p)] * 4}


def test_phase2_analysis_of_constructed_runs(v2):
    before = [nll(0.5)] * 200
    heldout = list(range(196, 200))  # held-out probability 0.5 before
    rng = random.Random(1)
    runs = {}
    for objective, hard_p in (("grad_diff", 0.35), ("npo", 0.25)):
        sets = {}
        for j in range(24):
            sets[f"random{j}"] = run_record("random", list(range(j, j + 40)), 0.25 + rng.uniform(-0.03, 0.03), 0.45)
        for k in range(4):
            sets[f"hard{k}"] = run_record("hard", list(range(k, k + 40)), hard_p + rng.uniform(-0.01, 0.01), 0.45)
            sets[f"easy{k}"] = run_record("easy", list(range(k, k + 40)), 0.25 + rng.uniform(-0.01, 0.01), 0.45)
        runs[objective] = sets
    budgets = {"grad_diff": {"epochs": 2}, "npo": {"epochs": 3}, "simnpo": {"epochs": None, "reason": "no epoch"}}
    scores = {"loss": {r: float(r) for r in range(200)}}
    out = v2.analyse_phase2(before, heldout, runs, budgets, scores)
    gd = out["objectives"]["grad_diff"]
    # efficacy 100(1 - p_after/0.5); held-out drop 10 points; adjusted = efficacy - 10
    hard = gd["comparisons"]["hard_minus_random"]
    assert hard["efficacy"]["diff"] == pytest.approx(hard["adjusted"]["diff"])  # the same damage everywhere
    assert hard["adjusted"]["diff"] == pytest.approx(-20.0, abs=2.0) and hard["adjusted"]["p"] < 1e-4
    assert abs(gd["comparisons"]["easy_minus_random"]["adjusted"]["diff"]) < 2.0
    assert out["objectives"]["npo"]["comparisons"]["hard_minus_random"]["adjusted"]["p"] > 0.01
    assert out["objectives"]["simnpo"] == {"left_out": "no epoch"}
    # Holm over the 4 comparisons made (2 objectives x hard/easy), the smallest p times 4
    assert len(out["holm_family"]) == 4
    ps = sorted(
        (c["adjusted"]["p"], c["adjusted"]["holm_p"])
        for o in ("grad_diff", "npo")
        for c in out["objectives"][o]["comparisons"].values()
    )
    assert ps[0][1] == pytest.approx(min(1.0, 4 * ps[0][0]))
    # the MDD from the random sets' SD, as mdd_of computes it by hand
    sd = gd["mdd"]["sd"]
    assert gd["mdd"]["normal"] == pytest.approx(
        (v2_norm(1 - 0.05 / 12) + v2_norm(0.8)) * sd * math.sqrt(1 / 4 + 1 / 24), rel=1e-9
    )
    assert gd["mdd"]["t"] > gd["mdd"]["normal"]
    assert set(out["correlations"]["loss"]) == {"grad_diff", "npo"}
    text = v2.markdown_phase2({**out, "budgets": budgets, "complete": False})
    assert "left out: no epoch" in text and "| grad_diff | hard | 4 |" in text


def v2_norm(q: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(q))


def test_the_epoch_probe_measures_every_epoch(tiny_model_dir, tmp_path, v2):
    from unlearn_plugins.data.qa import QASample, encode_samples
    from unlearn_plugins.models import load_tokenizer
    from unlearn_plugins.training.config import UnlearnConfig
    from unlearn_plugins.training.run import run_unlearning

    samples = [QASample(f"Who wrote book {i}?", f"Author number {i} wrote it.", i) for i in range(8)]
    tok = load_tokenizer(str(tiny_model_dir))
    forget = v2.write_samples(tmp_path / "forget.json", samples[:4])
    probe = v2.epoch_probe(
        encode_samples(tok, samples[:4], max_length=64),
        encode_samples(tok, samples[4:], max_length=64),
        tok.pad_token_id,
    )
    config = UnlearnConfig(
        out=str(tmp_path / "run"),
        model=str(tiny_model_dir),
        forget=forget,
        retain=None,
        objective="grad_ascent",
        epochs=2.0,
        lr=1e-3,
        batch_size=2,
        grad_accum=1,
        lora_r=4,
        lora_alpha=8,
        max_length=64,
        save_steps=0,
    )
    run_unlearning(config, callbacks=[probe])
    assert [p["epoch"] for p in probe.trace] == [1, 2] and [p["step"] for p in probe.trace] == [2, 4]
    assert all(len(p["set_nll"]) == 4 and len(p["heldout_nll"]) == 4 for p in probe.trace)
    assert probe.trace[1]["set_nll"][0] > probe.trace[0]["set_nll"][0]  # ascent raised the forget loss


def test_the_report_command_from_records_alone_with_phase2(v2, tmp_path):
    """`report` writes the .md, .json and .png from the records: phase 1 only (the agreement
    scatter), then with phase 2's pilots, MDD and runs (made up)."""
    pools = v2.author_pools()
    query = v2.rows_of(pools["query"])
    rng = random.Random(3)
    scores = {r: rng.random() for r in query}
    records = tmp_path / "records"
    records.mkdir()
    (records / "design.json").write_text(json.dumps({"authors": pools}))
    (records / "before.json").write_text(json.dumps({"nll": [nll(0.5)] * 800}))
    for name, pool, seeds in (("A012", "A", [0, 1, 2]), ("A345", "A", [3, 4, 5]), ("B012", "B", [0, 1, 2])):
        record = {
            "name": name,
            "pool": pool,
            "seeds": seeds,
            "scores": {str(r): v for r, v in scores.items()},
            "s_E": {str(r): 0.9 for r in query},
            "s_H": {str(r): 0.95 for r in query},
            "anchors": {"easy": [80], "hard": [120]},
        }
        (records / f"scoring-{name}.json").write_text(json.dumps(record))
    out = tmp_path / "out"
    assert v2.main(["report", "--records", str(records), "--out", str(out)]) == 0
    written = json.loads((out / "cud_stratification_v2.json").read_text())
    assert written["decision"]["stop"] is False and written["phase2"] is None
    assert (out / "cud_stratification_v2.png").stat().st_size > 1000
    assert "Phase 2" not in (out / "cud_stratification_v2.md").read_text()

    phase2 = records / "phase2"
    (phase2 / "runs" / "npo").mkdir(parents=True)
    budget = {"epochs": 2, "reason": "epoch 2: pilot efficacy 48.0 points"}
    (phase2 / "pilot-npo.json").write_text(json.dumps({"objective": "npo", "pilots": [], "budget": budget}))
    for objective in ("grad_diff", "simnpo"):
        left = {"epochs": None, "reason": "no epoch of the pilots reached 30-70% efficacy"}
        (phase2 / f"pilot-{objective}.json").write_text(json.dumps({"objective": objective, "budget": left}))
    plan = v2.set_plan(scores, [v2.rows_of(pools[f"subpool{j}"]) for j in range(4)], query)
    for name, entry in plan.items():
        p = 0.3 if entry["kind"] == "hard" else 0.25 + rng.uniform(-0.02, 0.02)
        record = {
            "objective": "npo",
            "set": name,
            **entry,
            "epochs": 2,
            "nll_after": [nll(p)] * 40,
            "heldout_nll_after": [nll(0.45)] * 80,
        }
        (phase2 / "runs" / "npo" / f"{name}.json").write_text(json.dumps(record))
    (phase2 / "mdd-npo.json").write_text(json.dumps(v2.mdd_of([1.0, 2.0, 3.0])))
    assert v2.main(["report", "--records", str(records), "--out", str(out)]) == 0
    written = json.loads((out / "cud_stratification_v2.json").read_text())
    p2 = written["phase2"]
    assert p2["complete"] is True and p2["objectives"]["grad_diff"] == {"left_out": left["reason"]}
    npo = p2["objectives"]["npo"]
    assert npo["mdd_stated"]["sd"] == pytest.approx(1.0)  # as stated before the stratified runs
    assert npo["comparisons"]["hard_minus_random"]["adjusted"]["diff"] < -5
    assert npo["comparisons"]["hard_minus_random"]["adjusted"]["holm_p"] is not None
    assert set(p2["correlations"]) == {"cud", "loss"}
    text = (out / "cud_stratification_v2.md").read_text()
    assert "# Phase 2, stratification" in text and "| npo | hard | 4 |" in text
