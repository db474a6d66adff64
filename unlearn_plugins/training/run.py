"""`run_unlearning(config)` and `run_finetune(config)`: the library calls behind `unlearn run`
and `unlearn finetune`: load, wrap in LoRA, initialise, train with the Trainer, save. The output
folder (its layout, --resume / --overwrite, run.json's content) is :mod:`.outputs`.

Order of work: every name and file is checked before the model is loaded, so a typo
fails in a second, not after the model load; and everything (model, dtype, initializer,
objective set-up) is checked before anything is written, so a run that fails before
training leaves ``config.out`` as it found it (an earlier run there, with --overwrite,
is only removed once training is about to start). The whole run holds an exclusive lock
on ``config.out`` (``OUT/.unlearn.lock``): a second run there is refused, naming the pid.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..data import prompts
from ..errors import DataError, UnlearnError
from ..files import folder_lock, write_json
from .config import ConfigError, FinetuneConfig, TrainingConfig, UnlearnConfig
from .objective import NLL, CombinedObjective, Initializer, ObjectiveContext
from .outputs import (
    RUN_CONFIG,
    RUN_JSON,
    adapter_intact,
    check_output,
    checkpoint_dir,
    clear_previous_run,
    component_records,
    drop_incomplete_checkpoints,
    initializer_record,
    last_complete_checkpoint,
    logged_losses,
    package_versions,
    reference_record,
    saved_config,
)


class TrainingError(UnlearnError):
    """Training stopped (non-finite loss); the message names the last good checkpoint."""


@dataclass
class RunResult:
    """Where the outputs went and what run.json says."""

    out: Path
    record: dict[str, Any]


# ----------------------------------------------------------------------------- set-up pieces


def training_arguments(config: TrainingConfig, *, unused_parameters: bool = False, train_size: int | None = None):
    """TrainingArguments with low overhead: no eval, no reporting, workers 0, per-epoch or
    per-N-step checkpoints. ``unused_parameters``: the loss does not reach every trainable
    parameter (RMU), so DDP must look for unused ones. ``train_size``: examples per epoch
    (needed by ``warmup_epochs``)."""
    import dataclasses

    import torch
    from transformers import TrainingArguments

    from ..models import cuda_bf16_native
    from .config import warmup_settings

    device = (config.device or "").lower()
    if device.startswith("cuda:"):
        raise ConfigError(
            f"--device {config.device}: choose the GPU with CUDA_VISIBLE_DEVICES (the Trainer uses "
            f"the first visible one, or one per process under accelerate launch)"
        )
    use_cpu = device == "cpu" or (
        not device and not torch.cuda.is_available() and not torch.backends.mps.is_available()
    )
    cuda = not use_cpu and torch.cuda.is_available()
    precision = config.mixed_precision
    if precision == "auto":
        precision = "bf16" if cuda and cuda_bf16_native() else "no"
    if precision != "no" and not cuda:
        raise ConfigError(f"mixed_precision {precision!r} needs a CUDA device")
    if config.save_steps == 0:
        save = {"save_strategy": "no"}
    elif config.save_steps is None:
        save = {"save_strategy": "epoch"}
    else:
        save = {"save_strategy": "steps", "save_steps": config.save_steps}
    args = TrainingArguments(
        output_dir=str(checkpoint_dir(config.out)),
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum,
        learning_rate=config.lr,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps if config.max_steps else -1,
        weight_decay=config.weight_decay,
        lr_scheduler_type=config.lr_scheduler,
        max_grad_norm=config.max_grad_norm,
        optim=config.optim,
        seed=config.seed,
        data_seed=config.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=use_cpu,
        logging_strategy="steps",
        logging_steps=config.logging_steps,
        logging_nan_inf_filter=False,  # we stop on a non-finite loss instead
        save_total_limit=config.save_total_limit,
        eval_strategy="no",
        report_to="none",
        disable_tqdm=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=cuda,
        remove_unused_columns=False,
        ddp_find_unused_parameters=unused_parameters,
        **_checkpointing(config.gradient_checkpointing),
        **save,
    )
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    for name, value in warmup_settings(config, train_size, args.world_size, fields).items():
        setattr(args, name, value)  # after construction: warmup_epochs needs the process count
    return args


def _checkpointing(on: bool) -> dict[str, Any]:
    """TrainingArguments' activation (gradient) checkpointing, non-reentrant (no input gradients
    needed for LoRA), by the names the installed transformers has (5.x renamed them)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {key: on, f"{key}_kwargs": {"use_reentrant": False} if on else None}


