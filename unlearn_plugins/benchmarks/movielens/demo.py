"""`unlearn demo --benchmark movielens`: recommendation unlearning on an LLM recommender:
MovieLens prompts, target and retrain models, E2URec, NegGrad, Bad-T and RecEraser (sharded),
test / forget AUC and JSD to the retrain model through lm-eval, CUD-easy vs CUD-hard forget
users, and a report. It is a study (demo.toml beside this module; `unlearn study demo-movielens
--dry-run`), run through the study's cells and cache; `unlearn demo` (unlearn_plugins.commands.demo)
reaches this module through the benchmark's ``demo`` part."""

from __future__ import annotations

from unlearn_plugins.commands.common import check_int, check_out_folder
from unlearn_plugins.errors import UnlearnError

from .data import add_movielens_dir_option

#: the demo's study (demo.toml) and its variant for --fast
STUDY = "demo-movielens"
FAST = "fast"
#: the default --out
OUT = "unlearn-demo-movielens"
#: this demo's own options: (flag, attribute)
OPTIONS = (
    ("--movielens-dir", "movielens_dir"),
    ("--users", "users"),
    ("--train-per-user", "train_per_user"),
    ("--eval-per-user", "eval_per_user"),
    ("--forget-fraction", "forget_fraction"),
    ("--shards", "shards"),
    ("--aggregator", "aggregator"),
)


def add_arguments(parser) -> None:
    """This demo's options, in their own group of `unlearn demo --help`."""
    rec = parser.add_argument_group(
        "--benchmark movielens (defaults: the study unlearn_plugins/benchmarks/movielens/demo.toml)"
    )
    add_movielens_dir_option(rec)
    rec.add_argument("--users", type=int, default=None, help="MovieLens users sampled (default: 20; 8 with --fast)")
    rec.add_argument(
        "--train-per-user", type=int, default=None, help="each user's latest training prompts (default: 4)"
    )
    rec.add_argument("--eval-per-user", type=int, default=None, help="each user's latest test prompts (default: 2)")
    rec.add_argument(
        "--forget-fraction",
        type=float,
        default=None,
        help="fraction of the users forgotten (default: 0.2; 0.25 with --fast)",
    )
    rec.add_argument("--shards", type=int, default=None, help="RecEraser's shards of users (default: 3; 2 with --fast)")
    rec.add_argument(
        "--aggregator",
        choices=("attention", "average"),
        default=None,
        help="RecEraser's attention or SISA's average over the shards (default: attention)",
    )


def movielens_data(args) -> dict:
    """The MovieLens demo's study tables (its --fast variant's) with this command's options in
    them (--train-dtype is added by :func:`movielens_study`)."""
    from pathlib import Path

    from unlearn_plugins.study.spec import read_study_data

    from .study.source import forget_count

    _, data = read_study_data(STUDY, FAST if args.fast else None)
    model = args.model
    if Path(model).expanduser().exists():  # a folder given on the command line: from here, not the study file
        model = str(Path(model).expanduser().resolve())
    data["model"]["base"] = model
    bench = data["benchmark"]
    for attr in ("users", "train_per_user", "eval_per_user", "forget_fraction"):
        if getattr(args, attr) is not None:
            bench[attr] = getattr(args, attr)
    if args.movielens_dir:
        bench["movielens_dir"] = str(Path(args.movielens_dir).expanduser().resolve())
    for attr in ("shards", "aggregator"):
        if getattr(args, attr) is not None:
            data["sharded"][attr] = getattr(args, attr)
    # CUD-easy and CUD-hard: half the forget users each
    data["cud"]["strata"] = forget_count(bench["users"], bench["forget_fraction"]) // 2
    return data


