"""MUSE (Shi et al. 2024): its lm-eval tasks (``tasks/``: the YAMLs and, beside them, ``utils.py``
with the VerbMem, KnowMem and PrivLeak metrics), reached by the core through :mod:`.plugin`."""
