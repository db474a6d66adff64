"""Run configurations for `unlearn run` and `unlearn finetune`: defaults, TOML files, CLI overrides.

Precedence, lowest first: dataclass defaults < the saved config of the run being resumed
(``--resume``) < ``--config FILE.toml`` < command-line flags. A TOML file holds the same
names as the dataclass fields (``lr = 1e-4``, ``objective = "npo"``,
``[objective_options] beta = 0.2``); unknown keys and wrong types are errors naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..data.qa import MIN_MAX_LENGTH
from ..errors import UnlearnError
from ..options import config_field as option

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
#: the --dtype names unlearn_plugins.models.pick_dtype knows
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
DEVICE_TYPES = ("cpu", "cuda", "mps")
WARMUP_OPTIONS = ("warmup_steps", "warmup_ratio", "warmup_epochs")
NO_WARMUP_SCHEDULERS = ("constant", "reduce_lr_on_plateau", "greedy")
#: options added after configs were first keyed: left out of ``to_dict`` while at these defaults
LATER_OPTIONS = {
    "prompt_format": None,
    "date_string": None,
    "gradient_checkpointing": False,
    "reference_dtype": None,
    "device_memory": None,
    "record_trajectory": False,
}


#: scheduler and optimizer names of every transformers release this package supports (>= 4.46):
#: a config using one is accepted without importing transformers' Trainer modules (2-3 s with torch
#: and peft, in every `unlearn` process that reads a config: a dry run, `--show-config`, a study
#: file); any other name is checked against the installed transformers
STABLE_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")
STABLE_OPTIMIZERS = ("adamw_torch",)


def scheduler_names() -> list[str]:
    """The lr scheduler names the installed transformers knows (``SchedulerType``)."""
    from transformers.trainer_utils import SchedulerType

    return [s.value for s in SchedulerType]


def optimizer_names() -> list[str]:
    """The optimizer names the installed transformers knows (``OptimizerNames``)."""
    from transformers.training_args import OptimizerNames

    return [o.value for o in OptimizerNames]


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot run here (None when it can): not a torch device, a type this
    package does not drive, or hardware this machine lacks."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return f"not a device name; use {', '.join(DEVICE_TYPES)} or cuda:N"
    if dev.type not in DEVICE_TYPES:
        return f"device type {dev.type!r} is not supported; use {', '.join(DEVICE_TYPES)} or cuda:N"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine (use --device cpu)"
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s)"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available on this machine (use --device cpu)"
    return None


def steps_per_epoch(n_examples: int, batch_size: int, grad_accum: int, world_size: int = 1) -> int:
    """Optimizer steps in one epoch, counted as the transformers Trainer counts them: each process
    gets ceil(ceil(n / batch) / processes) batches, and a partial accumulation ends the epoch
    with one more step."""
    batches = math.ceil(math.ceil(n_examples / batch_size) / world_size)
    return max(math.ceil(batches / grad_accum), 1)


def warmup_settings(config: "TrainingConfig", train_size: int | None, world_size: int, fields) -> dict[str, Any]:
    """TrainingArguments warmup attributes for ``config`` (``fields``: the names TrainingArguments has).

    transformers >= 5 folds the ratio into ``warmup_steps`` (a float < 1); older ones have
    ``warmup_ratio``. ``warmup_epochs`` becomes steps from the real steps per epoch.
    """
    if config.warmup_epochs is not None:
        if not train_size:
            raise ConfigError("option 'warmup_epochs' needs the training set size to count steps per epoch")
        per_epoch = steps_per_epoch(train_size, config.batch_size, config.grad_accum, world_size)
        return {"warmup_steps": math.ceil(round(config.warmup_epochs * per_epoch, 6))}
    if config.warmup_ratio is not None:
        return (
            {"warmup_ratio": config.warmup_ratio} if "warmup_ratio" in fields else {"warmup_steps": config.warmup_ratio}
        )
    return {"warmup_steps": config.warmup_steps or 0}


def _key_values(what: str) -> dict[str, Any]:
    """The metadata of a component's options field: a repeatable ``--WHAT-option KEY=VALUE``."""
    return {"group": METHOD, "flag": f"--{what}-option", "parse": "options", "metavar": "KEY=VALUE"}


class ConfigError(UnlearnError):
    """A bad option in a run configuration (the message names the file or flag and the field)."""


