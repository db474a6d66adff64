"""PEFT LoRA wiring: default targets, building the adapter model, saving it in standard form.

Default targets are every linear layer inside the decoder blocks (attention and MLP
projections; never the embeddings or LM head). Residual initializers (those that change the
base weights, InitResult.residual) are saved relative to the ORIGINAL base through PEFT's
``path_initial_model_for_weight_conversion``, so the adapter loads on the unchanged model.

The reference model of an objective (NPO, UNDIAL, the KL retain term, ...) costs no second copy
of the weights under LoRA (:class:`SharedWeightsReference`): the frozen base weights are already
in memory, so the starting model is the same model with the adapter switched off, or, when the
adapter does not start as a no-op (residual inits: B != 0 and base weights changed), switched to
a frozen copy of the initial adapter.
"""

from __future__ import annotations

import copy
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ModelError, UnlearnError
from ..interfaces import InitResult

INITIAL_ADAPTER = "initial_adapter"  # must be a valid PEFT adapter name (no dots)
REFERENCE_ADAPTER = "reference"  # the frozen copy of the initial adapter (not INITIAL_ADAPTER: PEFT's weight
#                                  conversion loads the saved initial adapter under that name)
_WRAPPER_PREFIXES = ("module.", "base_model.model.")  # DDP's, PEFT's


def active_adapter(model) -> str:
    """The adapter being trained: the model's active one (the first, when several are); PEFT's
    ``default`` for a wrapper that does not say (DDP)."""
    active = getattr(model, "active_adapter", "default")
    return active if isinstance(active, str) else active[0]


def canonical_name(name: str) -> str:
    """A module name without DDP's ``module.`` and PEFT's ``base_model.model.`` prefixes, so the
    same layer has one name in the bare, the PEFT-wrapped and the DDP-wrapped model."""
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
    return name


def lora_layers(model, adapter: str | None = None, *, canonical_names: bool = False) -> list[tuple[str, Any]]:
    """(name, PEFT LoRA layer) of every layer that holds ``adapter`` (default: the active one), in
    model order: the layers an initializer writes and a regulariser reads. ``canonical_names``:
    names without the wrappers' prefixes (:func:`canonical_name`), to match names recorded on
    another wrapping of the model (an initializer's ``retain_basis`` seen by ROL under DDP)."""
    from peft.tuners.lora import LoraLayer

    adapter = adapter or active_adapter(model)
    return [
        (canonical_name(name) if canonical_names else name, module)
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and adapter in module.lora_A
    ]


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
    outside = {
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        if isinstance(m, linear) and not name.startswith(prefix + ".")
    }
    if len(leaves) == len(inside) and not leaves & outside:
        return sorted(leaves)
    alternatives = "|".join(re.escape(rel) for rel in inside)
    return rf"^{re.escape(prefix)}\.\d+\.({alternatives})$"


def build_lora_model(model, *, r: int, alpha: float, dropout: float, target_modules: list[str] | None):
    """Wrap ``model`` in a PEFT LoRA model (B = 0: the function is unchanged until trained)."""
    from peft import LoraConfig, get_peft_model

    targets = target_modules or default_target_modules(model)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
        init_lora_weights=True,
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        linear = _linear_types()
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, linear)})
        raise ModelError(
            f"--target-modules {targets}: {exc}; linear layers of this model: {', '.join(names)}"
        ) from None


def save_initial_adapter(peft_model, folder: str | Path) -> Path:
    """Save the adapter right after a residual init (needed later for the weight conversion);
    only the trained adapter, not the reference's frozen copy of it."""
    path = Path(folder) / INITIAL_ADAPTER
    peft_model.save_pretrained(str(path), selected_adapters=[active_adapter(peft_model)])
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


# ----------------------------------------------------------------------------- reference without a copy


def adapter_is_noop(peft_model, adapter: str | None = None) -> bool:
    """Whether ``adapter`` (default: the active one) adds nothing to the base layers: plain LoRA
    with every lora_B (weights and bias) exactly zero. Other variants (DoRA, ...) count as not."""
    import torch
    from peft.tuners.lora import LoraLayer

    adapter = adapter or active_adapter(peft_model)
    found = False
    for module in peft_model.modules():
        if not isinstance(module, LoraLayer):
            continue
        if adapter in getattr(module, "lora_variant", {}) or module.use_dora.get(adapter, False):
            return False
        for holder in (module.lora_B, module.lora_embedding_B):
            if adapter in holder:
                found = True
                part = holder[adapter]
                tensors = [part] if isinstance(part, torch.Tensor) else list(part.parameters())
                if any(bool(t.detach().ne(0).any()) for t in tensors):
                    return False
    return found


