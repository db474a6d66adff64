"""The operating-point rule on synthetic sweep traces: the best Forget Quality among
the points whose paired Model Utility is at most 0.02 below the target's, ties broken as
written down, a clear answer when nothing qualifies, and pending points while Model Utility is
still missing."""

from __future__ import annotations

import pytest

from unlearn_plugins.benchmarks.tofu.study.operating_point import (
    OperatingPointError,
    Rule,
    check_trace,
    choose,
    choose_all,
    next_to_evaluate,
)

LRS = (1e-4, 3e-4, 1e-3)


def sweep(fq, mu) -> list[dict]:
    """A trace over 3 learning rates x 10 epochs: ``fq(lr, epoch)``, ``mu(lr, epoch)``."""
    return [
        {"lr": lr, "epoch": e, "forget_quality": fq(lr, e), "model_utility_diff": mu(lr, e)}
        for lr in LRS
        for e in range(1, 11)
    ]


def test_the_rule_picks_the_best_forget_quality_within_the_utility_band():
    """Forgetting grows with x = lr x epochs / 1e-4 and so does the utility lost, 0.004 x x. The
    band (>= -0.02) admits x <= 5: lr 1e-4 up to epoch 5 and lr 3e-4 at epoch 1 (x = 3), not lr
    1e-3 (x >= 10). Forget Quality saturates at 0.571 from x = 3, so lr 1e-4 epochs 3, 4, 5 and
    lr 3e-4 epoch 1 tie; no Wasserstein distance; the most utility kept, -0.012, is a tie of lr
    1e-4 epoch 3 and lr 3e-4 epoch 1; fewer epochs win: lr 3e-4, epoch 1."""
    levels = [0.034, 0.081, 0.175, 0.571]

    def fq(lr, e):
        return levels[min(round(lr * e / 1e-4), 3)]

    def mu(lr, e):
        return -0.004 * round(lr * e / 1e-4)

    trace = sweep(fq, mu)
    result = choose(trace)
    assert result["qualified"] and result["final"] and result["pending"] == []
    assert (result["chosen"]["lr"], result["chosen"]["epoch"]) == (3e-4, 1)
    assert result["use"] is result["chosen"] and result["qualifying"] == 6 and result["points"] == 30
    assert result["chosen"]["index"] == 10  # its position in the trace
    assert "lr 0.0003, epoch 1: Forget Quality 0.571" in result["reason"] and "6 of 30" in result["reason"]
    assert result["rule"]["tolerance"] == 0.02 and "at most 0.02 below" in result["rule"]["text"]
    # a looser band admits lr 1e-3 at epoch 1 (-0.04) too: the same Forget Quality, more utility lost
    loose = choose(trace, Rule(tolerance=0.05))
    assert (loose["chosen"]["lr"], loose["chosen"]["epoch"]) == (3e-4, 1)


def test_ties_are_broken_in_the_written_order():
    base = {"forget_quality": 0.571}
    # 1. Forget Quality first, even against a smaller Wasserstein distance
    t = [{**base, "lr": 1e-4, "epoch": 2, "model_utility_diff": 0.0, "wasserstein_log": 0.1},
         {"lr": 1e-4, "epoch": 3, "forget_quality": 0.832, "model_utility_diff": -0.01, "wasserstein_log": 0.5}]  # fmt: skip
    assert choose(t)["chosen"]["epoch"] == 3
    # 2. the smaller Wasserstein distance (a point without one ranks after one with it)
    t = [{**base, "lr": 1e-4, "epoch": 1, "model_utility_diff": 0.0},
         {**base, "lr": 1e-4, "epoch": 2, "model_utility_diff": -0.01, "wasserstein_log": 0.30},
         {**base, "lr": 1e-4, "epoch": 3, "model_utility_diff": -0.01, "wasserstein_log": 0.20}]  # fmt: skip
    assert choose(t)["chosen"]["epoch"] == 3
    # 3. the higher utility difference
    t = [{**base, "lr": 1e-4, "epoch": 1, "model_utility_diff": -0.015, "wasserstein_log": 0.2},
         {**base, "lr": 1e-4, "epoch": 2, "model_utility_diff": 0.005, "wasserstein_log": 0.2}]  # fmt: skip
    assert choose(t)["chosen"]["epoch"] == 2
    # 4. fewer epochs, 5. the smaller lr, 6. the trace's order
    t = [{**base, "lr": 1e-3, "epoch": 2, "model_utility_diff": 0.0},
         {**base, "lr": 1e-3, "epoch": 1, "model_utility_diff": 0.0},
         {**base, "lr": 3e-4, "epoch": 1, "model_utility_diff": 0.0}]  # fmt: skip
    assert (choose(t)["chosen"]["lr"], choose(t)["chosen"]["epoch"]) == (3e-4, 1)
    t = [{**base, "lr": 1e-4, "epoch": 1, "rol_weight": 0.5, "model_utility_diff": 0.0},
         {**base, "lr": 1e-4, "epoch": 1, "rol_weight": 0.1, "model_utility_diff": 0.0}]  # fmt: skip
    assert choose(t)["chosen"]["rol_weight"] == 0.5


