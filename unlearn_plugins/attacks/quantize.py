"""Weight-only round-to-nearest quantization of an unlearned model (the attack of "Catastrophic
Failure of LLM Unlearning via Quantization": 4-bit weights can bring forgotten answers back).

Every linear layer of the decoder blocks is quantized with torchao's affine primitives and
stored dequantized, so the attacked model is an ordinary checkpoint that any evaluation loads and
that computes exactly with the quantized weight values (a weight-only kernel computes the same
products, up to summation order). Embeddings and the output head stay as they are, as in
weight-only LLM quantization.

- int8: symmetric, one scale per output channel (torchao's int8 weight-only scheme);
- int4: asymmetric with a zero point, one (scale, zero) per group of ``group_size`` input
  weights (torchao's int4 weight-only scheme, group 128; a layer whose width it does not divide
  takes the largest power of two below it that does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UnlearnError
from ..interfaces import AttackResult

SCHEMES = {8: ("symmetric", -128, 127), 4: ("asymmetric", 0, 15)}


def _primitives():
    try:
        from torchao.quantization.quant_primitives import (
            MappingType,
            choose_qparams_affine,
            dequantize_affine,
            quantize_affine,
        )
    except ImportError as exc:
        raise UnlearnError(
            "the quantize attack needs torchao: pip install 'unlearn-plugins[attacks]' "
            f"(or pip install torchao) ({exc})"
        ) from None
    return MappingType, choose_qparams_affine, quantize_affine, dequantize_affine


def group_for(width: int, group_size: int) -> int:
    """The largest power of two <= group_size that divides ``width`` (itself if none does)."""
    g = group_size
    while g > 1 and width % g:
        g //= 2
    return g if g > 1 else width


def fake_quantize(weight, *, bits: int, group_size: int | None = 128):
    """``weight`` rounded to ``bits``-bit values and mapped back to its dtype."""
    import torch

    if bits not in SCHEMES:
        raise UnlearnError(f"quantize: bits must be 8 or 4, got {bits!r}")
    MappingType, choose, quantize, dequantize = _primitives()
    mapping, qmin, qmax = SCHEMES[bits]
    out_features, in_features = weight.shape
    block = (1, in_features if bits == 8 or group_size is None else group_for(in_features, group_size))
    w = weight.detach().float()
    kind = MappingType.SYMMETRIC if mapping == "symmetric" else MappingType.ASYMMETRIC
    scale, zero = choose(w, kind, block, torch.int8 if bits == 8 else torch.uint8, quant_min=qmin, quant_max=qmax)
    q = quantize(w, block, scale, zero, torch.int8 if bits == 8 else torch.uint8, qmin, qmax)
    return dequantize(
        q, block, scale, zero, torch.int8 if bits == 8 else torch.uint8, qmin, qmax, output_dtype=torch.float32
    ).to(weight.dtype), block[1]


def quantize_model(model, *, bits: int, group_size: int | None = 128) -> dict:
    """Quantize the decoder's linear weights in place; returns what was done (for attack.json)."""
    import torch

    layers, groups = 0, set()
    decoder = getattr(getattr(model, "model", model), "layers", None)
    if decoder is None:
        raise UnlearnError(f"quantize: {type(model).__name__} has no decoder layers (model.model.layers)")
    with torch.no_grad():
        for module in decoder.modules():
            if isinstance(module, torch.nn.Linear):
                weight, group = fake_quantize(module.weight, bits=bits, group_size=group_size)
                module.weight.copy_(weight)
                groups.add(group)
                layers += 1
    if not layers:
        raise UnlearnError("quantize: no linear layer found in the decoder")
    return {
        "bits": bits,
        "scheme": SCHEMES[bits][0],
        "layers": layers,
        "group_size": sorted(groups) if bits == 4 else "per output channel",
    }


@dataclass
class Quantize:
    """Round the merged model's decoder weights to ``bits``-bit integers (int8 per output channel,
    int4 in groups of ``group_size``) and store them dequantized."""

    bits: int = field(default=4, metadata={"help": "8 (symmetric, per output channel) or 4 (asymmetric, groups)"})
    group_size: int = field(default=128, metadata={"help": "int4: input weights per (scale, zero) group"})

    def __post_init__(self):
        if self.bits not in SCHEMES:
            raise ValueError(f"bits must be 8 or 4, got {self.bits!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2, got {self.group_size}")
        _primitives()  # torchao missing: one line now, before any model loads

    def attack(self, context) -> AttackResult:
        model, tokenizer = context.load_model()
        info = quantize_model(model, bits=self.bits, group_size=self.group_size)
        context.save_model(model, tokenizer)
        return AttackResult(info=info)
