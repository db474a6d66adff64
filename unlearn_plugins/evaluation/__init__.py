"""Evaluation: TOFU metrics and the lm-eval runner."""
