"""A study's cells as stages of the shared content-keyed cache (:mod:`unlearn_plugins.stages`).

A benchmark's study part plans the grid into cells whose stages (fine-tune, unlearn, CUD scores
(:mod:`.cud`) and the benchmark's own kinds, an evaluation say) each have a cache folder keyed
by everything their result depends on: the base model's weights,
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
from .spec import TINY_MODEL, Cell, Study

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


def is_evaluation(build: str) -> bool:
    """Whether a stage of this builder evaluates a model: a benchmark's evaluation stage (TOFU's
    ``evaluate``, say; a cell that ends in one is done once it is)."""
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
class WaitingCellPlan(CellPlan):
    """A cell whose stages are known but not their keys: it waits for ``waiting`` (a cell id),
    and the runner plans again once that cell has finished (an author-unit study's test cells
    wait for their method's operating point)."""

    waiting: str = ""

    @property
    def cached(self) -> bool:
        return False


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


def initializer_seed(config: dict, seed: int) -> dict:
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


def need_stage(path: str, what: str) -> None:
    if path.startswith(("/", ".")) and not Path(path).exists():
        raise UnlearnError(f"{what} is missing ({path}); its cell did not finish: run the study again")


def build_cud(tmp: Path, p: dict) -> None:
    from .cud import build_cud as build

    build(tmp, p)


BUILDERS: dict[str, Callable[[Path, dict], None]] = {
    "finetune": build_finetune,
    "unlearn": build_unlearn,
    "cud": build_cud,
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
    "execute_cell",
    "CellTask",
    "Plan",
    "CellPlan",
    "Stage",
    "default_cache",
    "run_stage",
    "cell_source",
    "STUDY_FORMAT",
    "unlearn_stage",
    "unlearn_key",
    "method_run",
    "cache_folder",
    "finetune_stage",
    "WaitingCellPlan",
    "initializer_seed",
    "evaluation_settings",
    "run_setting_key",
    "is_evaluation",
    "CPU_FP32",
    "stage_identity",
    "planned_as",
]
