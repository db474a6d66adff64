"""RMU (representation misdirection): steer one middle layer's activations on forget answers
towards a fixed random direction, keep them equal to the reference model's on retain answers."""

from __future__ import annotations

from ..data.tofu import IGNORE_INDEX
from ..errors import UnlearnError
from .base import ForgetRetainObjective, ObjectiveContext, check_option, forward, reference_outputs


def _config(model):
    for candidate in (model, getattr(model, "module", None)):
        config = getattr(candidate, "config", None)
        if config is not None:
            return config
    raise UnlearnError("rmu: the model has no config (cannot find its number of layers)")


def _decoder_layers(model):
    """The model's decoder layers (the ModuleList named ``layers``), through PEFT wrappers."""
    import torch

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "layers" and isinstance(module, torch.nn.ModuleList):
            return module
    raise UnlearnError("rmu: cannot find the model's decoder layers (a module list named 'layers')")


def layer_activations(model, part, layer: int, *, no_grad: bool = False):
    """Raw output of decoder layer ``layer`` (0-based) for every position: (B, T, D), as the
    reference's forward hook on the layer reads it. ``hidden_states[layer + 1]`` is that output
    except for the last layer, where transformers gives the final norm's output instead: the
    last layer is read through a hook."""
    call = reference_outputs if no_grad else forward
    config = next((c for c in (getattr(model, "config", None), getattr(model, "module", None)) if c), None)
    last = getattr(config, "num_hidden_layers", None)
    layers = _decoder_layers(model) if last is not None and layer == int(last) - 1 else None
    captured = {}
    handle = None
    if layers is not None:

        def keep(_module, _args, output):
            captured["h"] = output[0] if isinstance(output, tuple) else output

        handle = layers[layer].register_forward_hook(keep)
    kwargs = {} if layers is not None else {"output_hidden_states": True}
    try:
        try:
            out = call(model, part, logits_to_keep=1, **kwargs)  # skip the LM head where supported
        except TypeError:
            out = call(model, part, **kwargs)
    finally:
        if handle is not None:
            handle.remove()
    return captured["h"] if layers is not None else out.hidden_states[layer + 1]


def masked_mse(hidden, target, labels):
    """Squared error averaged over the hidden size, then over each sequence's answer positions
    (labels != -100), then over the sequences of the batch, as the reference does: every
    sequence weighs the same whatever its answer length (docs/methods.md)."""
    mask = (labels != IGNORE_INDEX).float()
    per_position = ((hidden.float() - target.float()) ** 2).mean(-1)
    per_sequence = (per_position * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    return per_sequence.mean()


class RMU(ForgetRetainObjective):
    """Forget: MSE(h_l(forget), c * u/|u|) with u ~ U[0,1)^D fixed by ``seed``; retain:
    MSE(h_l(retain), h_l^ref(retain)). Layer l defaults to the middle decoder layer
    ((L - 1) // 2), c (``steering_coeff``) to 2 as on TOFU."""

    name = "rmu"
    leaves_parameters_unused = True  # layers after `layer` get no gradient
    #: 2: the last layer is read as the reference reads it (its raw output, not the final norm's)
    revision = 2

    def __init__(self, *, layer: int | None = None, steering_coeff: float = 2.0, seed: int | None = None, **kwargs):
        if "retain_loss" in kwargs:
            raise UnlearnError(
                "objective 'rmu': option 'retain_loss' does not apply (its retain term is the "
                "activation MSE to the reference model)"
            )
        super().__init__(**kwargs)
        self.retain_loss = "activation_mse"
        check_option(
            self.name, "layer", layer, layer is None or (isinstance(layer, int) and layer >= 0), "a layer index >= 0"
        )
        check_option(self.name, "steering_coeff", steering_coeff, steering_coeff > 0, "a number > 0")
        self.layer = layer
        self.steering_coeff = float(steering_coeff)
        self.seed = seed
        self.control = None  # c * u / |u|, built on first use

    @property
    def needs_reference_model(self) -> bool:
        return self.alpha > 0  # the retain term compares with the reference activations

    def _setup(self, model, seed: int) -> None:
        import torch

        config = _config(model)
        layers = int(config.num_hidden_layers)
        if self.layer is None:
            self.layer = (layers - 1) // 2
        if self.layer >= layers:
            raise UnlearnError(f"objective 'rmu': option 'layer' is {self.layer}, but the model has {layers} layers")
        generator = torch.Generator().manual_seed(self.seed if self.seed is not None else seed)
        u = torch.rand(int(config.hidden_size), generator=generator)
        self.control = self.steering_coeff * u / u.norm()

    def prepare(self, context: ObjectiveContext) -> None:
        self._setup(context.model, context.seed)
        context.info["rmu_layer"] = self.layer
        return None

    def forget_loss(self, model, batch, reference_model=None):
        if self.control is None:
            self._setup(model, 0)
        part = batch["forget"]
        hidden = layer_activations(model, part, self.layer)
        target = self.control.to(hidden.device, hidden.dtype).expand_as(hidden)
        return masked_mse(hidden, target, part["labels"])

    def retain_loss_value(self, model, batch, reference_model=None):
        part = batch["retain"]
        hidden = layer_activations(model, part, self.layer)
        ref = layer_activations(reference_model, part, self.layer, no_grad=True)
        return masked_mse(hidden, ref, part["labels"])
