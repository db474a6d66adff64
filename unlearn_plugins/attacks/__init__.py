"""Attacks on "forgotten" knowledge: each turns an unlearned model into another model (quantized,
briefly re-fine-tuned) that evaluation then measures, to see whether the forgetting survives."""
