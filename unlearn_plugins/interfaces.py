"""What a plugin implements for each kind, and the small data types they exchange.

These are :class:`typing.Protocol` classes: a plugin author does not subclass
them, only provides the same attributes and methods. The host checks the
essentials when a component is instantiated (see :func:`unlearn_plugins.host.create`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # keep `import unlearn_plugins` free of torch
    import torch

#: Kind names, as used in registry.toml, the CLI (`unlearn plugins`) and the API.
DIFFICULTY_SCORER = "difficulty_scorer"
ADAPTER_INITIALIZER = "adapter_initializer"
UNLEARNING_OBJECTIVE = "unlearning_objective"
LM_EVAL_TASK_DIR = "lm_eval_task_dir"

#: kind -> the hook that registers it
HOOK_OF_KIND = {
    DIFFICULTY_SCORER: "register_difficulty_scorers",
    ADAPTER_INITIALIZER: "register_adapter_initializers",
    UNLEARNING_OBJECTIVE: "register_unlearning_objectives",
    LM_EVAL_TASK_DIR: "register_lm_eval_task_dirs",
}
KINDS = tuple(HOOK_OF_KIND)


@dataclass(frozen=True)
class QASample:
    """One question/answer pair, with where it came from (for error messages).

    ``extra`` keeps TOFU's other fields (paraphrased_answer, perturbed_answer, ...)
    so stratified splits can be written back in TOFU's format.
    """

    question: str
    answer: str
    index: int
    source: str = "<memory>"
    line: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line else self.source

    def to_record(self) -> dict[str, Any]:
        """The sample as a TOFU JSON-lines record."""
        return {"question": self.question, "answer": self.answer, **dict(self.extra)}


@runtime_checkable
class DifficultyScorer(Protocol):
    """Predicts, before unlearning, how hard each sample is to forget."""

    def score(self, samples: Sequence[QASample], *, model: Any, tokenizer: Any) -> list[float]:
        """One float per sample, in order; higher = harder to unlearn."""
        ...


@runtime_checkable
class ShardedScorer(DifficultyScorer, Protocol):
    """Optional extension for scorers whose scores depend on the whole sample set (CUD's
    anchors), used under ``accelerate launch`` (:func:`unlearn_plugins.scoring.score_sharded`).

    Scorers without ``prepare_shard`` are treated as per-sample: each process scores a
    contiguous shard and the main process merges the rows. With it, every process first calls
    ``prepare_shard`` (its share of the expensive work, left where ``score`` finds it, e.g. a
    disk cache all processes see), then the main process alone calls ``score(samples)``.
    """

    def prepare_shard(self, samples: Sequence[QASample], shard: Sequence[int], *, model: Any, tokenizer: Any,
                      group: Any) -> None:
        """``shard``: this process's sample positions (contiguous); ``group``: a
        :class:`unlearn_plugins.sharding.Group` (index, count, is_main, device, barrier())."""
        ...


@dataclass
class InitResult:
    """What an initializer hands on to training.

    ``retain_basis``: LoRA module name -> (d_out x k) orthonormal basis of the
    retain representation subspace, used by the ``rol`` regulariser.
    ``residual``: the base weights were changed (W0 - s B A); the adapter must be
    saved relative to the original base (PEFT's weight conversion).
    """

    retain_basis: dict[str, "torch.Tensor"] = field(default_factory=dict)
    residual: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class AdapterInitializer(Protocol):
    """Sets the LoRA weights of a PEFT model from forget/retain data before training."""

    def initialize(
        self,
        peft_model: Any,
        *,
        forget: Any,
        retain: Any,
        tokenizer: Any,
    ) -> InitResult | None:
        """Write lora_A / lora_B (and base weights for residual inits) in place.

        ``forget`` and ``retain`` are tokenised example lists (dicts with
        input_ids, attention_mask, labels) as built by :mod:`unlearn_plugins.data.tofu`.
        """
        ...


@runtime_checkable
class UnlearningObjective(Protocol):
    """A training loss over a batch of paired forget/retain examples."""

    needs_reference_model: bool

    def loss(self, model: Any, batch: Mapping[str, Any], reference_model: Any = None) -> "torch.Tensor":
        """Scalar loss. ``batch["forget"]`` and ``batch["retain"]`` each hold
        input_ids, attention_mask and labels (-100 outside answer tokens)."""
        ...


TaskDir = Path

PROTOCOL_OF_KIND = {
    DIFFICULTY_SCORER: DifficultyScorer,
    ADAPTER_INITIALIZER: AdapterInitializer,
    UNLEARNING_OBJECTIVE: UnlearningObjective,
}
