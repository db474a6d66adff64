"""A benchmark added by a plugin, as the built-in MovieLens one is: the toy benchmark of
docs/plugins.md ("register_benchmarks"), installed as an entry-point plugin, reached by the core
through its Benchmark alone: its task folder in lm-eval's task discovery, its CLI verb, its stage
kind in a study's builders; a bad description is refused whole."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

from unlearn_plugins import host as host_module
from unlearn_plugins.host import PluginHost
from unlearn_plugins.interfaces import BENCHMARK, LM_EVAL_TASK_DIR

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def doc_plugin() -> str:
    """The Python block of docs/plugins.md's register_benchmarks section."""
    section = DOCS.read_text().split("## register_benchmarks(register)", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The docs' plugin as package ``toy_benchmark`` with a one-task folder, made the process's host."""
    package = tmp_path / "toy_benchmark"
    (package / "tasks").mkdir(parents=True)
    (package / "__init__.py").write_text(doc_plugin())
    (package / "tasks" / "toy_task.yaml").write_text(
        "task: toy_task\ndataset_path: json\ntest_split: train\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toy_benchmark", None)
    host = PluginHost(entry_points=[md.EntryPoint(name="toy", value="toy_benchmark", group="unlearn_plugins")])
    monkeypatch.setattr(host_module, "_HOST", host)
    yield host
    sys.modules.pop("toy_benchmark", None)


def test_the_docs_benchmark_is_registered_with_its_task_folder(toy):
    assert toy.plugins["toy"].errors == []
    assert toy.get(BENCHMARK, "toy").obj.summary == "a toy benchmark"
    folder = toy.get(LM_EVAL_TASK_DIR, "toy")  # named after the benchmark, given by its plugin
    assert folder.plugin == "toy" and Path(folder.obj).name == "tasks"
    assert sorted(toy.plugins["toy"].components) == [BENCHMARK, LM_EVAL_TASK_DIR]


def test_the_core_reaches_its_tasks_verb_and_stage_kind(toy, tmp_path, capsys):
    from unlearn_plugins.cli import main
    from unlearn_plugins.evaluation.lm_eval_runner import task_manager
    from unlearn_plugins.study.cells import builder

    assert "toy_task" in task_manager(include_defaults=False).all_tasks
    assert main(["toy", "--out", str(tmp_path / "data")]) == 0
    assert capsys.readouterr().out == f"toy data -> {tmp_path / 'data'}\n"
    stage = tmp_path / "stage"
    stage.mkdir()
    builder("toy_count")(stage, {"items": [1, 2, 3]})
    assert (stage / "count.txt").read_text() == "3"
    assert main(["plugins"]) == 0
    assert "    toy  toy_benchmark; a toy benchmark" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize(
    "change, message",
    [
        ('task_dirs=(Path(__file__).parent / "tasks",)', r"task_dirs: .*missing is not a folder"),
        ('summary="a toy benchmark"', r"evaluation_stages: 'toy_eval' is not one of stage_kinds"),
        ("Benchmark(", r"not an unlearn_plugins.interfaces.Benchmark"),
        ('summary="a toy benchmark",', r"\[benchmark\] source 'generated' is benchmark 'tofu''s"),
    ],
)
def test_a_bad_benchmark_is_refused_whole(toy, tmp_path, change, message):
    replacement = {
        'task_dirs=(Path(__file__).parent / "tasks",)': 'task_dirs=(Path(__file__).parent / "missing",)',
        'summary="a toy benchmark"': 'summary="a toy benchmark", evaluation_stages=("toy_eval",)',
        "Benchmark(": "dict(",
        'summary="a toy benchmark",': 'summary="a toy benchmark", sources=("generated",),',  # TOFU's
    }[change]
    source = doc_plugin()
    assert change in source
    (tmp_path / "toy_benchmark" / "__init__.py").write_text(source.replace(change, replacement, 1))
    sys.modules.pop("toy_benchmark", None)
    with pytest.warns(RuntimeWarning, match=r"plugin 'toy' .*refused: hook register_benchmarks raised: .*" + message):
        host = PluginHost(entry_points=[md.EntryPoint(name="toy", value="toy_benchmark", group="unlearn_plugins")])
    assert host.plugins["toy"].components == {}
    assert "toy" not in host.components[LM_EVAL_TASK_DIR]
