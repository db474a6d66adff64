"""A study's ``cud`` stage: the CUD difficulty score of every forget sample on the target, and
the CUD-easy and CUD-hard strata (the ``strata`` lowest and highest scored samples, as
`unlearn stratify` writes them), for the per-stratum columns of the demo's report and of a
study's (``[cud]`` in a study file, docs/study.md).

The anchors come from a pool of retain QA, never from the scored forget set
(:func:`anchor_split`): CUD's anchor runs unlearn the pool with each objective and seed of
``[cud.scorer]``, trained with ``[cud.unlearn]``; the score matrices and anchor runs are kept in
the CUD cache as the ``cud`` scorer keeps them. The stage folder holds ``scores.jsonl`` (with its
``.meta.json``: the anchor vote, the runs, the agreement between seeds), ``easy.json``,
``hard.json`` and ``anchors.json``.

A benchmark scores its own units with the same pieces (MovieLens's ``cud_users`` stage scores
users: ``unlearn_plugins.benchmarks.movielens.study.cud``)."""

from __future__ import annotations

from pathlib import Path


def anchor_split(retain: Path, size: int) -> tuple[str, str]:
    """CUD's anchor pool and the retain set of its anchor runs: the first ``size`` retain QA and
    the second half of the retain QA (the other retain authors; with one, its last QA). The
    target knows both; neither holds a forget sample, so no scored sample is ever an anchor."""
    from ..data.qa import read_jsonl

    half = len(read_jsonl(retain)) // 2
    return f"{retain}[0:{min(size, half)}]", f"{retain}[{half}:]"


def split_unlearn(unlearn: dict) -> tuple[dict, dict]:
    """[cud.unlearn] as (the options of every anchor run, {objective: its own options})."""
    shared = {k: v for k, v in unlearn.items() if not isinstance(v, dict)}
    return shared, {k: v for k, v in unlearn.items() if isinstance(v, dict)}


def scorer(p: dict, anchor: tuple | None = None, **extra):
    """The stage's CUD scorer (``p``: the stage's parameters; ``anchor``: its anchor pool and
    the anchor runs' retain set, by default split from the TOFU benchmark's retain set;
    ``extra``: more of the scorer's options, a MovieLens study's ``answer_tokens``)."""
    from ..scorers.cud import CUDScorer

    options = {**p["scorer"], **extra}
    pool, anchor_retain = anchor or anchor_split(Path(p["bench"]) / "retain.json", p["anchor_pool"])
    shared, by_objective = split_unlearn(p["unlearn"])
    unlearn = {**shared, "retain": anchor_retain, "max_length": p["max_length"], "save_steps": 0}
    return CUDScorer(
        anchor_data=pool,
        objectives=options.pop("objectives"),
        seeds=options.pop("seeds"),
        model_spec=p["model"],
        unlearn_options=unlearn,
        unlearn_by_objective=by_objective or None,
        max_length=p["max_length"],
        progress=True,
        **options,
    )


def build_cud(tmp: Path, p: dict) -> None:
    """Score the forget set of ``p["bench"]`` on ``p["model"]`` and write its strata into ``tmp``."""
    from ..data.qa import load_split
    from ..files import write_json, write_jsonl
    from ..models import load_model
    from ..scoring import score_samples
    from ..stratify import metadata_path, stratify, write_split

    forget = Path(p["bench"]) / "forget.json"
    cud = scorer(p)
    samples = load_split(str(forget))
    model, tok = load_model(p["model"], device=p["device"])
    rows = score_samples(cud, samples, model=model, tokenizer=tok, scorer_name="cud")
    del model
    write_jsonl(tmp / "scores.jsonl", rows)
    meta = {"scorer": "cud", "data": str(forget), "rows": len(rows), **cud.last_metadata}
    write_json(metadata_path(tmp / "scores.jsonl"), meta)
    n = min(p["strata"], len(rows) // 2)
    easy, hard = stratify(rows, samples, n, n, where=str(tmp / "scores.jsonl"), meta=meta)
    write_split(tmp / "easy.json", easy)
    write_split(tmp / "hard.json", hard)
    write_json(tmp / "anchors.json", dict(cud.last_anchors))


def strata(folder: Path) -> tuple[list[int], list[int]]:
    """The forget-set positions of a ``cud`` stage's CUD-easy and CUD-hard samples."""
    from ..data.jsonl import iter_jsonl

    by_question = {row["question"]: row["index"] for _, row in iter_jsonl(Path(folder) / "scores.jsonl")}
    return tuple(
        [by_question[row["question"]] for _, row in iter_jsonl(Path(folder) / f"{name}.json")]
        for name in ("easy", "hard")
    )


__all__ = ["anchor_split", "split_unlearn", "scorer", "build_cud", "strata"]
