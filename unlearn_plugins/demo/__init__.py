"""`unlearn demo`: the whole product on the embedded model and a small benchmark, with every
stage cached so a rerun continues where the last one stopped.

- :mod:`unlearn_plugins.data.tofu_benchmark`: the N-author benchmark folder (TOFU's format)
  from TOFU or the generated fictitious authors (the studies build theirs with it too);
- :mod:`.pipeline`: the stages (targets, CUD, unlearning, evaluation) and their cache;
- :mod:`.report`: the terminal table, results.json, summary.md and the plots;
- :mod:`.movielens` and :mod:`.movielens_report`: the same for recommendation unlearning on
  MovieLens (``--benchmark movielens``).
"""

from .movielens import MovieLensDemoConfig, run_movielens_demo
from .pipeline import DemoConfig, run_demo

__all__ = ["DemoConfig", "run_demo", "MovieLensDemoConfig", "run_movielens_demo"]
