"""Plugin loading: a plugin loads whole or is refused (import error, misspelt hook, raising
hook, a taken name) while the rest keep working; the disable and load lists; strict mode;
what `unlearn plugins` shows."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap

import pytest

import unlearn_plugins
from unlearn_plugins import DIFFICULTY_SCORER, create, get_component, list_components
from unlearn_plugins.errors import PluginLoadError, UnknownComponentError
from unlearn_plugins.host import PluginHost


@pytest.fixture
def plugin_modules(tmp_path, monkeypatch):
    """Third-party plugin modules on sys.path: a good one, one that fails to import,
    one whose hook raises, and one that clashes with a built-in name."""
    (tmp_path / "good_plugin.py").write_text(
        textwrap.dedent("""
        from unlearn_plugins import hookimpl

        class ConstantScorer:
            def __init__(self, value=1.0):
                self.value = value
            def score(self, samples, *, model, tokenizer):
                return [self.value for _ in samples]

        @hookimpl
        def register_difficulty_scorers(register):
            register("constant", ConstantScorer)
    """)
    )
    (tmp_path / "good_copy.py").write_text((tmp_path / "good_plugin.py").read_text())
    (tmp_path / "broken_import.py").write_text("import module_that_does_not_exist\n")
    (tmp_path / "raising_hook.py").write_text(
        textwrap.dedent("""
        from unlearn_plugins import hookimpl

        @hookimpl
        def register_difficulty_scorers(register):
            raise RuntimeError("boom in hook")

        @hookimpl
        def register_lm_eval_task_dirs(register):
            register("raising-tasks", ".")
    """)
    )
    (tmp_path / "clash_plugin.py").write_text(
        textwrap.dedent("""
        from unlearn_plugins import hookimpl

        @hookimpl
        def register_difficulty_scorers(register):
            register("length", object)
    """)
    )
    (tmp_path / "misspelt_hook.py").write_text(
        textwrap.dedent("""
        from unlearn_plugins import hookimpl

        @hookimpl
        def register_difficulty_scorer(register):  # the hook is register_difficulty_scorers
            register("never", object)
    """)
    )
    (tmp_path / "no_hookimpl.py").write_text(
        textwrap.dedent("""
        def register_difficulty_scorers(register):  # not marked with @hookimpl
            register("never", object)
    """)
    )
    (tmp_path / "half_plugin.py").write_text(
        textwrap.dedent("""
        from pathlib import Path
        from unlearn_plugins import hookimpl

        class Scorer:
            def score(self, samples, *, model, tokenizer):
                return [0.0 for _ in samples]

        @hookimpl
        def register_lm_eval_task_dirs(register):
            register("half-tasks", Path(__file__).parent / "half_tasks")

        @hookimpl
        def register_difficulty_scorers(register):
            register("half_one", Scorer)
            raise RuntimeError("failed after registering half_one")
    """)
    )
    (tmp_path / "tasks_plugin.py").write_text(
        textwrap.dedent("""
        from pathlib import Path
        from unlearn_plugins import hookimpl

        @hookimpl
        def register_lm_eval_task_dirs(register):
            register("my-tasks", Path(__file__).parent / "my_tasks")
    """)
    )
    for folder in ("half_tasks", "my_tasks"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "t.yaml").write_text("task: t\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in (
        "good_plugin",
        "good_copy",
        "broken_import",
        "raising_hook",
        "clash_plugin",
        "misspelt_hook",
        "no_hookimpl",
        "half_plugin",
        "tasks_plugin",
    ):
        sys.modules.pop(name, None)
    return tmp_path


def eps(*pairs):
    return [md.EntryPoint(name=name, value=value, group="unlearn_plugins") for name, value in pairs]


def test_builtins_are_listed_and_created():
    names = [c.name for c in list_components(DIFFICULTY_SCORER)]
    assert {"length", "loss"} <= set(names)
    scorer = create(DIFFICULTY_SCORER, "length")
    assert hasattr(scorer, "score")


def test_unknown_name_lists_available():
    with pytest.raises(UnknownComponentError) as info:
        get_component(DIFFICULTY_SCORER, "nope")
    assert "unknown difficulty scorer 'nope'" in str(info.value)
    assert "length" in str(info.value) and "loss" in str(info.value)
    with pytest.raises(UnknownComponentError, match="kinds: difficulty_scorer"):
        list_components("scorers")


def test_failing_import_and_raising_hook_are_isolated(plugin_modules):
    with pytest.warns(RuntimeWarning) as caught:
        host = PluginHost(
            entry_points=eps(("good", "good_plugin"), ("broken", "broken_import"), ("raising", "raising_hook"))
        )
    messages = " ".join(str(w.message) for w in caught)
    assert "'broken'" in messages and "module_that_does_not_exist" in messages
    assert "'raising'" in messages and "boom in hook" in messages
    # the good plugin and the built-ins keep working
    assert host.get(DIFFICULTY_SCORER, "constant").plugin == "good"
    assert host.get(DIFFICULTY_SCORER, "length").plugin == "builtin-scorers"
    assert "failed to import" in host.plugins["broken"].errors[0]
    assert "register_difficulty_scorers raised" in host.plugins["raising"].errors[0]
    # a plugin loads whole or not at all: its other hook's task folder is not registered either
    with pytest.raises(UnknownComponentError):
        host.get("lm_eval_task_dir", "raising-tasks")
    assert host.plugins["raising"].components == {}


def test_strict_mode_turns_failures_into_errors(plugin_modules):
    with pytest.raises(PluginLoadError, match="'broken'.*failed to import.*UNLEARN_PLUGINS_STRICT"):
        PluginHost(entry_points=eps(("broken", "broken_import")), strict=True)
    with pytest.raises(PluginLoadError, match="boom in hook"):
        PluginHost(entry_points=eps(("raising", "raising_hook")), strict=True)


def refused_beside_good(entry_point: tuple[str, str]) -> tuple[PluginHost, str]:
    """The host of ``entry_point`` and the good plugin, and the one warning: the refusal."""
    with pytest.warns(RuntimeWarning) as caught:
        host = PluginHost(entry_points=eps(entry_point, ("good", "good_plugin")))
    (message,) = [str(w.message) for w in caught]
    return host, message


def test_a_plugin_reusing_a_builtin_name_is_refused_and_the_rest_keep_working(plugin_modules):
    host, message = refused_beside_good(("clash", "clash_plugin"))
    assert message.startswith(
        "plugin 'clash' (entry point) refused: name already taken: difficulty_scorer 'length' "
        "is already registered by plugin 'builtin-scorers'"
    )
    assert "UNLEARN_DISABLE_PLUGINS=clash" in message and "\n" not in message
    assert host.get(DIFFICULTY_SCORER, "length").plugin == "builtin-scorers"
    assert host.get(DIFFICULTY_SCORER, "length").obj is not object
    assert host.get(DIFFICULTY_SCORER, "constant").plugin == "good"
    assert host.plugins["clash"].components == {} and "name already taken" in host.plugins["clash"].errors[0]
    with pytest.raises(PluginLoadError, match="plugin 'clash'.*already registered by plugin 'builtin-scorers'"):
        PluginHost(entry_points=eps(("clash", "clash_plugin")), strict=True)


def test_a_plugin_named_like_a_builtin_is_refused(plugin_modules):
    with pytest.warns(RuntimeWarning, match="plugin 'builtin-scorers' \\(entry point\\) refused: name already taken"):
        host = PluginHost(entry_points=eps(("builtin-scorers", "good_plugin")))
    assert host.get(DIFFICULTY_SCORER, "length").plugin == "builtin-scorers"
    with pytest.raises(UnknownComponentError):
        host.get(DIFFICULTY_SCORER, "constant")
    refused = host.refused[0]
    assert (refused.name, refused.source) == ("builtin-scorers", "entry point") and refused.errors


def test_two_third_party_plugins_with_one_component_name(plugin_modules):
    """The first in name order keeps it; the other is refused, naming both."""
    with pytest.warns(RuntimeWarning, match="plugin 'good2' .*'constant' is already registered by plugin 'good1'"):
        host = PluginHost(entry_points=eps(("good2", "good_copy"), ("good1", "good_plugin")))
    assert host.get(DIFFICULTY_SCORER, "constant").plugin == "good1"


def test_misspelt_hook_is_reported_not_silently_ignored(plugin_modules):
    """pluggy's check_pending: a hook name that is not in the spec refuses the plugin."""
    host, message = refused_beside_good(("typo", "misspelt_hook"))
    assert message.startswith(
        "plugin 'typo' (entry point) refused: unknown hook: 'register_difficulty_scorer' is "
        "not an unlearn_plugins hook (did you mean 'register_difficulty_scorers'?"
    )
    assert host.plugins["typo"].errors[0].startswith("unknown hook: 'register_difficulty_scorer'")
    assert host.get(DIFFICULTY_SCORER, "constant").plugin == "good"  # the rest keep working
    assert "typo" not in {name for name, _ in host.pm.list_name_plugin()}
    with pytest.raises(PluginLoadError, match="unknown hook"):
        PluginHost(entry_points=eps(("typo", "misspelt_hook")), strict=True)


