"""TOFU's lm-eval tasks, one folder each with its ``utils.py`` beside the YAMLs (lm-eval's
convention; the YAMLs' ``!function`` lines name them): ``tofu/`` (probability, truth ratio,
Forget Quality, ROUGE, extraction strength, Model Utility), ``tofu_mia/`` (membership inference,
exact memorization) and ``tofu_probes/`` (paraphrased and plain-format questions). The metric
formulas they share with the study and its reports are :mod:`..metrics`."""
