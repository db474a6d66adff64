"""Recommendation unlearning on MovieLens with an LLM recommender (TALLRec / E2URec style): the
benchmark's one folder, reached by the core through :mod:`.plugin` (its
:class:`~unlearn_plugins.interfaces.Benchmark`).

* :mod:`.data` - reading MovieLens (100K, 1M, RecBole atomic files);
* :mod:`.prompts` - the Yes/No prompt from a user's last K rated movies;
* :mod:`.split` - the chronological per-user train / valid / test split;
* :mod:`.forget` - forget requests (all interactions of a set of users) and CUD anchor users;
* :mod:`.benchmark` - the samples of each part, written as TOFU-format JSON-lines files that
  `unlearn finetune`, `unlearn run`, `unlearn score` and the lm-eval tasks read;
* :mod:`.predict` - P(Yes) / (P(Yes) + P(No)) at the answer position, straight from a model;
* :mod:`.recipes` - the target and retrain fine-tuning recipes;
* ``tasks/`` - the lm-eval tasks ``movielens_rec`` and ``movielens_rec_forget``: YAMLs, their
  task classes (``tasks/utils.py``) and metrics (``tasks/metrics.py``);
* :mod:`.partition`, :mod:`.aggregators`, :mod:`.sharded` - RecEraser / SISA: users in
  shards, one LoRA adapter per shard, predictions aggregated, only affected shards retrained;
  :mod:`.sharded_lm` makes such an ensemble an lm-eval model for the same tasks;
* :mod:`.objectives` - registers the objectives ``e2urec`` (:mod:`.e2urec`) and ``bad_teacher``
  (:mod:`.bad_teacher`);
* :mod:`.study` - a study with ``[benchmark] source = "movielens"``: its tables, cells, stages;
* :mod:`.demo` (``demo.toml``) and :mod:`.report` - `unlearn demo --benchmark movielens`;
* :mod:`.commands` - `unlearn movielens`.

`unlearn movielens --out DIR` writes a benchmark folder; docs/methods.md ("Recommendation
unlearning") gives every formula, default and deviation from the reference code.
"""
