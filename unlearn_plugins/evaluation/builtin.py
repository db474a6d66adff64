"""Built-in lm-eval task folder (tasks/: local MMLU, which every benchmark uses; each benchmark's
own tasks are in its folder, ``unlearn_plugins/benchmarks/NAME/tasks/``)."""

from .. import hookimpl
from ..host import package_file


@hookimpl
def register_lm_eval_task_dirs(register):
    register("unlearn", package_file("tasks"))
