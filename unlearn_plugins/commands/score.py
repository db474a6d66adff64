"""`unlearn score`: how hard each sample will be to unlearn, by a difficulty scorer plugin
(cud, mrd, loss, length, or a third party's; see `unlearn plugins`): one JSON line per sample
(index, question, score; higher = harder) in OUT, and what the scorer recorded (cud: its
anchors and their runs) in OUT.meta.json. Finished rows are kept as they come, so an
interrupted scoring resumes when the same command runs again; under `accelerate launch`
each process scores a shard."""

from __future__ import annotations

from pathlib import Path

from ..errors import UnlearnError
from ..options import parse_options
from .common import add_command, add_data_options, add_model_options

EXAMPLE = """examples:
  unlearn score --scorer length --data tofu:forget01 --out length.jsonl
  unlearn score --scorer cud --model ft/merged --data tofu:forget01 --out cud.jsonl
  unlearn score --scorer mrd --option perturbations=20 --data 'tofu:forget01[0:10]' --out mrd.jsonl
  unlearn stratify cud.jsonl --data tofu:forget01 --easy 5 --hard 5 --out strata   # then: easy / hard splits
"""


def add_parser(sub) -> None:
    p = add_command(sub, "score", "score each sample's unlearning difficulty with a scorer plugin", __doc__, EXAMPLE)
    p.add_argument("--scorer", required=True, help="scorer name (see `unlearn plugins`)")
    add_model_options(p)
    p.add_argument("--adapter", default=None, help="PEFT adapter folder applied to --model (merged) before scoring")
    p.add_argument(
        "--allow-other-base", action="store_true", help="load --adapter even if it was trained on another base model"
    )
    add_data_options(p)
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="scorer option (repeatable)")
    p.add_argument(
        "--anchor-data",
        default=None,
        metavar="SPEC",
        help="cud: the anchor pool (tofu:SPLIT, a file, or 'self'), disjoint from --data "
        "(default for TOFU data: tofu:forget10, else tofu:retain90[3200:3600])",
    )
    p.add_argument("--out", default=None, help="output JSON-lines file (plus OUT.meta.json, what the scorer recorded)")
    from .plan import add_dry_run_options

    add_dry_run_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Check --out, lock it, score (finished rows go to OUT.partial.jsonl as they come, and a
    rerun with the same settings resumes from them), write OUT and OUT.meta.json."""
    from contextlib import ExitStack

    from ..data.qa import load_split
    from ..files import file_lock
    from ..host import create
    from ..interfaces import DIFFICULTY_SCORER
    from ..models import load_model_of
    from ..scoring import ScoreJournal, check_output_file, score_rows, score_sharded
    from ..sharding import launch_group, process_device

    if args.dry_run:
        from .plan import score_dry_run

        return score_dry_run(args, parse_options(args.option))
    if not args.out:
        raise UnlearnError("unlearn score: --out is required")
    check_output_file(args.out)  # before any work: a folder or unwritable path fails now, not after scoring
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
    if args.adapter and _accepts(args.scorer, "model_spec") and "model_spec" not in options:
        # its own runs (CUD's anchor runs) start from a model folder, which would lack the adapter
        raise UnlearnError(
            f"--adapter: scorer {args.scorer!r} trains from the model folder (option model_spec); give the "
            f"merged model as --model instead (`unlearn run` writes it in OUT/merged)"
        )

    def setup():
        scorer = create(DIFFICULTY_SCORER, args.scorer, **options)  # fail fast on a bad name/options
        samples = load_split(args.data, args.tofu_dir)
        device = process_device(group, args.device)
        model, tok = load_model_of(args, device=device, merge_adapter=bool(args.adapter))
        journal = ScoreJournal(
            args.out, _settings_key(args, options, samples, model), samples, rank=0 if group is None else group.index
        )
        return scorer, samples, model, tok, journal

    with ExitStack() as stack:
        if group is None:
            stack.enter_context(file_lock(args.out, f"--out {args.out}"))
            scorer, samples, model, tok, journal = setup()
            _say_resumed(journal, len(samples))
            rows = score_rows(scorer, samples, model=model, tokenizer=tok, scorer_name=args.scorer, journal=journal)
            _write(args, scorer, rows, journal)
        else:
            group.everywhere(
                lambda: stack.enter_context(file_lock(args.out, f"--out {args.out}")) if is_main else None,
                f"locking {args.out}",
            )
            result = {}
            group.everywhere(
                lambda: result.update(zip(("scorer", "samples", "model", "tok", "journal"), setup())), "loading"
            )
            if is_main:
                _say_resumed(result["journal"], len(result["samples"]))
            rows = score_sharded(
                result["scorer"],
                result["samples"],
                model=result["model"],
                tokenizer=result["tok"],
                group=group,
                scorer_name=args.scorer,
                journal=result["journal"],
            )
            group.everywhere(
                lambda: _write(args, result["scorer"], rows, result["journal"]) if is_main else None,
                f"writing {args.out}",
            )
            if not is_main:
                return 0
    scores = [r["score"] for r in rows]
    where = f" ({group.count} processes)" if group is not None else ""
    print(
        f"scored {len(rows)} samples with {args.scorer!r}{where}: min {min(scores):.4g}, "
        f"mean {sum(scores) / len(scores):.4g}, max {max(scores):.4g} -> {args.out}"
    )
    return 0


def _settings_key(args, options: dict, samples, model) -> str:
    """What the scores depend on: a partial file from other settings is never resumed."""
    import hashlib
    import json

    from ..models import resolve_model, weights_fingerprint

    where = resolve_model(args.model)
    settings = {
        "scorer": args.scorer,
        "options": {k: v for k, v in options.items() if k != "progress"},
        "samples": [(s.index, s.to_record()) for s in samples],
        "model": weights_fingerprint(where) or where,
        "dtype": str(next(model.parameters()).dtype),
    }
    from ..data import prompts

    if part := prompts.key_part(prompts.active()):  # only when not the default: earlier partial files resume
        settings["prompt_format"] = part
    if (device := next(model.parameters()).device.type) != "cpu":
        settings["device"] = device
    if args.adapter:  # only when given, so partial files of runs without one stay resumable
        from ..files import file_sha256
        from ..models import ADAPTER_WEIGHTS

        files = [Path(args.adapter) / n for n in ADAPTER_WEIGHTS if (Path(args.adapter) / n).is_file()]
        settings["adapter"] = [file_sha256(f) for f in files] or args.adapter
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def _say_resumed(journal, total: int) -> None:
    import sys

    if journal.done:
        print(
            f"notice: resuming an interrupted scoring: {len(journal.done)} of {total} samples already scored "
            f"({journal.path.name})",
            file=sys.stderr,
            flush=True,
        )


def _write(args, scorer, rows, journal) -> None:
    """OUT and OUT.meta.json, then the partial files go (they stay when the write fails)."""
    from ..files import write_json, write_jsonl
    from ..stratify import metadata_path

    try:
        write_jsonl(args.out, rows)
        write_json(metadata_path(args.out), _metadata(args, scorer, rows))
    except OSError as exc:
        raise UnlearnError(
            f"--out {args.out}: cannot write ({exc.strerror or exc}); the {len(rows)} scores are kept "
            f"in {journal.path} and the same command writes them without scoring again"
        ) from None
    journal.remove()


def _metadata(args, scorer, rows) -> dict:
    """The sidecar OUT.meta.json: what was scored, plus what the scorer recorded (``last_metadata``),
    e.g. cud's anchors and their votes; always written, so a stale one never describes new rows."""
    return {
        "scorer": args.scorer,
        "model": args.model,
        "data": args.data,
        "rows": len(rows),
        **(getattr(scorer, "last_metadata", None) or {}),
    }


def _accepts(name: str, option: str) -> bool:
    from ..host import get_component
    from ..interfaces import DIFFICULTY_SCORER
    from ..options import declared_options

    try:
        declared = declared_options(get_component(DIFFICULTY_SCORER, name))
    except (TypeError, ValueError, KeyError):
        return False
    return declared is not None and option in declared.names()
