"""A MovieLens study's stages: the benchmark folder (:mod:`.source`, which also reads the
``[benchmark]`` table), the target and retrain models (``rec_finetune``, :mod:`.models`), CUD's
forget users (``cud_users``, :mod:`.cud`), the recommendation evaluation (``rec_evaluate``,
:mod:`.evaluate`), the sharded recommender (``sharded_train``, ``sharded_unlearn``,
:mod:`.sharded`) and the cells' plan (:mod:`.cells`)."""
