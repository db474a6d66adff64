"""`unlearn logs`: open-unlearning's evaluation logs (TOFU_EVAL.json, MUSE_EVAL.json and their
summaries) from our evaluations, and theirs read here: a number computed with this project
beside open-unlearning's published ones, and their published retain-model logs as our Forget
Quality reference."""

from __future__ import annotations

from .common import add_command

EXAMPLE = """examples:
  unlearn eval --model M --tasks tofu_forget10 --out ev --open-unlearning-log   # writes ev/TOFU_EVAL.json too
  unlearn logs export ev                         # the same, for an evaluation already in ev/
  unlearn logs show saves/eval/tofu_retain90/TOFU_EVAL.json
  unlearn logs reference retain90/TOFU_EVAL.json --split forget10 --out retain_ref.json
  unlearn eval --model M --tasks tofu_forget10 --retain-reference retain_ref.json --out ev
"""


def add_parser(sub) -> None:
    p = add_command(
        sub,
        "logs",
        "write and read open-unlearning's evaluation logs (TOFU_EVAL.json, MUSE_EVAL.json)",
        __doc__,
        EXAMPLE,
    )
    verbs = p.add_subparsers(dest="logs_verb", metavar="VERB", required=True)
    export = verbs.add_parser("export", help="write open-unlearning's logs of an `unlearn eval --out` folder")
    export.add_argument("folder", help="an `unlearn eval --out` folder")
    export.add_argument("--out", default=None, help="where to write the logs (default: the evaluation's folder)")
    show = verbs.add_parser("show", help="print an open-unlearning log (_EVAL.json or _SUMMARY.json) as a table")
    show.add_argument("log", help="TOFU_EVAL.json, TOFU_SUMMARY.json, MUSE_EVAL.json or MUSE_SUMMARY.json")
    ref = verbs.add_parser(
        "reference", help="make a retain reference (for --retain-reference) from a retain model's TOFU_EVAL.json"
    )
    ref.add_argument("log", help="open-unlearning's TOFU_EVAL.json of the retain model")
    ref.add_argument(
        "--split", required=True, help="the forget split it was evaluated on: forget01, forget05, forget10"
    )
    ref.add_argument("--tofu-dir", default=None, help="TOFU's folder (default: $UNLEARN_TOFU_DIR)")
    ref.add_argument("--out", required=True, help="the reference file to write")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..evaluation import open_unlearning as ou

    if args.logs_verb == "export":
        for path in export(args.folder, args.out):
            print(path)
        return 0
    if args.logs_verb == "show":
        benchmark, log = ou.read_open_unlearning(args.log)
        print(ou.format_log(args.log, benchmark, log))
        return 0
    return make_reference(args)


def export(folder: str, out: str | None = None) -> list:
    """Write open-unlearning's logs of the evaluation in ``folder`` (into ``out``, default: beside
    lm-eval's results); returns the files written."""
    from ..errors import DataError
    from ..evaluation import open_unlearning as ou
    from ..evaluation.lm_eval_runner import read_outputs

    written = read_outputs(folder)
    logs = ou.to_open_unlearning(written.results, written.summary, written.samples)
    if not logs:
        raise DataError(f"{folder}: no TOFU or MUSE task in this evaluation: open-unlearning's logs cover those two")
    return ou.write_open_unlearning(out or folder, logs)


def make_reference(args) -> int:
    from pathlib import Path

    from ..data.qa import read_jsonl, resolve_tofu_dir
    from ..errors import DataError
    from ..evaluation import open_unlearning as ou
    from ..evaluation.reference import sample_key, write_reference
    from .common import check_out_file

    check_out_file("--out", args.out)
    benchmark, log = ou.read_open_unlearning(args.log)
    if benchmark != "TOFU":
        raise DataError(f"{args.log}: a retain reference is made from a TOFU log, not {benchmark}'s")
    ratios = ou.retain_truth_ratios(Path(args.log), log)
    split = args.split.removeprefix("tofu:").removesuffix("_perturbed")
    path = resolve_tofu_dir(args.tofu_dir) / f"{split}_perturbed.json"
    if not path.is_file():
        raise DataError(
            f"--split {args.split}: {path} not found (give a TOFU forget split: forget01, forget05, forget10)"
        )
    samples = read_jsonl(path)
    if len(samples) != len(ratios):
        raise DataError(
            f"{args.log} has {len(ratios)} forget truth ratios but {path} has {len(samples)} samples: "
            "give the --split the retain model was evaluated on"
        )
    task = f"tofu_{split}_truth_ratio" if split in ("forget01", "forget05", "forget10") else "tofu_forget_truth_ratio"
    write_reference(
        args.out,
        task=task,
        split=path.stem,
        keys=[sample_key(s.question, s.answer) for s in samples],
        truth_ratios=ratios,
        model=f"open-unlearning log {args.log}",
    )
    print(f"{args.out}: {len(ratios)} retain truth ratios of {path.stem} from {args.log}")
    return 0
