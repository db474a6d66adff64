"""`unlearn study`: run an experiment grid described by a study file (methods x forget sizes x
seeds on one benchmark and one budget), in parallel, every stage cached, and report each
method's Forget Quality, Model Utility and more with 95% confidence intervals over the seeds.

A study is a TOML file or the name of a built-in study (`unlearn study --list`); its format is
in docs/study.md. A rerun, or a run after an interruption, builds only the cells not yet in the
cache; `--dry-run` shows which those are. Exit status 1 when a cell failed (the report says
which, and why)."""

from __future__ import annotations

import argparse
import sys

from .common import check_int, check_out_folder, device_option


def add_parser(sub) -> None:
    p = sub.add_parser("study", help="run a grid of unlearning experiments with confidence intervals",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", nargs="?", metavar="STUDY", help="a study file (.toml) or a built-in study name")
    p.add_argument("--list", action="store_true", help="list the built-in studies and exit")
    p.add_argument("--out", default=None, help="report folder (default: study-NAME)")
    p.add_argument("--workers", type=int, default=1,
                   help="cells built at once (default: 1); local workers share the cores evenly")
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="local: worker processes on this machine; dask: a Dask LocalCluster of --workers "
                        "processes, or the cluster at --scheduler (default: local)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default: the cores shared evenly by the workers, at most "
                        "$OMP_NUM_THREADS when set)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="a running Dask scheduler (tcp://host:8786) for --executor dask")
    p.add_argument("--dry-run", action="store_true", help="print the grid of cells and which are cached; build nothing")
    p.add_argument("--device", default=None, type=device_option, help="cpu, cuda (default: cuda if available)")
    p.add_argument("--cache-dir", default=None, help="stage cache (default: $UNLEARN_CACHE_DIR/studies)")
    p.set_defaults(func=run)


def _list() -> int:
    from ..study import builtin_studies, load_study

    for name, path in builtin_studies().items():
        study = load_study(str(path))
        cells = len(study.methods) * len(study.forget_sizes) * len(study.seeds)
        print(f"{name:<16} {study.description} ({len(study.methods)} methods x {len(study.forget_sizes)} forget "
              f"sizes x {len(study.seeds)} seeds = {cells} runs)")
    return 0


def run(args) -> int:
    from pathlib import Path

    from ..errors import UnlearnError

    if args.list:
        return _list()
    if not args.study:
        raise UnlearnError("unlearn study: give a study file or a built-in study name (see unlearn study --list)")
    check_int("--workers", args.workers, 1)
    if args.threads is not None:
        check_int("--threads", args.threads, 1)
    if args.scheduler and args.executor != "dask":
        raise UnlearnError("--scheduler is the address of a Dask scheduler: use it with --executor dask")
    check_out_folder("--out", args.out)
    check_out_folder("--cache-dir", args.cache_dir)
    from ..study import load_study
    from ..study.cells import default_cache

    study = load_study(args.study)
    cache = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache()
    if args.dry_run:
        from ..study.cells import plan_study
        from ..study.runner import dry_run_table

        print(dry_run_table(plan_study(study, cache=cache, device=args.device, dry_run=True)))
        return 0
    from ..study.runner import run_study

    out = args.out or f"study-{study.name}"
    outcome = run_study(study, out=out, cache=cache, workers=args.workers, executor=args.executor,
                        scheduler=args.scheduler, device=args.device, threads=args.threads)
    print(outcome.table)
    print(f"report -> {out}/ ({', '.join(sorted(outcome.files))})")
    if outcome.failed:
        print(f"error: {len(outcome.failed)} of {len(outcome.results)} cells failed: "
              f"{', '.join(outcome.failed[:5])}{', ...' if len(outcome.failed) > 5 else ''} (see {out}/summary.md)",
              file=sys.stderr)
        return 1
    return 0
