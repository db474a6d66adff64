"""`unlearn demo` (``--benchmark tofu``, the default): a small TOFU benchmark, target models, CUD
difficulty scores, ReGLU and two baselines on the same budget, TOFU Forget Quality and Model
Utility through lm-eval, and a report (:mod:`.demo_report`). It is a study (demo.toml beside this
module; `unlearn study demo --dry-run` shows its cells), run through the study's cells, cache and
workers; `unlearn demo` (unlearn_plugins.commands.demo) reaches this module through the
benchmark's ``demo`` part."""

from __future__ import annotations

from pathlib import Path

from unlearn_plugins.commands.common import check_int, check_out_folder
from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.models import DTYPE_CHOICES

#: this demo's own options: (flag, attribute)
OPTIONS = (
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

#: the demo's study (demo.toml) and its variant for --fast
STUDY = "demo"
FAST = "fast"
#: the study whose methods --methods adds to the demo's table (every built-in objective)
PEERS = "peer_methods"
#: the default --out
OUT = "unlearn-demo"
#: what `unlearn demo --help` says of --benchmark tofu
SUMMARY = "LLM unlearning on TOFU authors"


def add_arguments(parser) -> None:
    """This demo's options, in their own group of `unlearn demo --help`."""
    from unlearn_plugins.evaluation.config import SCORINGS, EvaluationConfig
    from unlearn_plugins.options import config_defaults

    tofu = parser.add_argument_group("--benchmark tofu")
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


def check(args) -> None:
    """Ranges and output paths, before any stage runs (the benchmark stage checks --authors
    against the authors its source has)."""
    from unlearn_plugins.study.spec import read_study_data

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
    from unlearn_plugins.study.spec import read_study_data

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


def tofu_study(args, train_dtype: str | None, eval_dtype: str | None):
    """The demo's study with this command's options in its tables, and the budget of its
    description (its --fast variant's) as results.json records it."""
    from unlearn_plugins.study.spec import load_study, read_study_data

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


def run(args) -> int:
    """The TOFU demo: its study's cells built (cached), then the demo's report."""
    import sys

    from unlearn_plugins.commands.demo import build_and_report, default_workers
    from unlearn_plugins.models import native_dtype

    from . import demo_report
    from .data import find_tofu

    workers = args.workers if args.workers is not None else default_workers(args.device)
    out = Path(args.out or OUT)
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
    return build_and_report(study, args, out, demo_report.study_report, workers=workers, before=notice, **options)
