"""What the trainer runs an objective and an initializer through: the context an objective's
``prepare`` sees, :class:`CombinedObjective` (a forget objective plus its regularisers, each
part's ``loss`` checked to be a scalar tensor with a gradient, so a broken plugin fails with one
line naming it), :class:`Initializer` (a created initializer with its label and record), and
:class:`NLL`, the plain objective `unlearn finetune` trains target models with.

The objectives themselves (:mod:`unlearn_plugins.objectives`) build on these; they are here,
below them, because the trainer needs them and a layer imports only from below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..likelihood import mean_nll


@dataclass
class ObjectiveContext:
    """What an objective may look at before training starts (see ``prepare``)."""

    model: Any  # the model being trained (a PeftModel with LoRA), already on its device
    tokenizer: Any
    forget_samples: Sequence[Any] = ()
    retain_samples: Sequence[Any] = ()
    forget: Sequence[dict] = ()  # encoded examples (input_ids, attention_mask, labels)
    retain: Sequence[dict] = ()
    init_result: Any = None  # InitResult of the adapter initializer, if any
    max_length: int = 512
    seed: int = 0
    system_prompt: str | None = None
    #: where the model was loaded from (its folder, or a hub id): what the objective may find
    #: next to it (LMCleaner: the target's recorded trajectory)
    model_path: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # objectives may record what they chose


@dataclass
class Initializer:
    """A created adapter initializer, how errors name it, and what run.json records of it."""

    obj: Any
    label: str = "initializer"
    record: dict[str, Any] | None = None


@dataclass
class TrainingStep:
    """What an objective's optional ``training_step`` learns of the micro-batch it runs.

    ``backward(loss)`` back-propagates ``loss / accumulation_steps`` (through accelerate, so
    mixed precision and DDP behave as in an ordinary step); ``last_micro_batch`` is true when the
    optimizer steps right after this micro-batch; ``epoch`` is the Trainer's fractional epoch
    (its integer part is the epoch running, from 0).
    """

    epoch: float
    global_step: int
    accumulation_steps: int
    last_micro_batch: bool
    backward: Any


def own_training_step(objective):
    """The objective's ``training_step(model, batch, reference_model, step)``, or None.

    A :class:`CombinedObjective` passes on its forget objective's; a regulariser cannot be
    added to an objective that runs its own backward (its loss would never be back-propagated).
    """
    from ..errors import UnlearnError

    if isinstance(objective, CombinedObjective):
        own = getattr(objective.objective, "training_step", None)
        if own is not None and objective.regularizers:
            raise UnlearnError(
                f"{objective.labels[0]} runs its own backward pass (training_step): "
                f"it cannot take regularizers ({', '.join(objective.labels[1:])})"
            )
        return own
    return getattr(objective, "training_step", None)


def check_loss_value(value, label: str, *, needs_grad: bool = True):
    """``value`` if it is what ``loss`` must return - a scalar tensor carrying a gradient - else a
    :class:`~unlearn_plugins.errors.PluginError` naming the component (``label``)."""
    import torch

    from ..errors import PluginError

    if not isinstance(value, torch.Tensor):
        kind = "a Python float" if isinstance(value, (int, float)) else f"a {type(value).__name__}"
        raise PluginError(
            f"{label}: loss() returned {kind} ({value!r:.60}), not a torch tensor; return the "
            f"scalar tensor itself (no .item() or float()) so it can be backpropagated"
        )
    if value.numel() != 1 or value.dim() > 1:
        raise PluginError(
            f"{label}: loss() returned a tensor of shape {tuple(value.shape)}, not a scalar; "
            f"reduce it (e.g. .mean()) to one value"
        )
    if needs_grad and torch.is_grad_enabled() and not value.requires_grad:
        raise PluginError(
            f"{label}: loss() returned a tensor without a gradient (detached, or computed under "
            f"no_grad / from the reference model only): training would not change the model"
        )
    return value.reshape(())


def describe_part(record: Mapping[str, Any] | None, part: Any) -> str:
    """``name(option=value, ...)`` from a run.json component record, else the part's repr."""
    if not record:
        return repr(part)
    options = ", ".join(f"{k}={v!r}" for k, v in record.get("options", {}).items() if not isinstance(v, (list, dict)))
    return f"{record['name']}({options})"


