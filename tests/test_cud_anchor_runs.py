"""CUD's anchor runs as the paper runs them: each objective with the settings of the CUD code's
checkpoints (full-parameter, its lr, epochs and loss weights), the whole budget (the early stop an
option recorded as a deviation), per-objective settings in the scorer's options and a study's
[cud.unlearn.OBJECTIVE] tables."""

from __future__ import annotations

import re

import pytest

from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.scorers.cud import (
    PAPER_ANCHOR_RUNS,
    PAPER_ANCHOR_SCHEDULE,
    CUDScorer,
    anchor_run_options,
)
from unlearn_plugins.study import StudyError, builtin_studies, load_study

#: the checkpoints whose per-sample losses chose the paper's anchors, as the CUD code names them
#: (chengjiali/Explain-Sample-Unlearnability, open-unlearning/scripts/compute_sample_difficulty.sh)
REFERENCE_CHECKPOINTS = {
    "grad_diff": "unlearn_tofu_Llama-3.2-1B-Instruct_forget10_GradDiff_lr1e-05_alpha5_epoch10",
    "npo": "unlearn_tofu_Llama-3.2-1B-Instruct_forget10_NPO_lr1e-05_beta0.5_alpha1_epoch10",
    "simnpo": "unlearn_tofu_Llama-3.2-1B-Instruct_forget10_SimNPO_lr5e-05_b3.5_a1_d1_g0.25_ep5",
    "rmu": "unlearn_tofu_Llama-3.2-1B-Instruct_forget10_RMU_lr2e-05_layer10_scoeff100_epoch5",
    "undial": "unlearn_tofu_Llama-3.2-1B-Instruct_forget10_UNDIAL_lr0.0001_beta10_alpha2_epoch10",
}
#: the name parts of each checkpoint and the objective option (or config field) each one sets
NAME_PARTS = {
    "lr": "lr",
    "alpha": "alpha",
    "a": "alpha",
    "beta": "beta",
    "b": "beta",
    "d": "delta",
    "g": "gamma",
    "layer": "layer",
    "scoeff": "steering_coeff",
    "epoch": "epochs",
    "ep": "epochs",
}


def parsed(name: str) -> dict:
    """{field: value} from a checkpoint name's ``_KEYvalue`` parts after the method's name."""
    out = {}
    for part in name.split("forget10_", 1)[1].split("_")[1:]:
        key, value = re.fullmatch(r"([a-z]+)([0-9.e-]+)", part).groups()
        out[NAME_PARTS[key]] = float(value)
    return out


def test_the_paper_recipe_is_the_reference_checkpoints_settings():
    for objective, name in REFERENCE_CHECKPOINTS.items():
        options = anchor_run_options(objective)
        given = {"lr": options["lr"], "epochs": options["epochs"], **options["objective_options"]}
        assert {k: float(v) for k, v in given.items()} == parsed(name), objective
        assert options["full_finetune"] is True and options["batch_size"] * options["grad_accum"] == 32
    assert set(PAPER_ANCHOR_RUNS) == set(REFERENCE_CHECKPOINTS)


def test_precedence_recipe_then_shared_then_the_objectives_own():
    shared = {"lr": 1e-3, "objective_options": {"alpha": 0.5}, "retain": "tofu:retain90"}
    own = {"npo": {"epochs": 2.0, "objective_options": {"beta": 0.2}}}
    npo = anchor_run_options("npo", shared=shared, by_objective=own, base={"tofu_dir": "/data"})
    assert npo == {
        **PAPER_ANCHOR_SCHEDULE,
        "tofu_dir": "/data",
        "lr": 1e-3,
        "epochs": 2.0,
        "retain": "tofu:retain90",
        "objective_options": {"beta": 0.2, "alpha": 0.5},
    }
    # an objective outside the paper's five, or the recipe "none": the caller's options alone
    assert anchor_run_options("wga", shared=shared) == shared
    assert anchor_run_options("npo", recipe="none") == {}


def test_scorer_defaults_run_the_whole_paper_budget_and_record_deviations():
    scorer = CUDScorer()
    assert scorer.stop_prob is None and scorer.anchor_recipe == "paper" and scorer.deviations() == []
    assert scorer.run_options("rmu")["objective_options"] == {"layer": 10, "steering_coeff": 100.0}
    early = CUDScorer(stop_prob=0.1, anchor_recipe="none", unlearn_options={"max_steps": 4})
    said = early.deviations()
    assert said[0].startswith("anchor runs stop at the first check") and "whole budget" in said[0]
    assert "anchor_recipe=none" in said[1]
    assert said[2:] == [
        f"{o}: a budget of partial epochs: pool samples are not all seen equally often"
        for o in ("grad_diff", "npo", "simnpo", "rmu", "undial")
    ]
    mixed = CUDScorer(objectives=["npo", "rmu"], unlearn_by_objective={"rmu": {"lr": 1e-4}})
    assert mixed.run_options("rmu")["lr"] == 1e-4 and mixed.run_options("npo")["lr"] == 1e-5


