"""RMU (representation misdirection): steer one middle layer's activations on forget answers
towards a fixed random direction, keep them equal to the reference model's on retain answers.

Two recipes: ``open-unlearning`` (its TOFU trainer, the default) and ``wmdp`` (the WMDP
paper's ``rmu/unlearn.py``: its zephyr layer, steering coefficient and retain weight, the MSE
over every position of the batch, only the MLP down-projections of layers l-2..l trained)."""

from __future__ import annotations

from typing import Annotated

from ..data.qa import IGNORE_INDEX
from ..errors import UnlearnError
from .base import ForgetRetainObjective, ObjectiveContext, check_option, forward, reference_outputs


def _config(model):
    for candidate in (model, getattr(model, "module", None)):
        config = getattr(candidate, "config", None)
        if config is not None:
            return config
    raise UnlearnError("rmu: the model has no config (cannot find its number of layers)")


def _decoder_layers(model):
    """The model's decoder layers (the ModuleList named ``layers``), through PEFT wrappers and
    the LoRA run's reference (a callable holding the trained model as ``.model``)."""
    import torch

    root = model if hasattr(model, "named_modules") else getattr(model, "model", model)
    for name, module in root.named_modules():
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


#: each recipe's defaults (docs/methods.md, rmu): the layer (None: the middle one), the
#: steering coefficient, the retain weight alpha, how the squared error is averaged, and which
#: weights train (None: all that the run trains; else these modules of layers l-2..l)
RECIPES = {
    "open-unlearning": {"layer": None, "steering_coeff": 2.0, "alpha": 1.0, "average": "sequence", "train": None},
    "wmdp": {"layer": 7, "steering_coeff": 6.5, "alpha": 1200.0, "average": "all", "train": "mlp.down_proj"},
}


def masked_mse(hidden, target, labels):
    """Squared error averaged over the hidden size, then over each sequence's answer positions
    (labels != -100), then over the sequences of the batch, as the reference does: every
    sequence weighs the same whatever its answer length (docs/methods.md)."""
    mask = (labels != IGNORE_INDEX).float()
    per_position = ((hidden.float() - target.float()) ** 2).mean(-1)
    per_sequence = (per_position * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    return per_sequence.mean()


def mean_mse(hidden, target, labels=None):
    """Squared error averaged over every element of the (B, T, D) batch, padding included:
    ``torch.nn.functional.mse_loss`` as the WMDP reference calls it."""
    return ((hidden.float() - target.float()) ** 2).mean()


class RMU(ForgetRetainObjective):
    """Forget: MSE(h_l(forget), c * u/|u|) with u ~ U[0,1)^D fixed by ``seed``; retain:
    MSE(h_l(retain), h_l^ref(retain)). ``recipe`` picks the defaults (:data:`RECIPES`): with
    ``open-unlearning`` layer l is the middle decoder layer ((L - 1) // 2) and c 2 as on TOFU;
    with ``wmdp`` l = 7, c = 6.5, alpha = 1200 (the WMDP zephyr run)."""

    name = "rmu"
    leaves_parameters_unused = True  # layers after `layer` get no gradient
    #: 2: the last layer is read as the reference reads it (its raw output, not the final norm's)
    revision = 2

    def __init__(
        self,
        *,
        layer: int | None = None,
        steering_coeff: float | None = None,
        seed: int | None = None,
        recipe: Annotated[
            str, "'open-unlearning' (TOFU trainer) or 'wmdp' (WMDP rmu/unlearn.py defaults; docs/methods.md)"
        ] = "open-unlearning",
        **kwargs,
    ):
        check_option(self.name, "recipe", recipe, recipe in RECIPES, " or ".join(map(repr, RECIPES)))
        defaults = RECIPES[recipe]
        if kwargs.get("alpha") is None:
            kwargs["alpha"] = defaults["alpha"]
        if layer is None:
            layer = defaults["layer"]
        if steering_coeff is None:
            steering_coeff = defaults["steering_coeff"]
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
        self.recipe = recipe
        self.mse = mean_mse if defaults["average"] == "all" else masked_mse
        self.train_module = defaults["train"]
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
        if self.train_module is not None:
            context.info["rmu_trained"] = self.restrict_training(context.model)
        return None

    def restrict_training(self, model) -> list[str]:
        """Freeze every trainable parameter except those of ``train_module`` in layers l-2..l
        (the reference's ``get_params(model, layer_ids=[5, 6, 7], param_ids=[6])``: parameter 6
        of a Llama or Mistral decoder layer is ``mlp.down_proj.weight``). With LoRA the
        adapter's matrices on those modules train. Returns the names left trainable."""
        layers = [i for i in range(self.layer - 2, self.layer + 1) if i >= 0]
        keep = tuple(f".layers.{i}.{self.train_module}." for i in layers)
        kept = []
        for name, param in model.named_parameters():
            if param.requires_grad and any(k in f".{name}" for k in keep):
                kept.append(name)
            else:
                param.requires_grad_(False)
        if not kept:
            raise UnlearnError(
                f"objective 'rmu': recipe {self.recipe!r} trains {self.train_module} of layers "
                f"{layers}, but the model has no trainable parameter there"
            )
        return kept

    def forget_loss(self, model, batch, reference_model=None):
        if self.control is None:
            self._setup(model, 0)
        part = batch["forget"]
        hidden = layer_activations(model, part, self.layer)
        target = self.control.to(hidden.device, hidden.dtype).expand_as(hidden)
        return self.mse(hidden, target, part["labels"])

    def retain_loss_value(self, model, batch, reference_model=None):
        part = batch["retain"]
        hidden = layer_activations(model, part, self.layer)
        ref = layer_activations(reference_model, part, self.layer, no_grad=True)
        return self.mse(hidden, ref, part["labels"])