def test_plugin_without_marked_hooks_is_reported(plugin_modules):
    with pytest.warns(RuntimeWarning, match=r"plugin 'unmarked' .*refused: no hook: .*@unlearn_plugins.hookimpl"):
        host = PluginHost(entry_points=eps(("unmarked", "no_hookimpl")))
    assert host.plugins["unmarked"].components == {}


def test_a_hook_that_fails_half_way_leaves_nothing_registered(plugin_modules):
    with pytest.warns(RuntimeWarning, match="plugin 'half' .*failed after registering half_one"):
        host = PluginHost(entry_points=eps(("half", "half_plugin")))
    for kind, name in ((DIFFICULTY_SCORER, "half_one"), ("lm_eval_task_dir", "half-tasks")):
        with pytest.raises(UnknownComponentError):
            host.get(kind, name)
    assert host.plugins["half"].components == {} and host.plugins["half"].registered == []


def test_an_empty_task_folder_is_refused_with_the_package_data_hint(plugin_modules):
    """The usual cause: a setuptools package that did not declare its YAML as package data."""
    (plugin_modules / "my_tasks" / "t.yaml").unlink()
    with pytest.warns(
        RuntimeWarning,
        match=r"plugin 'tasks' .*holds no \.yaml task file \(a setuptools package "
        r"must declare its YAML files as package data\)",
    ):
        host = PluginHost(entry_points=eps(("tasks", "tasks_plugin")))
    assert host.plugins["tasks"].components == {}


