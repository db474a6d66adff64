"""`unlearn demo`: the whole product on the embedded model and a small benchmark, with every
stage cached so a rerun continues where the last one stopped.

- ``demo.toml``: the TOFU demo, a study (docs/study.md): the target and retain models, CUD
  difficulty scores of the forget set, ReGLU and two baselines unlearning it, every model
  evaluated; `unlearn demo` runs it through the study's cells, cache and workers
  (:func:`unlearn_plugins.study.runner.run_plan`) and `unlearn study demo --dry-run` shows them;
- :mod:`.report`: its terminal table, results.json, summary.md and the plots;
- :mod:`.movielens` and :mod:`.movielens_report`: recommendation unlearning on MovieLens
  (``--benchmark movielens``), with a pipeline of its own still.

The N-author benchmark folder (TOFU's format) is :mod:`unlearn_plugins.data.tofu_benchmark`'s.
"""

from .movielens import MovieLensDemoConfig, run_movielens_demo

__all__ = ["MovieLensDemoConfig", "run_movielens_demo"]
