"""The study report's statistics (intervals over seeds, Model Utility's bootstrap over QA) and
the extraction strength a study computes when its evaluation does not run that task."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from support_checks import mu_samples

from unlearn_plugins.benchmarks.tofu import metrics as tm
from unlearn_plugins.benchmarks.tofu.study.report import MU_PARTS, interval, mu_bootstrap


def test_t_interval_over_seeds_cut_to_the_metric_range():
    from scipy.stats import t

    values = [0.2, 0.4, 0.6]
    half = t.ppf(0.975, 2) * 0.2 / math.sqrt(3)
    raw = interval(values, "t")
    assert raw["mean"] == pytest.approx(0.4) and raw["n"] == 3 and raw["values"] == values
    assert (raw["low"], raw["high"]) == pytest.approx((0.4 - half, 0.4 + half))
    cut = interval(values, "t", (0.0, 1.0))
    assert cut["low"] == 0.0 and cut["high"] == pytest.approx(0.4 + half)  # -0.097 is no probability
    assert interval([0.3], "t") == {"mean": 0.3, "low": None, "high": None, "n": 1, "values": [0.3], "spread": None}
    # every seed gave one value: no spread, and no zero-width interval pretending to be one
    flat = interval([0.3, 0.3, 0.3], "t")
    assert flat["spread"] is False and flat["low"] is None and flat["high"] is None and flat["mean"] == 0.3
    assert raw["spread"] is True and interval([0.3, 0.3], "bootstrap")["low"] is None
    assert interval([None, float("nan")], "t")["mean"] is None


def test_bootstrap_interval_over_seeds():
    values = [0.1, 0.3, 0.5, 0.7]
    boot = interval(values, "bootstrap")
    assert boot["mean"] == pytest.approx(0.4)
    assert 0.1 <= boot["low"] < 0.4 < boot["high"] <= 0.7  # percentile: within the seeds' range
    assert boot == interval(values, "bootstrap")  # fixed random state


def _samples(n: dict[str, int], seed: int = 0) -> dict[str, list[dict]]:
    """Per-QA values of the nine Model Utility parts, each task's rows in reverse order (order in
    the file must not matter)."""
    rows = mu_samples(n, random.Random(seed))
    for task_rows in rows.values():
        task_rows.reverse()
    return rows


def test_model_utility_bootstrap_matches_tofu_and_narrows_with_more_qa():
    samples = _samples({"retain": 60, "real_authors": 30, "world_facts": 40})
    metrics: dict[str, dict] = {}
    for parts in MU_PARTS.values():
        for task, metric in parts:
            values = [r[metric] for r in samples[task]]
            agg = tm.true_better_truth_ratio(values) if metric == "truth_ratio" else sum(values) / len(values)
            metrics.setdefault(task, {})[metric] = agg
    expected, _, missing = tm.model_utility(metrics)
    assert not missing
    small = mu_bootstrap(samples)
    assert small["value"] == pytest.approx(expected)
    assert small["low"] < expected < small["high"] and small["qa"] == {
        "retain": 60,
        "real_authors": 30,
        "world_facts": 40,
    }
    large = mu_bootstrap(_samples({"retain": 960, "real_authors": 480, "world_facts": 640}))
    assert large["width"] < 0.5 * small["width"]  # 16x the QA: about a quarter of the width
    assert mu_bootstrap({"tofu_retain_prob": []}) is None


class _Echo:
    """A stand-in causal LM whose greedy prediction is the next input token only at the last
    ``m`` positions of each row (so exactly the last ``m`` answer tokens are 'extracted')."""

    def __init__(self, m: int, vocab: int):
        import torch

        self.m, self.vocab = m, vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def parameters(self):
        return iter([self.weight])

    def __call__(self, input_ids, attention_mask):
        import torch

        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.vocab)
        for b in range(batch):
            n = int(attention_mask[b].sum())
            for pos in range(n - 1):
                nxt = int(input_ids[b, pos + 1])
                right = pos + 1 >= n - self.m
                logits[b, pos, nxt if right else (nxt + 1) % self.vocab] = 1.0
        return type("Output", (), {"logits": logits})()


@pytest.mark.parametrize("m", [0, 3, 10_000])
def test_extraction_strength_of_a_study_without_the_task(monkeypatch, tmp_path, tiny_tokenizer, m):
    from unlearn_plugins import models
    from unlearn_plugins.benchmarks.tofu.study.cells import extraction_strengths
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.data.synthetic import generate_authors
    from unlearn_plugins.files import write_jsonl

    data = tmp_path / "forget.json"
    write_jsonl(data, generate_authors(1)[:6])
    monkeypatch.setattr(models, "load_model", lambda *a, **k: (_Echo(m, len(tiny_tokenizer)), tiny_tokenizer))
    got = extraction_strengths("model", None, str(data), 128, "cpu", batch_size=4)
    answers = [
        sum(1 for y in e["labels"] if y != -100)
        for e in encode_samples(tiny_tokenizer, load_split(str(data)), max_length=128)
    ]
    # open-unlearning's extraction strength drops the last label (the end token): of the n - 1 kept,
    # the last m - 1 are predicted right, so 1 - k/(n-1) with k = n - 1 - min(m - 1, n - 1)
    assert got == pytest.approx([min(max(m - 1, 0), n - 1) / (n - 1) for n in answers])


def _group(method: str, values: list[float]) -> dict:
    return {"method": method, "label": method.upper(), "metrics": {"forget_quality": interval(values, "t")}}


def test_the_leader_is_tested_against_every_other_method():
    """One-sided p-values of "the method with the highest mean is better": the permutation test
    against every split of the pooled seeds counted by hand, Holm over the rivals, Welch's
    t-test against scipy's where both sides vary and none against a group with no spread."""
    import itertools

    from scipy import stats

    from unlearn_plugins.benchmarks.tofu.study.report import leader_tests

    a, b, c = [0.571, 0.571, 0.336], [0.175, 0.336, 0.175], [0.175, 0.175, 0.175]
    test = leader_tests([_group("b", b), _group("a", a), _group("c", c), _group("empty", [])])
    assert test["leader"] == "a" and [r["method"] for r in test["against"]] == ["b", "c"]
    for row, other in zip(test["against"], (b, c)):
        pooled, observed = a + other, sum(a) / 3 - sum(other) / 3
        splits = list(itertools.combinations(range(6), 3))
        diffs = [sum(pooled[i] for i in s) / 3 - sum(pooled[i] for i in range(6) if i not in s) / 3 for s in splits]
        assert row["permutation_p"] == pytest.approx(sum(d >= observed - 1e-12 for d in diffs) / len(splits))
        assert row["difference"] == pytest.approx(observed) and row["n"] == [3, 3]
    want = stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    assert test["against"][0]["welch_p"] == pytest.approx(want)
    assert test["against"][1]["welch_p"] is None  # c's seeds all gave 0.175: its Welch p is an artifact
    assert test["against"][0]["permutation_p"] == pytest.approx(2 / 20)  # the tie at 0.336 counts
    assert test["against"][1]["permutation_p"] == pytest.approx(1 / 20)
    # Holm over the 2 rivals: 1/20 x 2 = 0.1, then max(0.1, 2/20 x 1) = 0.1
    assert [r["holm_p"] for r in test["against"]] == pytest.approx([0.1, 0.1])
    assert test["post_hoc"] is True and test["correction"] == "Holm over the 2 comparisons"
    # no spread on either side: Welch's t is undefined, the permutation test still answers
    flat = leader_tests([_group("x", [0.5, 0.5, 0.5]), _group("y", [0.1, 0.1, 0.1])])
    assert flat["against"][0]["welch_p"] is None and flat["against"][0]["permutation_p"] == pytest.approx(1 / 20)
    # a leader with no spread against a rival that varies: still no Welch p
    lone = leader_tests([_group("x", [0.571, 0.571, 0.571]), _group("y", [0.175, 0.175, 0.081])])
    assert lone["against"][0]["welch_p"] is None and lone["against"][0]["holm_p"] == pytest.approx(1 / 20)
    assert leader_tests([_group("x", [0.5]), _group("y", [0.1, 0.2])]) is None  # one seed: nothing to test
    assert leader_tests([_group("x", [0.5, 0.6])]) is None