def _weight_dtype(config: TrainingConfig, device):
    """Base weights: the --dtype given; else fp32 on CPU and for full fine-tuning (fp32 master
    weights, autocast does the rest), bf16 for frozen LoRA base weights on CUDA."""
    import torch

    from ..models import pick_dtype

    if config.dtype:
        return pick_dtype(str(device), config.dtype)
    if device.type == "cuda" and not config.full_finetune:
        return pick_dtype("cuda")
    return torch.float32


def _frozen_reference(model, config: TrainingConfig, args):
    """Full fine-tuning's frozen copy of the starting model, built tensor by tensor in its dtype
    (``reference_dtype``; by default bf16 under bf16 mixed precision, whose autocast runs the
    reference's matmuls in bf16 anyway, else the weights' own): no second full-precision copy
    exists even for a moment."""
    import torch

    from ..models import pick_dtype

    if config.reference_dtype:
        dtype = pick_dtype(str(args.device), config.reference_dtype)
    elif args.bf16:
        dtype = torch.bfloat16
    else:
        dtype = next(model.parameters()).dtype
    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = torch.nn.Parameter(param.detach().to(dtype, copy=True), requires_grad=False)
    return copy.deepcopy(model, memo).eval().requires_grad_(False)


def _load(config: TrainingConfig, device):
    """(model, tokenizer, base) where ``base`` is what run.json records of the base model (its
    folder or hub id and weights fingerprint) so the adapter is only applied to the same base.

    A model loaded from an alias is named by its hub id (``models.ALIAS_HUB_IDS``): PEFT writes
    that name into adapter_config.json as ``base_model_name_or_path`` and a merged model's config
    carries it, so both load anywhere, not only where this machine's cache folder exists."""
    from ..models import ALIAS_HUB_IDS, from_pretrained, load_tokenizer, resolve_model, weights_fingerprint

    where = resolve_model(config.model)
    model = from_pretrained(
        config.model,
        where,
        dtype=_weight_dtype(config, device),
        trust_remote_code=config.trust_remote_code,
        device=device,
    )
    model.config.use_cache = False
    model.to(device)
    tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
    hub_id = ALIAS_HUB_IDS.get(config.model)
    if hub_id:
        model.name_or_path = model.config._name_or_path = hub_id
        return (
            model,
            tokenizer,
            {"name_or_path": hub_id, "alias": config.model, "fingerprint": weights_fingerprint(where)},
        )
    name = str(Path(where).resolve()) if Path(where).is_dir() else where
    return model, tokenizer, {"name_or_path": name, "fingerprint": weights_fingerprint(where)}


def _encode(config: TrainingConfig, samples: dict[str, Sequence[Any]]):
    """(tokenizer, encoded samples by part): what the memory plan needs of the data, before any
    weights are loaded."""
    from ..data import text
    from ..data.qa import encode_samples
    from ..models import load_tokenizer

    tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
    encoded = {
        name: text.encode_windows(items)
        if text.are_windows(items)
        else encode_samples(tokenizer, items, max_length=config.max_length, system_prompt=config.system_prompt)
        for name, items in samples.items()
    }
    return tokenizer, encoded


def _load_data(config: UnlearnConfig, spec: str, option: str, objective=None) -> list[Any]:
    """A QA split (``tofu:SPLIT``, a .json file), or a text corpus (``text:...``) cut into
    windows of ``max_length`` tokens by the run's tokenizer (:mod:`..data.text`)."""
    from ..data import text
    from ..data.qa import load_split

    if not text.is_text_spec(spec):
        return load_split(spec, config.tofu_dir)
    from ..models import load_tokenizer

    if objective is not None:
        text.refuse_qa_objectives(objective, spec, option)
    tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
    return text.load_windows(spec, tokenizer, config.max_length)


