"""Shared pieces of the unlearning objectives: per-token answer quantities, retain terms,
the optional ``prepare`` step, and how a regulariser is added to a forget objective.

Conventions (as in locuslab/open-unlearning, docs/methods.md):

* every per-token quantity is taken over answer tokens only (labels != -100, shifted);
* ``S(x, y)`` is the summed answer-token NLL of one example, ``|y|`` its answer token count;
* an objective's total is ``gamma * L_forget + alpha * L_retain``; the retain term is the
  mean token NLL on retain answers (``retain_loss="nll"``) or KL(reference || current) per
  answer token (``retain_loss="kl"``; see :func:`kl_to_reference` for how it differs from
  the reference code's average).

The optional attributes an objective may have (``regularizer``, ``weight``,
``needs_retain_data``, ``leaves_parameters_unused``, ``prepare``, ``last_terms``) are
documented on the protocol, :class:`unlearn_plugins.interfaces.UnlearningObjective`. A
sequence that ``prepare`` returns may have ``set_epoch(epoch)``: it is told each epoch, so its
items may be redrawn per epoch (IdkDPO's refusals), as a function of (seed, epoch, i) to stay
resumable. :class:`CombinedObjective` checks what every part returns (a scalar tensor with a
gradient), so a broken plugin objective fails with one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping, Sequence

from ..errors import UnlearnError

RETAIN_LOSSES = ("nll", "kl")


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
    info: dict[str, Any] = field(default_factory=dict)  # objectives may record what they chose


def check_option(name: str, option: str, value: Any, ok: bool, expected: str) -> None:
    """Raise a clear error for a bad objective option (:func:`unlearn_plugins.host.create` adds
    which objective of which plugin; ``name`` is kept for callers that construct directly)."""
    if not ok:
        raise UnlearnError(f"option {option!r} must be {expected}, got {value!r}")


# ----------------------------------------------------------------------------- per-token maths


def forward(model, part: Mapping[str, Any], **kwargs):
    """Model outputs for one padded part of a batch (input_ids, attention_mask)."""
    return model(input_ids=part["input_ids"], attention_mask=part["attention_mask"], **kwargs)


def shifted(logits, labels):
    """The answer positions only: (fp32 logits predicting each answer token, those tokens, the
    answer mask): (N,V), (N,), (B,T-1). Picked before the fp32 copy, so it and what autograd keeps
    of the softmax that follows are answer-sized, not batch x length x vocab."""
    from ..data.tofu import IGNORE_INDEX

    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE_INDEX
    return logits[:, :-1, :][mask].float(), shift_labels[mask], mask


def token_nll(logits, labels):
    """Per answer-token NLL (B, T-1), zero outside answers, and the answer mask (fp32)."""
    from ..likelihood import token_nll as _token_nll

    return _token_nll(logits, labels)


def masked_mean(values, mask):
    """Mean of ``values`` over the True entries of ``mask`` (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def sequence_nll(model, part):
    """S(x, y) per example: summed answer-token NLL, shape (B,), and the token counts (B,)."""
    logits = forward(model, part).logits
    nll, mask = token_nll(logits, part["labels"])
    return nll.sum(1), mask.sum(1)


def mean_nll(model, part):
    """Mean token NLL over all answer tokens of the batch (the usual causal-LM loss)."""
    logits = forward(model, part).logits
    nll, mask = token_nll(logits, part["labels"])
    return masked_mean(nll, mask)


def reference_sequence_nll(reference_model, part):
    """S(x, y) and token counts under the frozen reference model (no gradient)."""
    import torch

    if reference_model is None:
        raise UnlearnError("this objective needs a reference model, but none was given")
    with torch.no_grad():
        return sequence_nll(reference_model, part)


def kl_to_reference(logits, ref_logits, labels):
    """Mean over answer tokens of KL(reference || current) between next-token distributions.

    The reference code averages the same KL over every position of the padded batch
    ("batchmean" over batch x length rows: prompt, answer and padding). Kept on answer tokens
    on purpose: that average changes with how much padding a batch gets (batch composition,
    process count), and every other per-token term here is over answer tokens
    (docs/methods.md).
    """
    import torch.nn.functional as F

    cur, _, mask = shifted(logits, labels)
    ref = ref_logits[:, :-1, :][mask].float()
    log_p = F.log_softmax(cur, dim=-1)
    log_q = F.log_softmax(ref, dim=-1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    return kl.sum() / max(kl.numel(), 1)


def reference_outputs(reference_model, part, **kwargs):
    """Outputs of the frozen reference model (no gradient)."""
    import torch

    if reference_model is None:
        raise UnlearnError("this objective needs a reference model, but none was given")
    with torch.no_grad():
        return forward(reference_model, part, **kwargs)


def retain_term(model, part, kind: str, reference_model=None):
    """The retain loss on a retain batch: mean token NLL, or KL to the reference model."""
    if kind == "nll":
        return mean_nll(model, part)
    logits = forward(model, part).logits
    ref_logits = reference_outputs(reference_model, part).logits
    return kl_to_reference(logits, ref_logits, part["labels"])


# ----------------------------------------------------------------------------- base class


class ForgetRetainObjective:
    """``gamma * forget_loss + alpha * retain_loss``; subclasses define ``forget_loss``.

    Class attributes give the defaults from the reference implementations; every
    instance option is keyword-only so unknown options fail in ``host.create``.
    """

    name = "objective"
    regularizer = False
    default_gamma = 1.0
    default_alpha = 1.0
    forget_needs_reference = False

    def __init__(
        self,
        *,
        gamma: Annotated[float | None, "weight of the forget term (None: the objective's default)"] = None,
        alpha: Annotated[
            float | None, "weight of the retain term; 0 trains without retain data (None: the objective's default)"
        ] = None,
        retain_loss: Annotated[str, "retain term: 'nll' on retain answers, or 'kl' to the reference model"] = "nll",
    ):
        self.gamma = float(self.default_gamma if gamma is None else gamma)
        self.alpha = float(self.default_alpha if alpha is None else alpha)
        check_option(self.name, "gamma", gamma, self.gamma >= 0, "a number >= 0")
        check_option(self.name, "alpha", alpha, self.alpha >= 0, "a number >= 0")
        check_option(self.name, "retain_loss", retain_loss, retain_loss in RETAIN_LOSSES, "'nll' or 'kl'")
        self.retain_loss = retain_loss
        self.last_terms: dict[str, Any] = {}

    @property
    def needs_reference_model(self) -> bool:
        return self.forget_needs_reference or (self.alpha > 0 and self.retain_loss == "kl")

    @property
    def needs_retain_data(self) -> bool:
        return self.alpha > 0

    def forget_loss(self, model, batch, reference_model=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def retain_loss_value(self, model, batch, reference_model=None):
        return retain_term(model, batch["retain"], self.retain_loss, reference_model)

    def loss(self, model, batch, reference_model=None):
        forget = self.forget_loss(model, batch, reference_model)
        total = self.gamma * forget
        terms = {"forget": forget.detach()}
        if self.alpha > 0:
            if batch.get("retain") is None:
                raise UnlearnError(
                    f"objective {self.name!r} has a retain term (alpha={self.alpha}) but the batch has no retain data"
                )
            retain = self.retain_loss_value(model, batch, reference_model)
            total = total + self.alpha * retain
            terms["retain"] = retain.detach()
        self.last_terms = terms
        return total

    def options(self) -> dict[str, Any]:
        """The option values in use (recorded in run.json)."""
        return {
            k: v
            for k, v in vars(self).items()
            if not k.startswith("_")
            and k not in ("last_terms", "control", "pairs")
            and isinstance(v, (int, float, str, bool, list, type(None)))
        }

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.options().items() if not isinstance(v, list))
        return f"{self.name}({options})"


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


def _describe(record: Mapping[str, Any] | None, part: Any) -> str:
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
            if isinstance(part, ForgetRetainObjective):  # our objectives: a retain term weighted by alpha
                reasons.append(f"{label} has a retain term (alpha={part.alpha}; --objective-option alpha=0 drops it)")
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

    def __repr__(self) -> str:
        parts = [_describe(self.records[0], self.objective)] + [
            f"{getattr(r, 'weight', 1.0)} * {_describe(rec, r)}" for r, rec in zip(self.regularizers, self.records[1:])
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
