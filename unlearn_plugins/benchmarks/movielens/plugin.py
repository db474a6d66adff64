"""The MovieLens benchmark as the core sees it: one :class:`~unlearn_plugins.interfaces.Benchmark`,
registered through the same hook a third-party benchmark uses (registry.toml names this module)."""

from pathlib import Path

from unlearn_plugins import hookimpl
from unlearn_plugins.interfaces import Benchmark

HERE = Path(__file__).resolve().parent
PACKAGE = __package__

MOVIELENS = Benchmark(
    summary="recommendation unlearning on MovieLens users",
    task_dirs=(HERE / "tasks",),
    studies={"demo-movielens": HERE / "demo.toml"},
    study=f"{PACKAGE}.runner",
    stage_kinds={
        "rec_finetune": f"{PACKAGE}.study.models:build_finetune",
        "rec_evaluate": f"{PACKAGE}.study.evaluate:build_evaluate",
        "cud_users": f"{PACKAGE}.study.cud:build_cud_users",
        "sharded_train": f"{PACKAGE}.study.sharded:build_train",
        "sharded_unlearn": f"{PACKAGE}.study.sharded:build_unlearn",
    },
    evaluation_stages=("rec_evaluate",),
    demo=f"{PACKAGE}.demo",
    commands=(f"{PACKAGE}.commands",),
    report=f"{PACKAGE}.report:study_report",
    data=f"{PACKAGE}.data:load_movielens",
)


@hookimpl
def register_benchmarks(register):
    register("movielens", MOVIELENS)
