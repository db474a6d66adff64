"""Stratifying a forget set by difficulty scores: the N easiest and N hardest samples,
written as TOFU JSON-lines splits (with the perturbed fields the truth-ratio tasks need)
that `unlearn run --forget FILE` and the `tofu_forget_*` lm-eval tasks accept; or, with a
group field (``--group-by user_id`` on recommendation data), the N easiest and N hardest
groups by the mean score of their samples, each with all of its samples.

CUD anchors never enter a split: they were chosen *because* of how they behaved under
unlearning, so a "hard" split holding them would be circular. Rows marked ``anchor`` and
samples the score file's metadata (``FILE.meta.json``) lists as anchors are dropped first.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from .data.jsonl import iter_jsonl
from .errors import DataError
from .interfaces import QASample

PERTURBED_FIELDS = ("paraphrased_answer", "perturbed_answer")
# What the cud scorer writes in a row's ``anchor`` besides null: the kind of anchor the sample was
# ("mixed": different kinds for different objectives). true / false are accepted from other tools.
ANCHOR_ROLES = ("easy", "hard", "mixed")


def read_scores(path: str | os.PathLike) -> list[dict]:
    """Rows of a `unlearn score` output; every error names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: score file not found")
    rows = []
    line_of: dict[int, int] = {}
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object")
        for key, kind in (("index", int), ("score", (int, float))):
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise DataError(f"{path}:{lineno}: field '{key}' is missing or not a number")
        if isinstance(row["score"], float) and not math.isfinite(row["score"]):
            raise DataError(
                f"{path}:{lineno}: field 'score' is {json.dumps(row['score'])}; scores must be finite numbers"
            )
        if row["index"] in line_of:
            raise DataError(
                f"{path}:{lineno}: index {row['index']} is scored twice (lines {line_of[row['index']]} and {lineno})"
            )
        anchor = row.get("anchor")
        if not (anchor is None or isinstance(anchor, bool) or anchor in ANCHOR_ROLES):
            raise DataError(
                f"{path}:{lineno}: field 'anchor' must be true, false, null or the anchor's role "
                f"({', '.join(map(repr, ANCHOR_ROLES))}, as the cud scorer writes), got {json.dumps(anchor)}"
            )
        line_of[row["index"]] = lineno
        row["_line"] = lineno
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no score rows")
    return rows


def metadata_path(path: str | os.PathLike) -> Path:
    """The sidecar of a score file: ``FILE.meta.json`` next to ``FILE`` (what the scorer recorded)."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def read_metadata(path: str | os.PathLike) -> dict[str, Any] | None:
    """The score file's sidecar metadata, or None when there is none."""
    meta = metadata_path(path)
    if not meta.is_file():
        return None
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{meta}: unreadable score metadata ({exc})") from None
    if not isinstance(data, dict):
        raise DataError(f"{meta}: expected a JSON object")
    _check_anchor_lists(data, meta)
    return data


def _check_anchor_lists(data: dict[str, Any], meta: Path) -> None:
    """The anchor sections :func:`anchor_keys` reads, in the scorer's shape: ``SECTION: {GROUP:
    {"easy": [{"question", "answer"}, ...], "hard": [...]}}`` (a hand-edited file is named)."""
    for section in ("anchors", "stable_by_objective"):
        groups = data.get(section)
        if groups is None:
            continue
        if not isinstance(groups, dict):
            raise DataError(f"{meta}: {section} must be an object of anchor groups, got {type(groups).__name__}")
        for name, group in groups.items():
            if not isinstance(group, dict):
                raise DataError(
                    f"{meta}: {section}.{name} must be an object with easy and hard lists, got {type(group).__name__}"
                )
            for kind in ("easy", "hard"):
                entries = group.get(kind) or []
                if not isinstance(entries, list):
                    raise DataError(f"{meta}: {section}.{name}.{kind} must be a list, got {type(entries).__name__}")
                for i, entry in enumerate(entries):
                    if not (
                        isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("question", "answer"))
                    ):
                        raise DataError(
                            f"{meta}: {section}.{name}.{kind}[{i}] must be an object with a question and an answer, "
                            f"got {json.dumps(entry)[:60]}"
                        )


