"""`unlearn score`: run a difficulty scorer and write one JSON line per sample."""

from __future__ import annotations

from ..errors import UnlearnError
from .common import add_data_options, add_model_options, parse_options


def add_parser(sub) -> None:
    p = sub.add_parser("score", help="score each sample's unlearning difficulty with a scorer plugin")
    p.add_argument("--scorer", required=True, help="scorer name (see `unlearn plugins`)")
    add_model_options(p)
    add_data_options(p)
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="scorer option (repeatable)")
    p.add_argument("--anchor-data", default=None, metavar="SPEC",
                   help="cud: the anchor pool (tofu:SPLIT, a file, or 'self'), disjoint from --data "
                        "(default for TOFU data: tofu:forget10, else tofu:retain90[3200:3600])")
    p.add_argument("--out", required=True, help="output JSON-lines file (plus OUT.meta.json, what the scorer recorded)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..files import write_json, write_jsonl
    from ..host import create
    from ..interfaces import DIFFICULTY_SCORER
    from ..scoring import score_samples, score_sharded
    from ..stratify import metadata_path
    from ..data.tofu import load_split
    from ..models import load_model
    from ..sharding import launch_group, process_device

    # under `accelerate launch` / torchrun: one shard per process, one merged output (main process)
    group = launch_group(cpu=(args.device or "").startswith("cpu"))
    is_main = group is None or group.is_main
    options = parse_options(args.option)
    if _accepts(args.scorer, "progress") and ("progress" not in options or not is_main):
        options["progress"] = is_main  # a progress bar on the command line, from the main process only
    if args.anchor_data is not None:
        if not _accepts(args.scorer, "anchor_data"):
            raise UnlearnError(f"--anchor-data: scorer {args.scorer!r} has no anchor pool (option anchor_data)")
        options["anchor_data"] = args.anchor_data
    if args.tofu_dir and _accepts(args.scorer, "tofu_dir"):
        options.setdefault("tofu_dir", args.tofu_dir)

    def setup():
        scorer = create(DIFFICULTY_SCORER, args.scorer, **options)  # fail fast on a bad name/options
        samples = load_split(args.data, args.tofu_dir)
        model, tok = load_model(args.model, device=process_device(group, args.device), dtype=args.dtype,
                                trust_remote_code=args.trust_remote_code)
        return scorer, samples, model, tok

    if group is None:
        scorer, samples, model, tok = setup()
        rows = score_samples(scorer, samples, model=model, tokenizer=tok, scorer_name=args.scorer)
        write_jsonl(args.out, rows)
        write_json(metadata_path(args.out), _metadata(args, scorer, rows))
    else:
        result = {}
        group.everywhere(lambda: result.update(zip(("scorer", "samples", "model", "tok"), setup())), "loading")
        rows = score_sharded(result["scorer"], result["samples"], model=result["model"], tokenizer=result["tok"],
                             group=group, scorer_name=args.scorer)
        def write():
            if is_main:
                write_jsonl(args.out, rows)
                write_json(metadata_path(args.out), _metadata(args, result["scorer"], rows))

        group.everywhere(write, f"writing {args.out}")
        if not is_main:
            return 0
    scores = [r["score"] for r in rows]
    where = f" ({group.count} processes)" if group is not None else ""
    print(f"scored {len(rows)} samples with {args.scorer!r}{where}: min {min(scores):.4g}, "
          f"mean {sum(scores) / len(scores):.4g}, max {max(scores):.4g} -> {args.out}")
    return 0


def _metadata(args, scorer, rows) -> dict:
    """The sidecar OUT.meta.json: what was scored, plus what the scorer recorded (``last_metadata``),
    e.g. cud's anchors and their votes; always written, so a stale one never describes new rows."""
    return {"scorer": args.scorer, "model": args.model, "data": args.data, "rows": len(rows),
            **(getattr(scorer, "last_metadata", None) or {})}


def _accepts(name: str, option: str) -> bool:
    import inspect

    from ..host import get_component
    from ..interfaces import DIFFICULTY_SCORER

    try:
        return option in inspect.signature(get_component(DIFFICULTY_SCORER, name)).parameters
    except (TypeError, ValueError, KeyError):
        return False