def test_when_no_point_qualifies_the_result_says_so():
    trace = sweep(lambda lr, e: 0.571, lambda lr, e: -0.03 - 0.01 * e - lr)
    result = choose(trace)
    assert result["chosen"] is None and result["qualified"] is False and result["qualifying"] == 0
    assert "no point qualifies" in result["reason"] and "more than 0.02 below" in result["reason"]
    assert "best: -0.040" in result["reason"]
    # what the study runs instead: the point that loses the least utility, flagged
    assert (result["use"]["lr"], result["use"]["epoch"]) == (1e-4, 1)
    assert choose(trace, Rule(on_none="exclude"))["use"] is None
    empty = choose([])
    assert empty["chosen"] is None and empty["use"] is None and empty["reason"] == "the trace is empty"


def test_band_both_also_excludes_utility_far_above_the_target():
    trace = [
        {"lr": 1e-4, "epoch": 1, "forget_quality": 0.832, "model_utility_diff": 0.03},
        {"lr": 1e-4, "epoch": 2, "forget_quality": 0.336, "model_utility_diff": 0.01},
    ]
    assert choose(trace)["chosen"]["epoch"] == 1  # "below": utility above the target's is no loss
    assert choose(trace, Rule(band="both"))["chosen"]["epoch"] == 2


def test_points_without_model_utility_are_pending_until_evaluated():
    """The cheap trace has Forget Quality at every epoch; Model Utility is a full evaluation.
    A point that could still beat the choice keeps it provisional, and next_to_evaluate names
    the best-ranked one."""
    trace = [
        {"lr": 1e-4, "epoch": 1, "forget_quality": 0.175, "model_utility_diff": -0.005},
        {"lr": 1e-4, "epoch": 2, "forget_quality": 0.571, "model_utility_diff": None},
        {"lr": 1e-4, "epoch": 3, "forget_quality": 0.832},
        {"lr": 1e-4, "epoch": 4, "forget_quality": 0.081},
    ]
    first = choose(trace)
    assert first["chosen"]["epoch"] == 1 and not first["final"]
    assert [p["epoch"] for p in first["pending"]] == [3, 2]  # epoch 4 cannot beat 0.175
    assert next_to_evaluate(trace)["epoch"] == 3
    trace[2]["model_utility_diff"] = -0.05  # too much utility lost
    assert next_to_evaluate(trace)["epoch"] == 2
    trace[1]["model_utility_diff"] = -0.01
    final = choose(trace)
    assert final["final"] and final["chosen"]["epoch"] == 2 and next_to_evaluate(trace) is None
    nothing = choose([{"lr": 1e-4, "epoch": 1, "forget_quality": 0.5}])
    assert nothing["chosen"] is None and nothing["use"] is None and not nothing["final"]
    assert nothing["reason"] == "no point has a Model Utility evaluation yet"


def test_bad_traces_and_rules_are_refused():
    good = {"lr": 1e-4, "epoch": 1, "forget_quality": 0.5, "model_utility_diff": 0.0}
    for bad, match in (
        ({**good, "lr": 0}, "lr must be > 0"),
        ({**good, "epoch": 0}, "epoch must be >= 1"),
        ({**good, "forget_quality": 1.5}, "forget_quality must be <= 1"),
        ({**good, "forget_quality": None}, "forget_quality must be a finite number"),
        ({**good, "model_utility_diff": float("nan")}, "model_utility_diff must be a finite number"),
        ({**good, "wasserstein_log": -1}, "wasserstein_log must be >= 0"),
    ):
        with pytest.raises(OperatingPointError, match=match):
            check_trace([bad])
    with pytest.raises(OperatingPointError, match="the same setting and epoch twice"):
        check_trace([good, {**good, "forget_quality": 0.7}])
    check_trace([good, {**good, "rol_weight": 0.1}])  # another setting
    with pytest.raises(OperatingPointError, match="unknown key"):
        Rule.from_mapping({"tolerance": 0.02, "metric": "fq"})
    with pytest.raises(OperatingPointError, match="band"):
        Rule(band="above")
    with pytest.raises(OperatingPointError, match="tolerance"):
        Rule(tolerance=-0.1)
    assert Rule.from_mapping({"tolerance": 0.05, "band": "both"}) == Rule(0.05, "both")


def test_every_method_gets_its_own_point():
    traces = {
        "ihl": [{"lr": 1e-4, "epoch": 1, "forget_quality": 0.1, "model_utility_diff": 0.0}],
        "reglu": [{"lr": 3e-4, "epoch": 2, "forget_quality": 0.5, "model_utility_diff": -0.01}],
    }
    got = choose_all(traces)
    assert got["ihl"]["chosen"]["lr"] == 1e-4 and got["reglu"]["chosen"]["epoch"] == 2
