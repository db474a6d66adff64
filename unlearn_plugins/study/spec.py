"""The study file: a TOML description of an experiment grid, its strict validation, and the
grid of cells it expands to.

A study names the base model, a TOFU-style benchmark (N authors, forget sizes), how the
target ("full") and retain models are made (a fine-tuning recipe, or given folders), the
unlearning methods, the seeds, the evaluation and ONE unlearning budget for every method.
Every unknown key and bad value is an error naming the file, the table and the key
(``FILE: [table] key: what is wrong``), raised before any work; docs/study.md describes the
format. Built-in studies live in ``studies/`` beside this module, and a benchmark's (its demo's,
``unlearn demo``) in its folder, named by its ``studies`` (``unlearn study --list``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import typing
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UnlearnError
from ..evaluation.config import EvaluationConfig
from ..options import config_defaults, config_field_of
from ..options import config_field as option

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BUILTIN_DIR = Path(__file__).resolve().parent / "studies"
#: [evaluation] gen_margin's largest value: new tokens past the longest answer (a larger one
#: was accepted, then failed late, or over any model's length)
MAX_GEN_MARGIN = 4096
#: the model alias of a randomly initialised 2-layer Llama built in code (unlearn_plugins.testing)
TINY_MODEL = "tiny-llama"
TABLES = (
    "study",
    "model",
    "benchmark",
    "target",
    "retain",
    "budget",
    "methods",
    "evaluation",
    "cud",
    "sharded",
    "variants",
)
CI_METHODS = ("t", "bootstrap")
#: a study file's [benchmark] source when it names none: a registered benchmark with a study part
#: (unlearn_plugins.interfaces.Benchmark) reads the study; this one's study part also adds the
#: author-unit tables every study file may hold (its ``TABLES``, ``split_tables``)
DEFAULT_SOURCE = "tofu"
#: the tasks every study evaluates: Forget Quality, Model Utility, forget probability and ROUGE-L
REQUIRED_TASKS = ("tofu_forget_prob", "tofu_forget_rouge", "tofu_forget_truth_ratio", "tofu_model_utility")
EXTRACTION_TASK = "tofu_forget_extraction_strength"
#: training options that make up the shared unlearning budget ([budget]) and a fine-tuning recipe
SCHEDULE_FIELDS = (
    "lr",
    "epochs",
    "max_steps",
    "batch_size",
    "grad_accum",
    "weight_decay",
    "lr_scheduler",
    "warmup_steps",
    "warmup_ratio",
    "warmup_epochs",
    "max_grad_norm",
    "optim",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "dtype",
    "mixed_precision",
)
#: what a [[methods]] entry may set besides name, label and preset
METHOD_FIELDS = (
    "objective",
    "objective_options",
    "retain_loss",
    "initializer",
    "initializer_options",
    "regularizer",
    "regularizer_options",
    "full_finetune",
)
#: options the study itself sets for every training run (paths, seed, length, device, checkpoints)
STUDY_CONTROLLED = (
    "out",
    "model",
    "data",
    "forget",
    "retain",
    "seed",
    "max_length",
    "device",
    "tofu_dir",
    "merge",
    "save_steps",
    "resume",
    "overwrite",
    "authors",
)
#: what [cud.unlearn] may set (a table per objective may add objective_options)
CUD_RUN_FIELDS = (*SCHEDULE_FIELDS, "full_finetune")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: options of the cud scorer that a study's [cud] stage sets itself (the anchor pool and the
#: anchor runs' options are [cud]'s; the model is the target)
CUD_STUDY_SET = (
    "anchor_data",
    "tofu_dir",
    "anchors",
    "anchor_losses",
    "runner",
    "model_spec",
    "unlearn_options",
    "unlearn_by_objective",
    "max_length",
    "cache",
    "cache_dir",
    "progress",
)


class StudyError(UnlearnError):
    """A bad study file: the message names the file, the table and the key."""


# ----------------------------------------------------------------------------- the parsed study


@dataclass(frozen=True)
class Recipe:
    """How a target or retain model is made: fine-tuned from the base model, or given."""

    finetune: dict = field(default_factory=dict)
    seed: int = 0
    threads: int | None = None  # torch threads while fine-tuning (None: the worker's)
    given: str | None = None  # target: a model folder or hub id

    def describe(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    settings: dict  # preset, objective, initializer, ... as written in the file
    #: the resolved UnlearnConfig values (preset < method < budget), without paths, seed, device
    config: dict


@dataclass(frozen=True)
class Evaluation:
    """[evaluation]: the evaluation of every model; the options it shares with `unlearn eval` are
    :class:`..evaluation.config.EvaluationConfig`'s fields (one default, one check)."""

    tasks: tuple[str, ...] = option(
        REQUIRED_TASKS, "lm-eval tasks every model is evaluated with (must include the study's required ones)"
    )
    mu_size: int = option(400, "retain QA in Model Utility's retain part (TOFU: 400)", minimum=2)
    batch_size: int = config_field_of(EvaluationConfig, "batch_size")
    gen_margin: int = option(
        16,
        "new tokens past the longest answer of the benchmark (the generation cap)",
        minimum=0,
        maximum=MAX_GEN_MARGIN,
    )
    #: the weights' dtype while evaluating (None: the device's default, fp32 on CPU)
    dtype: str | None = config_field_of(EvaluationConfig, "dtype")
    #: also membership inference against a holdout author and the forget metrics after the
    #: probes and the relearn / int4 attacks (`unlearn eval --mia --robustness`) in every evaluation
    robustness: bool = config_field_of(
        EvaluationConfig,
        "robustness",
        help="also membership inference against a holdout author, and the forget metrics under the probes "
        "and after the relearn / int4 attacks (`unlearn eval --mia --robustness`)",
    )
    #: the lm-eval model class (`unlearn eval --scoring`): "prefix" (each prompt scored once) or
    #: "hf" (lm-eval's HFLM, which every evaluation used before "prefix" existed). With fp32
    #: weights both give the same numbers (to 1e-5); with bf16 weights they differ by rounding,
    #: so a bf16 evaluation's cache key names its scoring (study/cells.py)
    scoring: str = config_field_of(EvaluationConfig, "scoring")

    @property
    def extraction_from_task(self) -> bool:
        return EXTRACTION_TASK in self.tasks


