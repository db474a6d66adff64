"""`unlearn demo --benchmark movielens`: recommendation unlearning end to end on the embedded
model, with the TOFU demo's stage cache (:mod:`unlearn_plugins.stages`) and report format.

Each stage is a plain library call, cached under ``$UNLEARN_CACHE_DIR/demo`` with a key over
everything it depends on (a rerun continues with the first unfinished stage):

1. benchmark: MovieLens (recbole's ML-100K, or ``--movielens-dir``) cut to the budget's users
   and prompts (:func:`~unlearn_plugins.recommendation.benchmark.build_benchmark`);
2. target and retrain models: :func:`~unlearn_plugins.recommendation.recipes.train_target` /
   ``train_retrain`` (LoRA, merged);
3. the retrain model evaluated first (lm-eval ``movielens_rec``, ``movielens_rec_forget``): its
   forget predictions are the JSD reference of every other model; then the target;
4. CUD scores of the forget users' training prompts (anchors from other, retained users; the
   EAP-IG metric on the Yes/No token), per-user means, the CUD-easy and CUD-hard users
   (:func:`~unlearn_plugins.stratify.stratify_groups`);
5. unlearning with E2URec, NegGrad (``grad_ascent``) and the bad teacher (``run_unlearning``,
   one budget for all three), each evaluated;
6. RecEraser: one adapter per shard of users (``train_sharded``), then the forget users
   unlearned from a copy (only the shards that held them retrain), the ensemble evaluated
   through :class:`~unlearn_plugins.recommendation.sharded_lm.ShardedRecommenderLM`;
7. the report (:mod:`.movielens_report`).

The CUD-easy / CUD-hard columns are the forget AUC over the prompts of those users, read from
each model's per-sample forget predictions (the same numbers ``forget_part=<easy.json>`` gives).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..data.tofu_benchmark import file_digest
from ..errors import UnlearnError
from ..files import folder_lock, write_json, write_jsonl
from ..stages import Stages, digest
from .pipeline import Method, model_key, quiet_libraries

REC_TASKS = ("movielens_rec", "movielens_rec_forget")
FORGET_TASK = "movielens_rec_forget"


@dataclass(frozen=True)
class RecBudget:
    """How much work each stage does (every unlearning method gets the same ``unlearn``)."""

    users: int  # a seeded sample of MovieLens users
    train_per_user: int  # each user's latest training prompts
    eval_per_user: int  # each user's latest valid / test prompts
    history: int  # K, rated movies shown in a prompt
    forget_fraction: float  # of the users, forgotten
    anchor_users: int  # retained users whose prompts are CUD's anchor pool (never scored)
    finetune: dict  # overrides of recipes.RECIPE for the target, the retrain model and each shard
    unlearn: dict
    e2urec: dict  # e2urec's options: its augmented teacher sized to a few dozen forget prompts
    anchor_unlearn: dict
    cud: dict
    shards: int
    aggregator: str
    aggregator_prompts: int
    aggregator_options: dict = field(default_factory=dict)
    eval_batch_size: int = 8

    @property
    def forget_users(self) -> int:
        """How many users the forget request holds (as choose_forget_users counts them)."""
        return min(max(1, int(round(self.forget_fraction * self.users))), self.users - 1)


REC_BUDGETS = {
    # sized for 15 minutes cold on 2 CPU cores (README, "Recommendation unlearning"). Estimated from
    # per-step timings, not timed end to end: a bf16-base LoRA step of 8 prompts (~150 tokens at
    # K = 5) ~3 s, an fp32 forward ~0.17 s a prompt, ~8 s of loading and saving per training stage.
    # Target 20 steps ~70 s, retrain 16 ~60 s, each evaluation (48 prompts) ~15 s (RecEraser: x3
    # shards, ~30 s), CUD ~120 s (3 anchor runs of <= 8 steps of 2 prompts ~55 s, EAP-IG on <= 20
    # prompts ~55 s), unlearning ~110 s (E2URec ~55, NegGrad ~20, Bad-T ~35), RecEraser shards ~110 s
    # (24 steps and two aggregator passes) and its unlearning ~90 s, the embedded model's first
    # conversion ~25 s: about 700 s.
    "default": RecBudget(
        users=20,
        train_per_user=4,
        eval_per_user=2,
        history=5,
        forget_fraction=0.2,
        anchor_users=2,
        finetune={},  # recipes.RECIPE: LoRA r 16, lr 1e-3, 2 epochs, batch 8
        unlearn=dict(lr=5e-4, epochs=2.0, lora_r=16, lora_alpha=32.0, batch_size=4, grad_accum=1),
        e2urec=dict(teacher_lr=1e-3, teacher_epochs=2.0, teacher_batch_size=8),
        anchor_unlearn=dict(lr=1e-3, epochs=2.0, lora_r=16, lora_alpha=32.0, batch_size=2, grad_accum=1),
        cud=dict(
            steps=5, n_edges=75, vector="binary", objectives=["npo"], seeds=[0, 1, 2], k=2, stop_prob=0.1, check_steps=2
        ),
        shards=3,
        aggregator="attention",
        aggregator_prompts=32,
    ),
    # --fast: every stage with minimal work (CI runs it on a tiny model)
    "fast": RecBudget(
        users=8,
        train_per_user=4,
        eval_per_user=2,
        history=3,
        forget_fraction=0.25,
        anchor_users=1,
        finetune=dict(epochs=1.0, lora_r=4, lora_alpha=8.0, max_length=512),
        unlearn=dict(lr=1e-3, epochs=2.0, lora_r=4, lora_alpha=8.0, batch_size=4, grad_accum=1, max_length=512),
        e2urec=dict(teacher_lr=1e-3, teacher_epochs=1.0, teacher_batch_size=4, teacher_lora_r=4),
        anchor_unlearn=dict(lr=1e-3, epochs=1.0, lora_r=4, lora_alpha=8.0, batch_size=2, grad_accum=1),
        cud=dict(
            steps=2, n_edges=20, vector="binary", objectives=["npo"], seeds=[0, 1], k=1, stop_prob=0.1, check_steps=1
        ),
        shards=2,
        aggregator="attention",
        aggregator_prompts=8,
        aggregator_options={"epochs": 5},
    ),
}

#: the unlearning methods run through run_unlearning (RecEraser has its own stages)
REC_METHODS = (
    Method("e2urec", "E2URec", {"objective": "e2urec"}),
    Method("neggrad", "NegGrad (grad_ascent)", {"objective": "grad_ascent", "retain": None}),
    Method("bad_teacher", "Bad-T (bad_teacher)", {"objective": "bad_teacher"}),
)


@dataclass
class MovieLensDemoConfig:
    out: str = "unlearn-demo-movielens"
    model: str = "smollm2-135m"
    fast: bool = False
    movielens_dir: str | None = None  # None: $UNLEARN_MOVIELENS_DIR, else recbole's ML-100K
    # budget overrides (None: the budget's)
    users: int | None = None
    train_per_user: int | None = None
    eval_per_user: int | None = None
    forget_fraction: float | None = None
    shards: int | None = None
    aggregator: str | None = None
    train_dtype: str = "auto"  # base weights under LoRA while training: auto | bf16 | fp32
    device: str | None = None
    seed: int = 0
    cache_dir: str | None = None  # None: $UNLEARN_CACHE_DIR/demo

    @property
    def budget(self) -> RecBudget:
        base = REC_BUDGETS["fast" if self.fast else "default"]
        given = {
            name: getattr(self, name)
            for name in ("users", "train_per_user", "eval_per_user", "forget_fraction", "shards", "aggregator")
            if getattr(self, name) is not None
        }
        return dataclasses.replace(base, **given)


def check_budget(b: RecBudget) -> None:
    """What the stages need of the sizes, checked before any of them runs."""
    if b.users < 4:
        raise UnlearnError(f"--users {b.users}: the demo needs at least 4 users (forgotten, retained, anchor)")
    if not 0 < b.forget_fraction < 1:
        raise UnlearnError(f"--forget-fraction {b.forget_fraction}: must be between 0 and 1 (exclusive)")
    if b.forget_users < 2:
        raise UnlearnError(
            f"--forget-fraction {b.forget_fraction} of --users {b.users} forgets {b.forget_users} user; "
            f"CUD-easy vs CUD-hard needs at least 2 forgotten users"
        )
    retained = b.users - b.forget_users
    if retained - b.anchor_users < 1:
        raise UnlearnError(
            f"--users {b.users}: {b.forget_users} forgotten and {b.anchor_users} CUD anchor user(s) "
            f"leave no retained user to train on"
        )
    if b.anchor_users * b.train_per_user < 4:
        raise UnlearnError(
            f"--train-per-user {b.train_per_user}: CUD's anchor pool ({b.anchor_users} user(s) x "
            f"{b.train_per_user} prompts) needs at least 4 prompts"
        )
    if not 1 <= b.shards <= retained:
        raise UnlearnError(f"--shards {b.shards}: must be between 1 and the {retained} retained users")
    if b.aggregator not in ("attention", "average"):
        raise UnlearnError(f"--aggregator {b.aggregator!r}: choose attention (RecEraser) or average (SISA)")


# ----------------------------------------------------------------------------- stages


def movielens_fingerprint(folder: str | None) -> str:
    """Changes when the MovieLens files change (another folder, an edited file)."""
    from ..data.movielens import detect_layout, resolve_movielens_dir

    layout, files = detect_layout(resolve_movielens_dir(folder))
    return "-".join([layout, *(file_digest(p) for p in files)])


def _build_benchmark(config: MovieLensDemoConfig, out: Path) -> None:
    from ..data.movielens import load_movielens
    from ..recommendation.benchmark import build_benchmark

    build_benchmark(load_movielens(config.movielens_dir), benchmark_settings(config)).write(out)


def benchmark_settings(config: MovieLensDemoConfig):
    from ..recommendation.benchmark import BenchmarkSettings

    b = config.budget
    return BenchmarkSettings(
        history=b.history,
        forget_fraction=b.forget_fraction,
        seed=config.seed,
        users=b.users,
        max_train_per_user=b.train_per_user,
        max_eval_per_user=b.eval_per_user,
        anchor_users=b.anchor_users,
    )


def _finetune(config: MovieLensDemoConfig, bench_dir: Path, part: str, dtype: str | None, out: Path) -> None:
    from ..recommendation import recipes

    train = recipes.train_target if part == "train" else recipes.train_retrain
    started = time.perf_counter()
    train(
        bench_dir,
        out / "run",
        model=config.model,
        device=config.device,
        dtype=dtype,
        seed=config.seed,
        **config.budget.finetune,
    )
    write_json(out / "timing.json", {"seconds": round(time.perf_counter() - started, 2)})


def _unlearn(
    config: MovieLensDemoConfig, bench_dir: Path, target: str, method: Method, dtype: str | None, out: Path
) -> None:
    from ..recommendation.benchmark import part_path
    from ..training import UnlearnConfig, run_unlearning

    b = config.budget
    settings = {"retain": str(part_path(bench_dir, "train_retain")), **method.settings}
    if settings["objective"] == "e2urec":
        settings["objective_options"] = dict(b.e2urec)
    started = time.perf_counter()
    run_unlearning(
        UnlearnConfig(
            out=str(out / "run"),
            model=target,
            forget=str(part_path(bench_dir, "train_forget")),
            save_steps=0,
            seed=config.seed,
            device=config.device,
            dtype=dtype,
            **{"max_length": 384, **b.unlearn},
            **settings,
        )
    )
    write_json(out / "timing.json", {"seconds": round(time.perf_counter() - started, 2)})


def _score_cud(config: MovieLensDemoConfig, bench_dir: Path, target: str, dtype: str | None, out: Path) -> None:
    from ..models import load_model
    from ..recommendation.benchmark import load_part, part_path
    from ..scorers.cud import CUDScorer
    from ..scoring import score_samples
    from ..stratify import group_scores, metadata_path, stratify_groups, write_split

    b = config.budget
    cud = dict(b.cud)
    max_length = int(b.unlearn.get("max_length", 384))
    anchor_options = {
        **b.anchor_unlearn,
        "retain": str(part_path(bench_dir, "anchor_retain")),
        "max_length": max_length,
        "save_steps": 0,
        **({"dtype": dtype} if dtype else {}),
    }
    scorer = CUDScorer(
        anchor_data=load_part(bench_dir, "anchor_pool"),
        objectives=cud.pop("objectives"),
        seeds=cud.pop("seeds"),
        model_spec=target,
        unlearn_options=anchor_options,
        max_length=max_length,
        answer_tokens=1,
        progress=True,
        **cud,
    )
    samples = load_part(bench_dir, "train_forget")
    model, tok = load_model(target, device=config.device)
    rows = score_samples(scorer, samples, model=model, tokenizer=tok, scorer_name="cud")
    del model
    write_jsonl(out / "scores.jsonl", rows)
    meta = {
        "scorer": "cud",
        "data": str(part_path(bench_dir, "train_forget")),
        "rows": len(rows),
        **scorer.last_metadata,
    }
    write_json(metadata_path(out / "scores.jsonl"), meta)
    n = b.forget_users // 2
    easy, hard, easy_users, hard_users = stratify_groups(
        rows, samples, "user_id", n, n, where=str(out / "scores.jsonl"), meta=meta
    )
    write_split(out / "easy.json", easy)
    write_split(out / "hard.json", hard)
    write_json(
        out / "users.json",
        {
            "easy": [g["group"] for g in easy_users],
            "hard": [g["group"] for g in hard_users],
            "scores": group_scores(rows, samples, "user_id", meta=meta),
        },
    )


def _train_sharded(config: MovieLensDemoConfig, bench_dir: Path, dtype: str | None, out: Path) -> None:
    from ..recommendation.sharded import train_sharded

    b = config.budget
    started = time.perf_counter()
    train_sharded(
        bench_dir,
        out / "sharded",
        model=config.model,
        shards=b.shards,
        partition="balanced",
        aggregator=b.aggregator,
        aggregator_options=dict(b.aggregator_options),
        aggregator_prompts=b.aggregator_prompts,
        seed=config.seed,
        device=config.device,
        **{**b.finetune, **({"dtype": dtype} if dtype else {})},
    )
    write_json(out / "timing.json", {"seconds": round(time.perf_counter() - started, 2)})


def _unlearn_sharded(config: MovieLensDemoConfig, trained: Path, users: list[int], out: Path) -> None:
    from ..recommendation.sharded import copy_sharded

    report = copy_sharded(trained / "sharded", out / "sharded").unlearn(users, device=config.device)
    write_json(out / "timing.json", {"seconds": report.seconds, "report": report.to_json()})


def _evaluate(
    config: MovieLensDemoConfig,
    bench_dir: Path,
    out: Path,
    *,
    model: str | None = None,
    adapter: str | None = None,
    sharded: Path | None = None,
    reference: str | None = None,
) -> None:
    """The two MovieLens tasks through lm-eval (the library's evaluate, with the task metadata
    that `unlearn eval` has no flag for); ``reference`` None: save this model's forget
    predictions as the JSD reference (the retrain model)."""
    from lm_eval.models.huggingface import HFLM

    from ..evaluation import lm_eval_runner as runner
    from ..evaluation import rec_metrics as rm
    from ..models import load_model, pick_device, resolve_model

    b = config.budget
    tokenizer = resolve_model(config.model if sharded else model)
    prepared = runner.prepare(
        list(REC_TASKS), metadata={"tokenizer": tokenizer, "rec_dir": str(bench_dir), "retrain_reference": reference}
    )
    if sharded is not None:
        from ..recommendation.sharded import ShardedRecommender
        from ..recommendation.sharded_lm import ShardedRecommenderLM

        lm = ShardedRecommenderLM(ShardedRecommender(sharded), device=config.device, batch_size=b.eval_batch_size)
        model_args = {"pretrained": f"{config.model}-sharded", "sharded": str(sharded)}
    else:
        loaded, tok = load_model(model, device=config.device, adapter=adapter)
        lm = HFLM(pretrained=loaded, tokenizer=tok, batch_size=b.eval_batch_size, softmax_dtype="float32")
        model_args = {"pretrained": model, **({"peft": adapter} if adapter else {})}
    describe = {
        "model": model or str(sharded),
        "adapter": adapter,
        "device": pick_device(config.device),
        "batch_size": b.eval_batch_size,
        "retrain_reference": reference,
    }
    evaluation = runner.evaluate(lm, prepared, describe=describe, model_args=model_args)
    if reference is None:
        rm.reference_from_samples(
            evaluation.samples[FORGET_TASK], out / "reference.json", task=FORGET_TASK, model=model, adapter=adapter
        )
    runner.write_outputs(out, evaluation)


# ----------------------------------------------------------------------------- the run


@dataclass
class MovieLensDemoResult:
    out: Path
    results: dict
    table: str
    files: dict = field(default_factory=dict)


@contextlib.contextmanager
def _quiet_rec_tasks():
    """The forget task's "no retrain reference" warning: the retrain evaluation makes it."""
    logger = logging.getLogger("unlearn_plugins.recommendation.tasks")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def run_movielens_demo(config: MovieLensDemoConfig, *, stream=None) -> MovieLensDemoResult:
    """Every stage (cached), then the report in ``config.out`` (locked throughout)."""
    check_budget(config.budget)
    with folder_lock(config.out, f"--out {config.out}"), quiet_libraries(), _quiet_rec_tasks():
        return _run(config, stream=stream)