#: the argument groups of the training flags, in --help's order (the commands make "data" and
#: "method" first)
MODEL, LORA, OPTIMISER, CHECKPOINTS = "model", "LoRA", "optimiser", "checkpoints"
DATA, METHOD = "data", "method"
SPLIT_HELP = (
    "tofu:SPLIT, tofu:SPLIT[a:b] or a .json file (default: %(default)s); or a text corpus cut into "
    "--max-length windows: text:FILE.jsonl, text:FOLDER, text:hf:ID:SPLIT:COLUMN"
)


@dataclass
class TrainingConfig:
    """Options shared by unlearning and fine-tuning: each field's metadata is its flag of
    `unlearn run` and `unlearn finetune` (:func:`..options.add_config_arguments`)."""

    out: str | None = option(None, "output folder (adapter or model, run.json)")
    model: str = option(
        "smollm2-135m", "local folder, hub id or alias 'smollm2-135m' (default: %(default)s)", group=MODEL
    )
    tofu_dir: str | None = option(None, "local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)", group=DATA)
    device: str | None = option(
        None, "cpu or cuda (default: cuda if available); under accelerate launch, one per process", group=MODEL
    )
    dtype: str | None = option(
        None,
        "base weight dtype: float32, bfloat16, float16 (default: fp32 on CPU, bf16 LoRA base on CUDA)",
        group=MODEL,
    )
    mixed_precision: str = option(
        "auto", "autocast (default: %(default)s = bf16 on CUDA)", group=MODEL, choices=MIXED_PRECISION
    )
    trust_remote_code: bool = option(False, "allow custom model code from the hub", group=MODEL)
    max_length: int = option(512, "max tokens per example (default: %(default)s)", group=MODEL)
    system_prompt: str | None = option(None, "system prompt for the chat template", group=MODEL)
    #: a named prompt format or a Jinja file (data/prompts.py; None: the one in force, by
    #: default the tokenizer's template) and the date its template is rendered with
    prompt_format: str | None = option(
        None,
        "prompt format: tokenizer (default: the model's chat template), tofu-llama3, tofu-llama2-chat, "
        "tofu-phi-1.5 (open-unlearning's TOFU formats), or a Jinja chat template file",
        group=MODEL,
        metavar="NAME|FILE",
    )
    date_string: str | None = option(
        None, "the date chat templates render (default: '26 Jul 2024', or the format's; never today's)", group=MODEL
    )
    # LoRA (ignored with full_finetune)
    full_finetune: bool = option(False, "train all weights instead of a LoRA adapter", group=LORA)
    lora_r: int = option(32, "LoRA rank (default: %(default)s)", group=LORA)
    lora_alpha: float = option(64.0, "LoRA alpha (default: %(default)s)", group=LORA)
    lora_dropout: float = option(0.0, "LoRA dropout (default: %(default)s)", group=LORA)
    target_modules: list[str] | None = option(
        None,
        "LoRA target module names (default: every linear layer of the decoder blocks)",
        group=LORA,
        parse="csv",
        metavar="A,B,...",
    )
    # optimiser and schedule
    lr: float = option(1e-4, "learning rate (default: %(default)s)", group=OPTIMISER)
    epochs: float = option(5.0, "epochs (default: %(default)s)", group=OPTIMISER)
    max_steps: int | None = option(None, "optimizer steps; overrides --epochs", group=OPTIMISER)
    batch_size: int = option(4, "per-device batch size (default: %(default)s)", group=OPTIMISER)
    grad_accum: int = option(4, "gradient accumulation steps (default: %(default)s)", group=OPTIMISER)
    weight_decay: float = option(0.01, "default: %(default)s", group=OPTIMISER)
    lr_scheduler: str = option(
        "constant",
        "transformers scheduler: linear, cosine, constant, constant_with_warmup, ... (default: %(default)s)",
        group=OPTIMISER,
        metavar="NAME",
    )
    # warmup: at most one of these (transformers' names, plus warmup_epochs)
    warmup_steps: int | None = option(
        None, "linear warmup over N optimizer steps (default: none)", group=OPTIMISER, mutex="warmup", metavar="N"
    )
    warmup_ratio: float | None = option(
        None, "warmup over this fraction of all steps, in [0, 1)", group=OPTIMISER, mutex="warmup", metavar="F"
    )
    warmup_epochs: float | None = option(
        None,
        "warmup over E epochs' optimizer steps, counted as the Trainer counts them",
        group=OPTIMISER,
        mutex="warmup",
        metavar="E",
    )
    max_grad_norm: float = option(1.0, "gradient clipping (default: %(default)s; 0 = off)", group=OPTIMISER)
    optim: str = option(
        "adamw_torch",
        "transformers optimizer name (default: %(default)s; adamw_bnb_8bit, paged_adamw_8bit need "
        "bitsandbytes; adafactor keeps almost no state)",
        group=OPTIMISER,
    )
    gradient_checkpointing: bool = option(
        False,
        "recompute each block's activations in the backward pass (less memory, ~30%% more time)",
        group=OPTIMISER,
    )
    reference_dtype: str | None = option(
        None,
        "full fine-tuning's frozen reference copy (default: bf16 under bf16 mixed precision, else the weights')",
        group=MODEL,
    )
    device_memory: str | None = option(
        None,
        "memory the run's plan must fit, e.g. 80GB (default: the card's total, or the available RAM on CPU)",
        group=MODEL,
        metavar="SIZE",
    )
    seed: int = option(0, "default: %(default)s", group=OPTIMISER)
    # checkpoints, logging, outputs
    save_steps: int | None = option(
        None, "checkpoint every N steps (default: every epoch; 0 = never)", group=CHECKPOINTS
    )
    save_total_limit: int = option(2, "checkpoints kept (default: %(default)s)", group=CHECKPOINTS)
    keep_checkpoints: bool = option(False, "keep OUT/checkpoints after success", group=CHECKPOINTS)
    logging_steps: int = option(1, "log the loss every N steps (default: %(default)s)", group=CHECKPOINTS)
    resume: bool = option(False, "continue the interrupted run in --out from its last checkpoint", group=CHECKPOINTS)
    overwrite: bool = option(False, "replace a run already in --out", group=CHECKPOINTS)
    merge: bool = option(False, "also write the model with the adapter merged into OUT/merged", group=LORA)

    #: fields that may differ between an interrupted run and its --resume
    RESUME_MAY_CHANGE = frozenset(
        {
            "resume",
            "overwrite",
            "merge",
            "out",
            "device",
            "tofu_dir",
            "save_total_limit",
            "logging_steps",
            "keep_checkpoints",
            "allow_overlap",
            "device_memory",
        }
    )

    def to_dict(self) -> dict[str, Any]:
        """Its fields; the options added later only when not at their defaults (the configs, and
        the study keys made of them, written before those options existed stay as they were)."""
        out = dataclasses.asdict(self)
        for name, default in LATER_OPTIONS.items():
            if name in out and out[name] == default:
                del out[name]
        return out

    def prompt(self):
        """The prompt format this run renders with: its own options over the one in force."""
        from ..data import prompts

        if self.prompt_format is None:
            fmt = prompts.active()
            if self.date_string is None:
                return fmt
            checked = prompts.resolve(date_string=self.date_string, where="option 'date_string'")
            return dataclasses.replace(fmt, date_string=checked.date_string)
        return prompts.resolve(self.prompt_format, date_string=self.date_string, where="option 'prompt_format'")

    def validate(self) -> None:
        """Check ranges that argparse/TOML types cannot express."""

        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise ConfigError(f"option '{name}' must be {expected}, got {getattr(self, name)!r}")

        def finite(name: str) -> bool:
            return math.isfinite(getattr(self, name))

        need(bool(self.out), "out", "an output folder (--out)")
        self.prompt()  # a format that does not exist or does not render is refused here
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise ConfigError(f"option 'out': {self.out} is an existing file, not a folder")
        need(self.max_length >= MIN_MAX_LENGTH, "max_length", f">= {MIN_MAX_LENGTH}")
        need(self.lora_r >= 1, "lora_r", ">= 1")
        need(finite("lora_alpha") and self.lora_alpha > 0, "lora_alpha", "a finite number > 0")
        need(0 <= self.lora_dropout < 1, "lora_dropout", "in [0, 1)")
        need(finite("lr") and self.lr > 0, "lr", "a finite number > 0")
        need(finite("epochs") and self.epochs > 0, "epochs", "a finite number > 0")
        need(finite("weight_decay") and self.weight_decay >= 0, "weight_decay", "a finite number >= 0")
        need(finite("max_grad_norm") and self.max_grad_norm >= 0, "max_grad_norm", "a finite number >= 0 (0 = off)")
        need(0 <= self.seed < 2**32, "seed", "in [0, 2**32)")
        need(self.max_steps is None or self.max_steps >= 1, "max_steps", ">= 1")
        need(self.batch_size >= 1, "batch_size", ">= 1")
        need(self.grad_accum >= 1, "grad_accum", ">= 1")
        need(self.save_steps is None or self.save_steps >= 0, "save_steps", ">= 0")
        need(self.save_total_limit >= 1, "save_total_limit", ">= 1")
        need(self.logging_steps >= 1, "logging_steps", ">= 1")
        need(self.warmup_steps is None or self.warmup_steps >= 0, "warmup_steps", ">= 0")
        need(self.warmup_ratio is None or 0 <= self.warmup_ratio < 1, "warmup_ratio", "in [0, 1)")
        need(
            self.warmup_epochs is None or (finite("warmup_epochs") and self.warmup_epochs >= 0),
            "warmup_epochs",
            "a finite number >= 0",
        )
        given = [name for name in WARMUP_OPTIONS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ConfigError(f"options {' and '.join(repr(g) for g in given)} both set the warmup; give only one")
        if self.lr_scheduler not in STABLE_SCHEDULERS:
            schedulers = scheduler_names()
            need(self.lr_scheduler in schedulers, "lr_scheduler", f"a transformers scheduler: {', '.join(schedulers)}")
        warmup = next((name for name in given if getattr(self, name)), None)
        if warmup and self.lr_scheduler in NO_WARMUP_SCHEDULERS:  # transformers would ignore it silently
            raise ConfigError(
                f"option {warmup!r}: lr_scheduler {self.lr_scheduler!r} has no warmup; use "
                f"'constant_with_warmup', 'linear', 'cosine', ..."
            )
        need(self.mixed_precision in MIXED_PRECISION, "mixed_precision", f"one of {', '.join(MIXED_PRECISION)}")
        optimizers = STABLE_OPTIMIZERS if self.optim in STABLE_OPTIMIZERS else optimizer_names()
        if self.optim not in optimizers:
            import difflib

            shown = difflib.get_close_matches(str(self.optim), optimizers, n=4, cutoff=0.5) or optimizers[:6]
            need(
                False,
                "optim",
                f"a transformers optimizer name ({', '.join(shown)}, ...: {len(optimizers)} in "
                f"transformers' OptimizerNames)",
            )
        if self.optim in optimizers:
            from ..memory_plan import check_optimizer_available

            check_optimizer_available(self.optim)
        need(self.dtype is None or self.dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}")
        need(
            self.reference_dtype is None or self.reference_dtype in DTYPES,
            "reference_dtype",
            f"one of {', '.join(DTYPES)}",
        )
        if self.device_memory is not None:
            from ..memory_plan import parse_size

            parse_size(self.device_memory, "option 'device_memory'")
        if self.device is not None:
            problem = device_problem(self.device)
            if problem:
                raise ConfigError(f"option 'device' {self.device!r}: {problem}")
        need(
            self.target_modules is None
            or (
                isinstance(self.target_modules, list)
                and self.target_modules
                and all(isinstance(t, str) and t for t in self.target_modules)
            ),
            "target_modules",
            "a non-empty list of module names",
        )


@dataclass
class UnlearnConfig(TrainingConfig):
    """`unlearn run`: forget/retain data, objective, initializer, regulariser."""

    forget: str = option("tofu:forget01", "forget split: " + SPLIT_HELP, group=DATA)
    retain: str | None = option("tofu:retain99", "retain split (default: %(default)s)", group=DATA)
    objective: str = option(
        "grad_diff", "unlearning objective (default: %(default)s; see `unlearn plugins`)", group=METHOD
    )
    objective_options: dict[str, Any] = option(dict, "objective option (repeatable)", **_key_values("objective"))
    #: shortcut for objective_options.retain_loss
    retain_loss: str | None = option(
        None, "retain term: NLL or KL to the reference model", group=METHOD, choices=("nll", "kl")
    )
    initializer: str = option(
        "kaiming", "LoRA adapter initializer (default: %(default)s, PEFT's default)", group=METHOD
    )  # PEFT's default LoRA init (init_lora_weights=True)
    initializer_options: dict[str, Any] = option(dict, "initializer option (repeatable)", **_key_values("initializer"))
    regularizer: str | None = option(None, "regulariser added to the objective, e.g. rol", group=METHOD)
    regularizer_options: dict[str, Any] = option(
        dict, "e.g. weight=0.5 (lambda), rank=128", **_key_values("regularizer")
    )
    #: keep samples that are in both forget and retain (default: refused, see data.qa.check_disjoint)
    allow_overlap: bool = option(
        False, "accept samples that are in both --forget and --retain (default: refused)", group=DATA
    )

    def validate(self) -> None:
        super().validate()
        if self.retain_loss is not None and self.retain_loss not in ("nll", "kl"):
            raise ConfigError(f"option 'retain_loss' must be 'nll' or 'kl', got {self.retain_loss!r}")

    def objective_kwargs(self) -> dict[str, Any]:
        """``objective_options``, plus ``retain_loss`` when given and the objective declares that
        option: a plugin objective that does not is not passed one (a warning says so)."""
        options = dict(self.objective_options)
        if self.retain_loss is not None:
            from ..host import accepts_option, component_label
            from ..interfaces import UNLEARNING_OBJECTIVE

            if accepts_option(UNLEARNING_OBJECTIVE, self.objective, "retain_loss"):
                options["retain_loss"] = self.retain_loss
            else:
                label = component_label(UNLEARNING_OBJECTIVE, self.objective)
                warnings.warn(
                    f"--retain-loss {self.retain_loss}: {label} has no option 'retain_loss', so it is not "
                    f"passed on (the objective keeps its own retain term, if it has one)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return options


@dataclass
class FinetuneConfig(TrainingConfig):
    """`unlearn finetune`: plain NLL training on a TOFU split (to build target models).
    ``record_trajectory`` (the last field, in LATER_OPTIONS: older configs keep their keys) writes
    each optimizer step's update, lr and batches to OUT/trajectory (training/trajectory.py), what
    the lmcleaner objective replays."""

    data: str = option("tofu:full", SPLIT_HELP, group=DATA)
    authors: list[int] | None = option(
        None,
        "train on these TOFU authors of the split only (20 QA each, 0-based)",
        group=DATA,
        parse="csv",
    )
    record_trajectory: bool = option(
        False,
        "write each optimizer step's update, lr and batches to OUT/trajectory (what lmcleaner replays)",
        group=DATA,
    )

    def validate(self) -> None:
        super().validate()
        if self.record_trajectory and self.resume:
            raise ConfigError(
                "option 'record_trajectory' cannot be used with --resume: the steps before the "
                "checkpoint were not recorded; start the run again with --overwrite"
            )
        if self.authors is not None and (
            not self.authors or not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in self.authors)
        ):
            raise ConfigError(f"option 'authors' must be a non-empty list of author indices >= 0, got {self.authors!r}")
        if self.authors is not None and len(set(self.authors)) < len(self.authors):
            twice = sorted({a for a in self.authors if self.authors.count(a) > 1})
            raise ConfigError(
                f"option 'authors' lists author{'s' if len(twice) > 1 else ''} {', '.join(map(str, twice))} more "
                f"than once ({self.authors!r}): their samples would be trained on repeatedly; give each author once"
            )


# ----------------------------------------------------------------------------- loading and merging


def type_ok(value: Any, annotation: str) -> bool:
    """Check a TOML value against a field's (string) annotation."""
    kinds = {
        "str": (str,),
        "int": (int,),
        "float": (int, float),
        "bool": (bool,),
        "list[str]": (list,),
        "list[int]": (list,),
        "dict[str, Any]": (dict,),
    }
    parts = [p.strip() for p in annotation.split("|")]
    if value is None:
        return "None" in parts
    for part in parts:
        if part == "None":
            continue
        allowed = kinds.get(part)
        if allowed is None:
            continue
        if isinstance(value, bool) and part in ("int", "float"):
            continue
        if isinstance(value, allowed):
            if part == "list[str]":
                return all(isinstance(v, str) for v in value)
            if part == "list[int]":
                return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            return True
    return False


def check_values(config_cls, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate names and types of ``values`` for ``config_cls``; errors name ``where`` and the field."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    out = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise ConfigError(f"{where}: unknown option {key!r}; known options: {', '.join(sorted(fields))}")
        annotation = str(fields[name].type)
        if not type_ok(value, annotation):
            raise ConfigError(f"{where}: option {key!r} must be of type {annotation}, got {value!r}")
        if annotation.startswith("float") and isinstance(value, int):
            try:
                value = float(value)
            except OverflowError:
                raise ConfigError(f"{where}: option {key!r}: {value} is too large") from None
        out[name] = value
    return out


def load_toml(path: str | os.PathLike, config_cls) -> dict[str, Any]:
    """Options from a TOML file, checked against ``config_cls``."""
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path}: is a folder; give a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return check_values(config_cls, data, str(path))


def build_config(config_cls, *layers: tuple[str, Mapping[str, Any]]):
    """A config from (where, values) layers applied in order over the defaults."""
    merged: dict[str, Any] = {}
    for where, values in layers:
        values = check_values(config_cls, values, where)
        warmup = [k for k in WARMUP_OPTIONS if values.get(k) is not None]
        if len(warmup) > 1:
            raise ConfigError(
                f"{where}: options {' and '.join(repr(k) for k in warmup)} both set the warmup; give only one"
            )
        if warmup:  # a layer's warmup replaces the lower layers' one (e.g. a preset's)
            merged.update({k: None for k in WARMUP_OPTIONS})
        merged.update(values)
    config = config_cls(**merged)
    config.validate()
    return config