def add_frozen_copy(peft_model, name: str = REFERENCE_ADAPTER) -> str:
    """Add ``name``: a frozen, inactive copy of the active adapter as it is now (weights and
    scaling). Every other parameter keeps its requires_grad (PEFT's add_adapter re-marks the
    active adapter trainable, which would undo a freeze an initializer chose)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from peft.tuners.lora import LoraLayer

    source = active_adapter(peft_model)
    flags = [(p, p.requires_grad) for p in peft_model.parameters()]
    config = copy.deepcopy(peft_model.peft_config[source])
    config.init_lora_weights = False  # overwritten below; never re-run a data or SVD init (PiSSA would
    #                                   change the base weights a second time)
    config.inference_mode = True
    peft_model.add_adapter(name, config)
    weights = get_peft_model_state_dict(peft_model, adapter_name=source, save_embedding_layers=False)
    set_peft_model_state_dict(peft_model, weights, adapter_name=name)
    for module in peft_model.modules():
        if isinstance(module, LoraLayer) and source in module.scaling and name in module.scaling:
            module.scaling[name] = module.scaling[source]
    for param, flag in flags:
        param.requires_grad_(flag)
    for param_name, param in peft_model.named_parameters():
        if f".{name}." in param_name or param_name.endswith(f".{name}"):
            param.requires_grad_(False)
    return name


@contextmanager
def adapter_switched(layers, adapter: str | None):
    """Within the block, the PEFT ``layers`` run only ``adapter`` (None: no adapter, the base
    weights). Switched through the layers' own active/disabled state: PEFT's ``set_adapter`` and
    ``disable_adapter()`` also set requires_grad (re-enabling marks the active adapter trainable),
    and the trained adapter must stay as the optimizer sees it."""
    saved = [(layer, layer._active_adapter, layer._disable_adapters) for layer in layers]
    try:
        for layer in layers:
            if adapter is None:
                layer._disable_adapters = True
            else:
                layer._active_adapter, layer._disable_adapters = [adapter], False
        yield
    finally:
        for layer, active, disabled in saved:
            layer._active_adapter, layer._disable_adapters = active, disabled


@contextmanager
def eval_mode(modules):
    """Every module in eval mode (no dropout) within the block; each module's own mode after."""
    saved = [(module, module.training) for module in modules]
    try:
        for module, _ in saved:
            module.training = False
        yield
    finally:
        for module, mode in saved:
            module.training = mode


class SharedWeightsReference:
    """The starting model, computed on the model being trained (no copy of its weights).

    Called like the model; a call runs it without gradient and in eval mode with the adapter
    switched off (``how = "adapter_disabled"``: the adapter started as a no-op, so the base
    weights are the starting model), or through a frozen copy of the initial adapter
    (``how = "initial_adapter"``: residual inits, whose base weights were changed at init and
    whose adapter holds the rest). Gradients, requires_grad flags, module modes and the
    optimizer's parameters are as they were after each call. Build it right after the
    initializer, before any training step; :meth:`release` drops the frozen copy (before saving).
    """

    def __init__(self, peft_model):
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.model = peft_model
        self.adapter = None if adapter_is_noop(peft_model) else add_frozen_copy(peft_model)
        self.how = "adapter_disabled" if self.adapter is None else "initial_adapter"
        self._layers = [m for m in peft_model.modules() if isinstance(m, BaseTunerLayer)]
        self._modules = list(peft_model.modules())
        self.released = False

    def __call__(self, *args, **kwargs):
        import torch

        if self.released:
            raise UnlearnError("the reference model was released after training (its frozen initial adapter is gone)")
        with torch.no_grad(), eval_mode(self._modules), adapter_switched(self._layers, self.adapter):
            return self.model(*args, **kwargs)

    forward = __call__

    @property
    def config(self):
        return self.model.config

    @property
    def device(self):
        return next(self.model.parameters()).device

    def frozen_copy(self):
        """A frozen copy of the starting model to use instead, and this reference released: for
        weights sharded by FSDP or DeepSpeed, which run only inside their wrapper. Before any
        training step (the trained adapter still equals the initial one, so merging it gives the
        starting model)."""
        clone = copy.deepcopy(self.model)
        if self.adapter is not None:
            clone.delete_adapter(self.adapter)
        self.release()
        return clone.merge_and_unload().eval().requires_grad_(False)

    def release(self) -> None:
        """Delete the frozen initial adapter (saving and merging then see the trained one only)."""
        if self.adapter is not None and self.adapter in self.model.peft_config:
            self.model.delete_adapter(self.adapter)
        self.released = True

    def record(self) -> dict[str, Any]:
        """What run.json says about how the reference outputs were computed."""
        what = {
            "adapter_disabled": "the trained model's base weights with the adapter switched off (it started "
            "as a no-op); no copy of the model",
            "initial_adapter": "the trained model's base weights through a frozen copy of the initial adapter "
            "(residual init); no copy of the model",
        }
        return {"how": self.how, "description": what[self.how]}


class ResetInit:
    """Re-draw every LoRA layer through PEFT's own ``reset_lora_parameters(adapter, init)``:
    B = 0, so training starts from the base model exactly. Draws A from torch's global RNG
    (seeded by the trainer), layer by layer in model order. The initializers built on it are
    :mod:`unlearn_plugins.initializers.peft_builtin`'s; `unlearn finetune` uses :class:`DefaultInit`."""

    name = ""
    peft_init: object = None

    def initialize(self, peft_model, *, forget=None, retain=None, tokenizer=None) -> InitResult:
        import torch

        adapter = peft_model.active_adapter
        layers = lora_layers(peft_model)
        with torch.no_grad():
            for _name, module in layers:
                module.reset_lora_parameters(adapter, self.peft_init)
        return InitResult(retain_basis={}, residual=False, info={"init": self.name, "lora_layers": len(layers)})


class DefaultInit(ResetInit):
    """PEFT's default, ``init_lora_weights=True``: A ~ kaiming-uniform(a=sqrt(5)), B = 0; what
    `unlearn finetune` trains target models with (the ``kaiming`` adapter initializer)."""

    name = "kaiming"
    peft_init = True
