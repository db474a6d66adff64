"""A study's cells as stages of the shared content-keyed cache (:mod:`unlearn_plugins.stages`).

:func:`plan_study` turns the grid into cells whose stages (fine-tune, unlearn, evaluate, and with
[cud] the CUD scores and strata of :mod:`.cud`) each have a cache folder keyed by everything
their result depends on: the base model's weights,
the benchmark files' content, the recipe or resolved unlearning config (preset < method <
budget, with the seed), the evaluation settings, and the keys of the stages they read. A
rerun, another study with the same target, or a second concurrent run find them there.

:func:`execute_cell` builds one cell's stages in the calling process (a worker), its output
going to a log file. A stage that another process is building (its lock is held) is waited
for, then reused: two runs of one study build each stage once. Each built stage records its
wall time and peak memory (``resources.json``).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..data import prompts
from ..errors import UnlearnError
from ..files import LockHeld, write_json
from ..interfaces import Benchmark
from ..models import merge_is_exact
from ..process import PeakSampler, gpu_identity, quiet_libraries, release_memory
from ..stages import DONE, Stages, digest
from .spec import TINY_MODEL, Cell, Study, expand

#: part of every key: a change of what a stage writes recomputes it
STUDY_FORMAT = 1
RESOURCES = "resources.json"
EXTRACTION = "extraction_strength.json"
#: with ``[evaluation] robustness``: `unlearn eval --mia --robustness`'s folder inside an evaluation
REALLY_FORGOTTEN = "really_forgotten"
#: and the retain model's MIA reference beside it (privleak, the reference attack)
MIA_REFERENCE = "mia_reference.json"
#: seconds between two looks at a stage that another process is building
WAIT_POLL_S = 1.0
#: the stage kinds that evaluate a model (a cell whose last one is finished is done)
EVALUATIONS = ("evaluate",)


def is_evaluation(build: str) -> bool:
    """Whether a stage of this builder evaluates a model: ``evaluate``, or a benchmark's
    evaluation stage (a cell that ends in one is done once it is)."""
    if build in EVALUATIONS:
        return True
    from ..host import benchmarks

    return any(build in bench.evaluation_stages for bench in benchmarks().values())


#: the device type and default dtype every study was run with before they were keyed
CPU_FP32 = ("cpu", "float32")


def default_cache() -> Path:
    from ..models import cache_dir

    return cache_dir() / "studies"


@dataclass
class Stage:
    """One build-then-rename stage: ``build`` names a builder of :data:`BUILDERS`."""

    label: str
    folder: str
    build: str
    params: dict

    @property
    def done(self) -> bool:
        return (Path(self.folder) / DONE).is_file()


@dataclass
class CellPlan:
    cell: Cell
    stages: list[Stage]
    #: the stage whose folder holds the cell's result (a model, or an evaluation)
    result: str = ""
    model: str | None = None  # the model a target/retain cell makes

    @property
    def cached(self) -> bool:
        """Every stage built, or the cell's evaluation finished (its model stage may be gone:
        restored from records, :mod:`unlearn_plugins.study.records`)."""
        last = self.stages[-1]
        return all(s.done for s in self.stages) or (is_evaluation(last.build) and last.done)


@dataclass
class Plan:
    study: Study
    cache: Path
    device: str | None
    benches: dict[int, dict]  # forget size -> the benchmark's description (+ folder)
    cells: dict[str, CellPlan] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # "target", "retain/forgetK" -> model folder
    #: (device type, default dtype) its stages are keyed for (:func:`stage_identity`)
    identity: tuple = CPU_FP32

    def ordered(self) -> list[CellPlan]:
        return list(self.cells.values())


# ----------------------------------------------------------------------------- planning


_PLANNED_AS: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("planned_as", default=None)


def stage_identity(device: str | None) -> tuple[str, str]:
    """(device type, dtype models load in there by default): what a stage's numbers depend on
    besides its settings (a dtype a study sets is in its stages' settings already)."""
    if (forced := _PLANNED_AS.get()) is not None:
        return forced
    import torch

    from ..models import pick_device, pick_dtype

    chosen = pick_device(device)
    return torch.device(chosen).type, str(pick_dtype(chosen)).removeprefix("torch.")


@contextlib.contextmanager
def planned_as(identity: tuple[str, str]):
    """Plan as if on another device and precision (the keys of records made there)."""
    token = _PLANNED_AS.set(tuple(identity))
    try:
        yield
    finally:
        _PLANNED_AS.reset(token)


def run_setting_key(key: str, study: Study, device: str | None) -> str:
    """A model's key with what every stage built from it depends on besides the weights: the
    device type and default dtype, and the prompt format; each only where it is not what every
    study used before they were keyed (CPU, fp32, the default format), so those keys and the
    committed records stay valid."""
    identity = stage_identity(device)
    extra = (() if identity == CPU_FP32 else ("device", *identity)) + prompts.key_part(study.prompt_format)
    return digest(key, *extra) if extra else key


def base_model(study: Study, stages: Stages | None, cache: Path, device: str | None = None) -> tuple[str, str]:
    """(model folder or id, key of its weights and run setting: :func:`run_setting_key`) of the
    study's base model. ``tiny-llama`` is built into the cache (``stages`` None, a dry run: not
    built, its key only)."""
    path, key = _base_model(study, stages, cache)
    return path, run_setting_key(key, study, device)


def _base_model(study: Study, stages: Stages | None, cache: Path) -> tuple[str, str]:
    from ..errors import ModelError
    from ..models import resolve_model, weights_fingerprint

    if study.model == TINY_MODEL:
        from .. import testing

        key = digest(STUDY_FORMAT, TINY_MODEL, _file_digest(Path(testing.__file__)))
        folder = cache / f"base-{TINY_MODEL}-{key}"
        if stages is not None:

            def build(tmp: Path) -> None:
                with output_to(Path(os.devnull)):  # the tokenizer trainer's and transformers' progress bars
                    testing.save_tiny_model(tmp / "model")

            run_stage(stages, f"build the {TINY_MODEL} base model", folder, build)
        return str(folder / "model"), key
    try:
        where = resolve_model(study.model)  # converts the embedded model once per machine
    except ModelError as exc:  # named as the study file has it, not as a --model flag
        reason = str(exc).removeprefix(f"--model {study.model}: ")
        raise UnlearnError(f"{study.path}: [model] base: {study.model}: {reason}") from None
    fingerprint = weights_fingerprint(where)
    return where, digest(STUDY_FORMAT, "weights", fingerprint or study.model)


def _file_digest(path: Path) -> str:
    from ..files import file_digest

    return file_digest(path)


def tofu_data():
    """The TOFU benchmark's data module (``benchmarks/tofu/data.py``), reached through the
    benchmark registry: the N-author benchmark folders a TOFU study is cut from."""
    from ..host import required_benchmark_part

    return required_benchmark_part("tofu", "data")


def study_tofu(study: Study):
    """The TOFU data a TOFU study's benchmarks are cut from (the TOFU benchmark's ``find_tofu``),
    a missing folder or a bad source named in one error."""
    from ..errors import DataError

    find_tofu = tofu_data().find_tofu

    # (source auto: a folder that is not there falls back to the generated authors, as find_tofu does)
    if study.tofu_dir and study.source == "tofu" and not Path(study.tofu_dir).expanduser().is_dir():
        raise UnlearnError(f"{study.path}: [benchmark] tofu_dir: TOFU folder not found: {study.tofu_dir}")
    try:
        return find_tofu(study.source, study.tofu_dir, study.authors)
    except DataError as exc:
        raise UnlearnError(f"{study.path}: [benchmark] source: {exc}") from None


def benchmark_stage(stages: Stages | None, label: str, folder: Path, build, scratch: Path, key: str) -> dict:
    """A TOFU benchmark folder built as a cached stage (a dry run, ``stages`` None, builds a
    missing one in ``scratch`` only, to know its content) and its description, folder, key and
    file digests."""
    from ..files import file_digest

    load_benchmark = tofu_data().load_benchmark
    if stages is not None:
        run_stage(stages, label, folder, build)
    elif not (folder / DONE).is_file():
        folder = scratch / folder.name
        build(folder)
        (folder / DONE).write_text("{}")
    bench = load_benchmark(folder)
    if bench is None:
        raise UnlearnError(f"{folder}: benchmark folder unreadable; delete it and run again")
    return {
        **bench.describe(),
        "folder": str(folder),
        "key": key,
        "content": {n: file_digest(folder / f"{n}.json") for n in ("full", "retain", "forget")},
    }


def prepare_benchmarks(study: Study, cache: Path, stages: Stages | None, scratch: Path) -> dict[int, dict]:
    """The benchmark folder of every forget size (cached stages; a dry run builds missing ones
    in ``scratch`` only, to know their content)."""
    data = tofu_data()
    build_benchmark, source_fingerprint, build_holdout = (
        data.build_benchmark,
        data.source_fingerprint,
        data.build_holdout,
    )
    tofu = study_tofu(study)
    out = {}
    for k in study.forget_sizes:
        key = digest(STUDY_FORMAT, "bench", source_fingerprint(tofu), study.authors, k, study.evaluation.mu_size)
        folder = cache / f"bench-{study.source}-{key}"

        def build(tmp: Path, k=k) -> None:
            build_benchmark(tmp, tofu=tofu, n_authors=study.authors, n_forget=k, eval_size=study.evaluation.mu_size)

        out[k] = benchmark_stage(stages, f"benchmark: {study.authors} authors, forget {k}", folder, build, scratch, key)
    if study.evaluation.robustness:  # membership inference's holdout: an author in no model's data
        key = digest(STUDY_FORMAT, "holdout", source_fingerprint(tofu), study.authors)
        folder = cache / f"holdout-{study.source}-{key}"

        def build_holdout_stage(tmp: Path) -> None:
            write_json(tmp / "author.json", build_holdout(tmp / "holdout.json", tofu=tofu, n_authors=study.authors))

        if stages is not None:
            run_stage(stages, "holdout author for membership inference", folder, build_holdout_stage)
        elif not (folder / DONE).is_file():
            folder = scratch / folder.name
            folder.mkdir(parents=True)
            build_holdout_stage(folder)
        for bench in out.values():
            bench["holdout"] = str(folder / "holdout.json")
    return out


def _initializer_seed(config: dict, seed: int) -> dict:
    """The cell's seed for an initializer that takes one (FILA's randomized SVD, RILA's
    sampling, ...) unless the method fixed it: seeds then vary the whole run."""
    from ..host import get_component
    from ..interfaces import ADAPTER_INITIALIZER

    options = dict(config.get("initializer_options") or {})
    if config.get("full_finetune") or "seed" in options:
        return options
    try:
        accepts = "seed" in inspect.signature(get_component(ADAPTER_INITIALIZER, config["initializer"])).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts:
        options["seed"] = seed
    return options


def component_revisions(config: dict) -> dict:
    """{kind/name: code identity} of the components an unlearning config uses whose code is not
    that of the study format's first version (:func:`..host.code_identity`: a built-in's
    ``revision`` above 1, a plugin's version and source digest). Components without one add
    nothing, so cells of unchanged built-ins keep their keys."""
    from ..host import code_identity
    from ..interfaces import ADAPTER_INITIALIZER, UNLEARNING_OBJECTIVE

    used = [(UNLEARNING_OBJECTIVE, config.get("objective")), (UNLEARNING_OBJECTIVE, config.get("regularizer"))]
    if not config.get("full_finetune"):
        used.append((ADAPTER_INITIALIZER, config.get("initializer")))
    revisions = {}
    for kind, name in used:
        if name and (identity := code_identity(kind, name)) is not None:
            # a built-in's bare revision number, as keys made before plugins were keyed had it
            revisions[f"{kind}/{name}"] = identity["revision"] if set(identity) == {"revision"} else identity
    return revisions


def task_code(tasks) -> dict:
    """{task: code identity} of the study's tasks that a plugin's task folder defines (a file
    of it names the task): a new version or edit of the plugin re-keys the evaluations."""
    from ..host import code_identity, get_host
    from ..interfaces import LM_EVAL_TASK_DIR

    host = get_host()
    found = {}
    for component in host.list(LM_EVAL_TASK_DIR):
        info = host.plugins.get(component.plugin)
        if info is None or info.source == "built-in":
            continue
        texts = "\n".join(p.read_text(errors="replace") for p in Path(component.obj).rglob("*.yaml"))
        for task in tasks:
            if re.search(rf"^\s*task:\s*['\"]?{re.escape(task)}['\"]?\s*$", texts, re.M):
                found[task] = code_identity(LM_EVAL_TASK_DIR, component.name)
    return found


def evaluation_settings(study: Study, device: str | None) -> tuple:
    """The study's evaluation settings as an evaluation stage's key holds them (each optional
    part only when it is set, so the keys of studies made before it stay as they were)."""
    ev = study.evaluation
    settings: tuple = (list(ev.tasks), ev.batch_size, ev.gen_margin, study.max_length)
    if ev.dtype:
        settings += (ev.dtype,)
    if ev.scoring != "hf" and not merge_is_exact(device, ev.dtype):
        # below fp32 the two scorings differ by rounding: an evaluation made before "prefix"
        # existed (HFLM, under the same key) is not this one's
        settings += ("scoring", ev.scoring)
    if plugin_tasks := task_code(ev.tasks):
        settings += ("task-code", plugin_tasks)
    if ev.robustness:
        from ..evaluation.really_forgotten import ATTACK_OPTIONS, ATTACKS

        settings += ("robustness", ATTACKS, ATTACK_OPTIONS, "capped-generations")
    return settings


def cache_folder(cache: Path, kind: str, name: str, key: str) -> str:
    """A stage's folder in the cache: ``{kind}-{name}-{key}`` (a ``/`` in the name as ``-``)."""
    return str(cache / f"{kind}-{name.replace('/', '-')}-{key}")


def finetune_stage(
    study: Study,
    label: str,
    where: tuple[Path, str, str],
    recipe,
    base: tuple[str, str],
    data: tuple[str | None, str],
    device: str | None,
    kind: str = "finetune",
) -> Stage:
    """A stage fine-tuning the base (``base``: its path and key) with ``recipe`` on ``data`` (a
    file and its content key), in the cache folder ``where`` (cache, folder kind, name) keyed
    by ``kind``, the base, the data and the recipe: every study kind's target and retain model."""
    (base_path, base_key), (file, data_key) = base, data
    key = digest(STUDY_FORMAT, kind, base_key, data_key, recipe.finetune, recipe.seed, recipe.threads, study.max_length)
    params = {
        "model": base_path,
        "data": file,
        "max_length": study.max_length,
        "seed": recipe.seed,
        "threads": recipe.threads,
        "finetune": recipe.finetune,
        "device": device,
        "key": key,
    }
    return Stage(label, cache_folder(*where, key), "finetune", params)


def unlearn_key(kind: str, model_key: str, data: list, config: dict, *extra, last: tuple = ()) -> str:
    """An unlearning run's key: its ``kind``, the model's key, the data's content keys, the
    method's config and ``extra`` (a study kind's own parts), the revisions of the config's
    components where any, then ``last``."""
    revisions = component_revisions(config)
    return digest(STUDY_FORMAT, kind, model_key, *data, config, *extra, *([revisions] if revisions else []), *last)


def unlearn_stage(cell: Cell, folder: str, config: dict, model: str, data: dict, device: str | None, **extra) -> Stage:
    """A method cell's unlearning run: ``config`` on ``model`` with ``data`` (the bench folder,
    or the forget and retain files) in ``folder``; ``extra``: more parameters, last."""
    params = {"config": config, "model": model, **data, "device": device, **extra}
    return Stage(f"unlearn: {cell.label}", folder, "unlearn", params)


def method_run(study: Study, cell: Cell) -> tuple[Any, dict, bool]:
    """A method cell's method, its config at the cell's seed, and whether it runs without a
    retain set (``retain = false``)."""
    method = study.method(cell.method)
    return method, {**method.config, "seed": cell.seed}, method.settings.get("retain") is False


def plan_study(study: Study, *, cache: Path, device: str | None = None, dry_run: bool = False, stream=None) -> Plan:
    """Every cell with its stages and their cache folders. A real run builds the base model (if
    it is ``tiny-llama``) and the benchmark folders here (seconds); a dry run writes nothing."""
    stream = stream or sys.stderr
    stages = None if dry_run else Stages(cache, total=1 + len(study.forget_sizes), stream=stream)
    with tempfile.TemporaryDirectory(prefix="unlearn-study-") as scratch:
        base_path, base_key = base_model(study, stages, cache, device)
        benches = prepare_benchmarks(study, cache, stages, Path(scratch))
        if dry_run:  # the scratch folder goes away: keep only what the keys need
            for bench in benches.values():
                bench["folder"] = None
    plan = Plan(study, cache, device, benches)
    ev = study.evaluation
    eval_settings = evaluation_settings(study, device)

    def folder(kind: str, name: str, key: str) -> str:
        return cache_folder(cache, kind, name, key)

    # models: the target and the retain model of every forget size
    first = benches[study.forget_sizes[0]]
    model_keys: dict[str, str] = {}
    for cell in expand(study):
        if cell.kind not in ("target", "retain"):
            continue
        target = cell.kind == "target"
        bench, split = (first, "full") if target else (benches[cell.forget], "retain")
        model = "the target" if target else "the retain model"
        authors = study.authors if target else len(bench["retain_authors"])
        stage = finetune_stage(
            study,
            f"fine-tune {model} on {authors} authors ({bench['sizes'][split]} QA)",
            (cache, "target", split),
            study.target if target else study.retain,
            (base_path, base_key),
            (_file(bench, split), bench["content"][split]),
            device,
        )
        plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder, model=_made_model(stage))
        model_id = "target" if target else cell.id
        model_keys[model_id] = stage.params["key"]
        plan.models[model_id] = plan.cells[cell.id].model
    if study.target.given is not None:
        plan.models["target"] = study.target.given
        model_keys["target"] = _given_key(study.target.given, study, device)
    for k, given in study.retain_given.items():
        plan.models[f"retain/forget{k}"] = given
        model_keys[f"retain/forget{k}"] = _given_key(given, study, device)

    # CUD scores of each forget set on the target ([cud])
    for cell in expand(study):
        if cell.kind != "cud":
            continue
        bench = benches[cell.forget]
        cud = study.cud
        unlearn = dict(cud.unlearn)
        key = digest(
            STUDY_FORMAT,
            "cud",
            model_keys["target"],
            bench["content"]["forget"],
            bench["content"]["retain"],
            cud.describe(),
            study.max_length,
        )
        stage = Stage(
            f"CUD scores of the {bench['sizes']['forget']} forget samples (forget {cell.forget})",
            folder("cud", f"forget{cell.forget}", key),
            "cud",
            {
                "bench": bench["folder"],
                "model": plan.models["target"],
                "device": device,
                "scorer": dict(cud.scorer),
                "unlearn": unlearn,
                "anchor_pool": cud.anchor_pool,
                "strata": cud.strata,
                "max_length": study.max_length,
            },
        )
        plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)

    # evaluations and methods
    eval_keys: dict[int, str] = {}
    for cell in expand(study):
        if cell.kind in ("target", "retain", "cud"):
            continue
        k = cell.forget
        bench = benches[k]
        common = {
            "bench": bench["folder"],
            "evaluation": ev,
            "max_length": study.max_length,
            "device": device,
        }
        reference = (
            None if cell.kind == "eval_retain" else str(Path(folder("eval", "retain", eval_keys[k])) / "reference.json")
        )
        if ev.robustness:
            common["robustness"] = {
                "holdout": bench.get("holdout"),
                # the retain model's evaluation saves it, the others read it (privleak)
                "mia_reference": None if reference is None else str(Path(reference).parent / MIA_REFERENCE),
            }
        if cell.kind == "eval_retain":
            key = digest(STUDY_FORMAT, "eval", model_keys[f"retain/forget{k}"], bench["key"], eval_settings)
            eval_keys[k] = key
            stage = Stage(
                f"evaluate the retain model (forget {k}; the Forget Quality reference)",
                folder("eval", "retain", key),
                "evaluate",
                {
                    **common,
                    "model": plan.models[f"retain/forget{k}"],
                    "adapter": None,
                    "references": [],
                    "save_reference": True,
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "eval_full":
            key = digest(STUDY_FORMAT, "eval", model_keys["target"], eval_keys[k], bench["key"], eval_settings)
            stage = Stage(
                f"evaluate the target (forget {k})",
                folder("eval", "full", key),
                "evaluate",
                {
                    **common,
                    "model": plan.models["target"],
                    "adapter": None,
                    "references": [reference],
                    "save_reference": False,
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        else:
            method, config, no_retain = method_run(study, cell)
            config["initializer_options"] = _initializer_seed(config, cell.seed)
            content = bench["content"]
            no = ("no-retain",) if no_retain else ()
            run_key = unlearn_key(
                "unlearn", model_keys["target"], [content["forget"], content["retain"]], config, last=no
            )
            run_folder = folder("run", f"{method.name}-forget{k}-seed{cell.seed}", run_key)
            retain = {"retain": None} if no_retain else {}
            unlearn = unlearn_stage(
                cell, run_folder, config, plan.models["target"], {"bench": bench["folder"]}, device, **retain
            )
            # the adapter is evaluated merged into the weights where that is exact (fp32 weights);
            # a method trained with full_finetune (LUNAR, T3) leaves a whole model instead
            full = bool(config.get("full_finetune"))
            merged = ("merged",) if merge_is_exact(device, ev.dtype) and not full else ()
            key = digest(STUDY_FORMAT, "eval", run_key, eval_keys[k], bench["key"], eval_settings, *merged)
            evaluate = Stage(
                f"evaluate: {cell.label}",
                folder("eval", f"{method.name}-forget{k}-seed{cell.seed}", key),
                "evaluate",
                {
                    **common,
                    "model": str(Path(run_folder) / "run") if full else plan.models["target"],
                    "adapter": None if full else str(Path(run_folder) / "run"),
                    "references": [reference],
                    "save_reference": False,
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [unlearn, evaluate], result=evaluate.folder)
    return plan


def _made_model(stage: Stage) -> str:
    """The model folder a fine-tuning stage leaves: the merged LoRA model, or the model itself
    after full fine-tuning."""
    run = Path(stage.folder) / "run"
    return str(run if stage.params["finetune"].get("full_finetune") else run / "merged")


def _file(bench: dict, name: str) -> str | None:
    return str(Path(bench["folder"]) / f"{name}.json") if bench["folder"] else None


def _given_key(model: str, study: Study, device: str | None) -> str:
    from ..models import resolve_model, weights_fingerprint

    key = digest(STUDY_FORMAT, "weights", weights_fingerprint(resolve_model(model)) or model)
    return run_setting_key(key, study, device)


# ----------------------------------------------------------------------------- builders


@contextlib.contextmanager
def _threads(n: int | None):
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_finetune(tmp: Path, p: dict) -> None:
    from ..training import FinetuneConfig, run_finetune

    with _threads(p["threads"]):  # part of the recipe: another thread count sums in another order
        run_finetune(
            FinetuneConfig(
                out=str(tmp / "run"),
                model=p["model"],
                data=p["data"],
                merge=True,
                save_steps=0,
                max_length=p["max_length"],
                seed=p["seed"],
                device=p["device"],
                **p["finetune"],
            )
        )


def build_unlearn(tmp: Path, p: dict) -> None:
    """An unlearning run: ``forget`` and ``retain`` the files given (``retain`` None: none), else
    the TOFU benchmark folder's ``forget.json`` and ``retain.json``."""
    from ..training import UnlearnConfig, run_unlearning

    need_stage(p["model"], "the target model")
    forget = p.get("forget") or str(Path(p["bench"]) / "forget.json")
    retain = p["retain"] if "retain" in p else str(Path(p["bench"]) / "retain.json")
    run_unlearning(
        UnlearnConfig(
            out=str(tmp / "run"),
            model=p["model"],
            forget=forget,
            retain=retain,
            device=p["device"],
            **p["config"],
        )
    )


def build_evaluate(tmp: Path, p: dict) -> None:
    """An evaluation of ``model`` (with ``adapter``) on the benchmark folder ``bench`` as the
    study's ``evaluation`` (:class:`.spec.Evaluation`) says."""
    from ..host import required_benchmark_part

    tofu_data = required_benchmark_part("tofu", "data")
    generation_cap, load_benchmark = tofu_data.generation_cap, tofu_data.load_benchmark
    from ..evaluation import lm_eval_runner as runner
    from ..models import load_tokenizer

    ev = p["evaluation"]
    need_stage(p["model"], "the model to evaluate")
    for ref in p["references"]:
        need_stage(ref, "the retain model's Forget Quality reference")
    bench = load_benchmark(p["bench"])
    if bench is None:
        raise UnlearnError(f"{p['bench']}: benchmark folder missing or unreadable; run the study again")
    max_gen_toks = generation_cap(load_tokenizer(p["model"]), bench, ev.gen_margin)
    evaluation = runner.evaluate_model(
        p["model"],
        list(ev.tasks),
        adapter=p["adapter"],
        device=p["device"],
        dtype=ev.dtype,
        batch_size=ev.batch_size,
        merge_adapter=merge_is_exact(p["device"], ev.dtype),
        retain_references=p["references"],
        tofu_dir=str(bench.folder),
        forget_split=str(bench.forget),
        max_gen_toks=max_gen_toks,
        scoring=ev.scoring,
    )
    if p["save_reference"]:
        runner.save_reference(evaluation, tmp / "reference.json", model=p["model"], adapter=p["adapter"])
    runner.write_outputs(tmp, evaluation)
    robust = p.get("robustness")
    if robust:  # is it really forgotten? membership inference and the attacks, beside it
        from ..evaluation import really_forgotten

        if robust["mia_reference"]:
            need_stage(robust["mia_reference"], "the retain model's MIA reference")
        really_forgotten.measure(
            p["model"],
            p["adapter"],
            tmp / REALLY_FORGOTTEN,
            forget_split=str(bench.forget),
            holdout_split=robust["holdout"],
            tofu_dir=str(bench.folder),
            batch_size=ev.batch_size,
            device=p["device"],
            dtype=ev.dtype,
            mia_reference=robust["mia_reference"],
            save_mia_reference=None if robust["mia_reference"] else str(tmp / MIA_REFERENCE),
            max_gen_toks=max_gen_toks,  # the evaluation's own cap: the same plain ROUGE-L
        )
    if not ev.extraction_from_task:
        values = extraction_strengths(
            p["model"], p["adapter"], str(bench.forget), p["max_length"], p["device"], ev.batch_size, ev.dtype
        )
        write_json(
            tmp / EXTRACTION,
            {
                "definition": "1 - k/n, teacher-forced greedy predictions (tofu_metrics)",
                "mean": sum(values) / len(values),
                "per_sample": values,
            },
        )


def need_stage(path: str, what: str) -> None:
    if path.startswith(("/", ".")) and not Path(path).exists():
        raise UnlearnError(f"{what} is missing ({path}); its cell did not finish: run the study again")


def extraction_strengths(
    model: str,
    adapter: str | None,
    data: str,
    max_length: int,
    device: str | None,
    batch_size: int = 8,
    dtype: str | None = None,
) -> list[float]:
    """Per forget sample, extraction strength ``1 - k/n`` (:mod:`..evaluation.tofu_metrics`): ``k``
    the first answer position from which every teacher-forced greedy prediction equals the
    answer's tokens (not the end token, as open-unlearning), in one forward pass per batch; for studies whose
    evaluation does not run the ``tofu_forget_extraction_strength`` task."""
    import torch

    from ..data.qa import IGNORE_INDEX, encode_samples, load_split, pad_batch
    from ..evaluation import tofu_metrics as tm
    from ..models import load_model

    loaded, tok = load_model(
        model, device=device, dtype=dtype, adapter=adapter, merge_adapter=merge_is_exact(device, dtype)
    )
    encoded = encode_samples(tok, load_split(data), max_length=max_length)
    out: list[float] = []
    dev = next(loaded.parameters()).device
    with torch.inference_mode():
        for i in range(0, len(encoded), batch_size):
            batch = {k: v.to(dev) for k, v in pad_batch(encoded[i : i + batch_size], tok.pad_token_id).items()}
            logits = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            predicted, labels = logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
            for row_pred, row_labels in zip(predicted.tolist(), labels.tolist()):
                # the last label is the end token: open-unlearning ignores its prediction
                pairs = [(p, y) for p, y in zip(row_pred, row_labels) if y != IGNORE_INDEX][:-1]
                if not pairs:
                    out.append(0.0)
                    continue
                k = tm.first_matching_suffix([p for p, _ in pairs], [y for _, y in pairs])
                out.append(tm.extraction_strength(k, len(pairs)))
    return out


def build_cud(tmp: Path, p: dict) -> None:
    from .cud import build_cud as build

    build(tmp, p)


def build_sweep(tmp: Path, p: dict) -> None:
    from .trace import build_sweep as build  # an author-unit study's traced run

    build(tmp, p)


def build_operating_point(tmp: Path, p: dict) -> None:
    from .operating_cell import choose_operating_point  # an author-unit study's method

    choose_operating_point(tmp, p, evaluate=build_evaluate)


BUILDERS: dict[str, Callable[[Path, dict], None]] = {
    "finetune": build_finetune,
    "unlearn": build_unlearn,
    "evaluate": build_evaluate,
    "cud": build_cud,
    # an author-unit study's (study/design_plan.py)
    "sweep": build_sweep,
    "operating_point": build_operating_point,
}


def builder(name: str) -> Callable[[Path, dict], None]:
    """The builder a stage names: one of :data:`BUILDERS`, a benchmark's stage kind
    (:class:`..interfaces.Benchmark`), or ``package.module:function`` for a pipeline that runs
    its own stages on these executors."""
    if name in BUILDERS:
        return BUILDERS[name]
    from ..host import benchmarks

    kinds = {k: ref for bench in benchmarks().values() for k, ref in bench.stage_kinds.items()}
    if name in kinds:
        return Benchmark.load(kinds[name])
    module, sep, function = name.partition(":")
    if not sep:
        known = ", ".join([*BUILDERS, *kinds])
        raise UnlearnError(f"stage builder {name!r}: neither one of {known} nor module:function")
    import importlib

    return getattr(importlib.import_module(module), function)


# ----------------------------------------------------------------------------- running a cell


def measured(build: Callable[[Path], None], info: dict) -> Callable[[Path], None]:
    """``build`` that also writes resources.json: wall time and peak memory (RSS, and CUDA's
    allocator peak where a GPU was used) of the stage, and where it ran (``info``: the device
    type and dtype it was keyed for; ``gpu``: the physical GPU's UUID, None on CPU)."""

    def run(tmp: Path) -> None:
        import torch

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        with PeakSampler() as sampler:
            build(tmp)
        record = {
            "seconds": round(time.perf_counter() - started, 2),
            "peak_rss_mb": sampler.peak_mb(),
            "peak_scope": sampler.scope,
            "threads": torch.get_num_threads(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "gpu": gpu_identity() if cuda and info.get("device_type", "cuda") == "cuda" else None,
            **info,
        }
        if cuda:
            record["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        write_json(tmp / RESOURCES, record)

    return run


@dataclass
class CellTask:
    """What a worker needs to build a cell (picklable: no study, no open files)."""

    plan: CellPlan
    cache: str
    log: str
    #: (device type, dtype) the plan keyed the stages for: recorded in resources.json
    identity: tuple = CPU_FP32
    #: the study's prompt format (data/prompts.py definition; None: the default), in force while it builds
    prompt_format: dict | None = None


def _emit_nothing(*event: Any) -> None:
    return None


def run_stage(
    stages: Stages,
    label: str,
    folder: Path,
    build: Callable[[Path], None],
    *,
    on_wait: Callable[[str], None] = lambda message: None,
) -> str:
    """``stages.run`` (build, or find it cached) that, while another process builds the stage
    (its lock is held), waits and then reuses that result. Returns built, cached or waited."""
    waited = False
    while True:
        try:
            stages.run(label, folder, build)
        except LockHeld as exc:
            stages.n -= 1  # the same stage again, not the next one
            if not waited:
                on_wait(str(exc))
                waited = True
            time.sleep(WAIT_POLL_S)
            continue
        if waited:
            return "waited"
        if stages.timings[label]["cached"]:
            return "cached"
        release_memory(between_stages=True)  # the next stage in this process starts from what this one left
        return "built"


@contextlib.contextmanager
def output_to(path: Path):
    """This process's stdout and stderr (file descriptors too: the Trainer's and lm-eval's
    progress bars, library warnings) into the cell's log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", buffering=1, encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield log
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def execute_cell(task: CellTask, emit: Callable[..., None] = _emit_nothing) -> dict:
    """Build every stage of one cell here; never raises for a failure of the cell itself (the
    result says ``failed`` with the error's one line, the log has the traceback), so the other
    cells go on."""
    import gc
    import traceback

    plan = task.plan
    cell_id = plan.cell.id
    started = time.perf_counter()
    sources: list[str] = []
    error = None
    with output_to(Path(task.log)) as log, quiet_libraries(), prompts.using(task.prompt_format):
        print(
            f"== {plan.cell.label} ({cell_id}), pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}",
            file=log,
            flush=True,
        )
        try:
            stages = Stages(Path(task.cache), total=len(plan.stages), stream=log)
            for i, stage in enumerate(plan.stages):
                emit("stage", cell_id, i, len(plan.stages), stage.label)
                where = {"cell": cell_id, "device_type": task.identity[0], "dtype": task.identity[1]}
                build = measured(lambda tmp, stage=stage: builder(stage.build)(tmp, stage.params), where)
                sources.append(
                    run_stage(
                        stages, stage.label, Path(stage.folder), build, on_wait=lambda msg: emit("wait", cell_id, msg)
                    )
                )
        except Exception as exc:  # noqa: BLE001 - reported per cell; the study goes on
            error = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
            if not isinstance(exc, UnlearnError):
                error = f"{type(exc).__name__}: {error}"
            print(f"\nFAILED: {error}\n{traceback.format_exc()}", file=log, flush=True)
        gc.collect()  # a failed run's progress bars close here, into the log
    result = {
        "status": "done" if error is None else "failed",
        "sources": sources,
        "log": task.log,
        "seconds": round(time.perf_counter() - started, 2),
    }
    if error is not None:
        result["error"] = error
    return result


def cell_source(sources: list[str]) -> str:
    """How a cell's result came about in this run: built (some stage built here), waited
    (built by another process while this run waited), or cached."""
    if "built" in sources:
        return "built"
    return "waited" if "waited" in sources else "cached"


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


__all__ = [
    "plan_study",
    "execute_cell",
    "CellTask",
    "Plan",
    "CellPlan",
    "Stage",
    "default_cache",
    "run_stage",
    "extraction_strengths",
    "cell_source",
    "STUDY_FORMAT",
    "unlearn_stage",
    "study_tofu",
    "benchmark_stage",
    "unlearn_key",
    "method_run",
    "cache_folder",
    "finetune_stage",
    "EVALUATIONS",
    "is_evaluation",
    "CPU_FP32",
    "stage_identity",
    "planned_as",
]
