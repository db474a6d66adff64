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

from typing import Annotated, Any

from ..errors import UnlearnError
from ..likelihood import forward, masked_mean, mean_nll
from ..training.objective import CombinedObjective, ObjectiveContext, check_loss_value

RETAIN_LOSSES = ("nll", "kl")


def check_option(name: str, option: str, value: Any, ok: bool, expected: str) -> None:
    """Raise a clear error for a bad objective option (:func:`unlearn_plugins.host.create` adds
    which objective of which plugin; ``name`` is kept for callers that construct directly)."""
    if not ok:
        raise UnlearnError(f"option {option!r} must be {expected}, got {value!r}")


# ----------------------------------------------------------------------------- per-token maths


def shifted(logits, labels):
    """The answer positions only: (fp32 logits predicting each answer token, those tokens, the
    answer mask): (N,V), (N,), (B,T-1). Picked before the fp32 copy, so it and what autograd keeps
    of the softmax that follows are answer-sized, not batch x length x vocab."""
    from ..data.qa import IGNORE_INDEX

    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE_INDEX
    return logits[:, :-1, :][mask].float(), shift_labels[mask], mask


def token_nll(logits, labels):
    """Per answer-token NLL (B, T-1), zero outside answers, and the answer mask (fp32)."""
    from ..likelihood import token_nll as _token_nll

    return _token_nll(logits, labels)


def sequence_nll(model, part):
    """S(x, y) per example: summed answer-token NLL, shape (B,), and the token counts (B,)."""
    logits = forward(model, part).logits
    nll, mask = token_nll(logits, part["labels"])
    return nll.sum(1), mask.sum(1)


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

    def retain_data_reason(self) -> str:
        """Why it needs retain data, after its label (:meth:`CombinedObjective.retain_data_needed_by`)."""
        return f"has a retain term (alpha={self.alpha}; --objective-option alpha=0 drops it)"

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


class RetainDataObjective:
    """The optional attributes of an objective that is no regulariser, always trains on retain
    data and needs no reference model (GRU, PDU, T3, LUNAR, SIBL), declared once."""

    regularizer = False
    needs_reference_model = False
    needs_retain_data = True


#: the names objectives and their tests have always taken from here (defined below this layer)
__all__ = [
    "ObjectiveContext",
    "CombinedObjective",
    "ForgetRetainObjective",
    "RetainDataObjective",
    "check_loss_value",
    "check_option",
    "forward",
    "masked_mean",
    "mean_nll",
    "sequence_nll",
    "shifted",
    "token_nll",
    "kl_to_reference",
    "reference_outputs",
    "reference_sequence_nll",
    "retain_term",
    "RETAIN_LOSSES",
]
