"""`unlearn demo`: the main job end to end on the embedded model: a small TOFU benchmark,
target models, CUD difficulty scores, ReGLU and two baselines on the same budget, TOFU
Forget Quality and Model Utility through lm-eval, and a report. Every stage is cached
($UNLEARN_CACHE_DIR/demo): a second run, or a run after Ctrl-C, continues where the last
one stopped."""

from __future__ import annotations

import argparse

from ..errors import UnlearnError
from .common import check_int, check_out_folder, device_option


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline on the embedded model and write a report",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="unlearn-demo", help="report folder (default: %(default)s)")
    p.add_argument("--authors", type=int, default=None,
                   help="authors in the benchmark, 20 QA each (default: 3; 2 with --fast)")
    p.add_argument("--forget-authors", type=int, default=1, help="how many of them to forget (default: 1)")
    p.add_argument("--fast", action="store_true", help="a smoke-test budget: every stage, minimal work")
    p.add_argument("--model", default="smollm2-135m",
                   help="base model: the embedded alias (default), a local folder or a hub id")
    p.add_argument("--data", choices=("auto", "tofu", "generated"), default="auto",
                   help="auto: TOFU (--tofu-dir, $UNLEARN_TOFU_DIR, else the TOFU authors shipped with the package, "
                        "else the hub), and if none has enough authors, generated fictitious authors (default: auto)")
    p.add_argument("--tofu-dir", default=None,
                   help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the 3 TOFU authors shipped with the "
                        "package; more authors: the hub)")
    p.add_argument("--device", default=None, type=device_option, help="cpu, cuda (default: cuda if available)")
    p.add_argument("--cache-dir", default=None, help="stage cache (default: $UNLEARN_CACHE_DIR/demo)")
    p.set_defaults(func=run)


def check_args(args) -> None:
    """Ranges and output paths, before any stage runs (the benchmark stage checks --authors
    against the authors its source has)."""
    from ..demo.pipeline import BUDGETS

    if args.authors is not None:
        check_int("--authors", args.authors, 2)  # one to forget, one to retain
    authors = args.authors if args.authors is not None else BUDGETS["fast" if args.fast else "default"].authors
    check_int("--forget-authors", args.forget_authors, 1)
    if args.forget_authors >= authors:
        raise UnlearnError(f"--forget-authors {args.forget_authors} must be below --authors {authors} "
                           f"(at least one author is retained)")
    check_out_folder("--out", args.out)
    check_out_folder("--cache-dir", args.cache_dir)


def run(args) -> int:
    from ..demo import DemoConfig, run_demo

    check_args(args)
    config = DemoConfig(out=args.out, model=args.model, authors=args.authors, forget_authors=args.forget_authors,
                        fast=args.fast, data=args.data, tofu_dir=args.tofu_dir, device=args.device,
                        cache_dir=args.cache_dir)
    result = run_demo(config)
    print(result.table)
    print(f"report -> {result.out}/ ({', '.join(sorted(result.files))})")
    return 0
