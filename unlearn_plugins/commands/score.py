"""`unlearn score`: run a difficulty scorer and write one JSON line per sample."""

from __future__ import annotations

from .common import add_data_options, add_model_options, parse_options


def add_parser(sub) -> None:
    p = sub.add_parser("score", help="score each sample's unlearning difficulty with a scorer plugin")
    p.add_argument("--scorer", required=True, help="scorer name (see `unlearn plugins`)")
    add_model_options(p)
    add_data_options(p)
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="scorer option (repeatable)")
    p.add_argument("--out", required=True, help="output JSON-lines file")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..files import write_jsonl
    from ..host import create
    from ..interfaces import DIFFICULTY_SCORER
    from ..scoring import score_samples
    from ..data.tofu import load_split
    from ..models import load_model

    options = parse_options(args.option)
    if "progress" not in options and _accepts_progress(args.scorer):
        options["progress"] = True  # scorers with a progress option show a bar on the command line
    scorer = create(DIFFICULTY_SCORER, args.scorer, **options)  # fail fast on a bad name/options
    samples = load_split(args.data, args.tofu_dir)
    model, tok = load_model(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    rows = score_samples(scorer, samples, model=model, tokenizer=tok, scorer_name=args.scorer)
    write_jsonl(args.out, rows)
    scores = [r["score"] for r in rows]
    print(f"scored {len(rows)} samples with {args.scorer!r}: min {min(scores):.4g}, "
          f"mean {sum(scores) / len(scores):.4g}, max {max(scores):.4g} -> {args.out}")
    return 0


def _accepts_progress(name: str) -> bool:
    import inspect

    from ..host import get_component
    from ..interfaces import DIFFICULTY_SCORER

    try:
        return "progress" in inspect.signature(get_component(DIFFICULTY_SCORER, name)).parameters
    except (TypeError, ValueError, KeyError):
        return False