def plan_stages(config: TrainingConfig, args, objective, initializer, encoded: dict[str, Sequence[dict]]):
    """The memory plan of this run (:mod:`unlearn_plugins.memory_plan`): the training stage and,
    for FILA, its initialisation; at the longest encoded example, from the model's config only."""
    from .. import memory_plan as mp

    shape = mp.model_shape(config.model, trust_remote_code=config.trust_remote_code)
    rows = [e for part in encoded.values() for e in part]
    length = max((len(e["input_ids"]) for e in rows), default=config.max_length)
    tokens = sum(len(e["input_ids"]) for e in rows) or 1
    answers = sum(sum(1 for x in e["labels"][1:] if x != -100) for e in rows)
    device = str(args.device)
    weight_dtype = config.dtype and mp.DTYPE_NAMES[config.dtype]
    stages = [
        mp.training_stage(
            shape,
            device=device,
            full_finetune=config.full_finetune,
            weight_dtype=weight_dtype,
            mixed_precision="bf16" if args.bf16 else "no",
            batch_size=config.batch_size,
            rows_per_example=2 if "retain" in encoded else 1,
            length=length,
            answer_fraction=answers / tokens,
            lora_r=config.lora_r,
            target_modules=config.target_modules,
            optim=config.optim,
            gradient_checkpointing=config.gradient_checkpointing,
            reference=bool(getattr(objective, "needs_reference_model", False)),
            reference_dtype=config.reference_dtype and mp.DTYPE_NAMES[config.reference_dtype],
            name="finetune" if "train" in encoded else "run",
        )
    ]
    name = getattr(getattr(initializer, "obj", None), "name", None)
    if name in ("fila", "vila") and not config.full_finetune:
        stages.append(
            mp.fila_stage(
                shape,
                device=device,
                dtype=weight_dtype or ("bfloat16" if device.startswith("cuda") else "float32"),
                lora_r=config.lora_r,
                target_modules=config.target_modules,
                batch_size=getattr(initializer.obj, "batch_size", 4),
                length=length,
            )
        )
    return shape, stages


def check_memory(config: TrainingConfig, args, objective, initializer, encoded) -> None:
    """Refuse, before the model is loaded, a run whose planned peak exceeds the device's memory
    (``device_memory``, else the card's total or the machine's available RAM)."""
    import warnings

    from .. import memory_plan as mp

    try:
        _, stages = plan_stages(config, args, objective, initializer, encoded)
    except UnlearnError as exc:  # an architecture the plan cannot read: the run goes on unchecked
        warnings.warn(f"no memory plan for this run: {exc}", RuntimeWarning, stacklevel=2)
        return
    if config.device_memory:
        limit, how = mp.parse_size(config.device_memory, "option 'device_memory'"), "--device-memory"
    else:
        limit, how = mp.available_bytes(str(args.device))
    mp.check_fits(stages, limit, how, f"`unlearn {'finetune' if 'train' in encoded else 'run'}`")


class UnlearningDataset:
    """Forget-anchored pairs (:class:`~unlearn_plugins.data.qa.ForgetRetainPairs`) plus extra
    per-forget-example views an objective asked for (e.g. ``forget_idk``). ``set_epoch``
    (called by the trainer) reaches the pairs and every view that has one, so draws that
    change per epoch stay a function of (seed, epoch, index) and survive a resume."""

    def __init__(
        self,
        forget: Sequence[dict],
        retain: Sequence[dict] | None,
        seed: int,
        views: dict[str, Sequence[dict]] | None = None,
    ):
        from ..data.qa import ForgetRetainPairs

        self.pairs = ForgetRetainPairs(forget, retain, seed)
        self.views = dict(views or {})
        for name, items in self.views.items():
            if len(items) != len(self.pairs):
                raise UnlearnError(
                    f"objective view {name!r} has {len(items)} items for {len(self.pairs)} forget examples"
                )

    def set_epoch(self, epoch: int) -> None:
        for part in (self.pairs, *self.views.values()):
            if hasattr(part, "set_epoch"):
                part.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.pairs[i]
        for name, items in self.views.items():
            item[name] = items[i]
        return item


# ----------------------------------------------------------------------------- the common run


