"""Where lm-eval's tasks come from: the task folders plugins register, and a TaskManager over them.

lm-eval has no entry-point task discovery, so the TaskManager is given every task folder that a
plugin registers (kind ``lm_eval_task_dir``; the built-in one is ``unlearn``). :func:`task_dirs`
is the one place that lists them: a folder moved or added is registered, nothing else changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import UnlearnError
from ..interfaces import LM_EVAL_TASK_DIR


def task_dirs() -> list[Path]:
    """Every registered lm-eval task folder (built-in and plugins), as paths."""
    from ..host import list_components

    return [Path(c.obj) for c in list_components(LM_EVAL_TASK_DIR)]


def builtin_task_dir() -> Path:
    """This package's task folder (mmlu_local), as registered by the
    built-in plugin: the path to give lm_eval's --include_path."""
    from ..host import get_component

    return Path(get_component(LM_EVAL_TASK_DIR, "unlearn")).resolve()


def task_manager(metadata: dict[str, Any] | None = None, *, include_defaults: bool = True):
    """A TaskManager that knows our tasks and every plugin's (include_path must be a list)."""
    from lm_eval.tasks import TaskManager

    dirs = [str(d) for d in task_dirs()]
    return TaskManager(include_path=dirs, include_defaults=include_defaults, metadata=dict(metadata or {}))


def task_manager_for(names: Sequence[str], metadata: dict[str, Any] | None = None):
    """The cheapest TaskManager that knows ``names``: lm-eval's ~15k built-in tasks are
    indexed (seconds) only when a name is not one of the registered folders' tasks."""
    manager = task_manager(metadata, include_defaults=False)
    if all(n in manager.all_tasks for n in names):
        return manager
    manager = task_manager(metadata, include_defaults=True)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        import difflib

        hints = []
        for n in unknown:
            close = difflib.get_close_matches(n, manager.all_tasks, n=4, cutoff=0.6)
            hints.append(f"{n}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        from ..host import get_host

        raise UnlearnError(
            f"unknown lm-eval task(s): {'; '.join(hints)}. TOFU: tofu_forget01 (tag: all forget01 and Model "
            "Utility tasks), tofu_forget01_nogen (without generation), tofu_forget01_truth_ratio, ...; "
            "offline: mmlu_local, wmdp_local. `lm_eval ls tasks --include_path $(unlearn eval --print-tasks-dir)` "
            f"lists all{get_host().not_loaded(LM_EVAL_TASK_DIR)}"
        )
    return manager


def load_tasks(manager, names: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """(objects to hand to simple_evaluate, leaf tasks by name), building each task once."""
    loaded = manager.load(list(names))
    tasks, groups = loaded["tasks"], loaded["groups"]
    specs: list[Any] = []
    for name in names:
        if name in groups:
            specs.append(groups[name])
        elif name in tasks:
            specs.append(tasks[name])
        else:  # a tag: its member tasks
            members = manager.task_index[name].tags
            specs.extend(tasks[m] for m in sorted(members) if m in tasks)
    return specs, tasks


def write_task_files(folder: Path, files: dict[str, str]) -> None:
    """Write a task folder's ``_generate_configs.py`` output ({file name: text}) into the folder
    (a test checks that the folder holds exactly that output)."""
    for name, text in files.items():
        (folder / name).write_text(text)
