"""open-unlearning's evaluation logs, on logs written by this project: `unlearn eval
--open-unlearning-log` writes TOFU_EVAL.json whose metrics, fed to open-unlearning's own
aggregators (transcribed below), give our Forget Quality and Model Utility; `unlearn logs
reference` turns a retain model's TOFU_EVAL.json back into the reference `--save-reference`
writes; `unlearn logs show` reads both files; bad logs get one line naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from unlearn_plugins.evaluation import open_unlearning as ou

#: the files tofu_forget01's tasks read, cut to their first rows so a reference covers the split
SPLIT_FILES = ("forget01.json", "forget01_perturbed.json", "retain_perturbed.json")
OTHER_FILES = ("real_authors_perturbed.json", "world_facts_perturbed.json")
ROWS = 4


def cli(*argv) -> int:
    from unlearn_plugins.cli import main

    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def small_tofu(tofu_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tofu-small")
    for name in SPLIT_FILES + OTHER_FILES:
        lines = (Path(tofu_dir) / name).read_text(encoding="utf-8").splitlines()
        (folder / name).write_text("\n".join(lines[:ROWS]) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def other_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with its weights moved a little: a second model whose truth ratios differ."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * p.std() * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("tiny-other")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def evaluations(tiny_model_dir, other_model_dir, small_tofu, tmp_path_factory):
    """A retain evaluation (with --save-reference) and a model's evaluation against it, both
    with --open-unlearning-log."""
    root = tmp_path_factory.mktemp("ou-evals")
    common = ["--tofu-dir", small_tofu, "--tasks", "tofu_forget01", "--max-gen-toks", 8, "--batch-size", 4]
    ref = root / "ref.json"
    assert cli("eval", "--model", other_model_dir, *common, "--save-reference", ref,
               "--out", root / "retain", "--open-unlearning-log") == 0  # fmt: skip
    assert cli("eval", "--model", tiny_model_dir, *common, "--retain-reference", ref,
               "--out", root / "model", "--open-unlearning-log") == 0  # fmt: skip
    return root


def _scores(log: dict, name: str) -> list[float]:
    return [v["score"] for v in log[name]["value_by_index"].values()]


def test_written_log_gives_our_forget_quality_and_model_utility_by_open_unlearnings_formulas(evaluations):
    from scipy.stats import hmean, ks_2samp

    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    model = json.loads((evaluations / "model" / "TOFU_EVAL.json").read_text())
    retain = json.loads((evaluations / "retain" / "TOFU_EVAL.json").read_text())
    summary = read_outputs(evaluations / "model").summary
    ours_fq = summary["forget_quality"]["tofu_forget01_truth_ratio"]["value"]
    # open-unlearning src/evals/metrics/privacy.py ks_test: ks_2samp(forget scores, retain_model_logs scores).pvalue,
    # the retain scores read from the retain log's 'forget_truth_ratio' (configs/eval/tofu_metrics/forget_quality.yaml)
    theirs_fq = ks_2samp(_scores(model, "forget_truth_ratio"), _scores(retain, "forget_truth_ratio")).pvalue
    assert ours_fq is not None and abs(theirs_fq - ours_fq) < 1e-12
    assert model["forget_quality"]["agg_value"] == pytest.approx(ours_fq, abs=1e-12)
    # open-unlearning src/evals/metrics/utility.py hm_aggregate: hmean of the 9 pre_compute agg_values
    # listed in configs/eval/tofu_metrics/model_utility.yaml
    parts = ["retain_Q_A_Prob", "retain_Q_A_ROUGE", "retain_Truth_Ratio", "ra_Q_A_Prob_normalised", "ra_Q_A_ROUGE",
             "ra_Truth_Ratio", "wf_Q_A_Prob_normalised", "wf_Q_A_ROUGE", "wf_Truth_Ratio"]  # fmt: skip
    theirs_mu = hmean([model[p]["agg_value"] for p in parts])
    assert theirs_mu == pytest.approx(summary["model_utility"]["value"], abs=1e-12)
    # src/evals/metrics/memorization.py truth_ratio, aggregator closer_to_1_better: mean(min(tr, 1/(tr + 1e-10)))
    trs = _scores(model, "forget_Truth_Ratio")
    assert len(trs) == ROWS
    closer = sum(min(t, 1 / (t + 1e-10)) for t in trs) / len(trs)
    assert model["forget_Truth_Ratio"]["agg_value"] == pytest.approx(closer, abs=1e-8)
    # true_better on retain: mean(max(0, 1 - tr))
    rtrs = _scores(model, "retain_Truth_Ratio")
    assert model["retain_Truth_Ratio"]["agg_value"] == pytest.approx(sum(max(0, 1 - t) for t in rtrs) / len(rtrs))
    probs = [v["prob"] for v in model["forget_Q_A_Prob"]["value_by_index"].values()]
    assert model["forget_Q_A_Prob"]["agg_value"] == pytest.approx(sum(probs) / len(probs), abs=1e-12)
    summary_file = json.loads((evaluations / "model" / "TOFU_SUMMARY.json").read_text())
    assert summary_file == {k: v["agg_value"] for k, v in model.items()}


def test_open_unlearning_retain_log_becomes_the_same_reference_as_save_reference(evaluations, small_tofu, tmp_path):
    from unlearn_plugins.evaluation.reference import read_reference

    out = tmp_path / "from_log.json"
    log = evaluations / "retain" / "TOFU_EVAL.json"
    assert cli("logs", "reference", log, "--split", "forget01", "--tofu-dir", small_tofu, "--out", out) == 0
    made, saved = read_reference(out), read_reference(evaluations / "ref.json")
    assert (made.task, made.split, made.keys) == (saved.task, saved.split, saved.keys)
    assert made.truth_ratios == pytest.approx(saved.truth_ratios, abs=1e-12)


def test_show_reads_eval_and_summary_logs(evaluations, capsys):
    capsys.readouterr()
    assert cli("logs", "show", evaluations / "model" / "TOFU_SUMMARY.json") == 0
    shown = capsys.readouterr().out
    model = json.loads((evaluations / "model" / "TOFU_EVAL.json").read_text())
    assert "forget_quality" in shown and f"{model['model_utility']['agg_value']:.4f}" in shown
    assert f"{model['forget_Q_A_Prob']['agg_value']:.4f}" in shown


def test_export_writes_the_same_log_again_and_log_files_from_open_unlearning_read_back(evaluations, tmp_path):
    again = tmp_path / "again"
    assert cli("logs", "export", evaluations / "model", "--out", again) == 0
    first = json.loads((evaluations / "model" / "TOFU_EVAL.json").read_text())
    assert json.loads((again / "TOFU_EVAL.json").read_text()) == first
    # a log as open-unlearning names it in its output folder, with metrics this project does not compute
    theirs = tmp_path / "saves" / "TOFU_EVAL.json"
    theirs.parent.mkdir()
    theirs.write_text(json.dumps({**first, "mia_min_k": {"agg_value": 0.4}}))
    benchmark, log = ou.read_open_unlearning(theirs)
    assert benchmark == "TOFU" and log["forget_quality"] == first["forget_quality"]
    assert "not computed by this project" in ou.format_log(theirs, benchmark, log)


def test_muse_results_map_to_muse_eval(tmp_path):
    samples = tmp_path / "s.jsonl"
    samples.write_text('{"doc_id": 1, "rougeL_f1": 0.5}\n{"doc_id": 0, "rougeL_f1": 0.25}\n')
    results = {
        "results": {
            "muse_news_verbmem": {"rougeL_f1,none": 0.375},
            "muse_news_privleak": {"auc_min_k,none": 0.6, "privleak,none": -20.0},
        }
    }
    logs = ou.to_open_unlearning(results, {}, {"muse_news_verbmem": samples})
    assert set(logs) == {"MUSE"}
    assert logs["MUSE"]["forget_verbmem_ROUGE"] == {
        "agg_value": 0.375,
        "value_by_index": {"0": {"rougeL_f1": 0.25}, "1": {"rougeL_f1": 0.5}},
    }
    assert logs["MUSE"]["mia_min_k"] == {"agg_value": 0.6} and logs["MUSE"]["privleak"] == {"agg_value": -20.0}


def test_two_forget_splits_in_one_folder_are_refused():
    results = {"results": {"tofu_forget01_prob": {"prob,none": 0.1}, "tofu_forget05_prob": {"prob,none": 0.2}}}
    with pytest.raises(Exception, match="tofu_forget01_prob, tofu_forget05_prob"):
        ou.to_open_unlearning(results, {}, {})


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("TOFU_EVAL.json", "{", "not valid JSON"),
        ("TOFU_EVAL.json", "[1]", "expected a JSON object"),
        ("results.json", "{}", "not an open-unlearning log"),
        ("TOFU_SUMMARY.json", '{"forget_quality": 0.5}', "needs open-unlearning's TOFU_EVAL.json"),
        (
            "TOFU_EVAL.json",
            '{"forget_truth_ratio": {"value_by_index": {"0": {"score": 1.0}, "2": {"score": 1.0}}}}',
            "must cover samples 0..1",
        ),  # fmt: skip
    ],
)
def test_bad_logs_get_one_line_naming_the_file(name, text, message, small_tofu, tmp_path, capsys):
    log = tmp_path / name
    log.write_text(text)
    capsys.readouterr()
    code = cli("logs", "reference", log, "--split", "forget01", "--tofu-dir", small_tofu, "--out", tmp_path / "r.json")
    err = capsys.readouterr().err.strip()
    assert code != 0 and message in err and str(log) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def test_reference_from_a_log_of_another_split_is_refused(evaluations, small_tofu, tmp_path, capsys):
    other = tmp_path / "tofu"
    shutil.copytree(small_tofu, other)
    rows = (other / "forget01_perturbed.json").read_text().splitlines()
    (other / "forget01_perturbed.json").write_text("\n".join(rows[:2]) + "\n")
    capsys.readouterr()
    log = evaluations / "retain" / "TOFU_EVAL.json"
    code = cli("logs", "reference", log, "--split", "forget01", "--tofu-dir", other, "--out", tmp_path / "r.json")
    err = capsys.readouterr().err
    assert code != 0 and f"has {ROWS} forget truth ratios" in err and "has 2 samples" in err
