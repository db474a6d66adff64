"""The TOFU benchmark as the core sees it: its task folder (``tofu``) and its data module (the
N-author benchmark folders of the demo and the studies), registered through the same hook a
third-party benchmark uses (registry.toml names this module)."""

from pathlib import Path

from unlearn_plugins import hookimpl
from unlearn_plugins.interfaces import Benchmark

HERE = Path(__file__).resolve().parent
PACKAGE = __package__

TOFU = Benchmark(
    summary="TOFU: forget probability, truth ratio, Forget Quality, ROUGE, extraction strength, Model Utility, "
    "membership inference and probes (lm-eval tasks tofu_*); the demo's and studies' N-author benchmark folders",
    task_dirs=(HERE / "tasks",),
    data=f"{PACKAGE}.data",
)


@hookimpl
def register_benchmarks(register):
    register("tofu", TOFU)
