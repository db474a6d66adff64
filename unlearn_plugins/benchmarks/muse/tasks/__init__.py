"""MUSE's lm-eval tasks: the YAMLs and, beside them, :mod:`.utils` (their data and metrics)."""
