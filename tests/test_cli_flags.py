"""The `unlearn` command's own flags: --debug and --verbosity on either side of the command,
every command's --help (a description and examples), and --show-config on run, finetune and
study (the merged options as TOML; nothing runs)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unlearn_plugins.cli import VERBOSITY_LOGGERS, build_parser, main, subcommands, verbosity
from unlearn_plugins.commands.common import to_toml
from unlearn_plugins.errors import UnlearnError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def unlearn(*args, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    """The command in a fresh process, run from ``cwd``: what a user sees on stdout and stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    for name in ("TRANSFORMERS_VERBOSITY", "DATASETS_VERBOSITY", "UNLEARN_VERBOSITY"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "unlearn_plugins.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


# ----------------------------------------------------------------------------- --help


@pytest.mark.parametrize("name", sorted(subcommands(build_parser())))
def test_every_command_has_a_description_and_examples(name):
    command = subcommands(build_parser())[name]
    text = command.format_help()
    assert (command.description or "").strip(), f"unlearn {name} --help has no description"
    assert "example" in (command.epilog or "").lower(), f"unlearn {name} --help has no example"
    assert f"unlearn {name}" in command.epilog, f"unlearn {name}'s examples do not show the command"
    assert "--debug" in text and "--verbosity" in text


# ----------------------------------------------------------------------------- --debug


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_command(where, tmp_path, capsys):
    args = ["probs", "--model", str(tmp_path / "missing"), "--data", "tofu:forget01", "--tofu-dir", str(tmp_path)]
    assert main(args) == 1  # without --debug: one line
    assert capsys.readouterr().err.startswith("error: ")
    with pytest.raises(UnlearnError):
        main(["--debug", *args] if where == "before" else [*args, "--debug"])


# ----------------------------------------------------------------------------- --verbosity


def test_debug_verbosity_shows_library_and_own_log_lines(tiny_model_dir, tmp_path):
    data = tmp_path / "qa.json"
    data.write_text('{"question": "Who wrote it?", "answer": "Someone did."}\n')
    args = ["probs", "--model", tiny_model_dir, "--data", data, "--device", "cpu"]
    quiet = unlearn(*args)
    assert quiet.returncode == 0, quiet.stderr
    assert "loading configuration file" not in quiet.stderr and "DEBUG" not in quiet.stderr
    loud = unlearn(*args, "--verbosity", "DEBUG")  # after the command
    assert loud.returncode == 0, loud.stderr
    assert f"[transformers] loading configuration file {tiny_model_dir}" in loud.stderr  # transformers' INFO line
    assert "DEBUG [unlearn_plugins.cli] unlearn probs: " in loud.stderr  # our own debug line
    assert loud.stdout == quiet.stdout  # the results are the same; only stderr says more


def test_error_verbosity_hides_warnings():
    env = {"UNLEARN_LOAD_PLUGINS": "no_such_plugin"}  # the host warns that no such plugin is installed
    shown = unlearn("plugins", env=env)
    assert shown.returncode == 0
    assert "warning: UNLEARN_LOAD_PLUGINS names 'no_such_plugin'" in shown.stderr
    for argv in (["--verbosity", "ERROR", "plugins"], ["plugins", "--verbosity", "error"]):
        hidden = unlearn(*argv, env=env)
        assert hidden.returncode == 0 and hidden.stderr == ""
        assert hidden.stdout == shown.stdout


def test_verbosity_sets_our_loggers_and_restores_them(capsys, monkeypatch):
    for name in ("TRANSFORMERS_VERBOSITY", "UNLEARN_VERBOSITY"):
        monkeypatch.delenv(name, raising=False)
    ours = logging.getLogger("unlearn_plugins.some_module")
    before = {name: logging.getLogger(name).level for name in VERBOSITY_LOGGERS}
    with verbosity("ERROR"):
        ours.warning("error level: hidden")
        ours.error("error level: shown")
    with verbosity("INFO"):
        # for transformers imported later, and for worker processes
        assert (os.environ["TRANSFORMERS_VERBOSITY"], os.environ["UNLEARN_VERBOSITY"]) == ("info", "INFO")
        assert logging.getLogger("transformers").getEffectiveLevel() == logging.INFO
        ours.info("info level: shown")
        ours.debug("info level: hidden")
    err = capsys.readouterr().err
    assert "ERROR [unlearn_plugins.some_module] error level: shown" in err and "info level: shown" in err
    assert "hidden" not in err
    assert {name: logging.getLogger(name).level for name in VERBOSITY_LOGGERS} == before
    assert "TRANSFORMERS_VERBOSITY" not in os.environ and "UNLEARN_VERBOSITY" not in os.environ


def test_a_bad_verbosity_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plugins", "--verbosity", "LOUD"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unlearn plugins: argument --verbosity: invalid choice: 'LOUD'")


