"""`unlearn stratify`: easy / hard forget splits from a score file of `unlearn score`: the
--easy lowest-scored samples of --data in OUT/easy.json, the --hard highest-scored in
OUT/hard.json (TOFU's format, perturbed answers kept), and OUT/stratify.json naming them
with their scores. With --group-by FIELD, the easiest and hardest groups (users) by the mean
score of their samples. The splits are --forget of `unlearn run` and --forget-split of
`unlearn eval`."""

from __future__ import annotations

from ..errors import UnlearnError
from .common import add_command, add_data_options, check_int, check_out_file, check_out_folder

EXAMPLE = """examples:
  unlearn stratify cud.jsonl --data tofu:forget01 --easy 5 --hard 5 --out strata
  unlearn run --forget strata/hard.json --retain tofu:retain99 --objective npo --out npo-hard
  unlearn stratify cud.jsonl --data ml/train_forget.json --group-by user_id --easy 2 --hard 2 --out users
"""


def add_parser(sub) -> None:
    p = add_command(
        sub, "stratify", "write the N easiest and N hardest samples of a score file as TOFU splits", __doc__, EXAMPLE
    )
    p.add_argument("scores", help="JSON-lines output of `unlearn score`")
    p.add_argument("--easy", type=int, required=True, help="number of lowest-score samples (groups with --group-by)")
    p.add_argument("--hard", type=int, required=True, help="number of highest-score samples (groups with --group-by)")
    p.add_argument(
        "--group-by",
        default=None,
        metavar="FIELD",
        help="rank groups of samples sharing this data field (e.g. user_id: easy / hard users) by the "
        "mean score of their samples; each split holds every sample of its groups",
    )
    p.add_argument(
        "--objective",
        default=None,
        help="rank by this objective's CUD score (score files of cud with per_objective=true)",
    )
    add_data_options(p)
    p.add_argument("--out", required=True, help="folder for easy.json, hard.json, stratify.json")
    p.add_argument(
        "--plot",
        action="store_true",
        help="also write circuits.png (easy vs hard circuit edges by layer; needs cud scores)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from ..data.qa import load_split
    from ..files import write_json
    from ..stratify import read_metadata, read_scores, split_anchor_rows, stratify, with_perturbed_fields, write_split

    check_int("--easy", args.easy, 0)
    check_int("--hard", args.hard, 0)
    if args.easy + args.hard == 0:
        raise UnlearnError("--easy 0 --hard 0: nothing to write; ask for at least one sample")
    check_out_file("scores", args.scores)
    check_out_folder("--out", args.out)
    rows = read_scores(args.scores)
    meta = read_metadata(args.scores)
    samples = with_perturbed_fields(load_split(args.data, args.tofu_dir), args.data, args.tofu_dir)
    if args.group_by:
        return _run_groups(args, rows, samples, meta)
    easy, hard = stratify(rows, samples, args.easy, args.hard, where=args.scores, meta=meta, objective=args.objective)
    _, dropped = split_anchor_rows(rows, samples, meta)
    if dropped:
        print(
            f"dropped {len(dropped)} of {len(rows)} rows: CUD anchors (chosen by how they behaved under "
            f"unlearning) never go into a split (indices {', '.join(str(r['index']) for r in dropped)})"
        )
    out = Path(args.out)
    write_split(out / "easy.json", easy)
    write_split(out / "hard.json", hard)
    score_of = {r["index"]: r["score"] for r in rows}
    write_json(
        out / "stratify.json",
        {
            "scores": str(args.scores),
            "data": args.data,
            "objective": args.objective,
            "dropped_anchors": [r["index"] for r in dropped],
            "easy": [{"index": s.index, "score": score_of[s.index]} for s in easy],
            "hard": [{"index": s.index, "score": score_of[s.index]} for s in hard],
        },
    )
    print(f"easy: {len(easy)} samples -> {out / 'easy.json'}; hard: {len(hard)} samples -> {out / 'hard.json'}")
    if args.plot:
        from ..circuits.plot import plot_easy_hard

        picked = {r["index"]: r for r in rows}
        plot_easy_hard([picked[s.index] for s in easy], [picked[s.index] for s in hard], out / "circuits.png")
        print(f"circuit plot -> {out / 'circuits.png'}")
    return 0


def _run_groups(args, rows, samples, meta) -> int:
    """--group-by: the easiest and hardest groups (users) by their samples' mean score."""
    from pathlib import Path

    from ..files import write_json
    from ..stratify import stratify_groups, write_split

    easy, hard, easy_groups, hard_groups = stratify_groups(
        rows, samples, args.group_by, args.easy, args.hard, where=args.scores, meta=meta, objective=args.objective
    )
    out = Path(args.out)
    write_split(out / "easy.json", easy)
    write_split(out / "hard.json", hard)

    def shown(groups):
        return [
            {"group": g["group"], "score": g["score"], "scored_samples": g["scored"], "samples": len(g["indices"])}
            for g in groups
        ]

    write_json(
        out / "stratify.json",
        {
            "scores": str(args.scores),
            "data": args.data,
            "objective": args.objective,
            "group_by": args.group_by,
            "aggregation": "mean",
            "easy": shown(easy_groups),
            "hard": shown(hard_groups),
        },
    )
    print(
        f"easy: {len(easy_groups)} groups ({args.group_by}), {len(easy)} samples -> {out / 'easy.json'}; "
        f"hard: {len(hard_groups)} groups, {len(hard)} samples -> {out / 'hard.json'}"
    )
    return 0
