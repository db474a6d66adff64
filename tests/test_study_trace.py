"""The traced run of a sweep (unlearn_plugins/study/trace.py): every epoch the adapter
saved and the cheap measures taken, without changing the training."""

from __future__ import annotations

import math

import pytest
import torch
from support_training import small_config

from unlearn_plugins.benchmarks.tofu.study import trace

PERTURBED = ("question", "answer", "paraphrased_answer", "perturbed_answer")


def rows(tofu_dir, spec, require=("question", "answer")):
    from unlearn_plugins.data.qa import load_split

    return load_split(spec, tofu_dir, require=require)


def test_a_model_against_itself_is_at_the_ceiling(tiny_model, tiny_tokenizer, tofu_dir):
    from unlearn_plugins.benchmarks.tofu import metrics as tm

    forget = rows(tofu_dir, "tofu:forget01_perturbed[0:5]", PERTURBED)
    ratios = trace.truth_ratios(tiny_model, tiny_tokenizer, forget, max_length=96)
    assert len(ratios) == 5 and all(r > 0 and math.isfinite(r) for r in ratios)
    point = trace.trace_point(
        tiny_model,
        tiny_tokenizer,
        forget=forget,
        reference_ratios=ratios,
        heldout=rows(tofu_dir, "tofu:retain99[0:3]"),
        measures=("forget_quality", "ks_statistic", "wasserstein_log", "forget_prob", "heldout_prob"),
        max_length=96,
    )
    assert point["forget_quality"] == 1.0 and point["ks_statistic"] == 0.0 and point["wasserstein_log"] == 0.0
    assert 0 < point["forget_prob"] < 1 and 0 < point["heldout_prob"] < 1
    # the truth ratio is TOFU's: perturbed answers' mean NLL against the paraphrased answer's
    from unlearn_plugins.data.qa import encode_qa
    from unlearn_plugins.likelihood import answer_nll

    row = forget[0]
    answers = [row.extra["paraphrased_answer"], *row.extra["perturbed_answer"]]
    enc = [encode_qa(tiny_tokenizer, row.question, a, max_length=96) for a in answers]
    nll = [s / n for s, n in answer_nll(tiny_model, enc, tiny_tokenizer.pad_token_id)]  # mean answer NLL
    assert ratios[0] == pytest.approx(tm.truth_ratio(nll[0], nll[1:]), rel=1e-6)
    # measuring leaves a training model in train mode
    tiny_model.train()
    trace.truth_ratios(tiny_model, tiny_tokenizer, forget[:1], max_length=96)
    assert tiny_model.training
    tiny_model.eval()


def _config(out, tiny_model_dir, tofu_dir, epochs=2):
    data = {"forget": "tofu:forget01_perturbed[0:4]", "retain": "tofu:retain99[0:4]", "max_length": 96}
    sizes = {"lora_alpha": 8, "lr": 5e-3, "epochs": float(epochs), "save_steps": 0}
    # a residual init: the saved adapters are converted to the original base
    method = {"objective": "ihl", "initializer": "rila"}
    return small_config(out, tiny_model_dir, tofu_dir, **data, **sizes, **method)


