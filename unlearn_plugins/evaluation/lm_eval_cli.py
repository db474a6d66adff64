"""lm-eval's own command line with this package's model class registered (``--model hf-prefix``,
:class:`.prefix_lm.PrefixSharedLM`: each prompt scored once, the same numbers as ``--model hf``).
lm-eval finds model classes only among its own, so this is its CLI after one import::

    unlearn-lm-eval --model hf-prefix --model_args pretrained=MODEL --tasks tofu_forget01 \\
        --include_path "$(unlearn eval --print-tasks-dir)"
    python -m unlearn_plugins.evaluation.lm_eval_cli ...   # the same, without the console script
"""

from __future__ import annotations


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    from . import prefix_lm  # noqa: F401  (registers hf-prefix)

    cli_evaluate()


if __name__ == "__main__":
    main()
