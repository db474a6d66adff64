"""PEFT LoRA wiring: default targets, building the adapter model, saving it in standard form.

Default targets are every linear layer inside the decoder blocks (attention and MLP
projections; never the embeddings or LM head). Residual initializers (those that change the
base weights, InitResult.residual) are saved relative to the ORIGINAL base through PEFT's
``path_initial_model_for_weight_conversion``, so the adapter loads on the unchanged model.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ModelError

INITIAL_ADAPTER = "initial_adapter"  # must be a valid PEFT adapter name (no dots)


def _linear_types():
    import torch.nn as nn

    types: tuple = (nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D

        types += (Conv1D,)
    except ImportError:  # pragma: no cover
        pass
    return types


def decoder_blocks(model) -> tuple[str, Any]:
    """(name, ModuleList) of the decoder blocks: the longest ModuleList of one module class."""
    import torch.nn as nn

    best: tuple[str, Any] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            if best is None or len(module) > len(best[1]):
                best = (name, module)
    if best is None:
        raise ModelError(f"{type(model).__name__}: cannot find the decoder blocks; pass --target-modules")
    return best


def default_target_modules(model) -> list[str] | str:
    """Every linear layer of the decoder blocks, as PEFT ``target_modules``.

    Leaf names (``["q_proj", ...]``) when they are unambiguous, else a regex over the
    block paths.
    """
    linear = _linear_types()
    prefix, blocks = decoder_blocks(model)
    inside = sorted({rel for block in blocks for rel, m in block.named_modules() if rel and isinstance(m, linear)})
    if not inside:
        raise ModelError(f"{type(model).__name__}: the decoder blocks ({prefix}) have no linear layers")
    leaves = {rel.rsplit(".", 1)[-1] for rel in inside}
    outside = {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
               if isinstance(m, linear) and not name.startswith(prefix + ".")}
    if len(leaves) == len(inside) and not leaves & outside:
        return sorted(leaves)
    alternatives = "|".join(re.escape(rel) for rel in inside)
    return rf"^{re.escape(prefix)}\.\d+\.({alternatives})$"


def build_lora_model(model, *, r: int, alpha: float, dropout: float, target_modules: list[str] | None):
    """Wrap ``model`` in a PEFT LoRA model (B = 0: the function is unchanged until trained)."""
    from peft import LoraConfig, get_peft_model

    targets = target_modules or default_target_modules(model)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                        task_type="CAUSAL_LM", init_lora_weights=True)
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        linear = _linear_types()
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, linear)})
        raise ModelError(f"--target-modules {targets}: {exc}; linear layers of this model: {', '.join(names)}") from None


def save_initial_adapter(peft_model, folder: str | Path) -> Path:
    """Save the adapter right after a residual init (needed later for the weight conversion)."""
    path = Path(folder) / INITIAL_ADAPTER
    peft_model.save_pretrained(str(path))
    return path


def save_adapter(peft_model, out: str | Path, *, initial: str | Path | None = None) -> None:
    """Save a standard PEFT adapter (adapter_config.json + adapter_model.safetensors).

    With ``initial`` (a residual init), PEFT converts the trained adapter to a plain LoRA of
    rank 2r relative to the original base weights.
    """
    if initial is not None:
        peft_model.save_pretrained(str(out), path_initial_model_for_weight_conversion=str(initial))
    else:
        peft_model.save_pretrained(str(out))


def merge(peft_model):
    """The base model with the adapter folded in (a plain transformers model)."""
    return peft_model.merge_and_unload()
