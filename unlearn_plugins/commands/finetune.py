"""`unlearn finetune`: plain NLL training on a TOFU split, e.g. to build the "full" and
"retain" target models (full fine-tuning, or LoRA with --merge)."""

from __future__ import annotations

import argparse

from .run import S, _int_list, _report, add_training_options, resolve_config


def add_parser(sub) -> None:
    p = sub.add_parser("finetune", help="fine-tune a model on a TOFU split (target models)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=S, help="tofu:SPLIT, tofu:SPLIT[a:b] or a .json file (default: tofu:full)")
    g.add_argument("--authors", type=_int_list, default=S, metavar="I,J,...",
                   help="train on these TOFU authors of the split only (20 QA each, 0-based)")
    g.add_argument("--tofu-dir", default=S, help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)")
    add_training_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training import FinetuneConfig, run_finetune

    config = resolve_config(FinetuneConfig, args)
    result = run_finetune(config)
    if result.record.get("outputs"):
        _report(result, f"fine-tuned on {result.record['samples']['train']} samples")
    return 0