def test_a_named_method_is_tested_against_every_other_method_whatever_its_rank():
    """A paper's claim ("ReGLU forgets best") is tested for that method even where it is not
    the leader: its p-values are then large, not the leader's small ones."""
    from unlearn_plugins.benchmarks.tofu.study.report import leader_tests

    a, b, c = [0.571, 0.571, 0.336], [0.175, 0.336, 0.175], [0.175, 0.175, 0.175]
    groups = [_group("a", a), _group("b", b), _group("c", c)]
    test = leader_tests(groups, method="b")
    assert test["leader"] == "b" and [r["method"] for r in test["against"]] == ["a", "c"]
    vs_a, vs_c = test["against"]
    assert vs_a["difference"] < 0 and vs_a["permutation_p"] > 0.5  # b is not above a
    assert vs_c["difference"] > 0 and vs_c["permutation_p"] == pytest.approx(
        10 / 20
    )  # 0.336 on b's side: 10 of 20 splits
    assert leader_tests(groups, method="absent") is None
    assert test["post_hoc"] is False  # named before the results: not picked after the fact


def test_tied_groups_print_no_spread_not_an_interval():
    """summary.md and the terminal table: a method whose seeds all gave one value reads "no
    spread"; the ranking line does not compare intervals it does not have; the leader table
    has a Holm column and says no spread where Welch's t is refused."""
    from unlearn_plugins.benchmarks.tofu.study.report import _ci_text, _leader_lines, _ranking, leader_tests

    flat, varied = interval([0.571, 0.571, 0.571], "t"), interval([0.175, 0.336, 0.175], "t")
    assert _ci_text(flat, "") == "0.571 (no spread)" and "[" not in _ci_text(flat, "")
    assert _ci_text(varied, "").startswith("0.229 [")
    groups = [
        {"method": m, "label": m.upper(), "forget": 1, "metrics": {"forget_quality": fq, "model_utility": mu}}
        for m, fq, mu in (
            ("rila", flat, interval([0.36, 0.355, 0.357], "t")),
            ("reglu", flat, interval([0.368, 0.348, 0.349], "t")),
            ("ihl", varied, interval([0.35, 0.35, 0.35], "t")),
        )
    ]
    refs = [{"name": "full", "forget": 1, "model_utility": 0.356}]
    line = " ".join(_ranking(groups, refs, 1))
    assert "Highest mean Forget Quality: RILA (0.571 (no spread)); tied with REGLU (0.571 (no spread))" in line
    assert "overlaps" not in line and "lies above" not in line
    alone = " ".join(_ranking([groups[0], groups[2]], refs, 1))
    assert "; next: IHL (0.229 [" in alone
    table = "\n".join(_leader_lines(leader_tests(groups)))
    assert "| RILA vs | difference in mean | permutation p | Holm p | Welch p | smallest possible p |" in table
    assert "| IHL | +0.342 | 0.050 | 0.100 | n/a (no spread) | 0.050 |" in table
    assert "picked after seeing the results" in table


