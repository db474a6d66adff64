"""`unlearn demo`: the main job end to end on the embedded model.

--benchmark tofu (default): a small TOFU benchmark, target models, CUD difficulty scores,
ReGLU and two baselines on the same budget, TOFU Forget Quality and Model Utility through
lm-eval, and a report. It is a study (unlearn_plugins/demo/demo.toml; `unlearn study demo
--dry-run` shows its cells), run through the study's cells, cache and workers.

--benchmark movielens: recommendation unlearning on an LLM recommender: MovieLens prompts,
target and retrain models, E2URec, NegGrad, Bad-T and RecEraser (sharded), test / forget AUC
and JSD to the retrain model through lm-eval, CUD-easy vs CUD-hard forget users, and a report.
It is a study too (unlearn_plugins/benchmarks/movielens/demo.toml; `unlearn study demo-movielens
--dry-run`). A registered benchmark with a demo part adds its own --benchmark.

Every stage is cached ($UNLEARN_CACHE_DIR/demo): a second run, or a run after Ctrl-C,
continues where the last one stopped."""

from __future__ import annotations

from pathlib import Path

from ..errors import UnlearnError
from ..models import DTYPE_CHOICES
from .common import add_command, check_int, check_out_folder, device_option

#: the TOFU demo's study (unlearn_plugins/demo/demo.toml) and its variant for --fast
STUDY = "demo"
FAST = "fast"
#: the study whose methods --methods adds to the demo's table (every built-in objective)
PEERS = "peer_methods"

EXAMPLE = """examples:
  unlearn demo --out demo-report                    # about 13 minutes on 2 CPU cores
  unlearn demo --fast --out smoke                   # every stage, minimal work
  unlearn demo --robustness --out demo-report       # + membership inference and attacks per model
  unlearn demo --authors 5 --forget-authors 2 --tofu-dir ../shared/data/tofu
  unlearn demo --methods npo,rmu,lunar --out demo-report   # + those methods of the peer_methods study
  unlearn demo --benchmark movielens --out demo-movielens
"""

#: options of one benchmark only: (flag, attribute)
TOFU_ONLY = (
    ("--authors", "authors"),
    ("--forget-authors", "forget_authors"),
    ("--data", "data"),
    ("--tofu-dir", "tofu_dir"),
    ("--workers", "workers"),
    ("--eval-dtype", "eval_dtype"),
    ("--scoring", "scoring"),
    ("--robustness", "robustness"),
    ("--methods", "methods"),
)


