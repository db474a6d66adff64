"""Cells per hour of a small study grid with `unlearn study --workers 2` (two single-threaded
workers) vs `--workers 1` (one worker with every core), in one run, each from an empty cache.

The grid is a built-in study (default: ``tiny``, the tiny model on generated authors) with
``--seeds`` seeds; every cell is built (fresh caches), and the wall time counts everything a
user waits for: planning, worker start-up, every cell, the report. Prints one JSON line:

    {"parallel_speedup": <cells/hour with 2 workers / with 1>, ...}

The machine's load average at the start and end is in the line too: another job on the same
cores makes the figure noisy.

    python bench/study_throughput.py [--study tiny] [--seeds 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


def run_once(study, workers: int, root: Path) -> dict:
    from unlearn_plugins.study.runner import run_study

    cache, out = root / f"cache-{workers}", root / f"report-{workers}"
    shutil.rmtree(cache, ignore_errors=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // workers)  # the cores shared evenly, whatever OMP_NUM_THREADS says
    started = time.perf_counter()
    outcome = run_study(study, out=out, cache=cache, workers=workers, threads=threads, stream=io.StringIO())
    wall = time.perf_counter() - started
    built = sum(1 for r in outcome.results.values() if r.get("source") == "built")
    if outcome.failed or built != len(outcome.results):
        raise SystemExit(
            f"error: --workers {workers}: {len(outcome.failed)} cell(s) failed, {built} of "
            f"{len(outcome.results)} built (see {out}/summary.md)"
        )
    return {
        "workers": workers,
        "threads_per_worker": threads,
        "cells": built,
        "wall_s": round(wall, 1),
        "cells_per_hour": round(built * 3600 / wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", default="tiny", help="a built-in study or study file (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 of every method (default: %(default)s)")
    p.add_argument("--keep", type=Path, default=None, help="keep the caches and reports in this folder")
    args = p.parse_args(argv)
    from unlearn_plugins.study import load_study

    study = dataclasses.replace(load_study(args.study), seeds=tuple(range(args.seeds)))
    root = args.keep or Path(tempfile.mkdtemp(prefix="study-throughput-"))
    load_start = os.getloadavg()
    try:
        one = run_once(study, 1, root)
        two = run_once(study, 2, root)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "parallel_speedup": round(two["cells_per_hour"] / one["cells_per_hour"], 2),
                "study": study.name,
                "cells": one["cells"],
                "workers_1": one,
                "workers_2": two,
                "cpus": os.cpu_count(),
                "load_average_start": [round(x, 2) for x in load_start],
                "load_average_end": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )
    return 0


if __name__ == "__main__":  # the workers are spawned processes that import this file
    sys.exit(main())
