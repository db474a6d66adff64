"""TOFU metric functions against hand computations, and retain-reference files."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import ks_2samp

from unlearn_plugins.benchmarks.tofu import metrics as tm
from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation.reference import read_reference, sample_key, write_reference


def test_probability_is_exp_of_mean_token_nll():
    # answer of 4 tokens with summed log-likelihood -2.0 -> mean NLL 0.5
    assert tm.mean_nll(-2.0, 4) == 0.5
    assert tm.probability(0.5) == pytest.approx(math.exp(-0.5))
    with pytest.raises(ValueError):
        tm.mean_nll(-1.0, 0)


def test_truth_ratio_is_mean_wrong_over_correct_in_log_space():
    # correct mean NLL 1.0; wrong 2.0 and 3.0 -> exp(-2.5) / exp(-1.0)
    assert tm.truth_ratio(1.0, [2.0, 3.0]) == pytest.approx(math.exp(-1.5))
    # model indifferent between true and false -> 1
    assert tm.truth_ratio(0.7, [0.7, 0.7, 0.7]) == pytest.approx(1.0)


def test_truth_ratio_aggregates():
    assert tm.forget_truth_ratio([0.5, 2.0, 1.0]) == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert tm.true_better_truth_ratio([0.5, 2.0]) == pytest.approx((0.5 + 0.0) / 2)


def test_probability_with_options_normalises_length_normalised_probabilities():
    # p_true = 1, wrong = 1/2 and 1/4 -> 1 / 1.75
    assert tm.probability_with_options(0.0, [math.log(2), math.log(4)]) == pytest.approx(4 / 7)


def test_rouge_recall_uses_stemming():
    scores = tm.rouge_recall("the cat sat", "the cat sat on the mat")
    assert scores["rougeL_recall"] == pytest.approx(3 / 6)
    stemmed = tm.rouge_recall("running dogs", "dog runs")  # run/dog after Porter stemming
    assert stemmed["rouge1_recall"] == pytest.approx(1.0)
    assert stemmed["rougeL_recall"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "preds, labels, k",
    [([1, 2, 3, 4], [9, 2, 3, 4], 1), ([1, 2, 3], [1, 2, 3], 0), ([1, 2, 3], [1, 2, 9], 3), ([5], [5], 0)],
)
def test_first_matching_suffix_and_extraction_strength(preds, labels, k):
    assert tm.first_matching_suffix(preds, labels) == k
    assert tm.extraction_strength(k, len(labels)) == pytest.approx(1 - k / len(labels))


def test_extraction_strength_rejects_bad_arguments():
    with pytest.raises(ValueError):
        tm.extraction_strength(5, 4)
    with pytest.raises(ValueError):
        tm.first_matching_suffix([1, 2], [1])


def test_forget_quality_is_the_ks_pvalue():
    a = [0.1, 0.4, 0.35, 0.8, 0.9, 0.05]
    b = [0.6, 0.7, 0.95, 1.2, 0.65, 0.99]
    assert tm.forget_quality(a, b) == ks_2samp(a, b).pvalue
    assert tm.forget_quality(a, a) == 1.0


def test_model_utility_is_the_harmonic_mean_of_nine_parts():
    metrics: dict[str, dict[str, float]] = {}
    values = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    for (task, metric), v in zip(tm.MODEL_UTILITY_PARTS, values):
        metrics.setdefault(task, {})[metric] = v
    value, parts, missing = tm.model_utility(metrics)
    assert not missing and len(parts) == 9
    assert value == pytest.approx(9 / sum(1 / v for v in values))
    del metrics["tofu_world_facts"]
    value, parts, missing = tm.model_utility(metrics)
    assert value is None and missing == ["tofu_world_facts/prob", "tofu_world_facts/truth_ratio"]
    assert tm.harmonic_mean([1.0, 0.0]) == 0.0


def test_reference_round_trip_and_checks(tmp_path):
    keys = [sample_key(f"q{i}", f"a{i}") for i in range(4)]
    path = tmp_path / "ref.json"
    write_reference(
        path,
        task="tofu_forget01_truth_ratio",
        split="forget01_perturbed",
        keys=keys[:3],
        truth_ratios=[0.5, 1.0, 2.0],
        model="m",
    )
    ref = read_reference(path)
    assert ref.keys == tuple(keys[:3]) and ref.truth_ratios == (0.5, 1.0, 2.0)
    assert ref.matches_split(keys) and not ref.matches_split(keys[1:])
    ref.check_evaluated(keys[:3], task="t", split="s")
    with pytest.raises(DataError, match="has 3 samples but t evaluated 4 .*--limit"):
        ref.check_evaluated(keys, task="t", split="s")
    with pytest.raises(DataError, match="was made on split 'forget01_perturbed'"):
        ref.check_evaluated([sample_key("x", "y")] * 3, task="t", split="other")


def test_malformed_reference_names_file_and_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {
                "format": "unlearn-plugins/tofu-retain-reference",
                "version": 1,
                "task": "t",
                "split": "s",
                "samples": [{"key": "k", "truth_ratio": "high"}],
            }
        )
    )
    with pytest.raises(DataError, match=r"bad\.json: samples\[0\]: field 'truth_ratio'"):
        read_reference(path)
    path.write_text("{not json")
    with pytest.raises(DataError, match=r"bad\.json: not valid JSON"):
        read_reference(path)