class CombinedObjective:
    """A forget objective plus weighted regularisers: ``L = L_objective + sum_i w_i L_reg_i``.

    ``labels`` name each part in errors (``objective 'x' (plugin 'p')``); ``records`` are what
    run.json records of each part (name, plugin, object, options; see ``host.create_with_record``).
    """

    regularizer = False

    def __init__(
        self,
        objective,
        regularizers: Sequence[Any] = (),
        *,
        labels: Sequence[str] | None = None,
        records: Sequence[Mapping[str, Any]] | None = None,
    ):
        self.objective = objective
        self.regularizers = list(regularizers)
        parts = (objective, *self.regularizers)
        self.labels = (
            list(labels)
            if labels is not None
            else [f"objective {getattr(p, 'name', type(p).__name__)!r}" for p in parts]
        )
        self.records = list(records) if records is not None else [None] * len(parts)
        self.last_terms: dict[str, Any] = {}

    @property
    def parts(self) -> list[Any]:
        return [self.objective, *self.regularizers]

    @property
    def needs_reference_model(self) -> bool:
        return any(bool(getattr(p, "needs_reference_model", False)) for p in self.parts)

    @property
    def leaves_parameters_unused(self) -> bool:
        return any(getattr(p, "leaves_parameters_unused", False) for p in self.parts)

    @property
    def needs_retain_data(self) -> bool:
        return bool(self.retain_data_needed_by())

    def retain_data_needed_by(self) -> list[str]:
        """Why retain data is needed: one phrase per part that needs it."""
        reasons = []
        for part, label in zip(self.parts, self.labels):
            if not getattr(part, "needs_retain_data", False):
                continue
            because = getattr(part, "retain_data_reason", None)  # ForgetRetainObjective's: its alpha
            if callable(because):
                reasons.append(f"{label} {because()}")
            else:
                reasons.append(f"{label} needs retain data (its needs_retain_data is true)")
        return reasons

    def prepare(self, context: ObjectiveContext) -> dict[str, list]:
        from ..errors import PluginError, UnlearnError

        views: dict[str, list] = {}
        for part, label in zip(self.parts, self.labels):
            prepare = getattr(part, "prepare", None)
            if prepare is None:
                continue
            try:
                views.update(prepare(context) or {})
            except UnlearnError:
                raise
            except Exception as exc:
                raise PluginError(f"{label}: prepare() raised {type(exc).__name__}: {exc}") from exc
        return views

    def wrap_model(self, model, context: ObjectiveContext):
        """Each part's optional ``wrap_model(model, context)`` in turn, before ``prepare``: the
        model the run then trains and saves (T3's guidance head around the frozen model)."""
        from ..errors import PluginError, UnlearnError

        for part, label in zip(self.parts, self.labels):
            wrap = getattr(part, "wrap_model", None)
            if wrap is None:
                continue
            try:
                wrapped = wrap(model, context)
            except UnlearnError:
                raise
            except Exception as exc:
                raise PluginError(f"{label}: wrap_model() raised {type(exc).__name__}: {exc}") from exc
            if not callable(getattr(wrapped, "named_parameters", None)) or not callable(wrapped):
                raise PluginError(f"{label}: wrap_model() returned {type(wrapped).__name__}, not a torch module")
            model = wrapped
        return model

    def finish(self, model, context: ObjectiveContext) -> None:
        """Each part's optional ``finish(model, context)``, once, after training and before saving."""
        from ..errors import PluginError, UnlearnError

        for part, label in zip(self.parts, self.labels):
            finish = getattr(part, "finish", None)
            if finish is None:
                continue
            try:
                finish(model, context)
            except UnlearnError:
                raise
            except Exception as exc:
                raise PluginError(f"{label}: finish() raised {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        parts = [describe_part(self.records[0], self.objective)] + [
            f"{getattr(r, 'weight', 1.0)} * {describe_part(rec, r)}"
            for r, rec in zip(self.regularizers, self.records[1:])
        ]
        return " + ".join(parts)

    def _part_loss(self, part, label, model, batch, reference_model):
        from ..errors import PluginError, UnlearnError

        try:
            value = part.loss(model, batch, reference_model)
        except UnlearnError:
            raise
        except Exception as exc:
            raise PluginError(f"{label}: loss() raised {type(exc).__name__}: {exc}") from exc
        return check_loss_value(value, label)

    def loss(self, model, batch, reference_model=None):
        total = self._part_loss(self.objective, self.labels[0], model, batch, reference_model)
        terms = dict(getattr(self.objective, "last_terms", {}) or {})
        for reg, label in zip(self.regularizers, self.labels[1:]):
            value = self._part_loss(reg, label, model, batch, reference_model)
            total = total + float(getattr(reg, "weight", 1.0)) * value
            terms[getattr(reg, "name", type(reg).__name__)] = value.detach()
        self.last_terms = terms
        return total


class NLL:
    """Plain next-token NLL on answer tokens of a batch of encoded examples (fine-tuning)."""

    name = "nll"
    regularizer = False
    needs_reference_model = False
    needs_retain_data = False

    def __init__(self):
        self.last_terms = {}

    def loss(self, model, batch, reference_model=None):
        part = batch["forget"] if "forget" in batch else batch
        return mean_nll(model, part)


__all__ = [
    "ObjectiveContext",
    "CombinedObjective",
    "Initializer",
    "NLL",
    "TrainingStep",
    "check_loss_value",
    "describe_part",
    "own_training_step",
]
