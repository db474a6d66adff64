"""Stratifying a forget set by difficulty scores: the N easiest and N hardest samples,
written as TOFU JSON-lines splits (with the perturbed fields the truth-ratio tasks need)
that `unlearn run --forget FILE` and the `tofu_forget_*` lm-eval tasks accept."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from .data.jsonl import iter_jsonl
from .errors import DataError
from .interfaces import QASample

PERTURBED_FIELDS = ("paraphrased_answer", "perturbed_answer")


def read_scores(path: str | os.PathLike) -> list[dict]:
    """Rows of a `unlearn score` output; every error names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: score file not found")
    rows = []
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object")
        for key, kind in (("index", int), ("score", (int, float))):
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise DataError(f"{path}:{lineno}: field '{key}' is missing or not a number")
        row["_line"] = lineno
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no score rows")
    return rows


def with_perturbed_fields(samples: Sequence[QASample], spec: str, tofu_dir=None) -> list[QASample]:
    """Add paraphrased/perturbed answers from TOFU's ``<split>_perturbed.json`` (joined by
    question) when the split itself lacks them; samples that already have them are kept."""
    from .data.tofu import load_split, parse_spec

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


def stratify(rows: Sequence[dict], samples: Sequence[QASample], n_easy: int, n_hard: int,
             where: str = "scores") -> tuple[list[QASample], list[QASample]]:
    """(easy, hard): the n_easy lowest and n_hard highest scores (ties: lower index first)."""
    by_index = {s.index: s for s in samples}
    for row in rows:
        sample = by_index.get(row["index"])
        if sample is None:
            raise DataError(f"{where}:{row.get('_line', '?')}: index {row['index']} is not in the data "
                            f"({len(samples)} samples): score file and --data do not match")
        if "question" in row and row["question"] != sample.question:
            raise DataError(f"{where}:{row.get('_line', '?')}: index {row['index']} has another question than "
                            f"the data ({sample.where}): score file and --data do not match")
    if n_easy < 0 or n_hard < 0 or n_easy + n_hard > len(rows):
        raise DataError(f"--easy {n_easy} + --hard {n_hard} exceeds the {len(rows)} scored samples")
    order = sorted(rows, key=lambda r: (r["score"], r["index"]))
    easy = [by_index[r["index"]] for r in order[:n_easy]]
    hard = [by_index[r["index"]] for r in sorted(rows, key=lambda r: (-r["score"], r["index"]))[:n_hard]]
    return easy, hard


def write_split(path: str | os.PathLike, samples: Sequence[QASample]) -> None:
    from .files import write_jsonl

    write_jsonl(path, [s.to_record() for s in samples])
