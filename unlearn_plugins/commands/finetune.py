"""`unlearn finetune`: plain NLL training on a TOFU split, e.g. to build the "full" and
"retain" target models (full fine-tuning, or LoRA with --merge). Options come from defaults,
then ``--config FILE.toml``, then the flags given; ``--show-config`` prints the result and
trains nothing."""

from __future__ import annotations

from .common import add_command, print_config
from .training_options import S, add_training_options, dry_run, int_list, report_run, resolve_config

EXAMPLE = """examples:
  unlearn finetune --data tofu:full --authors 0,1 --max-length 128 --lr 1e-3 --epochs 3 --merge --out ft
  unlearn finetune --data tofu:retain99 --full-finetune --out retain99
  unlearn finetune --data tofu:full --full-finetune --record-trajectory --out ft   # for --objective lmcleaner
  unlearn finetune --data movielens/train.json --merge --out ml-target   # files of `unlearn movielens`
  unlearn finetune --config ft.toml --lr 2e-4 --out ft --show-config      # the merged options; trains nothing
"""


def add_parser(sub) -> None:
    p = add_command(sub, "finetune", "fine-tune a model on a TOFU split (target models)", __doc__, EXAMPLE)
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        default=S,
        help="tofu:SPLIT, tofu:SPLIT[a:b] or a .json file (default: tofu:full); or a text corpus cut into "
        "--max-length windows: text:FILE.jsonl, text:FOLDER, text:hf:ID:SPLIT:COLUMN",
    )
    g.add_argument(
        "--authors",
        type=int_list,
        default=S,
        metavar="I,J,...",
        help="train on these TOFU authors of the split only (20 QA each, 0-based)",
    )
    g.add_argument("--tofu-dir", default=S, help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)")
    g.add_argument(
        "--record-trajectory",
        action="store_true",
        default=S,
        help="write each optimizer step's update, lr and batches to OUT/trajectory (what lmcleaner replays)",
    )
    add_training_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import FinetuneConfig, run_finetune

    if args.dry_run and not hasattr(args, "out"):  # a dry run writes nothing: no --out needed
        args.out = "(dry run)"
    config = resolve_config(FinetuneConfig, args)
    if args.show_config:
        return print_config(config.to_dict(), "unlearn finetune: the options this run would use")
    if args.dry_run:
        return dry_run(config, "`unlearn finetune`")
    result = run_finetune(config)
    if result.record.get("outputs"):
        report_run(result, f"fine-tuned on {result.record['samples']['train']} samples")
    return 0
