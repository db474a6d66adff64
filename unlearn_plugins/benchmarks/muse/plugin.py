"""The MUSE benchmark as the core sees it: its task folder (registered as task folder ``muse``)."""

from pathlib import Path

from unlearn_plugins import hookimpl
from unlearn_plugins.interfaces import Benchmark

MUSE = Benchmark(
    summary="MUSE's VerbMem, KnowMem and PrivLeak on News and Books (lm-eval tasks muse_news, muse_books)",
    task_dirs=(Path(__file__).resolve().parent / "tasks",),
)


@hookimpl
def register_benchmarks(register):
    register("muse", MUSE)
