"""The demo's stages, each a plain call into the library (run_finetune, the cud scorer,
run_unlearning, evaluate_model), each cached.

Cache: ``$UNLEARN_CACHE_DIR/demo/<stage>-<name>-<key>/``. The key digests everything the
stage's result depends on (base model files, benchmark data, the budget, the keys of the
stages it reads), so a change of any of them recomputes that stage and the ones after it,
and nothing else. A stage is built in ``<folder>.tmp-<host>-<pid>`` and renamed into place when
complete, so Ctrl-C leaves either a finished stage or a temporary folder that the next
run deletes: a rerun continues with the unfinished stages (:mod:`unlearn_plugins.stages`).
A stage being built holds an exclusive lock (``.<folder>.lock`` beside it), and another demo
that needs it waits for it and then reuses it; the whole demo holds one on its ``--out``, so
two demos never write one report at once: the second is refused.

The stages form a graph (:class:`Step`): the full and retain models; then CUD, the three
unlearning runs (which read the full model) and the retain model's evaluation (the Forget
Quality reference); then the other evaluations (which read that reference). With
``workers`` >= 2 the stages whose inputs are built run at once, each in a worker process of
the study's local executor (:class:`unlearn_plugins.study.executors.LocalExecutor`: pinned to
its share of the cores, one thread each on 2 cores). CUD's six anchor runs and its score
matrices are built side by side first, into the CUD cache, as the scorer's processes do
under ``accelerate launch`` (:meth:`CUDScorer.prepare_shard`); its stage then finds them
there. With ``robustness`` (``--robustness``), a holdout author's QA and then every model's
`unlearn eval --mia --robustness` (the retain model's first: its MIA reference) follow. The
parent process prints the stage lines; each stage's own output goes to
``<out>/logs/<stage>.log``. With ``workers=1`` every stage runs in this process, one after
the other, as before.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..data.tofu_benchmark import (
    Benchmark,
    build_benchmark,
    file_digest,
    find_tofu,
    generation_cap,
    load_benchmark,
    source_fingerprint,
)
from ..errors import UnlearnError
from ..files import folder_lock, write_json, write_jsonl
from ..models import merge_is_exact
from ..process import quiet_libraries
from ..stages import DONE, Stages, digest, usable  # noqa: F401  (DONE, digest: public here too)

#: the TOFU tasks the demo evaluates (extraction strength left out: one request per answer token)
EVAL_TASKS = ("tofu_forget_prob", "tofu_forget_rouge", "tofu_forget_truth_ratio", "tofu_model_utility")


@dataclass(frozen=True)
class Budget:
    """How much work each stage does; the same unlearning budget for every method."""

    authors: int
    eval_size: int  # QA per Model Utility set (retain, real authors, world facts); all forget QA are used
    max_length: int
    finetune: dict
    unlearn: dict
    anchor_unlearn: dict
    cud: dict
    easy_hard: int
    eval_batch_size: int = 8
    #: new tokens for the ROUGE generations: the longest reference answer of the benchmark plus
    #: this margin (TOFU allows 200; the demo's answers have 1 to 83 SmolLM2 tokens, so a
    #: complete answer always fits while runaway generations of unlearned models stop early)
    gen_margin: int = 16
    #: CUD's anchor pool: this many QA of the first retain author (never a forget sample)
    anchor_pool: int = 10


BUDGETS = {
    # sized so a cold run of the embedded model fits 15 minutes on 2 CPU cores
    "default": Budget(
        authors=3,
        eval_size=8,
        max_length=192,
        # micro-batches of 4 (two per optimizer step of 8): a batch of 8 peaked at 3.1 GB
        finetune=dict(lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=4, grad_accum=2),
        # unlearning reads a forget and a retain batch per micro-batch: 2 of each (four per step of
        # 8) peaked at 2.22 GB against 2.86 GB with 4, in the same time (grad_diff, alone)
        unlearn=dict(lr=2.5e-4, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=2, grad_accum=4),
        # anchor runs: at most 3 epochs, each stopped at the first check (every 2 steps) where the
        # pool's mean answer probability is < 0.1 (about step 8 on the embedded model)
        anchor_unlearn=dict(lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=2, grad_accum=1),
        # max_rows 6: one sample (its 5 IG rows) per EAP-IG pass. The default 20 (4 samples) made
        # the score matrices the demo's largest stage: 4.8 GB against 2.1 GB, in the same time
        # two of the paper's five anchor-vote methods (GradDiff, NPO, SimNPO, RMU, UNDIAL; threshold
        # 3): a deviation to save 9 anchor runs, printed in the report; threshold ceil(2/2) = 1, the
        # union of the two objectives' anchors. Circuits compared as 0/1 edge masks (the paper's)
        cud=dict(
            steps=5,
            n_edges=75,
            vector="binary",
            objectives=["grad_diff", "npo"],
            seeds=[0, 1, 2],
            k=3,
            stop_prob=0.1,
            check_steps=2,
            max_rows=6,
        ),
        easy_hard=5,
    ),
    # --fast: a smoke test of every stage (CI runs it on a tiny model)
    "fast": Budget(
        authors=2,
        eval_size=4,
        max_length=128,
        gen_margin=4,
        finetune=dict(lr=1e-3, epochs=1.0, lora_r=8, lora_alpha=16.0, batch_size=8, grad_accum=1),
        unlearn=dict(lr=1e-3, epochs=1.0, lora_r=8, lora_alpha=16.0, batch_size=4, grad_accum=1),
        anchor_unlearn=dict(lr=1e-3, epochs=1.0, lora_r=8, lora_alpha=16.0, batch_size=4, grad_accum=1),
        cud=dict(
            steps=2, n_edges=20, vector="binary", objectives=["grad_diff", "npo"], seeds=[0, 1, 2], k=3, stop_prob=0.1
        ),
        easy_hard=3,
    ),
}


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    settings: dict


#: ReGLU and two baselines, each with the same unlearning budget
METHODS = (
    Method("reglu", "ReGLU (rila + ihl + rol)", {"preset": "reglu"}),
    Method("grad_diff", "GradDiff (PEFT default init)", {"objective": "grad_diff", "initializer": "kaiming"}),
    Method("ihl_fila", "IHL + FILA", {"objective": "ihl", "initializer": "fila"}),
)


@dataclass
class DemoConfig:
    out: str = "unlearn-demo"
    model: str = "smollm2-135m"
    authors: int | None = None  # None: the budget's
    forget_authors: int = 1
    fast: bool = False
    data: str = "auto"  # auto | tofu | generated
    tofu_dir: str | None = None
    device: str | None = None
    seed: int = 0
    cache_dir: str | None = None  # None: $UNLEARN_CACHE_DIR/demo
    workers: int | None = None  # stages built at once; None: default_workers()
    #: base weights under LoRA while training / weights while evaluating: auto | bf16 | fp32
    #: (auto: bf16 where the hardware computes it natively, :func:`..models.native_dtype`)
    train_dtype: str = "auto"
    eval_dtype: str = "auto"
    #: also measure whether it is really forgotten: membership inference against a holdout author
    #: and the forget metrics under the probes and after the relearn and int4 attacks, per model
    robustness: bool = False

    def dtypes(self) -> tuple[str | None, str | None]:
        """The (training, evaluation) dtypes this machine resolves the choices to."""
        from ..models import native_dtype

        return (
            native_dtype(self.train_dtype, self.device, "--train-dtype"),
            native_dtype(self.eval_dtype, self.device, "--eval-dtype"),
        )

    @property
    def budget(self) -> Budget:
        return BUDGETS["fast" if self.fast else "default"]


# ----------------------------------------------------------------------------- cache helpers


def model_key(spec: str) -> str:
    """The base model's identity: the alias/hub id, or a folder's file names, sizes and mtimes."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return digest("model", spec)
    files = sorted(
        (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()
    )
    return digest("model-dir", str(path.resolve()), files)


# ----------------------------------------------------------------------------- stages


def _finetune(config: DemoConfig, data: Path, out: Path) -> None:
    from ..training import FinetuneConfig, run_finetune

    b = config.budget
    run_finetune(
        FinetuneConfig(
            out=str(out / "run"),
            model=config.model,
            data=str(data),
            merge=True,
            save_steps=0,
            max_length=b.max_length,
            seed=config.seed,
            device=config.device,
            **{**b.finetune, **({"dtype": dtype} if (dtype := config.dtypes()[0]) else {})},
        )
    )


def _unlearn(config: DemoConfig, bench: Benchmark, full_model: str, method: Method, out: Path, budget: dict) -> None:
    from ..training import UnlearnConfig, run_unlearning
    from ..training.presets import preset

    settings = dict(method.settings)
    base = preset(settings.pop("preset")) if "preset" in settings else {}
    values = {**base, **settings, **budget}  # the shared budget wins over a preset's lr/epochs/rank
    run_unlearning(
        UnlearnConfig(
            out=str(out / "run"),
            model=full_model,
            forget=str(bench.forget),
            retain=str(bench.retain),
            save_steps=0,
            max_length=config.budget.max_length,
            seed=config.seed,
            device=config.device,
            **{**values, **({"dtype": dtype} if (dtype := config.dtypes()[0]) else {})},
        )
    )


def anchor_split(bench: Benchmark, size: int) -> tuple[str, str]:
    """CUD's anchor pool and the retain set of its anchor runs: the first ``size`` retain QA and
    the second half of the retain QA (the other retain authors; with one, its last QA). The full
    model knows both; neither holds a forget sample, so no scored sample is ever an anchor."""
    from ..data.tofu import read_jsonl

    half = len(read_jsonl(bench.retain)) // 2
    return f"{bench.retain}[0:{min(size, half)}]", f"{bench.retain}[{half}:]"


def _cud_scorer(config: DemoConfig, bench: Benchmark, full_model: str):
    """The demo's CUD scorer: anchor runs on a pool of retain QA (:func:`anchor_split`)."""
    from ..scorers.cud import CUDScorer

    b = config.budget
    cud = dict(b.cud)
    pool, anchor_retain = anchor_split(bench, b.anchor_pool)
    anchor_options = {**b.anchor_unlearn, "retain": anchor_retain, "max_length": b.max_length, "save_steps": 0}
    if dtype := config.dtypes()[0]:  # anchor runs are unlearning runs: trained as the demo's others
        anchor_options["dtype"] = dtype
    return CUDScorer(
        anchor_data=pool,
        objectives=cud.pop("objectives"),
        seeds=cud.pop("seeds"),
        model_spec=full_model,
        unlearn_options=anchor_options,
        max_length=b.max_length,
        progress=True,
        **cud,
    )


def _score_cud(config: DemoConfig, bench: Benchmark, full_model: str, out: Path) -> None:
    from ..data.tofu import load_split
    from ..models import load_model
    from ..scoring import score_samples
    from ..stratify import metadata_path, stratify, write_split

    b = config.budget
    scorer = _cud_scorer(config, bench, full_model)
    samples = load_split(str(bench.forget))
    model, tok = load_model(full_model, device=config.device)
    rows = score_samples(scorer, samples, model=model, tokenizer=tok, scorer_name="cud")
    del model
    write_jsonl(out / "scores.jsonl", rows)
    meta = {"scorer": "cud", "data": str(bench.forget), "rows": len(rows), **scorer.last_metadata}
    write_json(metadata_path(out / "scores.jsonl"), meta)
    n = min(b.easy_hard, len(rows) // 2)
    easy, hard = stratify(rows, samples, n, n, where=str(out / "scores.jsonl"), meta=meta)
    write_split(out / "easy.json", easy)
    write_split(out / "hard.json", hard)
    write_json(out / "anchors.json", dict(scorer.last_anchors))


def cud_anchor_runs(config: DemoConfig) -> list[tuple[str, int]]:
    """CUD's (objective, seed) anchor runs, in the scorer's order."""
    cud = config.budget.cud
    return [(objective, seed) for objective in cud["objectives"] for seed in cud["seeds"]]


def _prepare_cud(config: DemoConfig, bench: Benchmark, full_model: str, run: int | None) -> None:
    """One part of the CUD stage, into the CUD cache where the stage's scorer then finds it:
    anchor run ``run`` of :func:`cud_anchor_runs`, or (None) the forget samples' EAP-IG
    matrices, in one batch as the stage itself would compute them."""
    from ..data.tofu import load_split
    from ..models import load_model
    from ..scorers.cud.cache import model_fingerprint

    scorer = _cud_scorer(config, bench, full_model)
    samples = load_split(str(bench.forget))
    model, tok = load_model(full_model, device=config.device)
    fingerprint = model_fingerprint(model)
    if run is None:
        scorer.score_matrices(samples, model=model, tokenizer=tok, model_fp=fingerprint)
    else:
        scorer.anchor_loss_runs(
            scorer.anchor_pool(samples), model=model, tokenizer=tok, model_fp=fingerprint, only=[run]
        )


def cached_generation_cap(root: Path, key: str, model: str, bench: Benchmark, margin: int) -> int:
    """:func:`generation_cap`, kept in ``root`` under ``key``: a warm run need not import
    transformers and load the tokenizer (3 of its 6 seconds) to know it."""
    import json

    path = root / f"gen-cap-{key}.json"
    try:
        return int(json.loads(path.read_text())["max_gen_toks"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from ..models import load_tokenizer

    cap = generation_cap(load_tokenizer(model), bench, margin)
    root.mkdir(parents=True, exist_ok=True)
    write_json(path, {"max_gen_toks": cap, "model": model, "margin": margin})
    return cap


def _evaluate(
    config: DemoConfig,
    bench: Benchmark,
    model: str,
    adapter: str | None,
    out: Path,
    references: list[str],
    save_reference: bool,
    max_gen_toks: int,
) -> None:
    from ..evaluation import lm_eval_runner as runner

    evaluation = runner.evaluate_model(
        model,
        list(EVAL_TASKS),
        adapter=adapter,
        device=config.device,
        dtype=config.dtypes()[1],
        merge_adapter=merge_is_exact(config.device, config.dtypes()[1]),
        batch_size=config.budget.eval_batch_size,
        retain_references=references,
        tofu_dir=str(bench.folder),
        forget_split=str(bench.forget),
        max_gen_toks=max_gen_toks,
    )
    if save_reference:
        runner.save_reference(evaluation, out / "reference.json", model=model, adapter=adapter)
    runner.write_outputs(out, evaluation)


#: the retain model's MIA reference, in its robustness stage folder
MIA_REFERENCE = "mia_reference.json"


def _measure_forgetting(
    config: DemoConfig,
    bench: Benchmark,
    model: str,
    adapter: str | None,
    out: Path,
    holdout: str,
    mia_reference: str | None,
    max_gen_toks: int,
) -> None:
    """Is it really forgotten? `unlearn eval --mia --robustness` of one model into ``out/eval``;
    the retain model (``mia_reference`` None) saves the MIA reference."""
    from ..evaluation import really_forgotten

    really_forgotten.measure(
        model,
        adapter,
        out / "eval",
        forget_split=str(bench.forget),
        holdout_split=holdout,
        tofu_dir=str(bench.folder),
        batch_size=config.budget.eval_batch_size,
        device=config.device,
        dtype=config.dtypes()[1],
        mia_reference=mia_reference,
        save_mia_reference=None if mia_reference else str(out / MIA_REFERENCE),
        max_gen_toks=max_gen_toks,
    )


# ----------------------------------------------------------------------------- the run


@dataclass
class DemoResult:
    out: Path
    results: dict
    table: str
    files: dict = field(default_factory=dict)


def default_workers() -> int:
    """Two workers where there are two cores or more, else one; more only when asked
    (``--workers``): each worker holds a model of its own in memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def run_demo(config: DemoConfig, *, stream=None) -> DemoResult:
    """Every stage (cached), then the report in ``config.out`` (locked throughout)."""
    if config.workers is None:
        config = replace(config, workers=default_workers())
    elif isinstance(config.workers, bool) or not isinstance(config.workers, int) or config.workers < 1:
        raise UnlearnError(f"--workers must be an integer >= 1, got {config.workers!r}")
    with folder_lock(config.out, f"--out {config.out}"), quiet_libraries():
        return _run_demo(config, stream=stream)


# ----------------------------------------------------------------------------- the stage graph

#: what a worker process calls to build a stage (``module:function``, :func:`..study.cells.builder`)
BUILDER = f"{__name__}:build_stage"


@dataclass
class Job:
    """A stage, or a part of one, to build: its line label, cache folder and :func:`build_stage`
    parameters (picklable: they travel to a worker process)."""

    label: str
    folder: Path
    params: dict


@dataclass
class Step:
    """A stage of the demo's graph. ``number``: its place in a sequential run, shown as
    ``[number/total]``; ``needs``: the steps whose results it reads; ``plan``: its job, asked
    for once those are built (an evaluation's key reads the retain model's reference);
    ``parts``: jobs built side by side before it in a parallel run; ``priority``: lower is
    handed to a free worker first (the full model first: most stages wait for it)."""

    name: str
    number: int
    label: str
    needs: tuple[str, ...]
    plan: Callable[[], Job]
    priority: int
    parts: Callable[[], list[Job]] | None = None


def build_stage(tmp: Path, p: dict) -> None:
    """Build the job ``p`` describes into ``tmp``, in this process or in a worker."""
    kind, config, bench = p["kind"], p["config"], p["bench"]
    if kind == "finetune":
        _finetune(config, Path(p["data"]), tmp)
    elif kind == "cud":
        _score_cud(config, bench, p["model"], tmp)
    elif kind == "cud_part":
        _prepare_cud(config, bench, p["model"], p["run"])
    elif kind == "unlearn":
        _unlearn(config, bench, p["model"], p["method"], tmp, config.budget.unlearn)
    elif kind == "evaluate":
        _evaluate(config, bench, p["model"], p["adapter"], tmp, p["references"], p["save_reference"], p["max_gen_toks"])
    elif kind == "holdout":
        from ..data.tofu_benchmark import build_holdout

        write_json(tmp / "author.json", build_holdout(tmp / "holdout.json", tofu=p["tofu"], n_authors=p["authors"]))
    elif kind == "really_forgotten":
        _measure_forgetting(
            config, bench, p["model"], p["adapter"], tmp, p["holdout"], p["mia_reference"], p["max_gen_toks"]
        )
    else:
        raise UnlearnError(f"demo stage kind {kind!r}: unknown")


def run_in_order(steps: list[Step], stages: Stages) -> None:
    """Every stage here, one after the other (``workers=1``); a stage that another demo is
    building is waited for, then reused."""
    from ..study.cells import run_stage

    for step in steps:
        job = step.plan()
        stages.n = step.number - 1
        run_stage(
            stages,
            job.label,
            job.folder,
            lambda tmp, job=job: build_stage(tmp, job.params),
            on_wait=lambda message, step=step: stages.say(step.number, f"{step.label}: waiting: {message}"),
        )


def run_in_parallel(steps: list[Step], stages: Stages, workers: int, logs: Path) -> None:
    """Every stage, each as soon as the stages it reads are built, on ``workers`` local worker
    processes; the stage lines from here. A failed stage stops new ones from starting; the
    running ones finish (they are valid cache entries), then its error is raised."""
    from ..study.cells import CellPlan, CellTask, Stage
    from ..study.executors import LocalExecutor
    from ..study.spec import Cell

    done: set[str] = set()
    waiting = list(steps)
    ready: list[tuple[Step, Job, bool]] = []  # (step, job, whether it is one of the step's parts)
    finals: dict[str, Job] = {}  # a step's own job while its parts are built
    parts_left: dict[str, set[str]] = {}
    running: dict[str, tuple[Step, Job, bool]] = {}
    started: dict[str, float] = {}
    failure: tuple[str, dict] | None = None  # (what failed, its result)
    executor = None

    def plan_ready_steps() -> None:
        while True:
            step = next((s for s in waiting if set(s.needs) <= done), None)
            if step is None:
                return
            waiting.remove(step)
            job = step.plan()
            if usable(job.folder, stages.stream):
                stages.say(step.number, f"{job.label}: cached ({job.folder.name})")
                stages.timings[job.label] = {"seconds": 0.0, "cached": True}
                done.add(step.name)
                continue
            parts = [p for p in (step.parts() if step.parts else []) if not usable(p.folder, stages.stream)]
            if parts:
                finals[step.name] = job
                parts_left[step.name] = {p.folder.name for p in parts}
                ready.extend((step, p, True) for p in parts)
            else:
                ready.append((step, job, False))

    def submit(step: Step, job: Job, part: bool) -> None:
        if step.name not in started:
            started[step.name] = time.perf_counter()
            stages.say(step.number, f"{step.label} ...")
        cell = Cell(id=job.folder.name, kind="demo", label=job.label)
        plan = CellPlan(cell, [Stage(job.label, str(job.folder), BUILDER, job.params)], result=str(job.folder))
        executor.submit(CellTask(plan, str(stages.root), str(logs / f"{job.folder.name}.log")))
        running[cell.id] = (step, job, part)

    def finished(step: Step, job: Job, part: bool, result: dict) -> None:
        nonlocal failure
        if result["status"] != "done":
            log = f" (log: {result['log']})" if result.get("log") else ""
            stages.say(step.number, f"{job.label}: FAILED: {result.get('error')}{log}")
            failure = failure or (f"{step.label} ({job.label})" if part else job.label, result)
            if running:
                print(f"waiting for the {len(running)} running stage(s) to finish", file=stages.stream, flush=True)
            return
        if part:
            stages.say(step.number, f"  {job.label}: done in {result.get('seconds', 0):.0f} s")
            parts_left[step.name].discard(job.folder.name)
            if not parts_left[step.name]:
                ready.append((step, finals.pop(step.name), False))
            return
        seconds = time.perf_counter() - started[step.name]
        stages.timings[job.label] = {"seconds": round(seconds, 2), "cached": False}
        stages.say(step.number, f"{job.label}: done in {seconds:.0f} s")
        done.add(step.name)
        for part_job in step.parts() if step.parts else []:  # they only marked what is now in the CUD cache
            shutil.rmtree(part_job.folder, ignore_errors=True)

    try:
        while True:
            if failure is None:
                plan_ready_steps()
                if ready and executor is None:
                    executor = LocalExecutor(workers)
                    print(f"workers: {executor.describe()}; their output: {logs}/", file=stages.stream, flush=True)
                ready.sort(key=lambda item: (item[0].priority, item[0].number))
                while ready and executor.free() > 0:
                    submit(*ready.pop(0))
            if not running:
                break
            for event in executor.events(0.5):
                kind, cell = event[0], event[1]
                if kind == "interrupted":  # Ctrl-C reached a worker (this process may ignore SIGINT)
                    raise KeyboardInterrupt(f"(in {event[2]})")
                if cell not in running:
                    continue
                step, job, part = running[cell]
                if kind == "wait":
                    stages.say(step.number, f"{job.label}: waiting: {event[2]}")
                elif kind == "done":
                    del running[cell]
                    finished(step, job, part, event[2])
    except BaseException:
        if executor is not None:
            executor.close(interrupted=True)  # each worker's stage removes its temporary folder
            executor = None
        raise
    finally:
        if executor is not None:
            executor.close()
    if failure is not None:
        what, result = failure
        log = f" (log: {result['log']})" if result.get("log") else ""
        raise UnlearnError(f"{what}: {result.get('error')}{log}")


# ----------------------------------------------------------------------------- the run


def _run_demo(config: DemoConfig, *, stream=None) -> DemoResult:
    from ..models import cache_dir, resolve_model
    from . import report

    stream = stream or sys.stderr
    b = config.budget
    n_authors = config.authors or b.authors
    if config.data not in ("auto", "tofu", "generated"):
        raise UnlearnError(f"--data {config.data!r}: choose auto, tofu or generated")
    root = Path(config.cache_dir).expanduser() if config.cache_dir else cache_dir() / "demo"
    # --robustness: the holdout author, then the retain, full and each unlearned model's attacks
    extra = 1 + 2 + len(METHODS) if config.robustness else 0
    stages = Stages(root, total=7 + 2 * len(METHODS) + extra, stream=stream)
    started = time.perf_counter()

    # 1. data and base model (here: every other stage reads them)
    tofu = find_tofu(config.data, config.tofu_dir, n_authors)
    notice = None
    if tofu is None:
        notice = (
            "--data generated: using generated fictitious authors in TOFU's format"
            if config.data == "generated"
            else "no TOFU data found (--tofu-dir / UNLEARN_TOFU_DIR names no folder with TOFU's files, or "
            f"--authors {n_authors} is more than the package ships and the hub is unreachable): using "
            "generated fictitious authors in TOFU's format"
        )
        print(f"notice: {notice}", file=stream, flush=True)
    bench_key = digest(source_fingerprint(tofu), n_authors, config.forget_authors, b.eval_size)

    def build_bench(tmp: Path) -> None:
        build_benchmark(tmp, tofu=tofu, n_authors=n_authors, n_forget=config.forget_authors, eval_size=b.eval_size)

    bench_label = f"benchmark: {n_authors} authors, {config.forget_authors} to forget"
    bench_dir = stages.run(bench_label, stages.folder("bench", "tofu" if tofu else "generated", bench_key), build_bench)
    bench = load_benchmark(bench_dir)
    if bench is None:
        raise UnlearnError(f"{bench_dir}: benchmark folder unreadable; delete it and run again")
    bench.folder = bench_dir
    # later stages key on the content of the files they read: another eval_size, say,
    # re-runs the evaluations but keeps the target models, CUD scores and unlearning runs
    content = {name: file_digest(bench.folder / f"{name}.json") for name in ("full", "retain", "forget")}
    base_path = resolve_model(config.model)  # converts the embedded model once (cached)
    base_key = model_key(base_path if Path(base_path).is_dir() else config.model)
    max_gen_toks = cached_generation_cap(
        root, digest(base_key, bench_key, b.gen_margin), config.model, bench, b.gen_margin
    )
    train_dtype, eval_dtype = config.dtypes()  # resolved here: keys and report say what ran
    # adapters are evaluated merged into the weights where that is exact (fp32 weights)
    merged = ("adapters merged",) if merge_is_exact(config.device, eval_dtype) else ()
    eval_settings = (list(EVAL_TASKS), b.eval_batch_size, max_gen_toks, eval_dtype, *merged)
    common = {"config": config, "bench": bench}
    steps: list[Step] = []

    def add(
        name: str,
        label: str,
        needs: tuple[str, ...],
        folder: Callable[[], Path],
        params: dict,
        priority: int,
        parts: Callable[[], list[Job]] | None = None,
    ) -> None:
        steps.append(
            Step(
                name, len(steps) + 2, label, needs, lambda: Job(label, folder(), {**common, **params}), priority, parts
            )
        )

    # 2. target models
    targets = {}
    for name, data in (("full", bench.full), ("retain", bench.retain)):
        key = digest(base_key, content[name], b.finetune, b.max_length, config.seed, train_dtype)
        folder = stages.folder("target", name, key)
        targets[name] = {"key": key, "model": str(folder / "run" / "merged")}
        add(
            f"target-{name}",
            f"fine-tune the {name} model on {bench.sizes[name]} QA",
            (),
            lambda folder=folder: folder,
            {"kind": "finetune", "data": str(data)},
            priority=len(steps),
        )
    full_model = targets["full"]["model"]

    # 3. CUD scores of the forget samples (run in parallel: its anchor runs and matrices first)
    cud_key = digest(
        targets["full"]["key"],
        content["forget"],
        content["retain"],
        b.cud,
        b.anchor_unlearn,
        b.easy_hard,
        b.max_length,
        b.anchor_pool,
        train_dtype,
    )
    cud_dir = stages.folder("cud", "forget", cud_key)

    def cud_parts() -> list[Job]:
        part = {**common, "kind": "cud_part", "model": full_model}
        jobs = [
            Job(
                f"CUD anchor run {objective}/seed {seed}",
                stages.folder("cudpart", f"run{j}", cud_key),
                {**part, "run": j},
            )
            for j, (objective, seed) in enumerate(cud_anchor_runs(config))
        ]
        return jobs + [
            Job(
                f"CUD score matrices of the {bench.sizes['forget']} forget samples",
                stages.folder("cudpart", "matrices", cud_key),
                {**part, "run": None},
            )
        ]

    add(
        "cud",
        f"CUD scores of the {bench.sizes['forget']} forget samples",
        ("target-full",),
        lambda: cud_dir,
        {"kind": "cud", "model": full_model},
        priority=2,
        parts=cud_parts,
    )

    # 4. unlearning, same budget for every method
    runs = {}
    for method in METHODS:
        key = digest(
            targets["full"]["key"],
            content["forget"],
            content["retain"],
            method.settings,
            b.unlearn,
            b.max_length,
            config.seed,
            train_dtype,
        )
        folder = stages.folder("run", method.name, key)
        runs[method.name] = {"key": key, "adapter": str(folder / "run")}
        add(
            f"run-{method.name}",
            f"unlearn with {method.label}",
            ("target-full",),
            lambda folder=folder: folder,
            {"kind": "unlearn", "model": full_model, "method": method},
            priority=4,
        )

    # 5. evaluation: the retain model first (its truth ratios are the Forget Quality reference)
    evaluate = {"kind": "evaluate", "max_gen_toks": max_gen_toks}
    key = digest(targets["retain"]["key"], bench_key, eval_settings)
    evals = {"retain": stages.folder("eval", "retain", key)}
    reference = str(evals["retain"] / "reference.json")
    add(
        "eval-retain",
        "evaluate the retain model (and save the Forget Quality reference)",
        ("target-retain",),
        lambda: evals["retain"],
        {**evaluate, "model": targets["retain"]["model"], "adapter": None, "references": [], "save_reference": True},
        priority=3,
    )
    models = [("full", "the full model", None, targets["full"]["key"], "target-full")]
    models += [(m.name, m.label, runs[m.name]["adapter"], runs[m.name]["key"], f"run-{m.name}") for m in METHODS]

    def keyed_on(into: dict, kind: str, name: str, model_k: str, ref: str, settings: tuple) -> Callable[[], Path]:
        """A stage folder keyed on a reference file the retain model's stage writes: its key is
        worked out when the stage is planned, once that file exists."""

        def folder() -> Path:
            into[name] = stages.folder(kind, name, digest(model_k, key_of_reference(ref), bench_key, settings))
            return into[name]

        return folder

    for name, label, adapter, model_k, made_by in models:
        add(
            f"eval-{name}",
            f"evaluate {label}",
            (made_by, "eval-retain"),
            keyed_on(evals, "eval", name, model_k, reference, eval_settings),
            {**evaluate, "model": full_model, "adapter": adapter, "references": [reference], "save_reference": False},
            priority=5,
        )

    forgetting: dict[str, Path] = {}
    if config.robustness:
        # 6. is it really forgotten? membership inference against an author no model trained on,
        # and the forget metrics after each attack: the retain model first (its MIA reference)
        holdout_key = digest(source_fingerprint(tofu), n_authors, "holdout-1")
        holdout_dir = stages.folder("holdout", "tofu" if tofu else "generated", holdout_key)
        holdout = str(holdout_dir / "holdout.json")
        add(
            "holdout",
            "holdout author for membership inference (in no model's training data)",
            (),
            lambda: holdout_dir,
            {"kind": "holdout", "tofu": tofu, "authors": n_authors},
            priority=6,
        )
        from ..evaluation.really_forgotten import ATTACK_OPTIONS, ATTACKS

        # generations capped as the demo's own evaluation caps them: its ROUGE-L is the plain one
        measure = {"kind": "really_forgotten", "holdout": holdout, "max_gen_toks": max_gen_toks}
        attack_settings = (ATTACKS, ATTACK_OPTIONS, b.eval_batch_size, eval_dtype, holdout_key, max_gen_toks)
        forgetting["retain"] = stages.folder(
            "forgotten", "retain", digest(targets["retain"]["key"], bench_key, attack_settings)
        )
        mia_reference = str(forgetting["retain"] / MIA_REFERENCE)
        add(
            "forgotten-retain",
            "is it really forgotten? the retain model (and save the MIA reference)",
            ("target-retain", "holdout"),
            lambda: forgetting["retain"],
            {**measure, "model": targets["retain"]["model"], "adapter": None, "mia_reference": None},
            priority=6,
        )
        for name, label, adapter, model_k, made_by in models:
            add(
                f"forgotten-{name}",
                f"is it really forgotten? {label}",
                (made_by, "forgotten-retain"),
                keyed_on(forgetting, "forgotten", name, model_k, mia_reference, attack_settings),
                {**measure, "model": full_model, "adapter": adapter, "mia_reference": mia_reference},
                priority=7,
            )

    if config.workers > 1:
        run_in_parallel(steps, stages, config.workers, Path(config.out) / "logs")
    else:
        run_in_order(steps, stages)
    # the stages' timings in a sequential run's order, whichever finished first
    order = [bench_label] + [step.label for step in steps]
    stages.timings = {label: stages.timings[label] for label in order if label in stages.timings}

    # 7. report
    stages.say(stages.total, f"report -> {config.out}")
    results, table, files = report.write_report(
        Path(config.out),
        config=config,
        bench=bench,
        notice=notice,
        targets=targets,
        runs=runs,
        methods=METHODS,
        evals=evals,
        cud_dir=cud_dir,
        timings=stages.timings,
        evaluation={
            "tasks": list(EVAL_TASKS),
            "batch_size": b.eval_batch_size,
            "max_gen_toks": max_gen_toks,
            "dtype": eval_dtype or "library default",
        },
        train_dtype=train_dtype or "library default",
        wall_s=time.perf_counter() - started,
        forgetting=forgetting,
    )
    return DemoResult(Path(config.out), results, table, files)


def key_of_reference(path: str) -> str:
    """The reference's content (another retain model gives another Forget Quality)."""
    try:
        return digest(Path(path).read_text())
    except OSError:
        return "missing"


__all__ = ["DemoConfig", "run_demo", "METHODS", "BUDGETS", "Budget", "Method", "EVAL_TASKS", "default_workers"]
