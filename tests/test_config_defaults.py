"""Every option's default is defined once, in its typed config: the command line's defaults (an
empty command line parsed) and a study file's (a study without the table) are collected and
compared with the dataclasses'. A default written again in argparse or in study/spec.py fails here."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing

import pytest

from unlearn_plugins.cli import build_parser, subcommands
from unlearn_plugins.commands.training_options import resolve_config
from unlearn_plugins.evaluation import lm_eval_runner
from unlearn_plugins.evaluation.config import SCORINGS, EvaluationConfig
from unlearn_plugins.options import (
    config_defaults,
    config_flag,
    config_help,
    config_metavar,
    field_default,
    scalar_type,
)
from unlearn_plugins.study import builtin_studies, load_study
from unlearn_plugins.study.spec import Cud, Evaluation
from unlearn_plugins.training.config import FinetuneConfig, TrainingConfig, UnlearnConfig

TINY = builtin_studies()["tiny"].read_text()


def _study(tmp_path, text: str):
    path = tmp_path / "study.toml"
    path.write_text(text)
    return load_study(str(path))


def _without_table(text: str, table: str) -> str:
    """The study text less ``[table]`` and its keys (up to the next table)."""
    return re.sub(rf"^\[{re.escape(table)}\]\n(?:(?!\[).*\n?)*", "", text, flags=re.M)


def test_eval_command_defaults_are_the_evaluation_configs():
    args = build_parser().parse_args(["eval"])
    defaults = config_defaults(EvaluationConfig)
    parsed = {name: getattr(args, name) for name in defaults}
    assert parsed == defaults
    # and every field is an option of the command (none left out of the generated flags)
    eval_parser = subcommands(build_parser())["eval"]
    dests = {a.dest for a in eval_parser._actions}
    assert set(defaults) <= dests


def test_eval_flags_are_generated_from_the_config():
    eval_parser = subcommands(build_parser())["eval"]
    by_dest = {a.dest: a for a in eval_parser._actions}
    for f in dataclasses.fields(EvaluationConfig):
        action = by_dest[f.name]
        if f.metadata.get("cli", True) is not True:
            continue  # the model options every command shares (commands/common.py): their defaults above
        assert action.help == config_help(f), f.name
        if "choices" in f.metadata:
            assert tuple(action.choices) == tuple(f.metadata["choices"]), f.name
    assert tuple(by_dest["scoring"].choices) == SCORINGS == lm_eval_runner.SCORINGS
    assert "--batch_size" in by_dest["batch_size"].option_strings  # lm_eval's spellings kept
    assert "--output_path" in by_dest["out"].option_strings
    assert by_dest["batch_size"].help == "lm-eval batch size (default: 8)"  # the field's default, shown


def test_eval_flags_parse_to_typed_values():
    args = build_parser().parse_args(
        ["eval", "--tasks", "a, b,", "--retain-reference", "r1", "--retain-reference", "r2", "--limit", "0.5"]
    )
    assert args.tasks == ["a", "b"] and args.retain_reference == ["r1", "r2"] and args.limit == 0.5
    # a repeatable flag's default list is not shared between two parses
    assert build_parser().parse_args(["eval"]).retain_reference == []


def test_study_evaluation_defaults_are_the_configs(tmp_path):
    study = _study(tmp_path, _without_table(TINY, "evaluation"))
    assert dataclasses.asdict(study.evaluation) == config_defaults(Evaluation)
    # tasks: the study's default is the tasks every study reports, `unlearn eval --tasks` has none
    # (required unless --mia or --robustness name theirs): one name, two options
    shared = {f.name for f in dataclasses.fields(Evaluation)} & {f.name for f in dataclasses.fields(EvaluationConfig)}
    shared -= {"tasks"}
    assert shared == {"batch_size", "dtype", "robustness", "scoring"}
    assert {k: getattr(study.evaluation, k) for k in shared} == {
        k: v for k, v in config_defaults(EvaluationConfig).items() if k in shared
    }
    # the two share one check too: the choices and minimum come from EvaluationConfig's fields
    for key, value, problem in (("scoring", '"fast"', "must be one of 'prefix', 'hf'"), ("batch_size", 0, ">= 1")):
        text = _without_table(TINY, "evaluation") + f"\n[evaluation]\n{key} = {value}\n"
        with pytest.raises(Exception, match=re.escape(problem)):
            _study(tmp_path, text)


def test_study_cud_defaults_are_the_configs(tmp_path):
    study = _study(tmp_path, TINY + "\n[cud]\n")
    assert (study.cud.anchor_pool, study.cud.strata) == (
        config_defaults(Cud)["anchor_pool"],
        config_defaults(Cud)["strata"],
    )


def test_study_model_max_length_default_is_the_training_configs(tmp_path):
    study = _study(tmp_path, TINY.replace("max_length = 128\n", ""))
    assert study.max_length == config_defaults(TrainingConfig)["max_length"]
    assert study.target.seed == 0 and study.target.threads is None


@pytest.mark.parametrize("command,config", [("run", UnlearnConfig), ("finetune", FinetuneConfig)])
def test_training_flags_hold_no_default_of_their_own(command, config):
    """A training flag not given sets nothing (the config's default applies), and a default its
    help names is the config's."""
    parser = subcommands(build_parser())[command]
    defaults = config_defaults(config)
    checked = 0
    for action in parser._actions:
        if action.dest not in defaults:
            continue
        assert action.default is argparse.SUPPRESS, f"--{action.dest} has a default of its own: {action.default!r}"
        said = re.search(r"default: ([\w.:+-]+)", action.help or "")
        value = defaults[action.dest]
        if not said or value is None or isinstance(value, bool):
            continue
        text = said.group(1).rstrip(".")
        if isinstance(value, (int, float)):
            assert float(text) == float(value), f"--{action.dest}: help says {text}, the config {value}"
        else:
            assert text == str(value), f"--{action.dest}: help says {text}, the config {value}"
        checked += 1
    assert checked >= 10


TRAINING = [("run", UnlearnConfig), ("finetune", FinetuneConfig)]
#: the flags of `unlearn run` / `finetune` that are no config field (``help``: -h)
NOT_FIELDS = {"help", "config", "show_config", "dry_run", "debug", "verbosity"}


@pytest.mark.parametrize("command,config", TRAINING)
def test_training_flags_are_generated_from_the_config(command, config):
    """Each field of the command's config is one flag, its spelling, help, metavar and choices the
    field's metadata: a flag written by hand (or a help or default written twice) fails here."""
    parser = subcommands(build_parser())[command]
    by_dest = {a.dest: a for a in parser._actions}
    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        action = by_dest[f.name]
        assert action.option_strings == [config_flag(f), *f.metadata.get("flags", ())], f.name
        assert action.help and action.help == config_help(f), f.name
        assert action.default is argparse.SUPPRESS, f.name
        metavar = config_metavar(f, scalar_type(hints[f.name]))
        assert (action.metavar, action.choices) == (metavar, f.metadata.get("choices")), f.name
    own = {"run": {"preset", "no_retain"}, "finetune": set()}[command]
    assert set(by_dest) - set(config_defaults(config)) == NOT_FIELDS | own
    # the warmup trio excludes each other; the KEY=VALUE flags keep their spelling
    warmup = [g for g in parser._mutually_exclusive_groups if by_dest["warmup_steps"] in g._group_actions]
    assert [a.dest for a in warmup[0]._group_actions] == ["warmup_steps", "warmup_ratio", "warmup_epochs"]
    if command == "run":
        assert by_dest["objective_options"].option_strings == ["--objective-option"]


@pytest.mark.parametrize("command,config", TRAINING)
def test_training_command_defaults_are_the_configs(command, config, tmp_path):
    """An empty command line resolves to the config's defaults (nothing but --out given)."""
    out = str(tmp_path / "out")
    resolved = resolve_config(config, build_parser().parse_args([command, "--out", out]))
    assert dataclasses.asdict(resolved) == {**config_defaults(config), "out": out}


@pytest.mark.parametrize("config", [UnlearnConfig, FinetuneConfig, EvaluationConfig])
def test_helps_write_no_default_again(config):
    """A help that names its field's default says ``%(default)s`` (filled in from the field)."""
    for f in dataclasses.fields(config):
        value = field_default(f)
        if value is None or isinstance(value, (bool, dict, list)):
            continue
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        assert not re.search(rf"default: {re.escape(shown)}\b", f.metadata["help"]), f.name


def test_shared_options_of_other_commands_are_the_training_configs():
    """--prompt-format, --date-string and --tofu-dir of the commands are TrainingConfig's fields
    (but the demo's --tofu-dir, which falls back to the authors shipped with the package)."""
    fields = {f.name: f for f in dataclasses.fields(TrainingConfig)}
    differ, seen = [], set()
    for name, parser in subcommands(build_parser()).items():
        for action in parser._actions:
            if action.dest in ("prompt_format", "date_string", "tofu_dir"):
                seen.add(action.dest)
                if action.help != config_help(fields[action.dest]):
                    differ.append(f"{name} {action.dest}")
    assert seen == {"prompt_format", "date_string", "tofu_dir"} and differ == ["demo tofu_dir"]


def test_runner_receives_every_shared_option():
    """The options model_eval passes on by name match (a renamed parameter of the runner would
    silently drop an option)."""
    common = EvaluationConfig().runner_options(
        lm_eval_runner.evaluate_model, given=("model", "tasks", "adapter", "forget_split", "save_reference")
    )
    assert set(common) == {
        "device",
        "dtype",
        "trust_remote_code",
        "batch_size",
        "limit",
        "num_fewshot",
        "tofu_dir",
        "mmlu_dir",
        "wmdp_dir",
        "system_prompt",
        "max_gen_toks",
        "allow_other_base",
        "use_cache",
        "scoring",
    }
    prepare = EvaluationConfig().runner_options(lm_eval_runner.prepare_for_model, given=("tasks", "save_reference"))
    assert set(prepare) == {
        "trust_remote_code",
        "tofu_dir",
        "forget_split",
        "mmlu_dir",
        "wmdp_dir",
        "system_prompt",
        "limit",
    }


def test_cud_scorer_options_are_its_typed_config():
    """The cud scorer's options are CUDConfig's fields: listed with their help, defaults and
    checks from there, and the scorer runs with them."""
    from unlearn_plugins.host import get_component
    from unlearn_plugins.interfaces import DIFFICULTY_SCORER
    from unlearn_plugins.options import declared_options
    from unlearn_plugins.scorers.cud import CUDScorer
    from unlearn_plugins.scorers.cud.config import CUDConfig

    declared = declared_options(get_component(DIFFICULTY_SCORER, "cud"))
    assert declared.names() == [f.name for f in dataclasses.fields(CUDConfig)] and not declared.open_ended
    assert all(o.help for o in declared.options)
    assert {o.name: o.default for o in declared.options} == config_defaults(CUDConfig)
    scorer = CUDScorer(runner=object(), n_edges=30, mode="activations")
    assert (scorer.n_edges, scorer.eap["mode"], scorer.objectives) == (30, "activations", list(CUDConfig().objectives))
    with pytest.raises(Exception, match=r"scorer cud: option vector='dense'; choose one of binary, signed"):
        CUDScorer(runner=object(), vector="dense")


def test_study_table_defaults_are_the_studys(tmp_path):
    from unlearn_plugins.study.spec import Study

    study = _study(tmp_path, TINY)  # its [study] sets neither one_budget nor workers_per_gpu
    defaults = {f.name: f.default for f in dataclasses.fields(Study)}
    assert (study.one_budget, study.workers_per_gpu) == (defaults["one_budget"], defaults["workers_per_gpu"])


def test_the_names_accepted_without_importing_transformers_are_the_installed_ones():
    """A config whose scheduler and optimizer are the stable names is checked without importing
    transformers' Trainer modules; each of them must be a name the installed transformers knows."""
    from unlearn_plugins.training.config import (
        STABLE_OPTIMIZERS,
        STABLE_SCHEDULERS,
        optimizer_names,
        scheduler_names,
    )

    assert set(STABLE_SCHEDULERS) <= set(scheduler_names())
    assert set(STABLE_OPTIMIZERS) <= set(optimizer_names())
    defaults = config_defaults(TrainingConfig)
    assert defaults["lr_scheduler"] in STABLE_SCHEDULERS and defaults["optim"] in STABLE_OPTIMIZERS
