"""Difficulty scorers: predict, before unlearning, how hard each sample is to forget."""
