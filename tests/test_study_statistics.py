"""unlearn_plugins.benchmarks.tofu.study.statistics: the paired tests over units, Holm's correction,
paired intervals, "no spread", truth-ratio distances and the noise ceiling, each against values
computed by hand."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from support_checks import mu_samples

from unlearn_plugins.benchmarks.tofu.study import statistics as st

# ----------------------------------------------------------------------------- permutation test


def test_exact_paired_permutation_test_against_the_16_sign_patterns_by_hand():
    """n = 4 units, differences a - b = [1, 2, 3, -4] (mean 0.5, sum 2). Flipping signs, the sum
    is 10 - 2 x (sum of the flipped magnitudes); over the 16 subsets of {1, 2, 3, 4} the flipped
    sums are 0,1,2,3,4,3,4,5,5,6,7,6,7,8,9,10, so the 16 sums are
    10,8,6,4,2,4,2,0,0,-2,-4,-2,-4,-6,-8,-10. |sum| >= 2: all but the two zeros, 14/16 = 0.875;
    sum >= 2: 10,8,6,4,2,4,2, 7/16; sum <= 2: 11/16."""
    a, b = [3, 5, 7, 1], [2, 3, 4, 5]
    sums = [10 - 2 * sum(s) for r in range(5) for s in itertools.combinations((1, 2, 3, 4), r)]
    assert sorted(sums) == sorted([10, 8, 6, 4, 2, 4, 2, 0, 0, -2, -4, -2, -4, -6, -8, -10])
    two = st.paired_permutation_test(a, b)
    assert two["pvalue"] == pytest.approx(14 / 16) and two["difference"] == pytest.approx(0.5)
    assert two["exact"] and two["patterns"] == 16 and two["n"] == 4 and two["smallest_p"] == 2 / 16
    assert st.paired_permutation_test(a, b, "greater")["pvalue"] == pytest.approx(7 / 16)
    assert st.paired_permutation_test(a, b, "less")["pvalue"] == pytest.approx(11 / 16)
    # every difference positive: only the observed pattern (and its mirror) is as extreme
    assert st.paired_permutation_test([1, 2, 3, 4], [0, 0, 0, 0])["pvalue"] == pytest.approx(2 / 16)
    assert st.paired_permutation_test([1, 2, 3, 4], [0, 0, 0, 0], "greater")["pvalue"] == pytest.approx(1 / 16)
    # no difference at all: no evidence
    assert st.paired_permutation_test([0.5, 0.2], [0.5, 0.2])["pvalue"] == 1.0


def test_paired_permutation_test_matches_an_enumeration_of_every_sign_pattern():
    """Random float differences (ties of KS p-values included), n = 1..8: the p-value is the
    share of the 2^n sign patterns whose mean is as extreme."""
    rng = random.Random(3)
    for n in range(1, 9):
        levels = [0.034, 0.081, 0.175, 0.336, 0.571, 0.832]  # the values a KS p-value took at one author
        a = [rng.choice(levels) for _ in range(n)]
        b = [rng.choice(levels) for _ in range(n)]
        d = [x - y for x, y in zip(a, b)]
        observed = sum(d) / n
        means = [sum(s * x for s, x in zip(signs, d)) / n for signs in itertools.product((1, -1), repeat=n)]
        tol = 1e-9
        want = {
            "two-sided": min(
                1.0, 2 * min(sum(m >= observed - tol for m in means), sum(m <= observed + tol for m in means)) / 2**n
            ),
            "greater": sum(m >= observed - tol for m in means) / 2**n,
            "less": sum(m <= observed + tol for m in means) / 2**n,
        }
        for alternative, p in want.items():
            assert st.paired_permutation_test(a, b, alternative)["pvalue"] == pytest.approx(p), (n, alternative)
        # two-sided as |mean| >= |observed| (the sign-flip distribution is symmetric)
        assert want["two-sided"] == pytest.approx(sum(abs(m) >= abs(observed) - tol for m in means) / 2**n)


def test_smallest_p_and_the_units_holm_needs():
    """Two-sided, n units: 2 / 2^n (6 units: 2/64 = 0.031). With Holm over 5 comparisons the
    smallest p is multiplied by 5: 7 units give 10/128 = 0.078 > 0.05, 8 give 10/256 = 0.039."""
    assert st.smallest_p(6) == pytest.approx(0.03125) and st.smallest_p(6, "greater") == pytest.approx(1 / 64)
    assert 5 * st.smallest_p(7) > 0.05 >= 5 * st.smallest_p(8)
    assert st.minimum_units(5) == 8 and st.minimum_units(5, alternative="greater") == 7
    assert st.minimum_units(1) == 6 and st.minimum_units(6) == 8 and st.minimum_units(7) == 9
    assert st.smallest_p(0) == 1.0


def test_paired_values_must_pair_up():
    with pytest.raises(st.StatisticsError, match="pair up"):
        st.paired_permutation_test([1, 2], [1])
    with pytest.raises(st.StatisticsError, match="not a finite number"):
        st.paired_permutation_test([1, float("nan")], [1, 2])
    with pytest.raises(st.StatisticsError, match="no paired values"):
        st.paired_interval([], [])
    with pytest.raises(st.StatisticsError, match="alternative"):
        st.paired_permutation_test([1], [0], "bigger")


# ----------------------------------------------------------------------------- Wilcoxon


def test_wilcoxon_signed_rank_exact_with_tied_ranks_by_hand():
    """d = [1, 1, 2, -3]: ranks of |d| 1.5, 1.5, 3, 4; W+ = 6 of 10. Subsets of the ranks with a
    sum >= 6: {all} 10, {1.5, 1.5, 3} 6, {1.5, 1.5, 4} 7, {1.5a, 3, 4} 8.5, {1.5b, 3, 4} 8.5,
    {3, 4} 7: 6 of 16; by symmetry W+ <= 4 also 6 of 16, so the two-sided p is 12/16."""
    res = st.wilcoxon_signed_rank([2, 2, 3, 0], [1, 1, 1, 3])
    assert res["pvalue"] == pytest.approx(12 / 16) and res["n_nonzero"] == 4
    assert st.wilcoxon_signed_rank([1, 2, 3, 4], [0, 0, 0, 0])["pvalue"] == pytest.approx(2 / 16)
    assert st.wilcoxon_signed_rank([1, 2, 3, 4], [0, 0, 0, 0], "greater")["pvalue"] == pytest.approx(1 / 16)
    # zero differences are dropped (Wilcoxon's convention): [0, 1, 2, 3, 4] is the n = 4 case
    assert st.wilcoxon_signed_rank([0, 1, 2, 3, 4], [0, 0, 0, 0, 0])["pvalue"] == pytest.approx(2 / 16)
    none = st.wilcoxon_signed_rank([0.3, 0.3], [0.3, 0.3])
    assert none["pvalue"] == 1.0 and none["why"] == "every difference is zero"


# ----------------------------------------------------------------------------- Holm


def test_holm_against_hand_computed_values():
    # sorted 0.01, 0.03, 0.04: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> kept non-decreasing: 0.06
    assert st.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # m = 5: 0.05, 0.08, 0.09, 0.08 -> 0.09, 0.05 -> 0.09
    assert st.holm([0.01, 0.02, 0.03, 0.04, 0.05]) == pytest.approx([0.05, 0.08, 0.09, 0.09, 0.09])
    assert st.holm([0.03, 0.01, 0.02, 0.04, 0.05]) == pytest.approx([0.09, 0.05, 0.08, 0.09, 0.09])
    assert st.holm([0.4, 0.5]) == pytest.approx([0.8, 0.8])
    assert st.holm([0.6, 0.7]) == [1.0, 1.0]  # capped
    # an untested comparison counts in m as p = 1 and stays untested: 0.01 x 3, 0.03 x 2
    assert st.holm([0.01, None, 0.03]) == [pytest.approx(0.03), None, pytest.approx(0.06)]
    assert st.holm([]) == []
    with pytest.raises(st.StatisticsError, match="in \\[0, 1\\]"):
        st.holm([0.2, 1.5])


def test_holm_family_refuses_comparisons_not_declared_before_the_run():
    declared = ["reglu vs grad_diff", "reglu vs ihl", "reglu vs ihl_rila"]
    rows = st.holm_family(declared, {"reglu vs ihl": 0.04, "reglu vs grad_diff": 0.01, "reglu vs ihl_rila": 0.03})
    assert [r["comparison"] for r in rows] == declared
    assert [r["holm_p"] for r in rows] == pytest.approx([0.03, 0.06, 0.06])
    assert [r["reject"] for r in rows] == [True, False, False] and rows[0]["m"] == 3
    # a declared comparison that could not be run still counts
    partial = st.holm_family(declared, {"reglu vs grad_diff": 0.01})
    assert partial[0]["holm_p"] == pytest.approx(0.03) and partial[1]["holm_p"] is None
    with pytest.raises(st.StatisticsError, match="not declared before the study ran: ihl vs grad_diff"):
        st.holm_family(declared, {"ihl vs grad_diff": 0.001})


# ----------------------------------------------------------------------------- intervals, spread


def test_paired_interval_is_student_t_over_the_differences():
    from scipy.stats import t

    a, b = [3, 5, 7, 1], [2, 3, 4, 5]  # differences 1, 2, 3, -4
    sd = math.sqrt(((1 - 0.5) ** 2 + (2 - 0.5) ** 2 + (3 - 0.5) ** 2 + (-4 - 0.5) ** 2) / 3)
    half = t.ppf(0.975, 3) * sd / 2
    got = st.paired_interval(a, b)
    assert got["difference"] == pytest.approx(0.5) and got["n"] == 4 and got["spread"] is True
    assert (got["low"], got["high"]) == pytest.approx((0.5 - half, 0.5 + half))
    assert got["text"] == f"+0.500 [{0.5 - half:+.3f}, {0.5 + half:+.3f}]"
    boot = st.paired_interval(a, b, method="bootstrap")
    assert -4 <= boot["low"] < 0.5 < boot["high"] <= 3 and boot == st.paired_interval(a, b, method="bootstrap")
    # the same difference on every unit: no spread, no interval
    flat = st.paired_interval([0.6, 0.7, 0.8], [0.5, 0.6, 0.7])
    assert flat["spread"] is False and flat["low"] is None and flat["high"] is None
    assert flat["text"] == "+0.100 (no spread, n=3)"
    one = st.paired_interval([0.6], [0.5])
    assert one["low"] is None and one["spread"] is None and one["text"] == "+0.100 (one unit, n=1)"


def test_no_spread_groups_get_no_interval_and_no_welch_p():
    """IHL + RILA's Forget Quality in reglu_tofu (0.571 on all three seeds) against IHL's."""
    rila, ihl = [0.571, 0.571, 0.571], [0.175, 0.175, 0.081]
    assert not st.has_spread(rila) and st.has_spread(ihl) and not st.has_spread([0.3])
    g = st.group_summary(rila)
    assert g["spread"] is False and g["low"] is None and g["high"] is None and g["mean"] == pytest.approx(0.571)
    assert g["text"] == "0.571 (no spread, n=3)"
    assert st.welch_test(rila, ihl) == {"pvalue": None, "statistic": None, "why": "a: no spread"}
    assert st.welch_test(ihl, rila)["why"] == "b: no spread"
    assert st.welch_test(ihl, [0.1])["why"] == "b: fewer than 2 values"
    from scipy import stats

    other = [0.571, 0.336, 0.336]
    want = stats.ttest_ind(other, ihl, equal_var=False, alternative="greater").pvalue
    assert st.welch_test(other, ihl, "greater")["pvalue"] == pytest.approx(want)
    spread = st.group_summary([0.336, 0.832, 0.034], bounds=(0.0, 1.0))  # IHL + VILA
    assert spread["spread"] is True and spread["low"] == 0.0 and spread["high"] > spread["mean"]


# ----------------------------------------------------------------------------- truth ratios


def test_truth_ratio_distances_by_hand():
    """log ratios {0, 1, 2} against {1, 2, 3}: the empirical CDFs differ by at most 1/3 (the KS
    statistic) and the distribution is shifted by 1 (the 1-Wasserstein distance)."""
    from scipy.stats import ks_2samp

    model = [math.exp(v) for v in (0, 1, 2)]
    retain = [math.exp(v) for v in (1, 2, 3)]
    got = st.truth_ratio_distances(model, retain)
    assert got["ks_statistic"] == pytest.approx(1 / 3) and got["wasserstein_log"] == pytest.approx(1.0)
    assert got["forget_quality"] == pytest.approx(ks_2samp(model, retain).pvalue) and got["n"] == [3, 3]
    same = st.truth_ratio_distances([0.5, 1.0, 2.0], [2.0, 0.5, 1.0])
    assert same == {"forget_quality": 1.0, "ks_statistic": 0.0, "wasserstein_log": 0.0, "n": [3, 3]}
    # log symmetry: ratio r against 1 and 1 / r against 1 are equally far
    assert st.truth_ratio_distances([4.0], [1.0])["wasserstein_log"] == pytest.approx(
        st.truth_ratio_distances([0.25], [1.0])["wasserstein_log"]
    )
    with pytest.raises(st.StatisticsError, match="<= 0"):
        st.truth_ratio_distances([0.0, 1.0], [1.0])


def test_noise_ceiling_is_other_retain_seeds_against_the_first():
    seed1 = [math.exp(v) for v in (0, 1, 2)]
    ceiling = st.noise_ceiling(seed1, {"seed2": [math.exp(v) for v in (1, 2, 3)], "seed3": list(seed1)})
    assert ceiling["seeds"]["seed3"]["forget_quality"] == 1.0
    assert ceiling["wasserstein_log"] == {"min": 0.0, "max": pytest.approx(1.0), "mean": pytest.approx(0.5)}
    assert ceiling["forget_quality"]["min"] == pytest.approx(ceiling["seeds"]["seed2"]["forget_quality"])
    with pytest.raises(st.StatisticsError, match="at least one"):
        st.noise_ceiling(seed1, {})


# ----------------------------------------------------------------------------- declared comparisons


def test_compare_paired_holm_over_the_declared_list():
    """Three authors; ReGLU beats GradDiff on each (+0.2, +0.3, +0.1), ties IHL + RILA on one and
    loses on another. Two-sided exact p: all-positive n = 3 gives 2/8; the IHL + RILA
    differences [0, 0.1, -0.2] give |mean| >= 0.1/3 on patterns (0 flips either way): sums
    +-0.1 +-0.2 = 0.3, -0.1, 0.1, -0.3: |.| >= 0.1 on all 4, doubled by the zero's sign: 8/8."""
    values = {
        "reglu": {180: 0.5, 190: 0.6, 191: 0.3},
        "grad_diff": {180: 0.3, 190: 0.3, 191: 0.2},
        "ihl_rila": {180: 0.5, 190: 0.5, 191: 0.5, 192: 0.9},
    }
    rows = st.compare_paired(values, [("reglu", "grad_diff"), ("reglu", "ihl_rila")])
    vs_gd, vs_rila = rows
    assert vs_gd["permutation_p"] == pytest.approx(2 / 8) and vs_gd["difference"] == pytest.approx(0.2)
    assert (vs_gd["wins"], vs_gd["ties"], vs_gd["losses"]) == (3, 0, 0)
    assert vs_rila["permutation_p"] == pytest.approx(1.0) and vs_rila["missing_units"] == [192]
    assert vs_rila["units"] == [180, 190, 191] and (vs_rila["wins"], vs_rila["ties"], vs_rila["losses"]) == (1, 1, 1)
    assert [r["holm_p"] for r in rows] == pytest.approx([0.5, 1.0]) and not any(r["reject"] for r in rows)
    assert vs_gd["interval"]["spread"] is True and vs_gd["m"] == 2
    with pytest.raises(st.StatisticsError, match="no values for vila"):
        st.compare_paired(values, [("reglu", "vila")])
    # a distance (lower is better): the same numbers, wins and losses are the other way round;
    # the difference and the p-values do not change
    distance = st.compare_paired(values, [("reglu", "grad_diff")], lower_is_better=True)[0]
    assert (distance["wins"], distance["ties"], distance["losses"]) == (0, 0, 3)
    assert distance["difference"] == vs_gd["difference"] and distance["permutation_p"] == vs_gd["permutation_p"]


# ----------------------------------------------------------------------------- Model Utility, paired


def test_paired_model_utility_is_the_difference_and_narrower_than_unpaired():
    from unlearn_plugins.benchmarks.tofu.study.report import mu_bootstrap

    target = mu_samples({"retain": 80, "real_authors": 40, "world_facts": 40}, random.Random(0))
    # the unlearned model: the same QA, each probability a little lower
    model = {
        task: [{**r, **({"prob": r["prob"] * 0.97} if "prob" in r else {})} for r in rows]
        for task, rows in target.items()
    }
    got = st.mu_paired_bootstrap(model, target)
    assert got["difference"] == pytest.approx(mu_bootstrap(model)["value"] - mu_bootstrap(target)["value"])
    assert got["low"] <= got["difference"] <= got["high"] < 0
    assert got["width"] < mu_bootstrap(target)["width"] / 3  # the shared QA's sampling error cancels
    same = st.mu_paired_bootstrap(target, target)
    assert same["difference"] == 0 and same["low"] == same["high"] == 0
    shuffled = {task: rows[1:] for task, rows in target.items()}
    with pytest.raises(st.StatisticsError, match="not score the same QA"):
        st.mu_paired_bootstrap(shuffled, target)