def _run(config: MovieLensDemoConfig, *, stream=None) -> MovieLensDemoResult:
    from ..models import cache_dir, native_dtype, resolve_model
    from ..recommendation.benchmark import FILES, read_info
    from . import movielens_report as report

    stream = stream or sys.stderr
    b = config.budget
    dtype = native_dtype(config.train_dtype, config.device, "--train-dtype")
    root = Path(config.cache_dir).expanduser() if config.cache_dir else cache_dir() / "demo"
    stages = Stages(root, total=10 + 2 * len(REC_METHODS), stream=stream)
    started = time.perf_counter()

    # 1. the benchmark
    settings = benchmark_settings(config)
    bench_key = digest(movielens_fingerprint(config.movielens_dir), dataclasses.asdict(settings))
    bench_dir = stages.run(
        f"MovieLens benchmark: {b.users} users, {b.forget_users} to forget",
        stages.folder("bench", "movielens", bench_key),
        lambda tmp: _build_benchmark(config, tmp),
    )
    info = read_info(bench_dir)
    content = {part: file_digest(bench_dir / name) for part, name in FILES.items()}
    base_path = resolve_model(config.model)  # converts the embedded model once (cached)
    base_key = model_key(base_path if Path(base_path).is_dir() else config.model)
    counts = info["counts"]

    # 2. the target and the retrain model
    models = {}
    for name, part in (("target", "train"), ("retrain", "train_retain")):
        key = digest(base_key, content[part], b.finetune, dtype, config.seed)
        folder = stages.run(
            f"fine-tune the {name} model on {counts[part]} prompts",
            stages.folder("rec", name, key),
            lambda tmp, part=part: _finetune(config, bench_dir, part, dtype, tmp),
        )
        models[name] = {"key": key, "model": str(folder / "run" / "merged"), "folder": folder}
    target = models["target"]["model"]

    # 3. evaluation: the retrain model first (its forget predictions are the JSD reference)
    evals = {}
    eval_settings = (list(REC_TASKS), b.eval_batch_size)
    key = digest(models["retrain"]["key"], bench_key, eval_settings)
    evals["retrain"] = stages.run(
        "evaluate the retrain model (and save the JSD reference)",
        stages.folder("receval", "retrain", key),
        lambda tmp: _evaluate(config, bench_dir, tmp, model=models["retrain"]["model"]),
    )
    reference = str(evals["retrain"] / "reference.json")
    ref_key = digest(Path(reference).read_text())

    def evaluate(name: str, label: str, model_k: str, **where) -> None:
        key = digest(model_k, ref_key, bench_key, eval_settings)
        evals[name] = stages.run(
            f"evaluate {label}",
            stages.folder("receval", name, key),
            lambda tmp: _evaluate(config, bench_dir, tmp, reference=reference, **where),
        )

    evaluate("target", "the target model", models["target"]["key"], model=target)

    # 4. CUD scores of the forget users' prompts, per user
    cud_key = digest(
        models["target"]["key"],
        content["train_forget"],
        content["anchor_pool"],
        content["anchor_retain"],
        b.cud,
        b.anchor_unlearn,
        b.unlearn.get("max_length"),
        dtype,
    )
    cud_dir = stages.run(
        f"CUD scores of the {counts['train_forget']} prompts of the {b.forget_users} forget users",
        stages.folder("reccud", "forget", cud_key),
        lambda tmp: _score_cud(config, bench_dir, target, dtype, tmp),
    )

    # 5. unlearning with E2URec, NegGrad and the bad teacher (one budget), each evaluated
    runs = {}
    for method in REC_METHODS:
        extra = b.e2urec if method.settings["objective"] == "e2urec" else None
        key = digest(
            models["target"]["key"],
            content["train_forget"],
            content["train_retain"],
            method.settings,
            extra,
            b.unlearn,
            dtype,
            config.seed,
        )
        folder = stages.run(
            f"unlearn with {method.label}",
            stages.folder("recrun", method.name, key),
            lambda tmp, m=method: _unlearn(config, bench_dir, target, m, dtype, tmp),
        )
        runs[method.name] = {"key": key, "adapter": str(folder / "run"), "folder": folder}
    for method in REC_METHODS:
        evaluate(
            method.name, method.label, runs[method.name]["key"], model=target, adapter=runs[method.name]["adapter"]
        )

    # 6. RecEraser: shards, then the forget users unlearned from a copy
    shard_settings = (
        b.shards,
        b.aggregator,
        b.aggregator_prompts,
        b.aggregator_options,
        b.finetune,
        dtype,
        config.seed,
    )
    trained_key = digest(base_key, content["train"], shard_settings)
    trained = stages.run(
        f"RecEraser: train {b.shards} shards ({b.aggregator} aggregator)",
        stages.folder("recshards", "trained", trained_key),
        lambda tmp: _train_sharded(config, bench_dir, dtype, tmp),
    )
    forget_users = list(info["forget_users"])
    unlearned_key = digest(trained_key, forget_users)
    unlearned = stages.run(
        f"RecEraser: unlearn the {len(forget_users)} forget users (retrain their shards)",
        stages.folder("recshards", "unlearned", unlearned_key),
        lambda tmp: _unlearn_sharded(config, trained, forget_users, tmp),
    )
    evaluate("receraser", "the RecEraser ensemble after unlearning", unlearned_key, sharded=unlearned / "sharded")

    # 7. report
    stages.n += 1
    print(f"[{stages.n}/{stages.total}] report -> {config.out}", file=stream, flush=True)
    seconds = {name: json.loads((m["folder"] / "timing.json").read_text())["seconds"] for name, m in models.items()}
    seconds.update({name: json.loads((r["folder"] / "timing.json").read_text())["seconds"] for name, r in runs.items()})
    sharded_timing = {
        "trained": json.loads((trained / "timing.json").read_text()),
        "unlearned": json.loads((unlearned / "timing.json").read_text()),
    }
    seconds["receraser"] = sharded_timing["unlearned"]["seconds"]
    results, table, files = report.write_report(
        Path(config.out),
        config=config,
        dtype=dtype,
        bench_dir=bench_dir,
        info=info,
        methods=REC_METHODS,
        evals=evals,
        reference=reference,
        cud_dir=cud_dir,
        seconds=seconds,
        sharded=sharded_timing,
        models={k: {"key": v["key"], "model": v["model"]} for k, v in models.items()},
        runs={k: {"key": v["key"], "adapter": v["adapter"]} for k, v in runs.items()},
        sharded_dirs={"trained": str(trained / "sharded"), "unlearned": str(unlearned / "sharded")},
        timings=stages.timings,
        wall_s=time.perf_counter() - started,
    )
    return MovieLensDemoResult(Path(config.out), results, table, files)


__all__ = [
    "MovieLensDemoConfig",
    "run_movielens_demo",
    "REC_BUDGETS",
    "REC_METHODS",
    "RecBudget",
    "check_budget",
]
