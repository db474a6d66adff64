"""Circuits of decoder-only transformers: the static edge graph, EAP-IG edge scores,
circuit selection and pruning, and similarities between circuits (the parts of CUD)."""
