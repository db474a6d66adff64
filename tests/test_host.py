"""Plugin loading: isolation of failing plugins, duplicates, the disable list, strict mode."""

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
from unlearn_plugins.errors import DuplicateComponentError, PluginLoadError, UnknownComponentError
from unlearn_plugins.host import PluginHost


@pytest.fixture
def plugin_modules(tmp_path, monkeypatch):
    """Third-party plugin modules on sys.path: a good one, one that fails to import,
    one whose hook raises, and one that clashes with a built-in name."""
    (tmp_path / "good_plugin.py").write_text(textwrap.dedent("""
        from unlearn_plugins import hookimpl

        class ConstantScorer:
            def __init__(self, value=1.0):
                self.value = value
            def score(self, samples, *, model, tokenizer):
                return [self.value for _ in samples]

        @hookimpl
        def register_difficulty_scorers(register):
            register("constant", ConstantScorer)
    """))
    (tmp_path / "broken_import.py").write_text("import module_that_does_not_exist\n")
    (tmp_path / "raising_hook.py").write_text(textwrap.dedent("""
        from unlearn_plugins import hookimpl

        @hookimpl
        def register_difficulty_scorers(register):
            raise RuntimeError("boom in hook")

        @hookimpl
        def register_lm_eval_task_dirs(register):
            register("raising-tasks", ".")
    """))
    (tmp_path / "clash_plugin.py").write_text(textwrap.dedent("""
        from unlearn_plugins import hookimpl

        @hookimpl
        def register_difficulty_scorers(register):
            register("length", object)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("good_plugin", "broken_import", "raising_hook", "clash_plugin"):
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
        host = PluginHost(entry_points=eps(("good", "good_plugin"), ("broken", "broken_import"), ("raising", "raising_hook")))
    messages = " ".join(str(w.message) for w in caught)
    assert "'broken'" in messages and "module_that_does_not_exist" in messages
    assert "'raising'" in messages and "boom in hook" in messages
    # the good plugin and the built-ins keep working
    assert host.get(DIFFICULTY_SCORER, "constant").plugin == "good"
    assert host.get(DIFFICULTY_SCORER, "length").plugin == "builtin-scorers"
    assert "failed to import" in host.plugins["broken"].errors[0]
    assert "register_difficulty_scorers raised" in host.plugins["raising"].errors[0]
    # a raising hook loses only that hook: its other hook still registered
    assert host.get("lm_eval_task_dir", "raising-tasks").plugin == "raising"


def test_strict_mode_turns_failures_into_errors(plugin_modules):
    with pytest.raises(PluginLoadError, match="'broken'.*failed to import.*UNLEARN_PLUGINS_STRICT"):
        PluginHost(entry_points=eps(("broken", "broken_import")), strict=True)
    with pytest.raises(PluginLoadError, match="boom in hook"):
        PluginHost(entry_points=eps(("raising", "raising_hook")), strict=True)


def test_duplicate_names_error_names_both_plugins(plugin_modules):
    with pytest.raises(DuplicateComponentError) as info:
        PluginHost(entry_points=eps(("clash", "clash_plugin")))
    assert "'builtin-scorers'" in str(info.value) and "'clash'" in str(info.value)
    assert "difficulty_scorer 'length'" in str(info.value)


def test_disable_list_blocks_plugins(plugin_modules, monkeypatch):
    monkeypatch.setenv("UNLEARN_DISABLE_PLUGINS", "clash, broken")
    host = PluginHost(entry_points=eps(("clash", "clash_plugin"), ("broken", "broken_import"), ("good", "good_plugin")))
    assert host.plugins["clash"].disabled and host.plugins["broken"].disabled
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
    with pytest.raises(PluginLoadError, match="rejected its options"):
        create(DIFFICULTY_SCORER, "constant", colour="red")
    # options called like create's own parameters are the component's options, not a TypeError
    for key in ("name", "kind"):
        with pytest.raises(PluginLoadError, match=f"rejected its options {{'{key}': 1}}"):
            create(DIFFICULTY_SCORER, "constant", **{key: 1})


def _dist_info(root, dist, module, version="1.0"):
    """A minimal installed distribution (dist-info) exposing one entry point."""
    info = root / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\nSummary: test plugin {dist}\n")
    (info / "entry_points.txt").write_text(f"[unlearn_plugins]\n{dist} = {module}\n")


def run_cli(args, env_extra, cwd=None):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "unlearn_plugins.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_cli_lists_entry_point_plugins_and_errors(plugin_modules):
    _dist_info(plugin_modules, "good-dist", "good_plugin")
    _dist_info(plugin_modules, "broken-dist", "broken_import")
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_modules), os.environ.get("PYTHONPATH", "")])}
    out = run_cli(["plugins", "--json"], env)
    assert out.returncode == 0, out.stderr
    listing = {p["name"]: p for p in json.loads(out.stdout)}
    assert listing["good-dist"]["source"] == "entry point"
    assert listing["good-dist"]["distribution"] == "good-dist" and listing["good-dist"]["version"] == "1.0"
    assert listing["good-dist"]["components"] == {"difficulty_scorer": ["constant"]}
    assert "module_that_does_not_exist" in listing["broken-dist"]["errors"][0]
    assert listing["builtin-scorers"]["source"] == "built-in"
    text = run_cli(["plugins"], env)
    assert "ERROR: failed to import" in text.stdout
    strict = run_cli(["plugins"], {**env, "UNLEARN_PLUGINS_STRICT": "1"})
    assert strict.returncode == 1
    assert "error: plugin 'broken-dist'" in strict.stderr and "Traceback" not in strict.stderr