# ----------------------------------------------------------------------------- --show-config


def shown_config(capsys, argv) -> dict:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("# unlearn ")
    return tomllib.loads(out)


def test_run_show_config_prints_the_merged_options(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text("lr = 3e-4\nepochs = 2.0\n[objective_options]\nbeta = 0.2\n")
    out = tmp_path / "never-made"
    values = shown_config(
        capsys,
        [
            "run",
            "--preset",
            "reglu",
            "--config",
            str(config),
            "--lr",
            "5e-5",
            "--regularizer-option",
            "weight=1.0",
            "--out",
            str(out),
            "--show-config",
        ],
    )
    assert values["lr"] == 5e-5  # the flag, over the file and the preset
    assert values["epochs"] == 2.0  # the file, over the preset's 5
    assert values["regularizer"] == "rol" and values["lr_scheduler"] == "linear"  # the preset's
    assert values["regularizer_options"] == {"weight": 1.0, "rank": 128}  # the flag's key over the preset's
    assert values["objective_options"] == {"beta": 0.2} and values["lora_r"] == 32  # the file; the default
    assert "max_steps" not in values  # None: a comment line, TOML has no null
    assert not out.exists()
    # what it prints is a --config file that gives the same options
    printed = tmp_path / "printed.toml"
    printed.write_text(to_toml(values))
    assert shown_config(capsys, ["run", "--config", str(printed), "--show-config"]) == values
    assert not out.exists()


def test_finetune_show_config_prints_the_merged_options(tmp_path, capsys):
    config = tmp_path / "ft.toml"
    config.write_text('data = "tofu:full"\nauthors = [0, 1]\nlr = 1e-3\nepochs = 3.0\n')
    out = tmp_path / "never-made"
    values = shown_config(
        capsys, ["finetune", "--config", str(config), "--epochs", "1", "--merge", "--out", str(out), "--show-config"]
    )
    assert values["epochs"] == 1.0 and values["merge"] is True  # the flags
    assert values["lr"] == 1e-3 and values["authors"] == [0, 1]  # the file's, where no flag overrides
    assert values["lora_r"] == 32 and values["out"] == str(out)
    assert not out.exists()


def test_study_show_config_prints_the_resolved_study(tmp_path, capsys):
    study = tmp_path / "one.toml"
    # every table inline: the same study as [study], [model], ... tables
    study.write_text("""
study = { seeds = [0] }
model = { base = "tiny-llama", max_length = 128 }
benchmark = { source = "generated", authors = 3, forget_authors = 1 }
target = { finetune = { lr = 1e-3 } }
budget = { lr = 2e-4 }
methods = [{ name = "reglu", preset = "reglu" }]
""")
    out, cache = tmp_path / "report", tmp_path / "cache"
    values = shown_config(
        capsys, ["study", str(study), "--workers", "3", "--out", str(out), "--cache-dir", str(cache), "--show-config"]
    )
    assert values["command_line"]["workers"] == 3 and values["command_line"]["out"] == str(out)  # the flags
    assert values["command_line"]["executor"] == "local"  # a default
    assert values["name"] == "one" and values["forget_sizes"] == [1] and values["ci"] == "t"  # defaults filled in
    assert values["evaluation"]["mu_size"] == 400
    (method,) = values["methods"]
    assert method["settings"] == {"preset": "reglu"}
    assert method["config"]["lr"] == 2e-4  # [budget], over the preset's 1e-4
    assert method["config"]["regularizer"] == "rol" and method["config"]["lr_scheduler"] == "linear"  # the preset's
    assert method["config"]["initializer_options"] == {"beta": 0.7, "rol_rank": 128}
    assert not out.exists() and not cache.exists()


# ----------------------------------------------------------------------------- the TOML writer

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SCALARS = st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=12)
ARRAYS = st.lists(SCALARS | st.lists(SCALARS, max_size=3), max_size=4)
TABLES = st.recursive(
    st.dictionaries(st.text(max_size=6), SCALARS | ARRAYS | st.none(), max_size=5),
    lambda inner: st.dictionaries(
        st.text(max_size=6), SCALARS | ARRAYS | st.none() | inner | st.lists(inner, min_size=1, max_size=3), max_size=5
    ),
    max_leaves=20,
)


def without_none(value):
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(TABLES)
def test_to_toml_reads_back_as_written(values):
    assert tomllib.loads(to_toml(values)) == without_none(values)


def test_to_toml_refuses_what_toml_cannot_hold():
    with pytest.raises(UnlearnError, match="option objective_options.x: None has no TOML form"):
        to_toml({"objective_options": {"x": [1, None]}})


