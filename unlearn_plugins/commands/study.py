"""`unlearn study`: run an experiment grid described by a study file (methods x forget sizes x
seeds on one benchmark and one budget), in parallel, every stage cached, and report each
method's Forget Quality, Model Utility and more with 95% confidence intervals over the seeds.

A study is a TOML file or the name of a built-in study (`unlearn study --list`); its format is
in docs/study.md. A rerun, or a run after an interruption, builds only the cells not yet in the
cache; `--dry-run` shows which those are, `--report-only` writes the report of the cells
finished so far (while a long study runs, say), `--show-config` prints the study as read (defaults
filled in, each method's options resolved) with this command's options. Exit status 1 when a
cell failed (the report says which, and why)."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import add_command, check_int, check_out_folder, device_option, print_config

EXAMPLE = """examples:
  unlearn study --list                                # the built-in studies
  unlearn study reglu_tofu --dry-run                  # the grid, and which cells are cached
  unlearn study reglu_tofu --workers 2 --show-config  # the study as resolved; runs nothing
  unlearn study reglu_tofu --report-only --out partial  # the table of the cells finished so far
  UNLEARN_TOFU_DIR=../shared/data/tofu unlearn study reglu_tofu --workers 2 --out reglu-tofu
  unlearn study my_study.toml --executor dask --scheduler tcp://HOST:8786