def _train(
    config: TrainingConfig,
    *,
    command: str,
    objective,
    build_dataset,
    initializer=None,
    samples: dict[str, Sequence[Any]],
    callbacks: Iterable[Any] = (),
    check_loss: bool = False,
    trajectory: bool = False,
) -> RunResult:
    """Load, wrap, initialise, train with the Trainer, save; write run.json. The main process
    holds the lock on ``config.out`` from the first check to the last write. ``check_loss``:
    call the objective once on the first batch before anything is written (:func:`_check_first_loss`)."""
    started = time.time()
    if initializer is not None and not isinstance(initializer, Initializer):
        initializer = Initializer(initializer, f"initializer {type(initializer).__name__!r}")
    args = training_arguments(
        config,
        unused_parameters=bool(getattr(objective, "leaves_parameters_unused", False)),
        train_size=len(samples["forget"] if "forget" in samples else samples["train"]),
    )
    with ExitStack() as stack:
        if args.process_index == 0:
            stack.enter_context(folder_lock(config.out, f"--out {config.out}"))
        # every prompt of the run (data, objective views, initializers, callbacks) in one format
        stack.enter_context(prompts.using(config.prompt()))
        return _train_locked(
            config,
            args,
            started,
            command=command,
            objective=objective,
            build_dataset=build_dataset,
            initializer=initializer,
            samples=samples,
            callbacks=callbacks,
            check_loss=check_loss,
            trajectory=trajectory,
        )


def _initialize(initializer: Initializer, model, encoded: dict[str, Any], tokenizer):
    """Run the adapter initializer; what it raises or returns wrongly is one error naming it."""
    from ..errors import PluginError
    from ..interfaces import InitResult

    try:
        result = initializer.obj.initialize(
            model, forget=encoded.get("forget", []), retain=encoded.get("retain", []), tokenizer=tokenizer
        )
    except UnlearnError:
        raise
    except Exception as exc:  # a plugin's bug or a library error: one line naming it (--debug: traceback)
        raise PluginError(f"{initializer.label}: initialize() raised {type(exc).__name__}: {exc}") from exc
    if result is not None and not isinstance(result, InitResult):
        raise PluginError(
            f"{initializer.label}: initialize() returned a {type(result).__name__}; return an "
            f"unlearn_plugins.InitResult or None"
        )
    return result


def _check_first_loss(trainer, dataset, collator) -> None:
    """Call the objective once on the first batch, as the Trainer will (device placement,
    autocast), before the run writes anything: an objective that raises or returns something
    other than a scalar tensor with a gradient fails with nothing half-written. The RNG state
    and each part's attributes (a call counter, ``last_terms``) are restored, so training runs
    exactly as it would have run without the check."""
    import torch

    objective = trainer.objective
    parts = [objective, *getattr(objective, "parts", [])]
    saved = [(part, _attributes(part)) for part in parts if hasattr(part, "__dict__")]
    items = [dataset[i] for i in range(min(trainer.args.per_device_train_batch_size, len(dataset)))]
    batch = trainer._prepare_inputs(collator(items))
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices), trainer.compute_loss_context_manager():
            objective.loss(trainer.model, batch, reference_model=trainer.reference_model)
    finally:
        for part, attributes in saved:
            _restore(part, attributes)


def _attributes(obj) -> dict[str, tuple[Any, Any]]:
    """An object's attributes, with a copy of the content of each list, dict or set."""
    return {
        name: (value, copy.copy(value) if type(value) in (list, dict, set) else None)
        for name, value in vars(obj).items()
    }


def _restore(obj, attributes: dict[str, tuple[Any, Any]]) -> None:
    """Put back what :func:`_attributes` saw: the same objects, containers refilled in place."""
    for value, content in attributes.values():
        if isinstance(content, list):
            value[:] = content
        elif content is not None:
            value.clear()
            value.update(content)
    vars(obj).clear()
    vars(obj).update({name: value for name, (value, _) in attributes.items()})