def test_load_list_loads_only_the_named_third_party_plugins(plugin_modules, monkeypatch):
    """UNLEARN_LOAD_PLUGINS, as llm's LLM_LOAD_PLUGINS: built-ins always load."""
    monkeypatch.setenv("UNLEARN_LOAD_PLUGINS", "good")
    host = PluginHost(entry_points=eps(("good", "good_plugin"), ("broken", "broken_import"), ("tasks", "tasks_plugin")))
    assert host.get(DIFFICULTY_SCORER, "constant").plugin == "good"
    assert host.get(DIFFICULTY_SCORER, "length").plugin == "builtin-scorers"
    for name in ("broken", "tasks"):
        assert host.plugins[name].disabled and host.plugins[name].disabled_by == "UNLEARN_LOAD_PLUGINS"
        assert host.plugins[name].errors == []  # never imported
    assert "broken_import" not in sys.modules
    monkeypatch.setenv("UNLEARN_LOAD_PLUGINS", "")  # set but empty: no third-party plugin
    host = PluginHost(entry_points=eps(("good", "good_plugin")))
    assert host.plugins["good"].disabled and host.get(DIFFICULTY_SCORER, "loss").plugin == "builtin-scorers"
    monkeypatch.setenv("UNLEARN_LOAD_PLUGINS", "good,godo")
    with pytest.warns(RuntimeWarning, match="UNLEARN_LOAD_PLUGINS names 'godo': no such plugin is installed"):
        PluginHost(entry_points=eps(("good", "good_plugin")))


def test_disable_list_blocks_plugins(plugin_modules, monkeypatch):
    monkeypatch.setenv("UNLEARN_DISABLE_PLUGINS", "clash, broken")
    host = PluginHost(entry_points=eps(("clash", "clash_plugin"), ("broken", "broken_import"), ("good", "good_plugin")))
    assert host.plugins["clash"].disabled and host.plugins["broken"].disabled
    assert host.plugins["clash"].disabled_by == "UNLEARN_DISABLE_PLUGINS"
    assert host.plugins["broken"].errors == []
    assert host.get(DIFFICULTY_SCORER, "length").plugin == "builtin-scorers"
    assert host.get(DIFFICULTY_SCORER, "constant").plugin == "good"
    # built-ins can be disabled too
    host = PluginHost(load_entry_points=False, disabled={"builtin-scorers"})
    with pytest.raises(UnknownComponentError):
        host.get(DIFFICULTY_SCORER, "length")


def test_create_checks_protocol(plugin_modules):
    host = PluginHost(entry_points=eps(("good", "good_plugin")))
    unlearn_plugins.host._HOST = host
    assert create(DIFFICULTY_SCORER, "constant", value=2.0).score([1, 2], model=None, tokenizer=None) == [2.0, 2.0]
    with pytest.raises(
        PluginLoadError,
        match=r"^scorer 'constant' \(plugin 'good'\) rejected its options "
        r"\{'colour': 'red'\}: unknown option 'colour' \(its options: value\)$",
    ):
        create(DIFFICULTY_SCORER, "constant", colour="red")
    # options called like create's own parameters are the component's options, not a TypeError
    for key in ("name", "kind"):
        with pytest.raises(PluginLoadError, match=f"rejected its options {{'{key}': 1}}"):
            create(DIFFICULTY_SCORER, "constant", **{key: 1})


