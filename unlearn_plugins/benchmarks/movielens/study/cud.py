"""A MovieLens study's ``cud_users`` stage: CUD (:mod:`unlearn_plugins.study.cud`'s pieces) on the
forget users. The scored samples are the forget users' training prompts, the anchor pool the
anchor users' prompts (``anchor_pool``, never scored) and the anchor runs retain the
``anchor_retain`` part; the EAP-IG metric is on the one Yes/No answer token. The strata are
users: each forget user's mean score, the ``strata`` lowest and highest scored users the CUD-easy
and CUD-hard users (``users.json``; ``easy.json`` and ``hard.json`` hold their prompts)."""

from __future__ import annotations

from pathlib import Path

from unlearn_plugins.study.cud import scorer


def build_cud_users(tmp: Path, p: dict) -> None:
    """Score the forget users' prompts of the MovieLens benchmark ``p["bench"]`` on ``p["model"]``
    and write the CUD-easy and CUD-hard users into ``tmp``."""
    from unlearn_plugins.files import write_json, write_jsonl
    from unlearn_plugins.models import load_model
    from unlearn_plugins.scoring import score_samples
    from unlearn_plugins.stratify import group_scores, metadata_path, stratify_groups, write_split

    from ..benchmark import load_part, part_path

    bench = p["bench"]
    anchor = (load_part(bench, "anchor_pool"), str(part_path(bench, "anchor_retain")))
    cud = scorer(p, anchor, answer_tokens=1)  # the EAP-IG metric on the Yes/No token
    samples = load_part(bench, "train_forget")
    model, tok = load_model(p["model"], device=p["device"])
    rows = score_samples(cud, samples, model=model, tokenizer=tok, scorer_name="cud")
    del model
    write_jsonl(tmp / "scores.jsonl", rows)
    meta = {"scorer": "cud", "data": str(part_path(bench, "train_forget")), "rows": len(rows), **cud.last_metadata}
    write_json(metadata_path(tmp / "scores.jsonl"), meta)
    n = p["strata"]
    easy, hard, easy_users, hard_users = stratify_groups(
        rows, samples, "user_id", n, n, where=str(tmp / "scores.jsonl"), meta=meta
    )
    write_split(tmp / "easy.json", easy)
    write_split(tmp / "hard.json", hard)
    write_json(
        tmp / "users.json",
        {
            "easy": [g["group"] for g in easy_users],
            "hard": [g["group"] for g in hard_users],
            "scores": group_scores(rows, samples, "user_id", meta=meta),
        },
    )
