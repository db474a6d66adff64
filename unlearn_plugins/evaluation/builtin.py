"""Built-in lm-eval task folder (tasks/: TOFU, local MMLU and WMDP)."""

from .. import hookimpl
from ..host import package_file


@hookimpl
def register_lm_eval_task_dirs(register):
    register("unlearn", package_file("tasks"))