def test_the_committed_reglu_tofu_report_has_no_zero_width_interval():
    """docs/study/reglu_tofu/summary.md as regenerated from bench/results/reglu_tofu: every
    interval it prints has a width; the groups whose seeds agreed say "no spread"."""
    import re

    summary = (Path(__file__).resolve().parents[1] / "docs" / "study" / "reglu_tofu" / "summary.md").read_text()
    intervals = re.findall(r"\[([-0-9.e]+), ([-0-9.e]+)\]", summary)
    assert intervals and all(low != high for low, high in intervals), [i for i in intervals if i[0] == i[1]]
    assert "| IHL + RILA | 3/3 | 0.571 (no spread) |" in summary
    assert "Holm p" in summary and "n/a (no spread)" in summary


def test_reglu_claim_holds_only_against_every_near_target_rival(tmp_path):
    """bench/reglu_claim.py: the claim holds where the claimant's utility is near the target's
    and its Forget Quality beats every near-target method's (a far-from-target method may beat
    it); it fails where a near-target rival is as good."""
    import json
    import subprocess
    import sys

    def group(method, fq, mu, forget):
        return {
            "method": method,
            "label": method.upper(),
            "forget": forget,
            "metrics": {"forget_quality": interval(fq, "t"), "model_utility": interval(mu, "t")},
        }

    near, low = [0.35, 0.36, 0.355], [0.20, 0.21, 0.22]
    data = {
        "references": [{"name": "full", "forget": f, "model_utility": 0.356} for f in (1, 2)],
        "groups": [
            group("reglu", [0.8, 0.9, 0.85], near, 1),
            group("ihl", [0.1, 0.2, 0.15], near, 1),
            group("vila", [0.95, 0.99, 0.97], low, 1),  # better, but far below the target's utility
            group("reglu", [0.3, 0.4, 0.35], near, 2),
            group("ihl_rila", [0.3, 0.45, 0.35], near, 2),  # as good: no claim
        ],
    }
    path = tmp_path / "study.json"
    path.write_text(json.dumps(data))
    bench = Path(__file__).resolve().parents[1] / "bench" / "reglu_claim.py"
    proc = subprocess.run([sys.executable, str(bench), str(path)], capture_output=True, text=True, check=True)
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["claim_holds"] == {"1": True, "2": False}
    assert "| VILA | -0.120 |" in proc.stdout and "| no |" in proc.stdout
    missing = subprocess.run(
        [sys.executable, str(bench), str(path), "--method", "rila"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no method 'rila'" in missing.stderr and not missing.stdout