@pytest.mark.parametrize(
    "options, message",
    [
        ({"anchor_recipe": "open"}, "option anchor_recipe='open'; choose one of paper, none"),
        ({"unlearn_by_objective": {"wga": {}}}, "unlearn_by_objective names wga, not among the objectives"),
        ({"unlearn_by_objective": {"npo": {"learning_rate": 1}}}, "unknown training option.s. learning_rate"),
        ({"unlearn_by_objective": {"npo": {"seed": 3}}}, "unlearn_by_objective.npo: seed set by each anchor run"),
        ({"unlearn_options": {"objective": "npo"}}, "unlearn_options: objective set by each anchor run"),
        ({"unlearn_by_objective": [1]}, "must be a table per objective"),
    ],
)
def test_bad_anchor_run_options_are_one_error(options, message):
    with pytest.raises(UnlearnError, match=message):
        CUDScorer(**options)


@pytest.mark.slow
def test_default_runner_trains_the_whole_budget_and_measures_the_pool_before(tiny_model_dir, tofu_dir, tmp_path):
    """No stop: every run takes its budget (2 steps), and records the pool's probability before."""
    from unlearn_plugins.data.qa import load_split
    from unlearn_plugins.models import load_model

    model, tok = load_model(str(tiny_model_dir), device="cpu")
    scorer = CUDScorer(
        anchor_data="tofu:forget10[0:6]",
        tofu_dir=str(tofu_dir),
        objectives=["grad_diff"],
        seeds=[0, 1],
        k=2,
        steps=1,
        min_votes=1,
        unlearn_options={
            "retain": "tofu:retain99[0:8]",
            "tofu_dir": str(tofu_dir),
            "batch_size": 3,
            "grad_accum": 1,
            "epochs": 1.0,
            "lr": 1e-2,
            "full_finetune": False,
        },
        unlearn_by_objective={"grad_diff": {"objective_options": {"alpha": 2.0}}},
        cache_dir=str(tmp_path),
    )
    scorer.score(load_split("tofu:forget01[0:4]", tofu_dir), model=model, tokenizer=tok)
    meta = scorer.last_metadata
    runs = meta["runs"]
    assert [(r["steps"], r["stopped_at_step"], r["checks"]) for r in runs] == [(2, None, []), (2, None, [])]
    assert all(0 < r["forget_prob_before"] < 1 and r["forget_prob"] > 0 for r in runs)
    used = meta["settings"]["anchor_run_options"]["grad_diff"]
    assert used["objective_options"] == {"alpha": 2.0} and used["lr"] == 1e-2 and used["full_finetune"] is False
    assert meta["settings"]["deviations"] == [] and meta["settings"]["anchor_recipe"] == "paper"


def _study(tmp_path, cud: str):
    path = tmp_path / "study.toml"
    path.write_text(builtin_studies()["tiny"].read_text() + "\n[cud]\n" + cud)
    return load_study(str(path))


def test_study_cud_tables_per_objective(tmp_path):
    study = _study(
        tmp_path,
        '[cud.scorer]\nobjectives = ["npo", "rmu"]\nseeds = [0]\n'
        "[cud.unlearn]\nlr = 1e-4\n[cud.unlearn.rmu]\nepochs = 2.0\nobjective_options = { layer = 3 }\n",
    )
    assert study.cud.unlearn == {"lr": 1e-4, "rmu": {"epochs": 2.0, "objective_options": {"layer": 3}}}
    # the defaults that changed are named in the scorer's options (and so in the stage's key)
    assert study.cud.scorer["anchor_recipe"] == "paper" and study.cud.scorer["stop_prob"] is None
    from unlearn_plugins.study.cud import split_unlearn

    assert split_unlearn(study.cud.unlearn) == (
        {"lr": 1e-4},
        {"rmu": {"epochs": 2.0, "objective_options": {"layer": 3}}},
    )
    # the demos keep their own anchor runs, declared
    demo = load_study("demo")
    assert demo.cud.scorer["anchor_recipe"] == "none" and demo.cud.scorer["stop_prob"] == 0.1


@pytest.mark.parametrize(
    "cud, message",
    [
        (
            '[cud.scorer]\nobjectives = ["npo"]\n[cud.unlearn.rmu]\nlr = 1e-4\n',
            r"\[cud.unlearn\] rmu: a table of one objective's anchor-run options names one of \[cud.scorer\] "
            r"objectives \(npo\)",
        ),
        (
            '[cud.scorer]\nobjectives = ["npo"]\n[cud.unlearn.npo]\nretain = "x"\n',
            r"\[cud.unlearn.npo\] retain: is set by the study",
        ),
        (
            '[cud.scorer]\nobjectives = ["npo"]\n[cud.unlearn.npo]\nobjective_options = { steering_coeff = 3 }\n',
            r"\[cud.unlearn.npo\] objective_options: .*steering_coeff",
        ),
        ('[cud.scorer]\nobjectives = ["npo"]\n[cud.unlearn.npo]\nlr = -1.0\n', r"\[cud.unlearn.npo\] lr: must be"),
    ],
)
def test_study_cud_per_objective_mistakes_are_one_error(tmp_path, cud, message):
    with pytest.raises(StudyError, match=message):
        _study(tmp_path, cud)