"""
#: parsed options that say what to do rather than how the study runs (left out of --show-config)
_NOT_RUN_OPTIONS = ("func", "command", "debug", "verbosity", "show_config", "list", "dry_run", "report_only", "study")


def add_parser(sub) -> None:
    p = add_command(sub, "study", "run a grid of unlearning experiments with confidence intervals", __doc__, EXAMPLE)
    p.add_argument("study", nargs="?", metavar="STUDY", help="a study file (.toml) or a built-in study name")
    p.add_argument("--list", action="store_true", help="list the built-in studies and exit")
    p.add_argument(
        "--variant",
        default=None,
        metavar="NAME",
        help="run the study as its variant NAME: the tables of [variants.NAME] in place of its own "
        "(e.g. unlearn study demo --variant fast, the demo's --fast)",
    )
    p.add_argument("--out", default=None, help="report folder (default: study-NAME)")
    p.add_argument(
        "--workers", type=int, default=1, help="cells built at once (default: 1); local workers share the cores evenly"
    )
    p.add_argument(
        "--executor",
        choices=("local", "dask"),
        default="local",
        help="local: worker processes on this machine; dask: a Dask LocalCluster of --workers "
        "processes, or the cluster at --scheduler (default: local)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per worker (default: the cores shared evenly by the workers, at most "
        "$OMP_NUM_THREADS when set)",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="a running Dask scheduler (tcp://host:8786) for --executor dask",
    )
    p.add_argument("--dry-run", action="store_true", help="print the grid of cells and which are cached; build nothing")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="write the report (--out) of the cells finished so far, cached or in --records; build "
        "nothing (a running study's table, or a stopped one's)",
    )
    p.add_argument(
        "--show-config",
        action="store_true",
        help="print the study as resolved (defaults filled in; each method's options: preset < method < "
        "[budget]) and this command's options as TOML, and exit without running anything",
    )
    p.add_argument("--device", default=None, type=device_option, help="cpu, cuda (default: cuda if available)")
    p.add_argument("--cache-dir", default=None, help="stage cache (default: $UNLEARN_CACHE_DIR/studies)")
    p.add_argument(
        "--records",
        default=None,
        metavar="DIR",
        help="keep each finished cell's results (no models) in DIR, small enough for a repository, "
        "and restore them first: a study resumes on another machine without rebuilding them",
    )
    p.add_argument(
        "--records-any-device",
        action="store_true",
        help="reuse --records made on another device type or precision (CPU fp32 records on a GPU run, "
        "say) as this run's; without it they are refused",
    )
    p.set_defaults(func=run)


def _list() -> int:
    from ..host import study_part
    from ..study import builtin_studies, load_study
    from ..study.spec import variants

    for name, path in builtin_studies().items():
        study = load_study(str(path))
        others = variants(str(path))
        grid = study_part(study.source).grid(study)
        print(f"{name:<16} {study.description} ({grid})" + (f"; variants: {', '.join(others)}" if others else ""))
    return 0


def _show_config(study, args, cache) -> int:
    """--show-config: the parsed study (load_study's result) and how this command would run it."""
    options = {k: v for k, v in vars(args).items() if k not in _NOT_RUN_OPTIONS}
    options.update(out=args.out or f"study-{study.name}", cache_dir=str(cache))
    return print_config(
        {"command_line": options, **study.settings()},
        f"unlearn study {args.study}: the study as resolved, and [command_line]: this command's options",
    )


def run(args) -> int:
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
    if args.scheduler:
        from ..study.executors import check_scheduler

        check_scheduler(args.scheduler)
    check_out_folder("--out", args.out)
    check_out_folder("--cache-dir", args.cache_dir)
    check_out_folder("--records", args.records)
    from ..study import load_study
    from ..study.cells import default_cache

    study = load_study(args.study, variant=args.variant)
    cache = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache()
    if args.show_config:
        return _show_config(study, args, cache)
    if args.dry_run and args.report_only:
        raise UnlearnError("--dry-run and --report-only: give one of them")
    if args.dry_run:
        from ..study.runner import dry_run_plan, dry_run_table

        records = _records(args)
        print(dry_run_table(dry_run_plan(study, cache=cache, device=args.device, records=records), records))
        return 0
    out = args.out or f"study-{study.name}"
    if not args.report_only and args.executor != "inline" and not args.scheduler and args.device != "cpu":
        from ..process import check_gpu_share, visible_gpus
        from ..study.executors import gpu_count

        # before any work: the executor itself is made once a cell is ready to run
        check_gpu_share(args.workers, len(visible_gpus(gpu_count())), study.workers_per_gpu)
    from ..host import study_part

    part = study_part(study.source)
    if refuse := getattr(part, "refuse", None):  # options its study does not take (yet)
        refuse(study, args)
    records = {"records": _records(args), "records_any_device": args.records_any_device}
    if args.report_only:
        from ..study.runner import report_study

        outcome = report_study(study, out=out, cache=cache, device=args.device, **records)
        failed = ("finished cell(s) cannot be read", f"see {out}/summary.md; a run rebuilds them")
    else:
        from ..study.runner import run_study

        outcome = run_study(study, out=out, cache=cache, **execution_options(args), **records)
        see = getattr(part, "FAILED_CELLS_SEE", "see {out}/summary.md").format(out=out)
        failed = (f"of {len(outcome.results)} cells failed", see)
    if outcome.files:  # none: a report that needs every cell (MovieLens's) is not written while one failed
        print(outcome.table)
        print(f"report -> {out}/ ({', '.join(sorted(outcome.files))})")
    if outcome.failed:
        print(failed_cells(outcome.failed, *failed), file=sys.stderr)
        return 1
    return _incomplete(study, outcome, out)


def _records(args) -> Path | None:
    """--records, its folder (None: not given)."""
    return Path(args.records).expanduser() if args.records else None


def execution_options(args) -> dict:
    """How a study's cells run (the keyword arguments of ``run_study`` and ``run_plan``), from
    `unlearn study`'s flags."""
    return {name: getattr(args, name) for name in ("workers", "executor", "scheduler", "device", "threads")}


def failed_cells(cells: list[str], what: str, see: str) -> str:
    """The `error:` line of a study whose ``cells`` failed: their count, ``what`` befell them,
    the first five and ``see`` (where to look) in brackets."""
    names = ", ".join(cells[:5]) + (", ..." if len(cells) > 5 else "")
    return f"error: {len(cells)} {what}: {names} ({see})"


def _incomplete(study, outcome, out: str) -> int:
    """An author-unit report that left finished cells out, or whose declared comparisons lack
    data, says so in one `error:` line and exits 1: its verdict (if any) is not stated."""
    if outcome.left_out:
        cells = list(outcome.left_out)
        print(
            f"error: {len(cells)} finished cell(s) left out of the comparisons: {', '.join(cells[:5])}"
            f"{', ...' if len(cells) > 5 else ''} ({outcome.left_out[cells[0]]})"
            f"{': no verdict' if study.design.verdict else ''} (see {out}/summary.md)",
            file=sys.stderr,
        )
        return 1
    if outcome.lacking:
        what = "no verdict" if study.design.verdict else "incomplete"
        print(f"error: {what}: {outcome.lacking} (see {out}/summary.md)", file=sys.stderr)
        return 1
    return 0
