"""The WMDP benchmark as the core sees it: its task folder (``wmdp``), its study part and study."""

from pathlib import Path

from unlearn_plugins import hookimpl
from unlearn_plugins.interfaces import Benchmark

HERE = Path(__file__).resolve().parent
PACKAGE = __package__

WMDP = Benchmark(
    summary="WMDP: unlearning from raw text (RMU, GradDiff), WMDP accuracy and MMLU; a synthetic stand-in",
    task_dirs=(HERE / "tasks",),
    studies={"wmdp_synthetic": HERE / "wmdp_synthetic.toml"},
    study=f"{PACKAGE}.runner",
    stage_kinds={
        "wmdp_data": f"{PACKAGE}.stages:build_data",
        "wmdp_teach": f"{PACKAGE}.stages:build_teach",
        "wmdp_evaluate": f"{PACKAGE}.stages:build_evaluate",
    },
    evaluation_stages=("wmdp_evaluate",),
    report=f"{PACKAGE}.report:write_report",
    data=f"{PACKAGE}.data:corpora",
)


@hookimpl
def register_benchmarks(register):
    register("wmdp", WMDP)
