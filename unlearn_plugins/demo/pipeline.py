"""The demo's stages, each a plain call into the library (run_finetune, the cud scorer,
run_unlearning, evaluate_model), each cached.

Cache: ``$UNLEARN_CACHE_DIR/demo/<stage>-<name>-<key>/``. The key digests everything the
stage's result depends on (base model files, benchmark data, the budget, the keys of the
stages it reads), so a change of any of them recomputes that stage and the ones after it,
and nothing else. A stage is built in ``<folder>.tmp-<pid>`` and renamed into place when
complete, so Ctrl-C leaves either a finished stage or a temporary folder that the next
run deletes: a rerun continues with the first unfinished stage (:mod:`unlearn_plugins.stages`).
A stage being built holds an exclusive lock (``.<folder>.lock`` beside it) and the whole demo
one on its ``--out``, so two demos never build one stage or write one report at once: the
second is refused.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UnlearnError
from ..files import folder_lock, write_json, write_jsonl
from ..stages import DONE, Stages, digest  # noqa: F401  (DONE, digest: public here too)
from .benchmark import Benchmark, build_benchmark, file_digest, find_tofu, load_benchmark, source_fingerprint

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
        authors=3, eval_size=8, max_length=192,
        finetune=dict(lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=8, grad_accum=1),
        unlearn=dict(lr=2.5e-4, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=4, grad_accum=2),
        # anchor runs: at most 3 epochs, each stopped at the first check (every 2 steps) where the
        # pool's mean answer probability is < 0.1 (about step 8 on the embedded model)
        anchor_unlearn=dict(lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=2, grad_accum=1),
        cud=dict(steps=5, n_edges=75, objectives=["grad_diff", "npo"], seeds=[0, 1, 2], k=3, stop_prob=0.1,
                 check_steps=2),
        easy_hard=5,
    ),
    # --fast: a smoke test of every stage (CI runs it on a tiny model)
    "fast": Budget(
        authors=2, eval_size=4, max_length=128, gen_margin=4,
        finetune=dict(lr=1e-3, epochs=1.0, lora_r=8, lora_alpha=16.0, batch_size=8, grad_accum=1),
        unlearn=dict(lr=1e-3, epochs=1.0, lora_r=8, lora_alpha=16.0, batch_size=4, grad_accum=1),
        anchor_unlearn=dict(lr=1e-3, epochs=1.0, lora_r=8, lora_alpha=16.0, batch_size=4, grad_accum=1),
        cud=dict(steps=2, n_edges=20, objectives=["grad_diff", "npo"], seeds=[0, 1, 2], k=3, stop_prob=0.1),
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

    @property
    def budget(self) -> Budget:
        return BUDGETS["fast" if self.fast else "default"]


# ----------------------------------------------------------------------------- cache helpers

def model_key(spec: str) -> str:
    """The base model's identity: the alias/hub id, or a folder's file names, sizes and mtimes."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return digest("model", spec)
    files = sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in path.rglob("*") if p.is_file())
    return digest("model-dir", str(path.resolve()), files)



# ----------------------------------------------------------------------------- stages

def _finetune(config: DemoConfig, data: Path, out: Path) -> None:
    from ..training import FinetuneConfig, run_finetune

    b = config.budget
    run_finetune(FinetuneConfig(out=str(out / "run"), model=config.model, data=str(data), merge=True,
                                save_steps=0, max_length=b.max_length, seed=config.seed, device=config.device,
                                **b.finetune))


def _unlearn(config: DemoConfig, bench: Benchmark, full_model: str, method: Method, out: Path,
             budget: dict) -> None:
    from ..training import UnlearnConfig, run_unlearning
    from ..training.presets import preset

    settings = dict(method.settings)
    base = preset(settings.pop("preset")) if "preset" in settings else {}
    values = {**base, **settings, **budget}  # the shared budget wins over a preset's lr/epochs/rank
    run_unlearning(UnlearnConfig(out=str(out / "run"), model=full_model, forget=str(bench.forget),
                                 retain=str(bench.retain), save_steps=0, max_length=config.budget.max_length,
                                 seed=config.seed, device=config.device, **values))


def anchor_split(bench: Benchmark, size: int) -> tuple[str, str]:
    """CUD's anchor pool and the retain set of its anchor runs: the first ``size`` retain QA and
    the second half of the retain QA (the other retain authors; with one, its last QA). The full
    model knows both; neither holds a forget sample, so no scored sample is ever an anchor."""
    from ..data.tofu import read_jsonl

    half = len(read_jsonl(bench.retain)) // 2
    return f"{bench.retain}[0:{min(size, half)}]", f"{bench.retain}[{half}:]"