def anchor_keys(meta: dict[str, Any] | None) -> set[tuple[str, str]]:
    """(question, answer) of every anchor the metadata lists (used ones and each objective's)."""
    keys: set[tuple[str, str]] = set()
    for section in ("anchors", "stable_by_objective"):
        for group in ((meta or {}).get(section) or {}).values():
            for kind in ("easy", "hard"):
                for entry in group.get(kind) or ():
                    keys.add((entry.get("question"), entry.get("answer")))
    return keys


def split_anchor_rows(
    rows: Sequence[dict], samples: Sequence[QASample], meta: dict[str, Any] | None = None
) -> tuple[list[dict], list[dict]]:
    """(kept, dropped): rows that are CUD anchors (``anchor`` set, or listed in ``meta``) are dropped."""
    keys = anchor_keys(meta)
    by_index = {s.index: s for s in samples}
    kept, dropped = [], []
    for row in rows:
        sample = by_index.get(row["index"])
        is_anchor = bool(row.get("anchor")) or (sample is not None and (sample.question, sample.answer) in keys)
        (dropped if is_anchor else kept).append(row)
    return kept, dropped


def with_perturbed_fields(samples: Sequence[QASample], spec: str, tofu_dir=None) -> list[QASample]:
    """Add paraphrased/perturbed answers from TOFU's ``<split>_perturbed.json`` (joined by
    question) when the split itself lacks them; samples that already have them are kept."""
    from .data.qa import load_split, parse_spec

    if all(all(f in s.extra for f in PERTURBED_FIELDS) for s in samples):
        return list(samples)
    name, _ = parse_spec(spec)
    if name.endswith((".json", ".jsonl")) or Path(name).is_file():
        return list(samples)  # a file of the user's: written back as it is
    try:
        perturbed = load_split(f"tofu:{name}_perturbed", tofu_dir)
    except DataError:
        return list(samples)
    by_question = {p.question: p for p in perturbed}
    out = []
    for s in samples:
        p = by_question.get(s.question)
        extra = dict(s.extra)
        if p is not None:
            extra.update({k: v for k, v in p.extra.items() if k not in extra})
        out.append(QASample(s.question, s.answer, s.index, s.source, s.line, extra))
    return out


def _check_rows(rows: Sequence[dict], samples: Sequence[QASample], where: str) -> dict[int, QASample]:
    """Samples by index, after checking that every score row names a sample of the data."""
    by_index = {s.index: s for s in samples}
    for row in rows:
        sample = by_index.get(row["index"])
        if sample is None:
            raise DataError(
                f"{where}:{row.get('_line', '?')}: index {row['index']} is not in the data "
                f"({len(samples)} samples): score file and --data do not match"
            )
        if "question" in row and row["question"] != sample.question:
            raise DataError(
                f"{where}:{row.get('_line', '?')}: index {row['index']} has another question than "
                f"the data ({sample.where}): score file and --data do not match"
            )
    return by_index


def stratify(
    rows: Sequence[dict],
    samples: Sequence[QASample],
    n_easy: int,
    n_hard: int,
    where: str = "scores",
    meta: dict[str, Any] | None = None,
    objective: str | None = None,
) -> tuple[list[QASample], list[QASample]]:
    """(easy, hard): the n_easy lowest and n_hard highest scores (ties: lower index easier),
    CUD anchors left out (:func:`split_anchor_rows`). ``objective``: rank by a per-objective
    CUD score (``score_by_objective``) instead of ``score``."""
    by_index = _check_rows(rows, samples, where)
    rows, dropped = split_anchor_rows(rows, samples, meta)
    if n_easy < 0 or n_hard < 0 or n_easy + n_hard > len(rows):
        left = f" left after dropping {len(dropped)} CUD anchors" if dropped else ""
        raise DataError(f"--easy {n_easy} + --hard {n_hard} exceeds the {len(rows)} scored samples{left}")
    value = {r["index"]: _score_of(r, objective, where) for r in rows}
    order = sorted(rows, key=lambda r: (value[r["index"]], r["index"]))
    # hard from the other end of the same order: easy and hard never share a sample, even when
    # scores tie (ties: lower index easier)
    easy = [by_index[r["index"]] for r in order[:n_easy]]
    hard = [by_index[r["index"]] for r in order[::-1][:n_hard]]
    return easy, hard