def check_movielens_budget(data: dict) -> None:
    """What the stages need of the sizes, checked before any of them runs (named as the options)."""
    from .study.source import forget_count

    bench, sharded = data["benchmark"], data["sharded"]
    users, fraction, per_user = bench["users"], bench["forget_fraction"], bench["train_per_user"]
    anchor_users = bench.get("anchor_users", 1)
    if users < 4:
        raise UnlearnError(f"--users {users}: the demo needs at least 4 users (forgotten, retained, anchor)")
    if not 0 < fraction < 1:
        raise UnlearnError(f"--forget-fraction {fraction}: must be between 0 and 1 (exclusive)")
    forget_users = forget_count(users, fraction)
    if forget_users < 2:
        raise UnlearnError(
            f"--forget-fraction {fraction} of --users {users} forgets {forget_users} user; "
            f"CUD-easy vs CUD-hard needs at least 2 forgotten users"
        )
    retained = users - forget_users
    if retained - anchor_users < 1:
        raise UnlearnError(
            f"--users {users}: {forget_users} forgotten and {anchor_users} CUD anchor user(s) "
            f"leave no retained user to train on"
        )
    if anchor_users * per_user < 4:
        raise UnlearnError(
            f"--train-per-user {per_user}: CUD's anchor pool ({anchor_users} user(s) x "
            f"{per_user} prompts) needs at least 4 prompts"
        )
    if not 1 <= sharded["shards"] <= retained:
        raise UnlearnError(f"--shards {sharded['shards']}: must be between 1 and the {retained} retained users")


def check(args) -> None:
    """The options' ranges and sizes, before any stage runs."""
    import math

    from .data import resolve_movielens_dir

    for flag, attr in (
        ("--users", "users"),
        ("--train-per-user", "train_per_user"),
        ("--eval-per-user", "eval_per_user"),
        ("--shards", "shards"),
    ):
        if getattr(args, attr) is not None:
            check_int(flag, getattr(args, attr), 1)
    if args.forget_fraction is not None and not (math.isfinite(args.forget_fraction) and 0 < args.forget_fraction < 1):
        raise UnlearnError(f"--forget-fraction {args.forget_fraction}: must be between 0 and 1 (exclusive)")
    data = movielens_data(args)
    check_movielens_budget(data)
    if args.movielens_dir is not None:
        resolve_movielens_dir(args.movielens_dir)  # a folder that is not there: said before any stage
    if args.users is not None:  # more than the data has: said before the target is trained
        from .study.source import too_many_users

        if problem := too_many_users(args.users, data["benchmark"].get("movielens_dir")):
            raise UnlearnError(f"--users {problem}")
    check_out_folder("--out", args.out)
    check_out_folder("--cache-dir", args.cache_dir)


def movielens_study(args, train_dtype: str | None):
    """The MovieLens demo's study with this command's options in its tables; the demo's config
    and budget as results.json records them."""
    from unlearn_plugins.study.spec import load_study

    from .report import study_budget

    data = movielens_data(args)
    for table in (data["target"].setdefault("finetune", {}), data["budget"], data["cud"]["unlearn"]):
        if train_dtype:  # the weights under LoRA while training: every training run, the anchor runs too
            table["dtype"] = train_dtype
    study = load_study(STUDY, data=data)
    config = {
        "out": args.out or OUT,
        "model": args.model,
        "fast": bool(args.fast),
        "movielens_dir": args.movielens_dir,
        "users": args.users,
        "train_per_user": args.train_per_user,
        "eval_per_user": args.eval_per_user,
        "forget_fraction": args.forget_fraction,
        "shards": args.shards,
        "aggregator": args.aggregator,
        "train_dtype": args.train_dtype or "auto",
        "device": args.device,
        "seed": study.movielens.seed,
        "cache_dir": args.cache_dir,
    }
    return study, config, study_budget(study)


def run(args) -> int:
    """The MovieLens demo: its study's cells built (cached) in this process, then its report."""
    from pathlib import Path

    from unlearn_plugins.commands.demo import build_and_report
    from unlearn_plugins.models import native_dtype

    from . import report as movielens_report

    out = Path(args.out or OUT)
    train_dtype = native_dtype(args.train_dtype or "auto", args.device, "--train-dtype")
    study, config, budget = movielens_study(args, train_dtype)
    options = {"config": config, "budget": budget, "train_dtype": train_dtype or "library default"}
    return build_and_report(study, args, out, movielens_report.study_report, **options)