@dataclass(frozen=True)
class Cud:
    """[cud]: CUD difficulty scores of each forget set, on the target, and its CUD-easy and
    CUD-hard strata (the ``strata`` lowest and highest scored samples). The anchors are chosen on
    the first ``anchor_pool`` retain QA, never on a scored sample."""

    scorer: dict  # the cud scorer's options ([cud.scorer])
    unlearn: dict  # the anchor runs' training options ([cud.unlearn]; a table per objective: its own)
    anchor_pool: int = option(10, "the first retain QA the anchors are chosen from", minimum=2)
    strata: int = option(5, "samples in each of the CUD-easy and CUD-hard strata", minimum=1)

    def describe(self) -> dict:
        return dataclasses.asdict(self)


#: fields added to the study format after its first version: left out of a study's digest and
#: of its report while they have these values, so the studies before them keep theirs
LATER_FIELDS: dict[str, Any] = {
    "cud": None,
    "one_budget": True,
    "movielens": None,
    "sharded": None,
    "design": None,
    "prompt_format": None,
    "benchmark": None,
}
#: how a study is run, not what it measures: never part of its digest
RUN_FIELDS = ("workers_per_gpu",)


@dataclass(frozen=True)
class Study:
    name: str
    path: str  # the study file
    description: str
    model: str  # alias, folder or hub id (folders resolved against the study file)
    max_length: int
    source: str  # tofu | generated
    tofu_dir: str | None
    authors: int
    forget_sizes: tuple[int, ...]
    target: Recipe
    retain: Recipe
    retain_given: dict  # forget size -> model folder
    budget: dict
    methods: tuple[Method, ...]
    seeds: tuple[int, ...]
    evaluation: Evaluation
    ci: str
    cud: Cud | None = None
    #: every schedule key the same for every method (False: [budget]'s keys only; a preset keeps
    #: the rest of its own, as the demo's ReGLU its weight decay and warmup)
    one_budget: bool = True
    #: [benchmark] source = "movielens": the MovieLens benchmark (authors and forget sizes unused)
    movielens: Any = None
    #: [sharded] (MovieLens only): a sharded recommender (RecEraser / SISA) unlearning too
    sharded: Any = None
    #: an author-unit study's tables ([benchmark] unit = "author": :class:`.design.Design`)
    design: Any = None
    #: a registered benchmark's own [benchmark] settings, read by its study part (e.g. WMDP's)
    benchmark: Any = None
    #: [model] prompt_format / date_string: the prompt format's definition (data/prompts.py;
    #: None: the default, the tokenizer's template with the fixed date)
    prompt_format: dict | None = None
    #: [study] workers_per_gpu: how many workers may share one GPU (more workers than GPUs
    #: are refused otherwise)
    workers_per_gpu: int = 1

    def method(self, name: str) -> Method:
        return next(m for m in self.methods if m.name == name)

    def digest(self) -> str:
        """What identifies the study in its report (study.json): its settings, not where its file
        is or how it is described, so two studies of one name are told apart."""
        from ..files import json_digest

        settings = {k: v for k, v in self.settings().items() if k not in ("path", "description")}
        return json_digest(settings, length=16)

    def settings(self) -> dict:
        """Its fields as a dict, less the :data:`LATER_FIELDS` a study leaves at their defaults
        (and an evaluation's ``scoring`` "hf", what every study used before it could choose)."""
        fields = dataclasses.asdict(self)
        if fields["evaluation"].get("scoring") == "hf":
            del fields["evaluation"]["scoring"]
        later = getattr(self.benchmark, "LATER_FIELDS", {})  # a benchmark's own later keys, as above
        for key, default in later.items():
            if fields["benchmark"].get(key) == default:
                del fields["benchmark"][key]
        return {
            k: v for k, v in fields.items() if not (k in LATER_FIELDS and v == LATER_FIELDS[k]) and k not in RUN_FIELDS
        }


