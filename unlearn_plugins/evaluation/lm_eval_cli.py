"""lm-eval's own command line with this package's model class registered (``--model hf-prefix``,
:class:`.prefix_lm.PrefixSharedLM`: each prompt scored once, the same numbers as ``--model hf``).
lm-eval (0.4) finds model classes only among its own and those registered by code already
imported (it has no entry points for models, and ``--include_path`` reads task YAMLs, not code),
so this is its CLI after one import::

    unlearn-lm-eval --model hf-prefix --model_args pretrained=MODEL --tasks tofu_forget01 \\
        --include_path "$(unlearn eval --print-tasks-dir)"
    python -m unlearn_plugins.evaluation.lm_eval_cli ...   # the same, without the console script

and from Python, lm-eval's own entry after the same import::

    import lm_eval, unlearn_plugins.evaluation.prefix_lm  # registers hf-prefix
    lm_eval.simple_evaluate(model="hf-prefix", model_args={"pretrained": MODEL}, tasks=[...],
        task_manager=lm_eval.tasks.TaskManager(include_path=TASKS_DIR, metadata={"tokenizer": MODEL}))

``hf-prefix``'s options (:func:`.prefix_lm.check_options`) and ``--limit`` are checked before
lm-eval starts, and a mistake in them is one ``error:`` line (exit 1), not a traceback; lm-eval's
own errors stay lm-eval's.
"""

from __future__ import annotations

import sys


def check_command_line(argv: list[str]) -> None:
    """What this package knows to be wrong in an lm-eval command line, as UnlearnError."""
    from lm_eval._cli import HarnessCLI

    from ..errors import UnlearnError
    from .prefix_lm import MODEL_NAME, check_options

    saved = list(sys.argv)
    sys.argv[:] = [saved[0] if saved else "unlearn-lm-eval", *argv]
    try:
        args = HarnessCLI().parse_args()  # inserts "run" into sys.argv where no command is given
    finally:
        sys.argv[:] = saved
    limit = getattr(args, "limit", None)
    if limit is not None and not limit > 0:
        raise UnlearnError(f"--limit {limit:g}: must be > 0 (documents per task, or a fraction of them below 1)")
    if getattr(args, "model", None) == MODEL_NAME:
        options = dict(getattr(args, "model_args", None) or {})
        if hasattr(args, "batch_size"):
            options["batch_size"] = args.batch_size
        if getattr(args, "device", None) is not None:
            options["device"] = args.device
        check_options(options)


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    from ..errors import UnlearnError
    from . import prefix_lm  # noqa: F401  (registers hf-prefix)

    try:
        check_command_line(sys.argv[1:])
        cli_evaluate()
    except UnlearnError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
