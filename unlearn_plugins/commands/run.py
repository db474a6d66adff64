"""`unlearn run`: unlearn a forget split from a model with an objective (LoRA or full
fine-tuning); writes a PEFT adapter and run.json. Options come from defaults, then
``--preset``, then ``--config FILE.toml``, then the flags given (only flags actually given
override); ``--show-config`` prints the result and runs nothing."""

from __future__ import annotations

from .common import add_command
from .training_options import (
    S,
    add_training_options,
    resolve_config,  # noqa: F401 - `unlearn run`'s option resolution, as tests reach it
    run_training,
)

EXAMPLE = """examples:
  unlearn run --forget tofu:forget01 --retain tofu:retain99 --objective npo --out npo
  unlearn run --preset reglu --forget tofu:forget05 --retain tofu:retain95 --lr 5e-5 --out reglu
  unlearn run --config run.toml --seed 1 --out run-s1      # the flags given override the file
  unlearn run --preset reglu --config run.toml --out x --show-config   # the merged options; runs nothing
  unlearn run --config run.toml --seed 1 --out run-s1 --resume         # continue an interrupted run
"""


def add_parser(sub) -> None:
    from ..training.config import DATA, METHOD, UnlearnConfig

    p = add_command(sub, "run", "unlearn a forget set (writes a PEFT adapter and run.json)", __doc__, EXAMPLE)
    groups = {DATA: p.add_argument_group(DATA), METHOD: p.add_argument_group(METHOD)}
    groups[METHOD].add_argument(
        "--preset",
        default=S,
        help="a named recipe applied below --config and flags: reglu "
        "(= --initializer rila --regularizer rol --objective ihl with ReGLU's TOFU defaults and schedule)",
    )
    add_training_options(p, UnlearnConfig, groups)
    groups[DATA].add_argument("--no-retain", action="store_true", default=S, help="train without retain data")
    p.set_defaults(func=run)


def check_overlap(config) -> None:
    """Refuse forget samples that are also retain samples (unless allow_overlap), before any model work."""
    from ..data import text
    from ..data.qa import check_disjoint, load_split

    if config.retain and (text.is_text_spec(config.forget) or text.is_text_spec(config.retain)):
        if text.is_text_spec(config.forget) and text.is_text_spec(config.retain):
            text.check_disjoint_documents(config.forget, config.retain, allow_overlap=config.allow_overlap)
    elif config.retain:
        check_disjoint(
            load_split(config.forget, config.tofu_dir),
            load_split(config.retain, config.tofu_dir),
            forget_spec=config.forget,
            retain_spec=config.retain,
            allow_overlap=config.allow_overlap,
        )


def run(args) -> int:
    from ..training import UnlearnConfig, run_unlearning

    def done(result, config) -> str:
        return f"unlearned {result.record['samples']['forget']} forget samples with {config.objective}"

    return run_training(args, UnlearnConfig, "unlearn run", run_unlearning, done, check=check_overlap)