def test_traced_run_saves_every_epoch_and_trains_as_untraced(tiny_model_dir, tofu_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.training import run_unlearning

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    forget = rows(tofu_dir, "tofu:forget01_perturbed[0:4]", PERTURBED)
    heldout = rows(tofu_dir, "tofu:retain99[10:13]")
    reference = trace.truth_ratios(base, tok, forget, max_length=96)  # the base stands in for the retain model
    measures = ("forget_quality", "ks_statistic", "wasserstein_log", "forget_prob", "heldout_prob")
    callback = trace.TraceCallback(
        tmp_path / "trace",
        tok,
        forget=forget,
        reference_ratios=reference,
        heldout=heldout,
        measures=measures,
        max_length=96,
    )
    run_unlearning(_config(tmp_path / "traced", tiny_model_dir, tofu_dir), callbacks=[callback])
    run_unlearning(_config(tmp_path / "plain", tiny_model_dir, tofu_dir))

    points = trace.read_trace(tmp_path / "trace")
    assert [p["epoch"] for p in points] == [1, 2] and [p["step"] for p in points] == [2, 4]
    for p in points:
        assert set(measures) <= set(p) and 0 <= p["forget_quality"] <= 1 and p["wasserstein_log"] >= 0
        assert (tmp_path / "trace" / p["adapter"] / "adapter_config.json").is_file()
    assert points[1]["forget_prob"] != points[0]["forget_prob"]  # measured on the model as trained so far

    ids = torch.tensor([[5, 17, 42, 99, 7, 3, 250, 11]])

    def logits(adapter):
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
        with torch.no_grad():
            return PeftModel.from_pretrained(model, str(adapter)).eval()(input_ids=ids).logits

    last, traced, plain = logits(tmp_path / "trace" / "epoch2"), logits(tmp_path / "traced"), logits(tmp_path / "plain")
    assert (last - traced).abs().max() < 1e-5  # the epoch-2 adapter is the run's (relative to the original base)
    assert (traced - plain).abs().max() < 1e-6  # tracing does not change the training
    first = logits(tmp_path / "trace" / "epoch1")
    assert (first - last).abs().max() > 1e-4
    with torch.no_grad():
        # the epoch-1 trace point is the epoch-1 adapter's: its forget probability, measured again
        model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), str(tmp_path / "trace" / "epoch1")
        ).eval()
    again = trace.trace_point(
        model, tok, forget=forget, reference_ratios=reference, measures=("forget_prob",), max_length=96
    )
    assert again["forget_prob"] == pytest.approx(points[0]["forget_prob"], rel=1e-4)


def test_a_sweep_stage_on_a_per_author_benchmark(tiny_model_dir, tmp_path):
    """The stage a [sweep] cell builds (TOFU's "sweep" stage kind): the reference's truth ratios
    from the retain model, one traced run, its points and adapters."""
    import json

    from unlearn_plugins.benchmarks.tofu.data import build_benchmark
    from unlearn_plugins.study.cells import builder

    bench = tmp_path / "bench"
    build_benchmark(bench, tofu=None, n_authors=4, n_forget=1, eval_size=4, forget_ids=[16])
    assert len(trace.heldout_rows(bench, {"real_authors": 2, "world_facts": 3, "retain_authors": 5})) == 10
    config = {
        "lr": 1e-3,
        "epochs": 2.0,
        "batch_size": 8,
        "grad_accum": 1,
        "lora_r": 4,
        "lora_alpha": 8.0,
        "max_length": 96,
        "objective": "grad_diff",
        "initializer": "kaiming",
        "save_steps": 0,
    }
    params = {
        "config": config,
        "model": str(tiny_model_dir),
        "bench": str(bench),
        "reference_model": str(tiny_model_dir),  # stands in for the reserved author's retain model
        "trace": ["forget_quality", "wasserstein_log", "forget_prob", "heldout_prob"],
        "heldout": {"real_authors": 2, "world_facts": 2, "retain_authors": 4},
        "max_length": 96,
        "batch_size": 8,
        "device": "cpu",
    }
    out = tmp_path / "stage"
    out.mkdir()
    builder("sweep")(out, params)
    points = trace.read_trace(out / "trace")
    assert [p["epoch"] for p in points] == [1, 2] and [p["step"] for p in points] == [3, 6]  # 20 QA, batch 8
    assert all({"forget_quality", "wasserstein_log", "forget_prob", "heldout_prob"} <= set(p) for p in points)
    reference = json.loads((out / trace.REFERENCE_FILE).read_text())["truth_ratios"]
    assert len(reference) == 20
    assert (out / "run" / "adapter_config.json").is_file() and (out / "trace" / "epoch2").is_dir()