def add_parser(sub) -> None:
    p = add_command(sub, "demo", "run the whole pipeline on the embedded model and write a report", __doc__, EXAMPLE)
    demos = _demos()
    p.add_argument(
        "--benchmark",
        choices=("tofu", *demos),
        default="tofu",
        help="; ".join(["tofu: LLM unlearning on TOFU authors", *(f"{n}: {b.summary}" for n, b in demos.items())])
        + " (default: tofu)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="report folder (default: unlearn-demo, or unlearn-demo-movielens with --benchmark movielens)",
    )
    p.add_argument("--fast", action="store_true", help="a smoke-test budget: every stage, minimal work")
    p.add_argument(
        "--model", default="smollm2-135m", help="base model: the embedded alias (default), a local folder or a hub id"
    )
    p.add_argument("--device", default=None, type=device_option, help="cpu, cuda (default: cuda if available)")
    p.add_argument("--cache-dir", default=None, help="stage cache (default: $UNLEARN_CACHE_DIR/demo)")
    p.add_argument(
        "--train-dtype",
        choices=DTYPE_CHOICES,
        default=None,
        help="base weights under LoRA while training; auto: bf16 on CUDA and on CPUs with native bf16 "
        "(AVX512-BF16 / AMX), else fp32 (default: auto)",
    )
    tofu = p.add_argument_group("--benchmark tofu")
    tofu.add_argument(
        "--authors", type=int, default=None, help="authors in the benchmark, 20 QA each (default: 3; 2 with --fast)"
    )
    tofu.add_argument("--forget-authors", type=int, default=None, help="how many of them to forget (default: 1)")
    tofu.add_argument(
        "--data",
        choices=("auto", "tofu", "generated"),
        default=None,
        help="auto: TOFU (--tofu-dir, $UNLEARN_TOFU_DIR, else the TOFU authors shipped with the "
        "package, else the hub), and if none has enough authors, generated fictitious authors "
        "(default: auto)",
    )
    tofu.add_argument(
        "--tofu-dir",
        default=None,
        help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the 3 TOFU authors shipped with the "
        "package; more authors: the hub)",
    )
    tofu.add_argument(
        "--workers",
        type=int,
        default=None,
        help="stages built at once, each in a worker process with its share of the cores (default: 2, "
        "1 on a 1-core machine); 1: one after the other in this process",
    )
    tofu.add_argument(
        "--eval-dtype",
        choices=DTYPE_CHOICES,
        default=None,
        help="weights while evaluating (log-softmax stays fp32); auto as --train-dtype, as open-unlearning "
        "evaluates in bf16 (default: auto)",
    )
    from ..evaluation.config import SCORINGS, EvaluationConfig
    from ..options import config_defaults

    tofu.add_argument(
        "--scoring",
        choices=SCORINGS,
        default=None,
        help="prefix: each prompt scored once (PrefixSharedLM); hf: lm-eval's HFLM, the evaluation before "
        "prefix existed (the same numbers in fp32, differing by rounding in bf16) "
        f"(default: the study's, {config_defaults(EvaluationConfig)['scoring']})",
    )
    tofu.add_argument(
        "--robustness",
        action="store_true",
        default=None,
        help="also ask whether it is really forgotten: membership inference (AUCs, privleak, exact "
        "memorization) against a holdout author, and the forget probability / ROUGE-L under the "
        "paraphrase and format probes and after the relearn and int4 attacks, for every model "
        "(about 6 more minutes a model on 2 CPU cores)",
    )
    tofu.add_argument(
        "--methods",
        default=None,
        help="more rows in the demo's table: methods of the peer_methods study (`unlearn study peer_methods "
        "--dry-run`), comma-separated, or 'all', each on the demo's budget (default: none)",
    )
    for name in demos:
        _demo(name).add_arguments(p)
    p.set_defaults(func=run)


def _demos() -> dict:
    """The registered benchmarks with a demo part (:class:`..interfaces.Benchmark`), by name."""
    from ..host import benchmarks

    return {name: bench for name, bench in benchmarks().items() if bench.demo}


def _demo(name: str):
    from ..host import benchmark_part

    return benchmark_part(name, "demo")


def _refuse_other(args, flags, benchmark: str) -> None:
    given = [flag for flag, attr in flags if getattr(args, attr) is not None]
    if given:
        raise UnlearnError(f"{', '.join(given)}: not an option of --benchmark {benchmark}")


def check_args(args) -> None:
    """Ranges and output paths, before any stage runs (the benchmark stage checks --authors
    against the authors its source has)."""
    from ..study.spec import read_study_data

    others = [(flag, attr) for name in _demos() if name != args.benchmark for flag, attr in _demo(name).OPTIONS]
    if args.benchmark != "tofu":
        _refuse_other(args, (*TOFU_ONLY, *others), args.benchmark)
        return _demo(args.benchmark).check(args)
    _refuse_other(args, others, "tofu")
    if args.authors is not None:
        check_int("--authors", args.authors, 2)  # one to forget, one to retain
    _, data = read_study_data(STUDY, FAST if args.fast else None)
    authors = args.authors if args.authors is not None else data["benchmark"]["authors"]
    if authors > 20:  # TOFU's forget10_perturbed and the generated authors both have 20
        source = "generated" if args.data == "generated" else "tofu"
        raise UnlearnError(f"--authors {authors}: the {source} source has 20 authors with every field")
    forget_authors = 1 if args.forget_authors is None else args.forget_authors
    check_int("--forget-authors", forget_authors, 1)
    if forget_authors >= authors:
        raise UnlearnError(
            f"--forget-authors {forget_authors} must be below --authors {authors} (at least one author is retained)"
        )
    if args.workers is not None:
        check_int("--workers", args.workers, 1)
    peer_methods(args.methods)
    check_out_folder("--out", args.out)
    check_out_folder("--cache-dir", args.cache_dir)