@dataclass(frozen=True)
class Cell:
    """One task of the grid: a model to make, a model to evaluate, or a method to run and
    evaluate. ``deps``: cells whose results it reads."""

    id: str
    kind: str  # target | retain | eval_retain | eval_full | method | cud | sharded | sharded_unlearn
    label: str
    forget: int | None = None
    method: str | None = None
    seed: int | None = None
    deps: tuple[str, ...] = ()
    author: int | None = None  # an author-unit study's author (its TOFU id)

    @classmethod
    def run(cls, cell_id: str, label: str, method: Method, seed: int, deps: tuple[str, ...], **more: Any) -> Cell:
        """The cell that runs ``method`` with ``seed`` (and evaluates what it made)."""
        return cls(cell_id, "method", label, method=method.name, seed=seed, deps=deps, **more)


# ----------------------------------------------------------------------------- finding and reading


def study_tables() -> tuple[str, ...]:
    """The tables a study file may hold: :data:`TABLES` and the default study kind's own (TOFU's
    author-unit tables, which its study part reads)."""
    from ..host import study_part

    return TABLES + tuple(study_part(DEFAULT_SOURCE).TABLES)


def builtin_studies() -> dict[str, Path]:
    """The studies shipped with the package: name -> file, those of ``studies/`` first, then the
    registered benchmarks' (:attr:`~unlearn_plugins.interfaces.Benchmark.studies`: the demos'
    ``demo`` and ``demo-movielens`` among them) by name."""
    found = {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.toml"))}
    from ..host import benchmarks

    found.update(sorted((name, Path(path)) for bench in benchmarks().values() for name, path in bench.studies.items()))
    return found


def find_study(spec: str) -> Path:
    """A study file path, or the name of a built-in study."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    builtins = builtin_studies()
    if spec in builtins:
        return builtins[spec]
    if path.exists():
        raise StudyError(f"{spec}: is a folder, not a study file")
    known = ", ".join(builtins) or "none"
    raise StudyError(f"{spec}: no such study file or built-in study (built-in: {known}; see unlearn study --list)")


def read_study_data(spec: str, variant: str | None = None) -> tuple[Path, dict]:
    """A study file's tables as read (TOML), with ``variant``'s tables in place of the study's
    of the same name: a variant (``[variants.NAME.TABLE]``) replaces each table it gives whole."""
    path = find_study(spec)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise StudyError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise StudyError(f"{path}: not valid TOML: {exc}") from None
    variants = data.pop("variants", {})
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise StudyError(f"{path}: [variants]: must hold one table per variant ([variants.NAME.TABLE])")
    for name, tables in variants.items():
        bad = [t for t in tables if t not in study_tables() or t in ("variants", "study")]
        if bad:
            raise StudyError(
                f"{path}: [variants.{name}.{bad[0]}]: a variant replaces tables of the study "
                f"({', '.join(t for t in study_tables() if t not in ('variants', 'study'))})"
            )
    if variant is not None:
        if variant not in variants:
            known = ", ".join(variants) or "none"
            raise StudyError(f"{path}: no variant {variant!r} (its variants: {known})")
        data.update(variants[variant])
    return path, data


def load_study(spec: str, variant: str | None = None, data: dict | None = None) -> Study:
    """Read and validate a study file (or built-in study name), as its ``variant`` if given;
    ``data``: its tables already read (:func:`read_study_data`) and changed by the caller."""
    if data is None:
        path, data = read_study_data(spec, variant)
    else:
        path = find_study(spec)
    return _Reader(path).study(data)


def variants(spec: str) -> list[str]:
    """The names of a study file's variants."""
    path = find_study(spec)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return []
    found = data.get("variants")
    return list(found) if isinstance(found, dict) else []


class _Reader:
    """Validation with one error format: ``FILE: [table] key: what is wrong``."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, table: str, key: str | None, what: str) -> StudyError:
        where = f"[{table}]" + (f" {key}" if key else "")
        return StudyError(f"{self.path}: {where}: {what}")

    # -- generic checks
    def table(self, data: dict, name: str, *, required: bool = False) -> dict:
        value = data.get(name)
        if value is None:
            if required:
                raise StudyError(f"{self.path}: [{name}]: missing table")
            return {}
        if not isinstance(value, dict):
            raise StudyError(f"{self.path}: [{name}]: must be a table, got {_show(value)}")
        return value

    def keys(self, table: str, values: dict, allowed, *, hints: dict | None = None) -> None:
        for key in values:
            if key in allowed:
                continue
            if hints and key in hints:
                raise self.error(table, key, hints[key])
            raise self.error(table, key, f"unknown key; known keys: {', '.join(allowed)}")

    def get(
        self,
        table: str,
        values: dict,
        key: str,
        kind: str,
        default: Any = None,
        *,
        required: bool = False,
        minimum: float | None = None,
        maximum: float | None = None,
        choices=None,
    ) -> Any:
        if key not in values:
            if required:
                raise self.error(table, key, "missing")
            return default
        value = values[key]
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(table, key, f"must be an integer, got {_show(value)}")
        elif kind == "str":
            if not isinstance(value, str) or not value.strip():
                raise self.error(table, key, f"must be a non-empty string, got {_show(value)}")
        elif kind == "table":
            if not isinstance(value, dict):
                raise self.error(table, key, f"must be a table, got {_show(value)}")
        if minimum is not None and value < minimum:
            raise self.error(table, key, f"must be >= {minimum:g}, got {_show(value)}")
        if maximum is not None and value > maximum:
            raise self.error(table, key, f"must be <= {maximum:g}, got {_show(value)}")
        if choices is not None and value not in choices:
            raise self.error(table, key, f"must be one of {', '.join(map(repr, choices))}, got {_show(value)}")
        return value

    def config_table(self, table: str, values: dict, cls, *, skip: tuple[str, ...] = ()) -> dict:
        """The values of a typed config's fields (less ``skip``) given in ``values``, each checked
        against its type and its metadata's minimum, maximum and choices; a field not given: its
        default (the config's, not one written here)."""
        from ..options import field_default, scalar_type

        hints = typing.get_type_hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in skip or not f.init:
                continue
            if f.name not in values:
                out[f.name] = field_default(f)
                continue
            hint = scalar_type(hints[f.name])
            if hint is bool:
                if not isinstance(values[f.name], bool):
                    raise self.error(table, f.name, f"must be true or false, got {_show(values[f.name])}")
                out[f.name] = values[f.name]
                continue
            kind = {int: "int", str: "str"}.get(hint)
            if kind is None:
                raise TypeError(f"{cls.__name__}.{f.name}: no study-file check for {hint}")
            meta = f.metadata
            out[f.name] = self.get(
                table,
                values,
                f.name,
                kind,
                minimum=meta.get("minimum"),
                maximum=meta.get("maximum"),
                choices=meta.get("choices"),
            )
        return out

    def int_list(
        self, table: str, values: dict, key: str, *, minimum: int, maximum: int | None = None, scalar_ok: bool = False
    ) -> tuple[int, ...]:
        if key not in values:
            raise self.error(table, key, "missing")
        value = values[key]
        if scalar_ok and isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or not value:
            raise self.error(table, key, f"must be a non-empty list of integers, got {_show(value)}")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.error(table, key, f"must be a list of integers, got {_show(v)} in it")
            if v < minimum or (maximum is not None and v > maximum):
                span = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
                raise self.error(table, key, f"each value must be {span}, got {v}")
        if len(set(value)) != len(value):
            dup = next(v for v in value if value.count(v) > 1)
            raise self.error(table, key, f"{dup} is listed twice")
        return tuple(value)

    def training_options(self, table: str, values: dict, config_cls, allowed) -> dict:
        """Options of a training config (a recipe's finetune table, the budget): names and types."""
        from ..training.config import type_ok

        fields = {f.name: f for f in dataclasses.fields(config_cls)}
        out = {}
        for key, value in values.items():
            if key not in allowed:
                if key in STUDY_CONTROLLED:
                    raise self.error(
                        table,
                        key,
                        "is set by the study (paths, seed, max_length in [model], device "
                        "on the command line); remove it",
                    )
                if table.startswith("methods") and key in SCHEDULE_FIELDS:
                    raise self.error(
                        table, key, "is a budget setting: set it in [budget] (one budget for every method)"
                    )
                if table == "budget" and key in METHOD_FIELDS:
                    raise self.error(table, key, "belongs to a method: set it in [[methods]]")
                raise self.error(table, key, f"unknown key; known keys: {', '.join(allowed)}")
            annotation = str(fields[key].type)
            if not type_ok(value, annotation):
                raise self.error(table, key, f"must be of type {annotation}, got {_show(value)}")
            if annotation.startswith("float") and isinstance(value, int):
                value = float(value)
            if isinstance(value, float) and not math.isfinite(value):
                raise self.error(table, key, f"must be a finite number, got {value}")
            out[key] = value
        return out

    def checked_config(self, table: str, config_cls, layers: list[tuple[str, dict]]) -> dict:
        """Build the config from layers and run its range checks; a range error names ``table``."""
        from ..training.config import ConfigError, build_config

        try:
            config = build_config(config_cls, *layers, ("study", {"out": "<study>", "save_steps": 0}))
        except ConfigError as exc:
            raise self.error(table, *_config_problem(str(exc))) from None
        return config.to_dict()

    # -- tables
    def study(self, data: dict) -> Study:
        from ..host import study_part

        # the default study kind's author-unit tables: read after the rest, against it
        data, design_data = study_part(DEFAULT_SOURCE).split_tables(data)
        tables = study_tables()
        for key, value in data.items():
            if key not in tables:
                if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
                    raise StudyError(f"{self.path}: [{key}]: unknown table; tables: {', '.join(tables)}")
                raise StudyError(
                    f"{self.path}: {key}: unknown top-level key; keys belong in a table "
                    f"({', '.join(f'[{t}]' for t in tables)})"
                )
        head = self.table(data, "study", required=True)
        self.keys("study", head, ("name", "description", "seeds", "ci", "one_budget", "workers_per_gpu"))
        name = self.get("study", head, "name", "str", self.path.stem)
        if not NAME_RE.match(name):
            raise self.error("study", "name", f"must be letters, digits, '_', '-' or '.', got {name!r}")
        description = head.get("description", "")
        if not isinstance(description, str):
            raise self.error("study", "description", f"must be a string, got {_show(description)}")
        seeds = self.int_list("study", head, "seeds", minimum=0, maximum=2**32 - 1)
        ci = self.get("study", head, "ci", "str", "t", choices=CI_METHODS)
        defaults = {f.name: f.default for f in dataclasses.fields(Study)}  # the Study's own
        one_budget = head.get("one_budget", defaults["one_budget"])
        if not isinstance(one_budget, bool):
            raise self.error("study", "one_budget", f"must be true or false, got {_show(one_budget)}")
        workers_per_gpu = self.get("study", head, "workers_per_gpu", "int", defaults["workers_per_gpu"], minimum=1)

        model_t = self.table(data, "model", required=True)
        self.keys("model", model_t, ("base", "max_length", "prompt_format", "date_string"))
        model = self.get("model", model_t, "base", "str", required=True)
        model = self.model_path(model)
        from ..data.qa import MIN_MAX_LENGTH
        from ..training.config import TrainingConfig

        max_length = self.get(
            "model", model_t, "max_length", "int", config_defaults(TrainingConfig)["max_length"], minimum=MIN_MAX_LENGTH
        )
        prompt_format = self.prompt_format(model_t)
        run_fields = {"prompt_format": prompt_format, "workers_per_gpu": workers_per_gpu}

        bench = self.table(data, "benchmark", required=True)
        from ..host import study_part, study_sources

        choices = study_sources(first=DEFAULT_SOURCE)
        source = self.get("benchmark", bench, "source", "str", DEFAULT_SOURCE, choices=choices)
        return study_part(source).read(
            self,
            data,
            bench,
            design_data,
            name=name,
            description=description,
            seeds=seeds,
            ci=ci,
            one_budget=one_budget,
            model=model,
            max_length=max_length,
            **run_fields,
        )

    def benchmark_study(self, source: str, **fields: Any) -> Study:
        """The Study of a registered benchmark's study part (``source``): this file's, without the
        TOFU study's folder, authors, forget sizes and given retain models."""
        return Study(
            path=str(self.path), source=source, tofu_dir=None, authors=0, forget_sizes=(), retain_given={}, **fields
        )

    def prompt_format(self, model_t: dict) -> dict | None:
        """[model] prompt_format (a name or a Jinja file beside the study file) and date_string:
        the format's definition, or None for the default."""
        from ..data import prompts

        name = self.get("model", model_t, "prompt_format", "str")
        date = self.get("model", model_t, "date_string", "str")
        if name is None and date is None:
            return None
        if name is not None and name not in prompts.FORMATS:
            name = str(self.relative(name))
        try:
            fmt = prompts.resolve(name, date_string=date, where="[model] prompt_format")
        except UnlearnError as exc:
            raise StudyError(f"{self.path}: {exc}") from None
        return None if fmt.is_default else fmt.definition()

    def relative(self, value: str) -> Path:
        """A path written in the study file, relative to the file's folder."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else (self.path.parent / path).resolve()

    def model_path(self, value: str) -> str:
        """Aliases and hub ids as written; a relative path resolved against the study file."""
        from ..models import EMBEDDED_ALIASES

        if value in EMBEDDED_ALIASES or value == TINY_MODEL:
            return value
        if value.startswith((".", "/", "~")) or self.relative(value).exists():
            return str(self.relative(value))
        return value

    def given_model(self, table: str, key: str, value: str) -> str:
        """A given target or retain model: :meth:`model_path`, refused when it is a LoRA adapter
        folder (its cells failed late, with a 2 KB regex of module names)."""
        import json

        path = self.model_path(value)
        folder = Path(path).expanduser()
        if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
            try:
                base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
            except (OSError, ValueError, AttributeError):
                base = None
            merged = folder / "merged"
            hint = (
                f'its merged model is {merged}: given = "{merged}"'
                if (merged / "config.json").is_file()
                else "merge it into its base (unlearn finetune --merge writes OUT/merged) and give that folder"
            )
            raise self.error(
                table,
                key,
                f"{folder} is a LoRA adapter folder{f' (trained on {base})' if base else ''}, not a whole model; {hint}",
            )
        return path

    def recipe(self, table: str, values: dict, base: Recipe | None) -> Recipe:
        from ..training.config import FinetuneConfig

        self.keys(table, values, ("finetune", "seed", "threads", "given"))
        inherited = base or Recipe()  # the retain model's: the target's; the target's: the defaults
        seed = self.get(table, values, "seed", "int", inherited.seed, minimum=0)
        threads = self.get(table, values, "threads", "int", inherited.threads, minimum=1)
        finetune_t = self.get(table, values, "finetune", "table", None)
        finetune = {k: v for k, v in base.finetune.items() if k != "record_trajectory"} if base else {}
        if finetune_t is not None:
            finetune.update(
                self.training_options(
                    f"{table}.finetune",
                    finetune_t,
                    FinetuneConfig,
                    SCHEDULE_FIELDS + ("full_finetune", "record_trajectory"),
                )
            )
        if finetune_t is not None or base is None:
            self.checked_config(f"{table}.finetune", FinetuneConfig, [(f"[{table}.finetune]", finetune)])
        return Recipe(finetune=finetune, seed=seed, threads=threads)

    def budget(self, data: dict) -> dict:
        from ..training.config import UnlearnConfig

        values = self.table(data, "budget", required=True)
        budget = self.training_options("budget", values, UnlearnConfig, SCHEDULE_FIELDS)
        self.checked_config("budget", UnlearnConfig, [("[budget]", budget)])
        return budget

    def methods(self, data: dict, budget: dict, max_length: int, one_budget: bool = True) -> tuple[Method, ...]:
        from ..training.config import UnlearnConfig

        entries = data.get("methods")
        if entries is None:
            raise StudyError(f"{self.path}: [[methods]]: missing (one [[methods]] table per method)")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise StudyError(
                f"{self.path}: [[methods]]: must be an array of tables ([[methods]] ...), got {_show(entries)}"
            )
        methods: list[Method] = []
        for i, entry in enumerate(entries, 1):
            name = entry.get("name")
            table = f"methods.{name}" if isinstance(name, str) and name else f"methods #{i}"
            name = self.get(table, entry, "name", "str", required=True)
            if not NAME_RE.match(name):
                raise self.error(table, "name", f"must be letters, digits, '_', '-' or '.', got {name!r}")
            if any(m.name == name for m in methods):
                raise self.error(table, "name", f"{name!r} is used by another method")
            label = self.get(table, entry, "label", "str", name)
            if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in label):
                raise self.error(
                    table,
                    "label",
                    f"must be one line of text (it heads a row of the report's tables): no line breaks or "
                    f"control characters, got {_show(label)}",
                )
            preset_name = self.get(table, entry, "preset", "str")
            # retain = false: unlearning without a retain set (NegGrad); the study gives it otherwise
            no_retain = "retain" in entry
            if no_retain and entry["retain"] is not False:
                raise self.error(
                    table,
                    "retain",
                    "is set by the study; only retain = false (unlearn without a retain set) is allowed",
                )
            rest = {k: v for k, v in entry.items() if k not in ("name", "label", "preset", "retain")}
            settings = self.training_options(table, rest, UnlearnConfig, METHOD_FIELDS)
            layers = []
            if preset_name is not None:
                from ..training.presets import PRESETS

                if preset_name not in PRESETS:
                    raise self.error(
                        table, "preset", f"unknown preset {preset_name!r}; presets: {', '.join(sorted(PRESETS))}"
                    )
                layers.append((f"preset {preset_name}", PRESETS[preset_name]))
            layers += [(f"[{table}]", settings), ("[budget]", budget), ("[model]", {"max_length": max_length})]
            config = self.checked_config(table, UnlearnConfig, layers)
            self.components(table, config)
            for key in ("out", "model", "forget", "retain", "device", "tofu_dir", "seed"):
                config.pop(key, None)
            methods.append(
                Method(
                    name=name,
                    label=label,
                    settings={
                        **({"preset": preset_name} if preset_name else {}),
                        **settings,
                        **({"retain": False} if no_retain else {}),
                    },
                    config=config,
                )
            )
        # one budget: every method trains with the same schedule, whatever its preset says
        # ([study] one_budget = false: [budget]'s keys only, which are every method's by construction)
        for key in SCHEDULE_FIELDS if one_budget else ():
            seen = {m.name: m.config.get(key) for m in methods}
            if len({repr(v) for v in seen.values()}) > 1:
                shown = ", ".join(f"{n}: {_show(v)}" for n, v in seen.items())
                raise self.error(
                    "budget",
                    key,
                    f"the methods would train with different values ({shown}, from "
                    f"their presets); set it in [budget] so every method uses one",
                )
        return tuple(methods)

    def components(self, table: str, config: dict) -> None:
        """Objective, regulariser and initializer names and options, checked by building them."""
        from ..host import create
        from ..interfaces import ADAPTER_INITIALIZER, UNLEARNING_OBJECTIVE
        from ..training.config import UnlearnConfig
        from ..training.run import build_objective

        unlearn = UnlearnConfig(**config)
        parts = [("objective", config["objective"], unlearn.objective_kwargs())]
        if config.get("regularizer"):
            parts.append(("regularizer", config["regularizer"], config.get("regularizer_options", {})))
        for key, name, options in parts:
            try:
                create(UNLEARNING_OBJECTIVE, name, **options)
            except UnlearnError as exc:
                raise self.error(table, key, _one_line(exc)) from None
        try:
            build_objective(unlearn)  # a regulariser as objective, options without a regulariser, ...
        except UnlearnError as exc:
            raise self.error(
                table, "regularizer" if config.get("regularizer") else "objective", _one_line(exc)
            ) from None
        if not config.get("full_finetune"):
            try:
                create(ADAPTER_INITIALIZER, config["initializer"], **config.get("initializer_options", {}))
            except UnlearnError as exc:
                raise self.error(table, "initializer", _one_line(exc)) from None

    def cud(self, data: dict, movielens: bool = False) -> Cud | None:
        """[cud]: the scorer's options (checked by building it), the anchor runs' budget."""
        from ..host import create, get_component
        from ..interfaces import DIFFICULTY_SCORER, UNLEARNING_OBJECTIVE
        from ..scorers.cud import anchor_run_options
        from ..training.config import UnlearnConfig

        if "cud" not in data:
            return None
        values = self.table(data, "cud")
        self.keys("cud", values, ("anchor_pool", "strata", "scorer", "unlearn"))
        if movielens and "anchor_pool" in values:
            raise self.error(
                "cud",
                "anchor_pool",
                "a MovieLens study's anchor pool is its anchor users' prompts ([benchmark] anchor_users)",
            )
        sizes = self.config_table("cud", values, Cud, skip=("scorer", "unlearn"))
        scorer = dict(self.get("cud", values, "scorer", "table", {}))
        for key in scorer:
            if movielens and key == "answer_tokens":
                raise self.error("cud.scorer", key, "is set by the study (the one Yes/No answer token); remove it")
            if key in CUD_STUDY_SET:
                raise self.error(
                    "cud.scorer", key, "is set by the study (anchor_pool, [cud.unlearn], the target); remove it"
                )
        try:
            built = create(DIFFICULTY_SCORER, "cud", **scorer)
        except UnlearnError as exc:
            raise self.error("cud.scorer", None, _one_line(exc)) from None
        for name in scorer.get("objectives") or ():  # the anchor runs' objectives, run after the target
            try:
                get_component(UNLEARNING_OBJECTIVE, name)
            except UnlearnError as exc:
                raise self.error("cud.scorer", "objectives", _one_line(exc)) from None
        # the defaults that changed when anchor runs became the paper's: named, so that a stage
        # scored under the old ones keeps its own cache key
        scorer.setdefault("anchor_recipe", built.anchor_recipe)
        scorer.setdefault("stop_prob", built.stop_prob)
        unlearn_t = dict(self.get("cud", values, "unlearn", "table", {}))
        by_objective = {o: unlearn_t.pop(o) for o in list(unlearn_t) if isinstance(unlearn_t[o], dict)}
        unlearn = self.training_options("cud.unlearn", unlearn_t, UnlearnConfig, CUD_RUN_FIELDS)
        self.checked_config("cud.unlearn", UnlearnConfig, [("[cud.unlearn]", dict(unlearn))])
        for o, table in by_objective.items():
            if o not in built.objectives:
                raise self.error(
                    "cud.unlearn",
                    o,
                    f"a table of one objective's anchor-run options names one of [cud.scorer] objectives "
                    f"({', '.join(built.objectives)})",
                )
            unlearn[o] = self.training_options(
                f"cud.unlearn.{o}", table, UnlearnConfig, (*CUD_RUN_FIELDS, "objective_options")
            )
        for o in built.objectives:  # each objective's runs: the recipe < [cud.unlearn] < [cud.unlearn.o]
            table = f"cud.unlearn.{o}" if o in by_objective else "cud.unlearn"
            options = anchor_run_options(
                o,
                recipe=built.anchor_recipe,
                shared={k: v for k, v in unlearn.items() if not isinstance(v, dict)},
                by_objective={o: unlearn.get(o, {})},
            )
            self.checked_config(table, UnlearnConfig, [(f"[{table}]", {**options, "objective": o})])
            try:
                create(UNLEARNING_OBJECTIVE, o, **options.get("objective_options", {}))
            except UnlearnError as exc:
                raise self.error(table, "objective_options", _one_line(exc)) from None
        return Cud(scorer=scorer, unlearn=unlearn, **sizes)

    def evaluation(self, data: dict, required: tuple[str, ...] = REQUIRED_TASKS) -> Evaluation:
        values = self.table(data, "evaluation")
        self.keys("evaluation", values, [f.name for f in dataclasses.fields(Evaluation)])
        tasks = values.get("tasks", list(required))
        if not isinstance(tasks, list) or not all(isinstance(t, str) and t for t in tasks):
            raise self.error("evaluation", "tasks", f"must be a list of lm-eval task names, got {_show(tasks)}")
        missing = [t for t in required if t not in tasks]
        if missing:
            why = (
                "every study reports Forget Quality, Model Utility, forget probability and ROUGE-L"
                if required == REQUIRED_TASKS
                else "a MovieLens study reports the test and forget AUC and the JSD to the retrain model"
            )
            raise self.error("evaluation", "tasks", f"must include {', '.join(missing)} ({why})")
        if len(set(tasks)) != len(tasks):
            raise self.error("evaluation", "tasks", "lists a task twice")
        from ..evaluation.lm_eval_runner import task_manager_for

        try:  # before any work, --dry-run included: a misspelt task would fail every cell late
            task_manager_for(tasks)
        except UnlearnError as exc:
            raise self.error("evaluation", "tasks", _one_line(exc)) from None
        return Evaluation(tasks=tuple(tasks), **self.config_table("evaluation", values, Evaluation, skip=("tasks",)))


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


_OPTION_RE = re.compile(r"^(?:.*?: )?option '([a-z_]+)' (.*)$", re.S)


def _config_problem(message: str) -> tuple[str | None, str]:
    """(key, problem) of a training config's range error ("option 'lr' must be ...")."""
    match = _OPTION_RE.match(_one_line(message))
    if match:
        return match.group(1), match.group(2)
    return None, _one_line(message)


# ----------------------------------------------------------------------------- the grid


def expand(study: Study) -> list[Cell]:
    """Every cell of the grid, each after the cells it needs: the study part of its benchmark's
    ``expand``."""
    from ..host import study_part

    return study_part(study.source).expand(study)


__all__ = [
    "Study",
    "Method",
    "Recipe",
    "Evaluation",
    "Cell",
    "Cud",
    "StudyError",
    "load_study",
    "read_study_data",
    "variants",
    "find_study",
    "builtin_studies",
    "expand",
    "TINY_MODEL",
]
