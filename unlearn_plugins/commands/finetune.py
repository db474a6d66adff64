"""`unlearn finetune`: plain NLL training on a TOFU split, e.g. to build the "full" and
"retain" target models (full fine-tuning, or LoRA with --merge). Options come from defaults,
then ``--config FILE.toml``, then the flags given; ``--show-config`` prints the result and
trains nothing."""

from __future__ import annotations

from .common import add_command
from .training_options import add_training_options, run_training

EXAMPLE = """examples:
  unlearn finetune --data tofu:full --authors 0,1 --max-length 128 --lr 1e-3 --epochs 3 --merge --out ft
  unlearn finetune --data tofu:retain99 --full-finetune --out retain99
  unlearn finetune --data tofu:full --full-finetune --record-trajectory --out ft   # for --objective lmcleaner
  unlearn finetune --data movielens/train.json --merge --out ml-target   # files of `unlearn movielens`
  unlearn finetune --config ft.toml --lr 2e-4 --out ft --show-config      # the merged options; trains nothing
"""


def add_parser(sub) -> None:
    from ..training.config import DATA, FinetuneConfig

    p = add_command(sub, "finetune", "fine-tune a model on a TOFU split (target models)", __doc__, EXAMPLE)
    add_training_options(p, FinetuneConfig, {DATA: p.add_argument_group(DATA)})
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import FinetuneConfig, run_finetune

    def done(result, config) -> str:
        return f"fine-tuned on {result.record['samples']['train']} samples"

    return run_training(args, FinetuneConfig, "unlearn finetune", run_finetune, done)