def peer_methods(value: str | None) -> list[dict]:
    """The method tables of the peer_methods study that ``--methods`` names ('all': every one),
    in the study's order."""
    if value is None:
        return []
    from ..study.spec import read_study_data

    _, data = read_study_data(PEERS, None)
    known = {m["name"]: m for m in data["methods"]}
    names = [n.strip() for n in value.split(",")]
    if value.strip() == "all":
        return list(known.values())
    if not all(names):
        raise UnlearnError(f"--methods {value!r}: give method names separated by commas, or 'all'")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnlearnError(
            f"--methods: no method {unknown[0]!r} in the peer_methods study; known: {', '.join(known)} (or 'all')"
        )
    return [known[n] for n in known if n in names]


def raise_failed(plan, results: dict) -> None:
    failed = [(cell, r) for cell, r in results.items() if r["status"] != "done"]
    if failed:
        cell, result = failed[0]
        log = f" (log: {result['log']})" if result.get("log") else ""
        raise UnlearnError(f"{plan.cells[cell].cell.label}: {result.get('error')}{log}")


def default_workers(device: str | None = None) -> int:
    """Two workers where there are two cores or more, else one; more only when asked
    (``--workers``): each worker holds a model of its own in memory. Cells on CUDA: at most one
    worker per GPU (two workers are not put on one card)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = max(1, min(2, cores))
    if device != "cpu":
        from ..study.executors import gpu_count

        workers = min(workers, gpu_count() or workers)
    return workers


def tofu_study(args, train_dtype: str | None, eval_dtype: str | None):
    """The demo's study with this command's options in its tables, and the budget of its
    description (its --fast variant's) as results.json records it."""
    from pathlib import Path

    from ..study.spec import load_study, read_study_data

    _, data = read_study_data(STUDY, FAST if args.fast else None)
    cud = data["cud"]
    # the study's own tables as written (the evaluation's and [cud]'s sizes: as read, defaults
    # included, once the study is loaded below)
    budget = {
        "authors": data["benchmark"]["authors"],
        "eval_size": None,
        "max_length": data["model"]["max_length"],
        "finetune": dict(data["target"]["finetune"]),
        "unlearn": dict(data["budget"]),
        "anchor_unlearn": dict(cud["unlearn"]),
        "cud": dict(cud["scorer"]),
        "easy_hard": None,
        "eval_batch_size": None,
        "gen_margin": None,
        "anchor_pool": None,
    }
    model = args.model
    if Path(model).expanduser().exists():  # a folder given on the command line: from here, not the study file
        model = str(Path(model).expanduser().resolve())
    data["model"]["base"] = model
    bench = data["benchmark"]
    if args.authors is not None:
        bench["authors"] = args.authors
    bench["forget_authors"] = [1 if args.forget_authors is None else args.forget_authors]
    bench["source"] = args.data or "auto"
    if args.tofu_dir and bench["source"] != "generated":  # (ignored with --data generated, as it always was)
        bench["tofu_dir"] = str(Path(args.tofu_dir).expanduser().resolve())
    for table in (data["target"]["finetune"], data["budget"], data["cud"]["unlearn"]):
        if train_dtype:  # the weights under LoRA while training: every training run, the anchor runs too
            table["dtype"] = train_dtype
    data.setdefault("evaluation", {})
    if eval_dtype:
        data["evaluation"]["dtype"] = eval_dtype
    if getattr(args, "scoring", None):
        data["evaluation"]["scoring"] = args.scoring
    if args.robustness:
        data["evaluation"]["robustness"] = True
    own = {m["name"] for m in data["methods"]}  # grad_diff is in both, on the same budget
    data["methods"] += [m for m in peer_methods(getattr(args, "methods", None)) if m["name"] not in own]
    study = load_study(STUDY, data=data)
    ev = study.evaluation
    budget.update(
        eval_size=ev.mu_size,
        easy_hard=study.cud.strata,
        eval_batch_size=ev.batch_size,
        gen_margin=ev.gen_margin,
        anchor_pool=study.cud.anchor_pool,
    )
    return study, budget


def run_tofu(args) -> int:
    """The TOFU demo: its study's cells built (cached), then the demo's report."""
    import sys

    from ..host import required_benchmark_part

    find_tofu = required_benchmark_part("tofu", "data").find_tofu
    from ..demo import report
    from ..models import native_dtype

    workers = args.workers if args.workers is not None else default_workers(args.device)
    out = Path(args.out or "unlearn-demo")
    train_dtype = native_dtype(args.train_dtype or "auto", args.device, "--train-dtype")
    eval_dtype = native_dtype(args.eval_dtype or "auto", args.device, "--eval-dtype")
    study, budget = tofu_study(args, train_dtype, eval_dtype)
    config = {
        "out": str(out),
        "model": args.model,
        "authors": args.authors,
        "forget_authors": 1 if args.forget_authors is None else args.forget_authors,
        "fast": bool(args.fast),
        "data": args.data or "auto",
        "tofu_dir": args.tofu_dir,
        "device": args.device,
        "seed": study.seeds[0],
        "cache_dir": args.cache_dir,
        "workers": workers,
        "train_dtype": args.train_dtype or "auto",
        "eval_dtype": args.eval_dtype or "auto",
        "robustness": bool(args.robustness),
        "methods": args.methods,
    }

    def notice() -> dict:
        """The report's notice when the demo runs on generated authors (said once the lock is held)."""
        if find_tofu(study.source, study.tofu_dir, study.authors) is not None:
            return {"notice": None}
        notice = (
            "--data generated: using generated fictitious authors in TOFU's format"
            if study.source == "generated"
            else "no TOFU data found (--tofu-dir / UNLEARN_TOFU_DIR names no folder with TOFU's files, or "
            f"--authors {study.authors} is more than the package ships and the hub is unreachable): using "
            "generated fictitious authors in TOFU's format"
        )
        print(f"notice: {notice}", file=sys.stderr, flush=True)
        return {"notice": notice}

    options = {"config": config, "budget": budget, "train_dtype": train_dtype or "library default"}
    return build_and_report(study, args, out, report.study_report, workers=workers, before=notice, **options)


def demo_cache(args) -> Path:
    """The demos' stage cache: --cache-dir, else the package's."""
    from ..models import cache_dir

    return Path(args.cache_dir).expanduser() if args.cache_dir else cache_dir() / "demo"


def build_and_report(study, args, out: Path, study_report, *, workers: int = 1, before=None, **options) -> int:
    """A demo's ``study`` built under --out's lock (cached stages reused; ``workers`` > 1: local
    worker processes), then its report written by ``study_report`` with ``options`` (and what
    ``before()``, called once the lock is held, returns); prints the table and the files."""
    import sys
    import time

    from ..files import folder_lock
    from ..process import quiet_libraries
    from ..study.runner import run_plan

    with folder_lock(out, f"--out {out}"), quiet_libraries():
        started = time.perf_counter()
        if before is not None:
            options = {**options, **before()}
        # --workers 1: every cell in this process, one after the other (no worker to start)
        executor = "local" if workers > 1 else "inline"
        cache = demo_cache(args)
        plan, results = run_plan(study, out=out, cache=cache, workers=workers, executor=executor, device=args.device)
        raise_failed(plan, results)
        print(f"report -> {out}", file=sys.stderr, flush=True)
        _, table, files = study_report(out, plan, results, wall_s=time.perf_counter() - started, **options)
    print(table)
    print(f"report -> {out}/ ({', '.join(sorted(files))})")
    return 0


def run(args) -> int:
    check_args(args)
    if args.benchmark == "tofu":
        return run_tofu(args)
    return _demo(args.benchmark).run(args)