def _score_cud(config: DemoConfig, bench: Benchmark, full_model: str, out: Path) -> None:
    from ..data.tofu import load_split
    from ..models import load_model
    from ..scorers.cud import CUDScorer
    from ..scoring import score_samples
    from ..stratify import metadata_path, stratify, write_split

    b = config.budget
    cud = dict(b.cud)
    pool, anchor_retain = anchor_split(bench, b.anchor_pool)
    anchor_options = {**b.anchor_unlearn, "retain": anchor_retain, "max_length": b.max_length, "save_steps": 0}
    scorer = CUDScorer(anchor_data=pool, objectives=cud.pop("objectives"), seeds=cud.pop("seeds"),
                       model_spec=full_model, unlearn_options=anchor_options, max_length=b.max_length,
                       progress=True, **cud)
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


def generation_cap(tokenizer, bench: Benchmark, margin: int) -> int:
    """max_gen_toks for the ROUGE tasks: the longest reference answer they score, plus ``margin``."""
    from ..data.tofu import read_jsonl

    longest = 0
    for name in ("forget", "retain_perturbed", "real_authors_perturbed", "world_facts_perturbed"):
        for sample in read_jsonl(bench.folder / f"{name}.json"):
            longest = max(longest, len(tokenizer(sample.answer, add_special_tokens=False)["input_ids"]))
    return longest + 1 + margin  # + the end token


def _evaluate(config: DemoConfig, bench: Benchmark, model: str, adapter: str | None, out: Path,
              references: list[str], save_reference: bool, max_gen_toks: int) -> None:
    from ..evaluation import lm_eval_runner as runner

    evaluation = runner.evaluate_model(
        model, list(EVAL_TASKS), adapter=adapter, device=config.device, batch_size=config.budget.eval_batch_size,
        retain_references=references, tofu_dir=str(bench.folder), forget_split=str(bench.forget),
        max_gen_toks=max_gen_toks)
    if save_reference:
        runner.save_reference(evaluation, out / "reference.json", model=model, adapter=adapter)
    runner.write_outputs(out, evaluation)


# ----------------------------------------------------------------------------- the run

@dataclass
class DemoResult:
    out: Path
    results: dict
    table: str
    files: dict = field(default_factory=dict)


@contextlib.contextmanager
def quiet_libraries():
    """Keep the demo's output to its stage lines and progress bars: lm-eval's per-task
    warnings and deprecation notices are for people calling those libraries directly."""
    import warnings

    # (and our TOFU tasks' "no retain reference" warning: the retain model's evaluation makes it)
    names = ("lm_eval", "transformers", "peft", "accelerate", "unlearn_plugins.evaluation.tofu_tasks")
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def run_demo(config: DemoConfig, *, stream=None) -> DemoResult:
    """Every stage (cached), then the report in ``config.out`` (locked throughout)."""
    with folder_lock(config.out, f"--out {config.out}"), quiet_libraries():
        return _run_demo(config, stream=stream)


