"""`unlearn demo`: the whole product on the embedded model and a small benchmark, with every
stage cached so a rerun continues where the last one stopped. Both demos are studies
(docs/study.md), run by `unlearn demo` through the study's cells, cache and executors
(:func:`unlearn_plugins.study.runner.run_plan`); this package holds their descriptions and
reports:

- ``demo.toml``: the TOFU demo: the target and retain models, CUD difficulty scores of the
  forget set, ReGLU and two baselines unlearning it, every model evaluated (`unlearn study demo
  --dry-run` shows its cells); :mod:`.report`: its terminal table, results.json, summary.md and
  the plots;
- the MovieLens demo (``--benchmark movielens``) lives in its benchmark's folder
  (unlearn_plugins/benchmarks/movielens/: ``demo.toml``, ``demo.py``, ``report.py``), reached
  through the benchmark's ``demo`` part (`unlearn study demo-movielens --dry-run`).

The N-author benchmark folder (TOFU's format) is :mod:`unlearn_plugins.benchmarks.tofu.data`'s.
"""
