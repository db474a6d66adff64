"""The TOFU benchmark as the core sees it: its task folder (``tofu``), its data module (the
N-author benchmark folders of the demo and the studies), its study kind (the default
``[benchmark] source``) and its demo (`unlearn demo`'s default, the built-in study ``demo``),
registered through the same hook a third-party benchmark uses (registry.toml names this module)."""

from pathlib import Path

from unlearn_plugins import hookimpl
from unlearn_plugins.interfaces import Benchmark

HERE = Path(__file__).resolve().parent
PACKAGE = __package__

TOFU = Benchmark(
    summary="TOFU: forget probability, truth ratio, Forget Quality, ROUGE, extraction strength, Model Utility, "
    "membership inference and probes (lm-eval tasks tofu_*); its study kind, the default, and `unlearn demo`",
    task_dirs=(HERE / "tasks",),
    studies={"demo": HERE / "demo.toml"},
    demo=f"{PACKAGE}.demo",
    data=f"{PACKAGE}.data",
    metrics=f"{PACKAGE}.metrics",
    study=f"{PACKAGE}.runner",
    # auto: TOFU where a folder, the shipped subset or the hub has enough authors, else generated ones
    sources=("generated", "auto"),
    stage_kinds={
        "evaluate": f"{PACKAGE}.study.cells:build_evaluate",
        # an author-unit study's traced run and its method's operating point
        "sweep": f"{PACKAGE}.study.cells:build_sweep",
        "operating_point": f"{PACKAGE}.study.cells:build_operating_point",
    },
    evaluation_stages=("evaluate",),
)


@hookimpl
def register_benchmarks(register):
    register("tofu", TOFU)
