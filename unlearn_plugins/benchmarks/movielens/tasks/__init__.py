"""MovieLens's lm-eval tasks: the YAMLs, and beside them (lm-eval's ``utils.py`` convention) the
task classes (:mod:`.utils`) and the metrics (:mod:`.metrics`) their ``!function`` lines name."""