def group_of(sample: QASample, field: str, where: str) -> Any:
    """The value of ``field`` (e.g. user_id) a sample is grouped by; a sample without it is an error."""
    if field not in sample.extra:
        raise DataError(
            f"{sample.where}: field {field!r} (--group-by) is missing; "
            f"fields of the data: {', '.join(sorted(sample.extra)) or 'none besides question and answer'}"
        )
    value = sample.extra[field]
    if isinstance(value, (dict, list)):
        raise DataError(f"{sample.where}: field {field!r} (--group-by) must be a string or a number, got {value!r}")
    return value


def group_scores(
    rows: Sequence[dict],
    samples: Sequence[QASample],
    field: str,
    where: str = "scores",
    meta: dict[str, Any] | None = None,
    objective: str | None = None,
) -> list[dict[str, Any]]:
    """Per group of samples sharing ``field`` (a user's interactions): the MEAN score of its scored
    samples (CUD anchors left out), how many were scored and the group's sample indices in the
    data. Groups with no scored sample are left out. Sorted by score, ties by first index."""
    by_index = _check_rows(rows, samples, where)
    rows, _ = split_anchor_rows(rows, samples, meta)
    scored: dict[Any, list[float]] = {}
    for row in rows:
        scored.setdefault(group_of(by_index[row["index"]], field, where), []).append(_score_of(row, objective, where))
    members: dict[Any, list[int]] = {}
    for s in samples:
        key = group_of(s, field, where)
        if key in scored:
            members.setdefault(key, []).append(s.index)
    out = [
        {"group": key, "score": sum(values) / len(values), "scored": len(values), "indices": members[key]}
        for key, values in scored.items()
    ]
    return sorted(out, key=lambda g: (g["score"], min(g["indices"])))


def stratify_groups(
    rows: Sequence[dict],
    samples: Sequence[QASample],
    field: str,
    n_easy: int,
    n_hard: int,
    where: str = "scores",
    meta: dict[str, Any] | None = None,
    objective: str | None = None,
) -> tuple[list[QASample], list[QASample], list[dict], list[dict]]:
    """(easy samples, hard samples, easy groups, hard groups): the n_easy groups with the lowest
    mean score and the n_hard with the highest (:func:`group_scores`), each with every sample of
    the group in the data (a forget request of users covers all their interactions)."""
    groups = group_scores(rows, samples, field, where, meta, objective)
    if n_easy < 0 or n_hard < 0 or n_easy + n_hard > len(groups):
        raise DataError(
            f"--easy {n_easy} + --hard {n_hard} exceeds the {len(groups)} groups of scored samples (--group-by {field})"
        )
    by_index = {s.index: s for s in samples}
    easy = groups[:n_easy]
    hard = groups[::-1][:n_hard]  # the other end of the same order: disjoint from easy even on ties
    pick = lambda chosen: [by_index[i] for g in chosen for i in g["indices"]]  # noqa: E731
    return pick(easy), pick(hard), easy, hard


def _score_of(row: dict, objective: str | None, where: str) -> float:
    if objective is None:
        return row["score"]
    by_objective = row.get("score_by_objective") or {}
    if not isinstance(by_objective, dict):
        raise DataError(
            f"{where}:{row.get('_line', '?')}: field 'score_by_objective' must be an object of scores by "
            f"objective, got {type(by_objective).__name__}"
        )
    value = by_objective.get(objective)
    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(
            f"{where}:{row.get('_line', '?')}: score_by_objective[{objective!r}] is {json.dumps(value)}; "
            "scores must be finite numbers"
        )
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        have = ", ".join(by_objective) or "none (score with per_objective=true)"
        raise DataError(
            f"{where}:{row.get('_line', '?')}: no score for objective {objective!r} (score_by_objective has: {have})"
        )
    return value


def write_split(path: str | os.PathLike, samples: Sequence[QASample]) -> None:
    from .files import write_jsonl

    write_jsonl(path, [s.to_record() for s in samples])
