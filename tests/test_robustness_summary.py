"""The attack-aware summary of `unlearn eval --robustness` and the tables `unlearn demo
--robustness` and bench/really_forgotten.py build from it: every probe and attack lands in its metric's row, the worst case is the highest
forget value, relearn carries the plain value on the samples it was measured on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from unlearn_plugins.evaluation import really_forgotten
from unlearn_plugins.evaluation.robustness import robustness_summary


def evaluation(metrics: dict, samples: dict | None = None):
    return SimpleNamespace(summary={"metrics": metrics}, samples=samples or {})


def rows(task: str, metric: str, values: dict) -> list[dict]:
    return [{"doc": {"key": key}, metric: value} for key, value in values.items()]


@pytest.fixture
def summary():
    plain = evaluation(
        {
            "tofu_forget_prob": {"prob": 0.30},
            "tofu_forget_rouge": {"rougeL_recall": 0.40},
            "tofu_forget_paraphrase_prob": {"prob": 0.25},
            "tofu_forget_paraphrase_rouge": {"rougeL_recall": 0.45},
            "tofu_forget_format_prob": {"prob": 0.20},
            "tofu_forget_format_rouge": {"rougeL_recall": 0.35},
        },
        {
            "tofu_forget_prob": rows("tofu_forget_prob", "prob", {"a": 0.1, "b": 0.3, "c": 0.5}),
            "tofu_forget_rouge": rows("tofu_forget_rouge", "rougeL_recall", {"a": 0.2, "b": 0.4, "c": 0.6}),
        },
    )
    relearned = evaluation(
        {"tofu_forget_prob": {"prob": 0.70}, "tofu_forget_rouge": {"rougeL_recall": 0.42}},
        {
            "tofu_forget_prob": rows("tofu_forget_prob", "prob", {"b": 0.6, "c": 0.8}),
            "tofu_forget_rouge": rows("tofu_forget_rouge", "rougeL_recall", {"b": 0.4, "c": 0.44}),
        },
    )
    quantized = evaluation({"tofu_forget_prob": {"prob": 0.28}, "tofu_forget_rouge": {"rougeL_recall": 0.39}})
    attacked = {
        "relearn": (relearned, {"attack": {"options": {"steps": 10}}, "measure_split": "measure.json"}),
        "quantize": (quantized, {"attack": {"options": {"bits": 4}}}),
    }
    return robustness_summary(plain, attacked)


def test_the_worst_case_is_the_highest_forget_value_over_probes_and_attacks(summary):
    prob, rouge = summary["metrics"]["prob"], summary["metrics"]["rougeL_recall"]
    assert prob["plain"] == 0.30 and rouge["plain"] == 0.40
    assert prob["worst"] == {"attack": "relearn", "value": 0.70, "above_plain": pytest.approx(0.40)}
    assert rouge["worst"]["attack"] == "paraphrase" and rouge["worst"]["value"] == 0.45
    # relearn is measured on the held-back samples (b, c): the plain model's mean on the same two
    assert prob["attacks"]["relearn"]["samples"] == 2
    assert prob["attacks"]["relearn"]["plain_same_samples"] == pytest.approx(0.4)
    assert prob["attacks"]["quantize"] == {"value": 0.28, "kind": "attack", "options": {"bits": 4}}


def test_the_really_forgotten_table_reads_every_robustness_figure(summary, tmp_path):
    bench = really_forgotten
    mia = {"privleak": -12.5, "exact_memorization": 0.6, "attacks": {"loss": {"auc": 0.9}}}
    row = bench.row("GradDiff", {"mia": mia, "robustness": summary})
    assert row["prob:plain"] == 0.30 and row["prob:relearn"] == 0.70 and row["prob:quantize"] == 0.28
    assert row["prob:relearn:plain_same_samples"] == pytest.approx(0.4)
    assert row["rougeL_recall:paraphrase"] == 0.45 and row["rougeL_recall:worst_attack"] == "paraphrase"
    assert row["auc_loss"] == 0.9 and row["auc_zlib"] is None
    text = bench.table([row])
    assert "| GradDiff | 0.300 | 0.250 | 0.200 | 0.700 (plain 0.400) | 0.280 | 0.700 (relearn) |" in text
    assert "| GradDiff | -12.500 | 0.600 | 0.900 | n/a |" in text
    bench.plot_under_attack([row], tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
