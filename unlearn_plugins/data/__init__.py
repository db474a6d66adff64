"""Data sets: TOFU splits, and the tokenisation shared by training, scoring and evaluation."""