def test_verbosity_wins_over_the_demo_and_study_quieting(monkeypatch):
    """demo and study quiet transformers, lm-eval, peft and accelerate to errors, unless
    --verbosity was given (the CLI sets UNLEARN_VERBOSITY; study and demo workers inherit it)."""
    import logging

    from unlearn_plugins.process import quiet_libraries

    lg = logging.getLogger("transformers")
    before = lg.level
    monkeypatch.delenv("UNLEARN_VERBOSITY", raising=False)
    with quiet_libraries():
        assert lg.level == logging.ERROR
    assert lg.level == before
    monkeypatch.setenv("UNLEARN_VERBOSITY", "DEBUG")
    lg.setLevel(logging.DEBUG)
    with quiet_libraries():
        assert lg.level == logging.DEBUG
    lg.setLevel(before)


# ----------------------------------------------------------------------------- quiet output


def test_eval_prints_nothing_a_user_cannot_act_on(tiny_model_dir, tofu_dir, tmp_path):
    """Outside a git repository lm-eval's `git describe` printed "fatal: not a git repository" on
    every evaluation, and lm-eval warned about custom datasets and an already-loaded model."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    args = ["eval", "--model", tiny_model_dir, "--tasks", "tofu_forget01_prob", "--limit", 2]
    proc = unlearn(*args, "--tofu-dir", tofu_dir, "--out", tmp_path / "out", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    for noise in ("fatal:", "Custom kwargs", "`pretrained` model kwarg", "already-initialized model"):
        assert noise not in proc.stderr, noise


def test_the_tiny_model_alias_works_on_the_command_line(tofu_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("UNLEARN_CACHE_DIR", str(tmp_path / "cache"))
    code = main(["probs", "--model", "tiny-llama", "--data", "tofu:forget01[0:2]", "--tofu-dir", str(tofu_dir)])
    assert code == 0, capsys.readouterr().err
    assert "mean answer probability over 2 samples" in capsys.readouterr().out
    assert len(list((tmp_path / "cache" / "models").glob("tiny-llama-*"))) == 1


def test_an_unknown_component_of_a_disabled_plugin_says_so(tiny_model_dir, tofu_dir, tmp_path, monkeypatch, capsys):
    from unlearn_plugins.host import reset_host

    monkeypatch.setenv("UNLEARN_DISABLE_PLUGINS", "builtin-objectives")
    reset_host()
    try:
        args = ["run", "--model", str(tiny_model_dir), "--objective", "npo", "--tofu-dir", str(tofu_dir)]
        code = main([*args, "--forget", "tofu:forget01[0:2]", "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and err[-1].startswith("error: unknown unlearning objective 'npo'; available: ")
        assert err[-1].endswith(
            "; not loaded: plugin 'builtin-objectives' (built-in) is disabled by UNLEARN_DISABLE_PLUGINS"
        )
    finally:
        monkeypatch.undo()
        reset_host()


def test_score_takes_an_adapter(tiny_model_dir, tofu_dir, tmp_path, capsys):
    import json

    run = ["run", "--model", str(tiny_model_dir), "--tofu-dir", str(tofu_dir), "--forget", "tofu:forget01[0:4]"]
    run += ["--retain", "tofu:retain99[0:4]", "--max-steps", "2", "--lr", "1e-2", "--lora-r", "4", "--save-steps", "0"]
    assert main([*run, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    score = ["score", "--scorer", "loss", "--model", str(tiny_model_dir), "--data", "tofu:forget01[0:4]"]
    score += ["--tofu-dir", str(tofu_dir)]
    assert main([*score, "--out", str(tmp_path / "base.jsonl")]) == 0
    assert main([*score, "--adapter", str(tmp_path / "run"), "--out", str(tmp_path / "adapted.jsonl")]) == 0
    capsys.readouterr()

    def scores(name):
        return [json.loads(line)["score"] for line in (tmp_path / name).read_text().splitlines()]

    assert scores("base.jsonl") != scores("adapted.jsonl")
    cud = ["score", "--scorer", "cud", "--model", str(tiny_model_dir), "--adapter", str(tmp_path / "run")]
    code = main([*cud, "--data", "tofu:forget01[0:4]", "--tofu-dir", str(tofu_dir), "--out", str(tmp_path / "c.jsonl")])
    assert code == 1
    assert "trains from the model folder (option model_spec)" in capsys.readouterr().err


def test_a_model_neither_local_nor_cached_fails_at_once(tofu_dir, capsys, monkeypatch):
    """A hub id that is not cached: one short request decides (here the hub cannot be reached),
    instead of transformers' minute of retries; with HF_HUB_OFFLINE set, no request at all."""
    args = ["probs", "--model", "someone/not-a-model", "--data", "tofu:forget01[0:2]", "--tofu-dir", str(tofu_dir)]
    assert main(args) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: --model someone/not-a-model: not a local folder nor in the hub cache, and the hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(args) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --model someone/not-a-model: not a local folder nor in the hub cache, and HF_HUB_OFFLINE is set"
    )