def _run_demo(config: DemoConfig, *, stream=None) -> DemoResult:
    from ..models import cache_dir, load_tokenizer, resolve_model
    from . import report

    stream = stream or sys.stderr
    b = config.budget
    n_authors = config.authors or b.authors
    if config.data not in ("auto", "tofu", "generated"):
        raise UnlearnError(f"--data {config.data!r}: choose auto, tofu or generated")
    root = Path(config.cache_dir).expanduser() if config.cache_dir else cache_dir() / "demo"
    stages = Stages(root, total=7 + 2 * len(METHODS), stream=stream)
    started = time.perf_counter()

    # 1. data and base model
    tofu = find_tofu(config.data, config.tofu_dir, n_authors)
    notice = None
    if tofu is None:
        notice = ("--data generated: using generated fictitious authors in TOFU's format" if config.data == "generated"
                  else "no TOFU data found (--tofu-dir / UNLEARN_TOFU_DIR names no folder with TOFU's files, or "
                       f"--authors {n_authors} is more than the package ships and the hub is unreachable): using "
                       "generated fictitious authors in TOFU's format")
        print(f"notice: {notice}", file=stream, flush=True)
    bench_key = digest(source_fingerprint(tofu), n_authors, config.forget_authors, b.eval_size)

    def build_bench(tmp: Path) -> None:
        build_benchmark(tmp, tofu=tofu, n_authors=n_authors, n_forget=config.forget_authors,
                        eval_size=b.eval_size)

    bench_dir = stages.run(f"benchmark: {n_authors} authors, {config.forget_authors} to forget",
                           stages.folder("bench", "tofu" if tofu else "generated", bench_key), build_bench)
    bench = load_benchmark(bench_dir)
    if bench is None:
        raise UnlearnError(f"{bench_dir}: benchmark folder unreadable; delete it and run again")
    bench.folder = bench_dir
    # later stages key on the content of the files they read: another eval_size, say,
    # re-runs the evaluations but keeps the target models, CUD scores and unlearning runs
    content = {name: file_digest(bench.folder / f"{name}.json") for name in ("full", "retain", "forget")}
    base_path = resolve_model(config.model)  # converts the embedded model once (cached)
    base_key = model_key(base_path if Path(base_path).is_dir() else config.model)

    # 2. target models
    targets = {}
    for name, data in (("full", bench.full), ("retain", bench.retain)):
        key = digest(base_key, content[name], b.finetune, b.max_length, config.seed)
        folder = stages.run(f"fine-tune the {name} model on {bench.sizes[name]} QA",
                            stages.folder("target", name, key),
                            lambda tmp, data=data: _finetune(config, data, tmp))
        targets[name] = {"key": key, "model": str(folder / "run" / "merged")}
    full_model = targets["full"]["model"]

    # 3. CUD scores of the forget samples
    cud_key = digest(targets["full"]["key"], content["forget"], content["retain"], b.cud, b.anchor_unlearn,
                     b.easy_hard, b.max_length, b.anchor_pool)
    cud_dir = stages.run(f"CUD scores of the {bench.sizes['forget']} forget samples",
                         stages.folder("cud", "forget", cud_key),
                         lambda tmp: _score_cud(config, bench, full_model, tmp))

    # 4. unlearning, same budget for every method
    runs = {}
    for method in METHODS:
        key = digest(targets["full"]["key"], content["forget"], content["retain"], method.settings, b.unlearn,
                     b.max_length, config.seed)
        folder = stages.run(f"unlearn with {method.label}", stages.folder("run", method.name, key),
                            lambda tmp, m=method: _unlearn(config, bench, full_model, m, tmp, b.unlearn))
        runs[method.name] = {"key": key, "adapter": str(folder / "run")}

    # 5. evaluation: the retain model first (its truth ratios are the Forget Quality reference)
    evals = {}
    max_gen_toks = generation_cap(load_tokenizer(config.model), bench, b.gen_margin)
    eval_settings = (list(EVAL_TASKS), b.eval_batch_size, max_gen_toks)
    key = digest(targets["retain"]["key"], bench_key, eval_settings)
    folder = stages.run("evaluate the retain model (and save the Forget Quality reference)",
                        stages.folder("eval", "retain", key),
                        lambda tmp: _evaluate(config, bench, targets["retain"]["model"], None, tmp, [], True,
                                              max_gen_toks))
    evals["retain"] = folder
    reference = str(folder / "reference.json")
    models = [("full", "the full model", full_model, None, targets["full"]["key"])]
    models += [(m.name, m.label, full_model, runs[m.name]["adapter"], runs[m.name]["key"]) for m in METHODS]
    for name, label, model, adapter, model_k in models:
        key = digest(model_k, key_of_reference(reference), bench_key, eval_settings)
        evals[name] = stages.run(f"evaluate {label}", stages.folder("eval", name, key),
                                 lambda tmp, m=model, a=adapter: _evaluate(config, bench, m, a, tmp, [reference],
                                                                           False, max_gen_toks))

    # 6. report
    stages.n += 1
    print(f"[{stages.n}/{stages.total}] report -> {config.out}", file=stream, flush=True)
    results, table, files = report.write_report(
        Path(config.out), config=config, bench=bench, notice=notice, targets=targets, runs=runs,
        methods=METHODS, evals=evals, cud_dir=cud_dir, timings=stages.timings,
        evaluation={"tasks": list(EVAL_TASKS), "batch_size": b.eval_batch_size, "max_gen_toks": max_gen_toks},
        wall_s=time.perf_counter() - started)
    return DemoResult(Path(config.out), results, table, files)


def key_of_reference(path: str) -> str:
    """The reference's content (another retain model gives another Forget Quality)."""
    try:
        return digest(Path(path).read_text())
    except OSError:
        return "missing"


__all__ = ["DemoConfig", "run_demo", "METHODS", "BUDGETS", "Budget", "Method", "EVAL_TASKS"]
