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
ATTACK = "attack"
BENCHMARK = "benchmark"

#: kind -> the hook that registers it
HOOK_OF_KIND = {
    DIFFICULTY_SCORER: "register_difficulty_scorers",
    ADAPTER_INITIALIZER: "register_adapter_initializers",
    UNLEARNING_OBJECTIVE: "register_unlearning_objectives",
    LM_EVAL_TASK_DIR: "register_lm_eval_task_dirs",
    ATTACK: "register_attacks",
    BENCHMARK: "register_benchmarks",
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
    """Predicts, before unlearning, how hard each sample is to forget.

    ``model`` is a transformers causal LM already on its device, in eval mode, with the
    run's dtype (fp32 on CPU, bf16 on CUDA unless --dtype); put tensors on
    ``next(model.parameters()).device``. ``tokenizer`` is its tokenizer, with a pad token.
    """

    def score(self, samples: Sequence[QASample], *, model: Any, tokenizer: Any) -> list[float]:
        """One finite float per sample, in order; higher = harder to unlearn. An item may
        instead be a dict with a ``"score"`` and extra JSON fields for the output rows (not
        ``index`` or ``question``: the host writes those)."""
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

    def prepare_shard(
        self, samples: Sequence[QASample], shard: Sequence[int], *, model: Any, tokenizer: Any, group: Any
    ) -> None:
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
    ``info``: JSON-able facts about what the initializer did, recorded in run.json under
    ``initializer`` (e.g. how many modules, which path, what was measured).
    """

    retain_basis: dict[str, "torch.Tensor"] = field(default_factory=dict)
    residual: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class AdapterInitializer(Protocol):
    """Sets the LoRA weights of a PEFT model from forget/retain data before training.

    When ``initialize`` is called the LoRA layers are already injected (PEFT's LoraConfig
    with ``--lora-r``, ``--lora-alpha``, ``--lora-dropout``, ``--target-modules``; B = 0,
    A drawn by PEFT's default), under the adapter name ``peft_model.active_adapter``
    ("default"); ``module.r[adapter]`` and ``module.scaling[adapter]`` give each layer's rank and
    scale. The model is on the training device, in train mode (as ``get_peft_model`` leaves
    it); base weights have the run's dtype (fp32 on CPU, bf16 on CUDA by default), LoRA weights
    fp32. Write weights in place under ``torch.no_grad()`` (``.copy_`` converts dtype). Under
    ``accelerate launch`` every process calls it with the same seed: the result must be
    identical on every process.
    """

    def initialize(
        self,
        peft_model: Any,
        *,
        forget: Any,
        retain: Any,
        tokenizer: Any,
    ) -> InitResult | None:
        """Write lora_A / lora_B (and base weights for residual inits) in place.

        ``forget`` and ``retain`` are tokenised example lists (dicts with input_ids,
        attention_mask, labels as Python lists; labels -100 outside answer tokens) as built by
        :func:`unlearn_plugins.data.qa.encode_samples`; ``retain`` is empty without retain
        data. Batch them with :func:`unlearn_plugins.data.qa.pad_batch`.
        """
        ...


@runtime_checkable
class UnlearningObjective(Protocol):
    """A training loss over a batch of paired forget/retain examples.

    The trainer calls ``loss`` once per micro-batch with the model being trained (a PeftModel,
    or the whole model with --full-finetune), a batch already on the model's device, and, when
    ``needs_reference_model`` is true, the starting model as ``reference_model``: called like the
    model, it returns the outputs the model had before training (eval mode, no gradients). Under
    LoRA it shares the trained model's weights (``training.lora.SharedWeightsReference``: the
    adapter switched off, or a frozen copy of the initial adapter after a residual init); with
    --full-finetune it is a frozen copy.

    Optional attributes, read with ``getattr`` when present:

    * ``needs_retain_data: bool`` - refuse to train without a retain split (``--no-retain``);
    * ``regularizer: bool`` - the component is a regulariser (``--regularizer``), added to the
      forget objective as ``+ weight * loss``; it cannot be the ``--objective``;
    * ``weight: float`` - a regulariser's coefficient;
    * ``prepare(context) -> dict | None`` - called once before training with an
      :class:`unlearn_plugins.objectives.base.ObjectiveContext` (model, tokenizer, samples,
      encoded examples, the initializer's InitResult, seed, ``model_path``: where the model was
      loaded from); may return extra per-forget-example encodings (name -> sequence, item i for
      forget example i) that every batch then carries under that name; may change the weights
      in place before training (LMCleaner's correction);
    * ``last_terms: dict[str, Tensor]`` - detached parts of the last loss, logged as ``loss_<name>``;
    * ``leaves_parameters_unused: bool`` - the loss does not reach every trainable parameter
      (multi-process training then asks DDP to look for unused ones).
    * ``finish(model, context) -> None`` - called once after training and before saving, on
      every process, with the trained model (PeftModel, or the whole model) and the context
      ``prepare`` saw; edits the weights in place, for methods that are more than a per-batch
      loss (Task Vector negates the update).
    * ``wrap_model(model, context) -> model`` - called once before ``prepare`` (and before training)
      with the model the run built (PeftModel, or the whole model) and the context; returns the
      module the run trains and saves in its place (T3 wraps the frozen model with a guidance
      head). It is saved with ``save_pretrained`` (a ``PreTrainedModel`` whose ``model_type`` is
      registered with transformers' Auto classes loads back as itself).
    * ``training_step(model, batch, reference_model, step) -> Tensor`` - called for every
      micro-batch instead of ``loss`` and the trainer's backward: runs its own backward pass(es)
      with ``step.backward(loss)``, leaves in ``.grad`` what the optimizer applies, may keep state
      between steps, and returns the loss to log; ``step`` is a
      :class:`unlearn_plugins.training.objective.TrainingStep` (epoch, global_step,
      accumulation_steps, last_micro_batch, backward). For gradient surgery (GRU) and per-step
      state (PDU's dual variable).
    """

    needs_reference_model: bool

    def loss(self, model: Any, batch: Mapping[str, Any], reference_model: Any = None) -> "torch.Tensor":
        """A scalar (0-d) tensor that depends on the trainable parameters (not a Python float).
        ``batch["forget"]`` and ``batch["retain"]`` (absent without retain data) each hold
        input_ids, attention_mask and labels (-100 outside answer tokens), right-padded; retain
        example i is a random partner of forget example i, redrawn each epoch."""
        ...


@dataclass
class AttackResult:
    """What an attack hands back besides the model it saved.

    ``info``: JSON-able facts about what it did, recorded in attack.json under ``info``.
    ``measure_on``: the forget rows (0-based, in split order) that evaluation should measure,
    when the attack was shown the others (relearning); None: all of them. ``unlearn attack``
    writes those rows as ``measure.json`` beside the model, for ``unlearn eval --forget-split``.
    """

    info: dict[str, Any] = field(default_factory=dict)
    measure_on: list[int] | None = None


@runtime_checkable
class AttackContext(Protocol):
    """What an attack is given (built by the host: :class:`unlearn_plugins.attacks.context.Context`).

    ``model`` / ``adapter``: the attacked model as ``unlearn attack --model / --adapter`` name it;
    ``device`` and ``dtype``: where and in which dtype to load it (fp32 unless ``--dtype``, so
    attacked weights are stored exactly); ``out``: the folder the attacked model is saved to (a
    staging folder, renamed into place when the attack succeeds).
    """

    model: str
    adapter: str | None
    device: str
    dtype: str
    out: Path

    def load_model(self) -> tuple[Any, Any]:
        """(model with the adapter merged in, tokenizer), on ``device``, in eval mode."""
        ...

    def model_dir(self) -> str:
        """A folder (or hub id) holding the model with the adapter merged in, for attacks that
        train from a path (``unlearn finetune``)."""
        ...

    def forget_samples(self) -> list[QASample]:
        """The forget split (``unlearn attack --forget``), for attacks that need data."""
        ...

    def save_model(self, model: Any, tokenizer: Any) -> None:
        """Save the attacked model (``save_pretrained``) and tokenizer into ``out``."""
        ...

    def adopt_folder(self, folder: Any) -> None:
        """Take a model already saved in ``folder`` (e.g. ``run_finetune``'s ``merged/``) as the result."""
        ...


@runtime_checkable
class Attack(Protocol):
    """Turns a model (usually an unlearned one) into another model that evaluation then measures,
    to see whether the forgetting survives: quantize it, fine-tune it briefly, perturb it.

    Optional attribute ``needs_forget_data: bool``: refuse to run without ``--forget``.
    """

    def attack(self, context: AttackContext) -> AttackResult | None:
        """Save the attacked model with ``context.save_model``; return what to record."""
        ...


@dataclass(frozen=True)
class Benchmark:
    """Everything of one benchmark that the core reaches, each part in the benchmark's own
    folder (the built-ins': ``unlearn_plugins/benchmarks/NAME/``). The core imports no
    benchmark module; it follows these references, each ``"package.module"`` or
    ``"package.module:attribute"``, imported only when used (listing plugins imports no torch).

    - ``task_dirs``: lm-eval task folders (YAMLs with their ``utils.py`` beside them); the host
      registers each as a task folder named after the benchmark (``NAME`` or ``NAME.FOLDER``).
    - ``studies``: built-in study files, name -> path (``unlearn study NAME``).
    - ``study``: a module with what a study of ``[benchmark] source = NAME`` needs:
      ``read(reader, data, bench, **head) -> Study`` (its tables), ``expand(study)`` (its cells),
      ``plan(study, *, cache, device, dry_run, stream)`` (its cells' stages), ``grid(study) ->
      str`` and ``write_report(out, plan, results, run) -> (files, table, left_out, lacking)``:
      the core's runner runs every study (records, ``--report-only``) and writes that report.
      Optional: ``refuse(study, args)`` (raises for the `unlearn study` options it does not take),
      ``FAILED_CELLS_SEE`` (where the failed cells' line points, ``{out}`` filled in),
      ``check_evaluation(folder)``, ``check_records(plan, records)``. ``sources``: other
      ``[benchmark] source`` names its study reads (TOFU's ``generated`` and ``auto``).
    - ``stage_kinds``: stage builder name -> ``"module:function"`` ``(tmp, params)``;
      ``evaluation_stages``: those that evaluate a model (a cell that ends in one is done once it is).
    - ``demo``: a module for `unlearn demo --benchmark NAME`: ``add_arguments(parser)``,
      ``OPTIONS`` ((flag, attribute) of its own options), ``check(args)``, ``run(args) -> int``
      (optional: ``SUMMARY``, its line in ``--benchmark``'s help, else ``summary``).
    - ``commands``: modules each adding a CLI verb (``add_parser(subparsers)``, as
      ``unlearn_plugins.commands``'s).
    - ``report``: its report writer (its record and summary.md sections, written by
      :mod:`unlearn_plugins.study.report_writer`); ``data``: its data loader (documentation for a
      reader and ``unlearn plugins``; the benchmark's own study and demo call them); ``metrics``:
      its metric formulas where the core's summaries need them (TOFU's Model Utility in
      `unlearn eval`'s summary).
    """

    summary: str
    task_dirs: tuple[Path, ...] = ()
    studies: Mapping[str, Path] = field(default_factory=dict)
    study: str | None = None
    sources: tuple[str, ...] = ()
    stage_kinds: Mapping[str, str] = field(default_factory=dict)
    evaluation_stages: tuple[str, ...] = ()
    demo: str | None = None
    commands: tuple[str, ...] = ()
    report: str | None = None
    data: str | None = None
    metrics: str | None = None

    @staticmethod
    def load(reference: str) -> Any:
        """The module or attribute a reference names."""
        import importlib

        module, _, attribute = reference.partition(":")
        obj = importlib.import_module(module)
        for part in attribute.split(".") if attribute else ():
            obj = getattr(obj, part)
        return obj

    def problems(self) -> list[str]:
        """What is wrong with this description (checked when it is registered)."""
        out = []
        for path in self.task_dirs:
            if not Path(path).is_dir():
                out.append(f"task_dirs: {path} is not a folder")
        for name, path in self.studies.items():
            if not Path(path).is_file():
                out.append(f"studies: {name!r}: {path} is not a file")
        for kind in self.evaluation_stages:
            if kind not in self.stage_kinds:
                out.append(f"evaluation_stages: {kind!r} is not one of stage_kinds")
        return out


PROTOCOL_OF_KIND = {
    DIFFICULTY_SCORER: DifficultyScorer,
    ADAPTER_INITIALIZER: AdapterInitializer,
    UNLEARNING_OBJECTIVE: UnlearningObjective,
    ATTACK: Attack,
}