def _train_locked(
    config: TrainingConfig,
    args,
    started: float,
    *,
    command: str,
    objective,
    build_dataset,
    initializer,
    samples: dict[str, Sequence[Any]],
    callbacks: Iterable[Any],
    check_loss: bool = False,
    trajectory: bool = False,
) -> RunResult:
    from transformers import set_seed

    from ..data.qa import PaddingCollator, prompt_record
    from . import lora
    from .trainer import WRITE_ERRORS, CheckpointWriteError, NonFiniteLossError, UnlearningTrainer, write_reason

    is_main = args.process_index == 0
    out = Path(config.out)
    ckpt_dir = checkpoint_dir(out)
    had_checkpoints = ckpt_dir.exists()
    resume_from = check_output(config, report=is_main)
    # every process checks --out before any writes to it (the Trainer creates the checkpoint
    # folder): a late process would otherwise find the folder and refuse to run
    if args.world_size > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    # Everything that can fail before training, with nothing written (the Trainer creates
    # the empty checkpoint folder; removed again on failure).
    try:
        set_seed(config.seed)
        tokenizer, encoded = _encode(config, samples)
        check_memory(config, args, objective, initializer, encoded)  # before the model is loaded
        model, tokenizer, base = _load(config, args.device)

        # The reference model: full fine-tuning keeps a frozen copy (every weight changes); LoRA
        # computes it on the trained model's own frozen weights (lora.SharedWeightsReference).
        needs_ref = bool(getattr(objective, "needs_reference_model", False))
        reference = _frozen_reference(model, config, args) if needs_ref and config.full_finetune else None

        init_result = None
        initial_adapter = None
        if config.full_finetune:
            train_model = model
        else:
            set_seed(config.seed)
            train_model = lora.build_lora_model(
                model,
                r=config.lora_r,
                alpha=config.lora_alpha,
                dropout=config.lora_dropout,
                target_modules=config.target_modules,
            )
            if initializer is not None:
                init_result = _initialize(initializer, train_model, encoded, tokenizer)
                if init_result is not None and init_result.residual:
                    initial_adapter = ckpt_dir / lora.INITIAL_ADAPTER
            if needs_ref:
                reference = lora.SharedWeightsReference(train_model)

        context = ObjectiveContext(
            model=train_model,
            tokenizer=tokenizer,
            forget_samples=samples.get("forget", ()),
            retain_samples=samples.get("retain", ()),
            forget=encoded.get("forget", ()),
            retain=encoded.get("retain", ()),
            init_result=init_result,
            max_length=config.max_length,
            seed=config.seed,
            system_prompt=config.system_prompt,
            model_path=base.get("name_or_path"),
        )
        wrap = getattr(objective, "wrap_model", None)
        if wrap is not None:  # the model the run trains and saves instead (T3: a head around the frozen model)
            train_model = context.model = wrap(train_model, context)
        prepare = getattr(objective, "prepare", None)
        views = (prepare(context) or {}) if prepare is not None else {}
        dataset = build_dataset(encoded, views)

        collator = PaddingCollator(tokenizer.pad_token_id)
        recorder = None
        if trajectory:  # --record-trajectory: each micro-batch's dataset indices reach the recorder
            from .trajectory import FOLDER, IndexedCollator, IndexedExamples, TrajectoryRecorder

            if args.world_size > 1:
                raise ConfigError(
                    "option 'record_trajectory' records a run of one process; run it without accelerate launch"
                )
            dataset, collator = IndexedExamples(dataset), IndexedCollator(collator)
            recorder = TrajectoryRecorder(out / FOLDER, samples["train"], encoded["train"])
            callbacks = [*callbacks, recorder]
        trainer = UnlearningTrainer(
            model=train_model,
            args=args,
            train_dataset=dataset,
            data_collator=collator,
            objective=objective,
            reference_model=reference,
            callbacks=list(callbacks),
            trajectory=recorder,
        )
        if isinstance(reference, lora.SharedWeightsReference) and (
            trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled
        ):
            # sharded weights run only inside their wrapper: a frozen copy, as with full fine-tuning
            reference = trainer.reference_model = reference.frozen_copy().to(args.device)
        if check_loss:
            _check_first_loss(trainer, dataset, collator)
    except BaseException:
        if is_main and not had_checkpoints:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        raise

    # Training starts: only now replace an earlier run (--overwrite) and write the run's files.
    if is_main:
        if config.resume:
            drop_incomplete_checkpoints(ckpt_dir, resume_from)
        elif config.overwrite:
            clear_previous_run(out)
        write_json(ckpt_dir / RUN_CONFIG, {"command": command, "config": config.to_dict()})
        if initial_adapter is not None and not (config.resume and adapter_intact(initial_adapter)):
            lora.save_initial_adapter(train_model, ckpt_dir)
    trainer.accelerator.wait_for_everyone()

    trainable = sum(p.numel() for p in train_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in train_model.parameters())
    record: dict[str, Any] = {
        "status": "running",
        "command": command,
        "config": config.to_dict(),
        "versions": package_versions(),
        "seed": config.seed,
        "device": str(args.device),
        "weight_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "mixed_precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "no",
        "num_processes": args.world_size,
        # how the processes share the model: NO, MULTI_CPU / MULTI_GPU (DDP), FSDP, DEEPSPEED
        "distributed": trainer.accelerator.distributed_type.name,
        "samples": {name: len(items) for name, items in samples.items()},
        "parameters": {"trainable": trainable, "total": total},
        "objective": repr(objective),
        "initializer": initializer_record(initializer, init_result),
        "components": component_records(objective, initializer),
        "context": context.info,
        "resumed_from": str(resume_from) if resume_from else None,
        "reference_model": reference_record(reference),
        "base_model": base,  # checked when the adapter is loaded (models.check_adapter)
        "prompt_format": prompt_record(tokenizer),
    }
    try:
        result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except CheckpointWriteError as exc:  # a checkpoint that cannot be written (a full disk)
        last = last_complete_checkpoint(ckpt_dir)
        where = f"--resume continues from {last}" if last else "no checkpoint was written before it"
        raise TrainingError(f"training stopped at step {exc.step}: {exc}; {where}") from exc
    except NonFiniteLossError as exc:
        last = last_complete_checkpoint(ckpt_dir)
        record.update(
            status="failed",
            error=str(exc),
            steps=trainer.state.global_step,
            losses=logged_losses(trainer.state.log_history),
            last_good_checkpoint=str(last) if last else None,
            wall_time_s=round(time.time() - started, 3),
        )
        if is_main:
            write_json(out / RUN_JSON, record)
        where = (
            f"last good checkpoint: {last}" if last else "no checkpoint was written before it"
        ) + f"; details in {out / RUN_JSON} (start again with a lower --lr and --overwrite)"
        raise TrainingError(f"training stopped: {exc}; {where}") from None

    trainer.accelerator.wait_for_everyone()
    if isinstance(reference, lora.SharedWeightsReference):
        reference.release()  # the saved adapter and the merged model hold the trained adapter only
    finish = getattr(objective, "finish", None)
    if finish is not None:  # a whole-run step after training (Task Vector's subtraction), before saving
        finish(train_model, context)
    outputs: dict[str, str] = {}
    if is_main:
        # written to a staging folder inside --out, moved into place once complete: a full disk
        # leaves no half-written adapter that looks like a finished run
        staging = Path(tempfile.mkdtemp(prefix=".saving-", dir=out))
        try:
            if initial_adapter is not None:
                lora.save_adapter(train_model, staging, initial=initial_adapter)
            else:
                trainer.save_model(str(staging))
                (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle; run.json has the config
            tokenizer.save_pretrained(str(staging))
            if config.merge and not config.full_finetune:
                merged = lora.merge(train_model)
                merged.config.use_cache = True
                merged.save_pretrained(str(staging / "merged"))
                tokenizer.save_pretrained(str(staging / "merged"))
                outputs["merged"] = str(out / "merged")
        except WRITE_ERRORS as exc:
            shutil.rmtree(staging, ignore_errors=True)
            kept = f"; the checkpoints are kept in {ckpt_dir}" if last_complete_checkpoint(ckpt_dir) else ""
            raise TrainingError(
                f"--out {out}: cannot save the trained {'model' if config.full_finetune else 'adapter'}: "
                f"{write_reason(exc, out)}{kept}"
            ) from exc
        for path in staging.iterdir():
            if path.is_dir():
                shutil.rmtree(out / path.name, ignore_errors=True)
            os.replace(path, out / path.name)
        staging.rmdir()
        outputs = {"adapter" if not config.full_finetune else "model": str(out), **outputs}
    losses = logged_losses(trainer.state.log_history)
    record.update(
        status="completed",
        steps=trainer.state.global_step,
        epochs=trainer.state.epoch,
        train_loss=result.training_loss,
        final_loss=losses[-1]["loss"] if losses else None,
        losses=losses,
        wall_time_s=round(time.time() - started, 3),
        outputs=outputs,
    )
    if is_main:
        write_json(out / RUN_JSON, record)
        if not config.keep_checkpoints:
            shutil.rmtree(ckpt_dir, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    return RunResult(out, record)


# ----------------------------------------------------------------------------- public calls


def with_run_seed(kind: str, name: str, options: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """``options`` plus ``seed``: the run's seed, for a component that declares a ``seed`` option
    the configuration leaves unset (FILA's randomized SVD, RILA's retain draw, RMU's direction,
    ROL's random basis): `unlearn run --seed S` and a study's cell of seed S build the same one."""
    from ..host import get_host

    component = get_host().components.get(kind, {}).get(name)
    declared = component.options() if component is not None else None
    if seed is None or "seed" in options or declared is None or declared.get("seed") is None:
        return dict(options)
    return {**options, "seed": seed}


def _check_component(kind: str, name: str, options: dict[str, Any], seed: int | None = None):
    """(instance, run.json record, label) of a configured component (names and options checked);
    ``seed``: the run's seed, for a component that takes one (:func:`with_run_seed`)."""
    from ..host import component_label, create_with_record

    instance, record = create_with_record(kind, name, **options)  # errors name the options given
    seeded = with_run_seed(kind, name, options, seed)
    if seeded != options:
        instance, record = create_with_record(kind, name, **seeded)
    return instance, record, component_label(kind, name)


def build_objective(config: UnlearnConfig):
    """The objective of ``config`` combined with its regulariser (names and options checked)."""
    from ..interfaces import UNLEARNING_OBJECTIVE

    objective, record, label = _check_component(
        UNLEARNING_OBJECTIVE, config.objective, config.objective_kwargs(), config.seed
    )
    if getattr(objective, "regularizer", False):
        raise ConfigError(
            f"--objective {config.objective}: this is a regulariser; use it as --regularizer "
            f"{config.objective} together with a forget objective"
        )
    regularizers, records, labels = [], [record], [label]
    if config.regularizer:
        reg, reg_record, reg_label = _check_component(
            UNLEARNING_OBJECTIVE, config.regularizer, dict(config.regularizer_options), config.seed
        )
        if not getattr(reg, "regularizer", False):
            raise ConfigError(
                f"--regularizer {config.regularizer}: this is a forget objective, not a regulariser "
                f"(regularisers have regularizer = True, e.g. rol)"
            )
        regularizers.append(reg)
        records.append(reg_record)
        labels.append(reg_label)
    elif config.regularizer_options:
        raise ConfigError("regularizer options were given without --regularizer")
    return CombinedObjective(objective, regularizers, labels=labels, records=records)


def run_unlearning(
    config: UnlearnConfig, *, objective=None, initializer=None, callbacks: Iterable[Any] = ()
) -> RunResult:
    """Unlearn ``config.forget`` from ``config.model``; returns where the adapter and run.json went.

    ``objective`` / ``initializer`` replace the configured ones with ready objects (an
    object with ``loss`` and ``needs_reference_model``; one with ``initialize``);
    ``callbacks`` are passed to the Trainer.
    """
    from ..interfaces import ADAPTER_INITIALIZER

    config.validate()
    objective = _as_combined(objective) if objective is not None else build_objective(config)
    if config.full_finetune:
        if config.initializer != UnlearnConfig.initializer or initializer is not None:
            raise ConfigError(f"--initializer {config.initializer} needs LoRA; it cannot be used with --full-finetune")
    elif initializer is None:
        obj, record, label = _check_component(
            ADAPTER_INITIALIZER, config.initializer, dict(config.initializer_options), config.seed
        )
        initializer = Initializer(obj, label, record)
    elif not isinstance(initializer, Initializer):
        initializer = Initializer(initializer, f"initializer {type(initializer).__name__!r}")

    forget = _load_data(config, config.forget, "--forget", objective)
    if not forget:
        raise DataError(f"--forget {config.forget}: the split is empty: nothing to unlearn")
    samples: dict[str, Sequence[Any]] = {"forget": forget}
    if config.retain:
        samples["retain"] = _load_data(config, config.retain, "--retain", objective)
    elif getattr(objective, "needs_retain_data", False):
        reasons = (
            objective.retain_data_needed_by()
            if hasattr(objective, "retain_data_needed_by")
            else [f"objective {config.objective!r} needs retain data"]
        )
        raise ConfigError(f"{'; '.join(reasons)}: give --retain")

    def build(encoded, views):
        return UnlearningDataset(encoded["forget"], encoded.get("retain"), config.seed, views)

    return _train(
        config,
        command="run",
        objective=objective,
        build_dataset=build,
        initializer=initializer,
        samples=samples,
        callbacks=callbacks,
        check_loss=True,
    )


def plan_run(config: TrainingConfig):
    """(shape, stages, device memory, how it was found) of `unlearn run` / `finetune` with
    ``config``, checked as the run checks its options and data, nothing loaded but the
    tokenizer (``--dry-run``)."""
    from .. import memory_plan as mp
    from ..data.qa import load_split
    from ..interfaces import ADAPTER_INITIALIZER

    config.validate()
    if isinstance(config, UnlearnConfig):
        objective = build_objective(config)
        initializer = None
        if not config.full_finetune:
            obj, record, label = _check_component(
                ADAPTER_INITIALIZER, config.initializer, dict(config.initializer_options), config.seed
            )
            initializer = Initializer(obj, label, record)
        samples = {"forget": _load_data(config, config.forget, "--forget", objective)}
        if config.retain:
            samples["retain"] = _load_data(config, config.retain, "--retain", objective)
    else:
        objective, initializer = NLL(), None
        data = load_split(config.data, config.tofu_dir)
        samples = {"train": select_authors(data, config.authors, config.data) if config.authors else data}
    args = training_arguments(config, train_size=len(next(iter(samples.values()))))
    with prompts.using(config.prompt()):  # the run's prompt format: its lengths
        _, encoded = _encode(config, samples)
    shape, stages = plan_stages(config, args, objective, initializer, encoded)
    if config.device_memory:
        limit, how = mp.parse_size(config.device_memory, "option 'device_memory'"), "--device-memory"
    else:
        limit, how = mp.available_bytes(str(args.device))
    return shape, stages, limit, how


def _as_combined(objective):
    """Wrap a bare objective object so the trainer sees one interface."""
    return objective if isinstance(objective, CombinedObjective) else CombinedObjective(objective)


def select_authors(samples: Sequence[Any], authors: Sequence[int], where: str) -> list[Any]:
    """The rows of the given TOFU authors (20 QA each, author-major) within a split."""
    from ..data.qa import QA_PER_AUTHOR, author_slice

    n_authors = len(samples) // QA_PER_AUTHOR
    bad = [a for a in authors if a >= n_authors]
    if bad:
        raise DataError(
            f"{where}: author(s) {bad} out of range; the split has {n_authors} authors "
            f"({len(samples)} QA, {QA_PER_AUTHOR} per author)"
        )
    return [samples[i] for i in author_slice(authors)]


def run_finetune(config: FinetuneConfig, *, callbacks: Iterable[Any] = ()) -> RunResult:
    """Plain NLL training on a TOFU split (or some of its authors), or on a text corpus
    (``text:...``: windows of ``max_length`` tokens, :mod:`..data.text`): builds target models."""
    from ..data import text
    from ..data.qa import load_split
    from .lora import DefaultInit

    config.validate()
    if text.is_text_spec(config.data):
        if config.authors:
            raise DataError(f"--authors: selects TOFU authors; --data {config.data} is a text corpus")
        data = _load_data(config, config.data, "--data")
    else:
        data = load_split(config.data, config.tofu_dir)
    if config.authors:
        data = select_authors(data, config.authors, config.data)
    if not data:
        raise DataError(f"--data {config.data}: no samples to train on")

    def build(encoded, views):
        return list(encoded["train"])

    return _train(
        config,
        command="finetune",
        objective=NLL(),
        build_dataset=build,
        initializer=None if config.full_finetune else DefaultInit(),
        samples={"train": data},
        callbacks=callbacks,
        trajectory=config.record_trajectory,
    )


__all__ = [
    "run_unlearning",
    "plan_run",
    "run_finetune",
    "RunResult",
    "TrainingError",
    "last_complete_checkpoint",
    "saved_config",
    "build_objective",
    "UnlearnConfig",
    "FinetuneConfig",
]
