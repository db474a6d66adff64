"""`unlearn demo`: the main job end to end on the embedded model.

--benchmark tofu (default): a small TOFU benchmark, target models, CUD difficulty scores,
ReGLU and two baselines on the same budget, TOFU Forget Quality and Model Utility through
lm-eval, and a report. It is a study (unlearn_plugins/benchmarks/tofu/demo.toml; `unlearn study demo
--dry-run` shows its cells), run through the study's cells, cache and workers.

--benchmark movielens: recommendation unlearning on an LLM recommender: MovieLens prompts,
target and retrain models, E2URec, NegGrad, Bad-T and RecEraser (sharded), test / forget AUC
and JSD to the retrain model through lm-eval, CUD-easy vs CUD-hard forget users, and a report.
It is a study too (unlearn_plugins/benchmarks/movielens/demo.toml; `unlearn study demo-movielens
--dry-run`). A registered benchmark with a demo part adds its own --benchmark.

Every stage is cached ($UNLEARN_CACHE_DIR/demo): a second run, or a run after Ctrl-C,
continues where the last one stopped."""

from __future__ import annotations

from pathlib import Path

from ..errors import UnlearnError
from ..models import DTYPE_CHOICES
from .common import add_command, device_option

#: the demo `unlearn demo` runs without --benchmark
DEFAULT = "tofu"

EXAMPLE = """examples:
  unlearn demo --out demo-report                    # about 13 minutes on 2 CPU cores
  unlearn demo --fast --out smoke                   # every stage, minimal work
  unlearn demo --robustness --out demo-report       # + membership inference and attacks per model
  unlearn demo --authors 5 --forget-authors 2 --tofu-dir ../shared/data/tofu
  unlearn demo --methods npo,rmu,lunar --out demo-report   # + those methods of the peer_methods study
  unlearn demo --benchmark movielens --out demo-movielens
"""


def add_parser(sub) -> None:
    p = add_command(sub, "demo", "run the whole pipeline on the embedded model and write a report", __doc__, EXAMPLE)
    benches = _demos()
    demos = {name: _demo(name) for name in benches}
    p.add_argument(
        "--benchmark",
        choices=tuple(demos),
        default=DEFAULT,
        help="; ".join(f"{name}: {getattr(demo, 'SUMMARY', benches[name].summary)}" for name, demo in demos.items())
        + f" (default: {DEFAULT})",
    )
    p.add_argument(
        "--out",
        default=None,
        help="report folder (default: unlearn-demo, or unlearn-demo-movielens with --benchmark movielens)",
    )
    p.add_argument("--fast", action="store_true", help="a smoke-test budget: every stage, minimal work")
    p.add_argument(
        "--model", default="smollm2-135m", help="base model: the embedded alias (default), a local folder or a hub id"
    )
    p.add_argument("--device", default=None, type=device_option, help="cpu, cuda (default: cuda if available)")
    p.add_argument("--cache-dir", default=None, help="stage cache (default: $UNLEARN_CACHE_DIR/demo)")
    p.add_argument(
        "--train-dtype",
        choices=DTYPE_CHOICES,
        default=None,
        help="base weights under LoRA while training; auto: bf16 on CUDA and on CPUs with native bf16 "
        "(AVX512-BF16 / AMX), else fp32 (default: auto)",
    )
    for demo in demos.values():
        demo.add_arguments(p)
    p.set_defaults(func=run)


def _demos() -> dict:
    """The registered benchmarks with a demo part (:class:`..interfaces.Benchmark`), by name,
    :data:`DEFAULT` first (its options first in the help)."""
    from ..host import benchmarks

    found = {name: bench for name, bench in benchmarks().items() if bench.demo}
    return dict(sorted(found.items(), key=lambda item: item[0] != DEFAULT))


def _demo(name: str):
    """Benchmark ``name``'s demo part (an error naming it when it is not registered)."""
    from ..host import required_benchmark_part

    return required_benchmark_part(name, "demo")


def check_args(args) -> None:
    """No option of another benchmark's demo, then the chosen demo's own checks (ranges and output
    paths, before any stage runs)."""
    others = [(flag, attr) for name in _demos() if name != args.benchmark for flag, attr in _demo(name).OPTIONS]
    given = [flag for flag, attr in others if getattr(args, attr) is not None]
    if given:
        raise UnlearnError(f"{', '.join(given)}: not an option of --benchmark {args.benchmark}")
    _demo(args.benchmark).check(args)


def raise_failed(plan, results: dict) -> None:
    failed = [(cell, r) for cell, r in results.items() if r["status"] != "done"]
    if failed:
        cell, result = failed[0]
        log = f" (log: {result['log']})" if result.get("log") else ""
        raise UnlearnError(f"{plan.cells[cell].cell.label}: {result.get('error')}{log}")


def default_workers(device: str | None = None) -> int:
    """Two workers where there are two cores or more, else one; more only when asked
    (``--workers``): each worker holds a model of its own in memory. Cells on CUDA: at most one
    worker per GPU (two workers are not put on one card)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = max(1, min(2, cores))
    if device != "cpu":
        from ..study.executors import gpu_count

        workers = min(workers, gpu_count() or workers)
    return workers


def demo_cache(args) -> Path:
    """The demos' stage cache: --cache-dir, else the package's."""
    from ..models import cache_dir

    return Path(args.cache_dir).expanduser() if args.cache_dir else cache_dir() / "demo"


def build_and_report(study, args, out: Path, study_report, *, workers: int = 1, before=None, **options) -> int:
    """A demo's ``study`` built under --out's lock (cached stages reused; ``workers`` > 1: local
    worker processes), then its report written by ``study_report`` with ``options`` (and what
    ``before()``, called once the lock is held, returns); prints the table and the files."""
    import sys
    import time

    from ..files import folder_lock
    from ..process import quiet_libraries
    from ..study.runner import run_plan

    with folder_lock(out, f"--out {out}"), quiet_libraries():
        started = time.perf_counter()
        if before is not None:
            options = {**options, **before()}
        # --workers 1: every cell in this process, one after the other (no worker to start)
        executor = "local" if workers > 1 else "inline"
        cache = demo_cache(args)
        plan, results = run_plan(study, out=out, cache=cache, workers=workers, executor=executor, device=args.device)
        raise_failed(plan, results)
        print(f"report -> {out}", file=sys.stderr, flush=True)
        _, table, files = study_report(out, plan, results, wall_s=time.perf_counter() - started, **options)
    print(table)
    print(f"report -> {out}/ ({', '.join(sorted(files))})")
    return 0


def run(args) -> int:
    check_args(args)
    return _demo(args.benchmark).run(args)