def _dist_info(root, dist, module, version="1.0"):
    """A minimal installed distribution (dist-info) exposing one entry point."""
    info = root / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: test plugin {dist}\n"
    )
    (info / "entry_points.txt").write_text(f"[unlearn_plugins]\n{dist} = {module}\n")


def run_cli(args, env_extra, cwd=None):
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "unlearn_plugins.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_cli_lists_entry_point_plugins_and_errors(plugin_modules):
    _dist_info(plugin_modules, "good-dist", "good_plugin")
    _dist_info(plugin_modules, "broken-dist", "broken_import")
    _dist_info(plugin_modules, "clash-dist", "clash_plugin")
    _dist_info(plugin_modules, "tasks-dist", "tasks_plugin")
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_modules), os.environ.get("PYTHONPATH", "")])}
    out = run_cli(["plugins", "--json"], env)
    assert out.returncode == 0, out.stderr  # a plugin clashing with a built-in does not take the command down
    assert "warning: plugin 'clash-dist' (entry point) refused: name already taken" in out.stderr
    listing = {p["name"]: p for p in json.loads(out.stdout)}
    good = listing["good-dist"]
    assert good["source"] == "entry point"
    assert good["distribution"] == "good-dist" and good["version"] == "1.0"
    assert good["components"] == {
        "difficulty_scorer": [
            {
                "name": "constant",
                "module": "good_plugin:ConstantScorer",
                "options": [{"name": "value", "type": "", "help": "", "default": 1.0}],
            }
        ]
    }
    assert "module_that_does_not_exist" in listing["broken-dist"]["errors"][0]
    assert listing["clash-dist"]["components"] == {} and "already registered" in listing["clash-dist"]["errors"][0]
    assert listing["tasks-dist"]["components"] == {
        "lm_eval_task_dir": [
            {"name": "my-tasks", "module": "tasks_plugin", "path": str((plugin_modules / "my_tasks").resolve())}
        ]
    }
    assert listing["builtin-scorers"]["source"] == "built-in"
    assert listing["builtin-objectives"]["components"]["unlearning_objective"][0]["module"].startswith(
        "unlearn_plugins.objectives."
    )
    text = run_cli(["plugins"], env)
    assert "ERROR: failed to import" in text.stdout
    assert "ERROR: name already taken: difficulty_scorer 'length'" in text.stdout
    assert f"    my-tasks  {(plugin_modules / 'my_tasks').resolve()}" in text.stdout.splitlines()
    assert "    constant  good_plugin:ConstantScorer; options: value=1.0" in text.stdout.splitlines()
    strict = run_cli(["plugins"], {**env, "UNLEARN_PLUGINS_STRICT": "1"})
    assert strict.returncode == 1
    assert "error: plugin 'broken-dist'" in strict.stderr and "Traceback" not in strict.stderr


def test_plugins_json_into_a_closed_pipe_is_not_an_error():
    """`unlearn plugins --json | head -1`: the reader leaves before the listing is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "unlearn_plugins.cli", "plugins", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # nobody reads: every write gets EPIPE
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, stderr
    assert "BrokenPipe" not in stderr and "Traceback" not in stderr and "Exception ignored" not in stderr
    shell = subprocess.run(
        "'%s' -m unlearn_plugins.cli plugins --json | head -1" % sys.executable,
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shell.stdout == "[\n" and shell.stderr == ""


def test_a_plugin_that_exits_or_interrupts_at_import_is_named(tmp_path):
    """sys.exit(0) at import made every plugin-loading command exit 0 with no
    output; a KeyboardInterrupt printed "interrupted" without naming the plugin."""
    (tmp_path / "exiting_plugin.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "interrupting_plugin.py").write_text("raise KeyboardInterrupt\n")
    _dist_info(tmp_path, "exiting-dist", "exiting_plugin")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = run_cli(["plugins"], env)
    assert out.returncode == 0, out.stderr
    assert "plugin 'exiting-dist' (entry point) refused: failed to import: it called sys.exit(0)" in out.stderr
    assert "builtin-scorers" in out.stdout  # the command went on

    _dist_info(tmp_path, "interrupting-dist", "interrupting_plugin")
    out = run_cli(["plugins"], env)
    assert out.returncode == 130
    assert out.stderr.strip().splitlines()[-1] == (
        "interrupted while importing plugin 'interrupting-dist' (entry point)"
    )
