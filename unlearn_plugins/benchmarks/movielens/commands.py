"""`unlearn movielens`: write the MovieLens recommendation-unlearning benchmark: one prompt
per rating (the user's latest rated movies and a target movie; answer Yes or No), each user's
ratings split by time into train / valid / test, a seeded fraction of the users asking to be
forgotten and CUD's anchor users. Every part is a TOFU-format JSON-lines file for `unlearn
finetune / run / score / stratify` and the lm-eval tasks movielens_rec / movielens_rec_forget."""

from __future__ import annotations

from unlearn_plugins.commands.common import add_command, check_int, check_out_folder

from .data import add_movielens_dir_option

EXAMPLE = """examples:
  unlearn movielens --budget --out ml
  unlearn finetune --data ml/train.json --merge --out ml-target
  unlearn run --model ml-target/merged --forget ml/train_forget.json --retain ml/train_retain.json \\
      --objective grad_ascent --out ml-negrad
  unlearn movielens --movielens-dir ml-1m --users 500 --forget-fraction 0.2 --out ml1m
"""


def add_parser(sub) -> None:
    from .benchmark import BenchmarkSettings

    d = BenchmarkSettings()
    p = add_command(
        sub, "movielens", "write the MovieLens recommendation-unlearning benchmark (prompt files)", __doc__, EXAMPLE
    )
    p.add_argument("--out", required=True, help="folder for train.json, train_forget.json, test_retain.json, ...")
    add_movielens_dir_option(p)
    p.add_argument(
        "--budget",
        action="store_true",
        help="the CPU-budget subsample (100 users, 10 training and 5 test prompts each); the flags below override it",
    )
    p.add_argument("--history", type=int, default=None, help=f"K, rated movies shown in a prompt (default {d.history})")
    p.add_argument(
        "--min-history", type=int, default=None, help=f"earlier ratings a prompt needs (default {d.min_history})"
    )
    p.add_argument(
        "--forget-fraction",
        type=float,
        default=None,
        help=f"fraction of users whose interactions are forgotten (default {d.forget_fraction})",
    )
    p.add_argument("--seed", type=int, default=None, help=f"seed of every draw (default {d.seed})")
    p.add_argument("--users", type=int, default=None, help="keep a seeded sample of this many users (default: all)")
    p.add_argument("--max-train-per-user", type=int, default=None, help="keep each user's N latest training prompts")
    p.add_argument("--max-eval-per-user", type=int, default=None, help="keep each user's N latest valid/test prompts")
    p.add_argument(
        "--anchor-users",
        type=int,
        default=None,
        help="retained users in CUD's anchor pool (default: as many as forgotten)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    import dataclasses
    from pathlib import Path

    from unlearn_plugins.errors import UnlearnError

    from .benchmark import FILES, BenchmarkSettings, build_benchmark
    from .data import load_movielens
    from .recipes import BUDGET_SETTINGS

    check_out_folder("--out", args.out)
    if (Path(args.out) / "benchmark.json").exists():
        raise UnlearnError(f"--out {args.out} already holds a benchmark (benchmark.json); choose another folder")
    base = BUDGET_SETTINGS if args.budget else BenchmarkSettings()
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(BenchmarkSettings)
        if getattr(args, f.name, None) is not None
    }
    for name in ("history", "min_history", "users", "max_train_per_user", "max_eval_per_user", "anchor_users"):
        if name in given:
            check_int(f"--{name.replace('_', '-')}", given[name], 1)
    settings = dataclasses.replace(base, **given)
    bench = build_benchmark(load_movielens(args.movielens_dir), settings)
    out = bench.write(args.out)
    counts = ", ".join(f"{name} {len(items)}" for name, items in bench.parts.items())
    print(
        f"MovieLens benchmark ({bench.source['layout']}, {len(bench.users)} users, {len(bench.forget_users)} "
        f"forgotten) -> {out}: {counts}"
    )
    print(
        f"target: unlearn finetune --data {out / FILES['train']} --merge ...; forget request: "
        f"--forget {out / FILES['train_forget']} --retain {out / FILES['train_retain']}; lm-eval: "
        f'--metadata \'{{"rec_dir": "{out}"}}\''
    )
    return 0
