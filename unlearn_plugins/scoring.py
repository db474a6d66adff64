"""Running a difficulty scorer over samples and checking what it returns; scoring into a
file incrementally (``OUT.partial.jsonl``), so an interrupted or failed scoring resumes."""

from __future__ import annotations

import glob
import json
import math
import numbers
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .errors import PluginError, UnlearnError
from .interfaces import QASample

#: samples per scorer call when scoring into a file with a per-sample scorer (no
#: ``prepare_shard``): each finished chunk is recorded in ``OUT.partial.jsonl``, so an
#: interruption loses at most one chunk. Chunks are fixed by sample position, so a resumed
#: scoring makes exactly the calls an uninterrupted one makes.
CHUNK_SIZE = 64


#: fields of a score row the host writes; a scorer's dict results may not set them
HOST_FIELDS = ("index", "question")


def _scorer_label(scorer_name: str) -> str:
    from .host import component_label
    from .interfaces import DIFFICULTY_SCORER

    return component_label(DIFFICULTY_SCORER, scorer_name)


def _as_score(value: Any) -> float | None:
    """A real number (not a bool, str or None) as a float; a 0-d tensor or NumPy scalar too."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        try:
            inner = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        return float(inner) if isinstance(inner, numbers.Real) and not isinstance(inner, bool) else None
    return None


def score_samples(
    scorer: Any, samples: Sequence[QASample], *, model: Any, tokenizer: Any, scorer_name: str = "?"
) -> list[dict]:
    """Rows ``{index, question, score, ...}``; a scorer may return floats or dicts with a
    'score' key plus extra fields (CUD adds s_E and s_H).

    What the scorer returns is checked, and every failure is one error naming the scorer and
    its plugin: a scorer that raises (other than an UnlearnError, passed on as it is), returns
    None or the wrong number of scores, a score that is not a real number or not finite, or a
    row that would overwrite the host's ``index`` / ``question``."""
    label = _scorer_label(scorer_name)
    try:
        results = scorer.score(samples, model=model, tokenizer=tokenizer)
    except UnlearnError:
        raise
    except Exception as exc:  # a plugin's bug or a library error: one line that names it (--debug: traceback)
        raise PluginError(f"{label} raised {type(exc).__name__}: {exc}") from exc
    if results is None:
        raise PluginError(f"{label} returned None; score() must return one number per sample")
    try:
        results = list(results)
    except TypeError:
        raise PluginError(f"{label} returned a {type(results).__name__}, not a list of scores") from None
    if len(results) != len(samples):
        raise PluginError(f"{label} returned {len(results)} scores for {len(samples)} samples")
    rows = []
    for sample, result in zip(samples, results):
        extra = {}
        if isinstance(result, dict):
            taken = [k for k in HOST_FIELDS if k in result]
            if taken:
                raise PluginError(
                    f"{label} returned field {taken[0]!r} for sample {sample.index}; the host writes "
                    f"{' and '.join(HOST_FIELDS)} itself (give yours another name)"
                )
            extra = {k: v for k, v in result.items() if k != "score"}
            result = result.get("score")
        value = _as_score(result)
        if value is None:
            raise PluginError(f"{label} returned a non-number {result!r} for sample {sample.index} ({sample.where})")
        if not math.isfinite(value):
            raise PluginError(f"{label} returned {value} for sample {sample.index} ({sample.where})")
        rows.append({"index": sample.index, "question": sample.question, "score": value, **extra})
    return rows


# ----------------------------------------------------------------------------- scoring into a file


def partial_path(out: str | os.PathLike, rank: int = 0) -> Path:
    """Where a scoring into ``out`` keeps its finished rows (``OUT.partial.jsonl``; process
    ``rank`` of a launch: ``OUT.partial-RANK.jsonl``)."""
    out = Path(out)
    return out.with_name(out.name + (".partial.jsonl" if rank == 0 else f".partial-{rank}.jsonl"))


def check_output_file(out: str, what: str = "--out") -> None:
    """Refuse an output path that cannot be written, before any scoring."""
    from .stratify import metadata_path

    path = Path(out)
    if path.is_dir():
        raise UnlearnError(f"{what} {out} is a folder; give a file name, e.g. {path / 'scores.jsonl'}")
    for side in (metadata_path(path), partial_path(path)):
        if side.is_dir():
            raise UnlearnError(f"{what} {out}: {side} is a folder; move it away or write elsewhere")
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise UnlearnError(f"{what} {out}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UnlearnError(f"{what} {out}: cannot write to {folder} (permission denied)")


class ScoreJournal:
    """The rows a scoring into ``out`` has finished (``OUT.partial.jsonl``), for a resume.

    The file's first line is ``{"partial": KEY}`` (a digest of everything the scores depend
    on: scorer, options, samples, model weights); each further line ``{"pos": i, "row": ...}``
    is one finished sample. A run with the same key reuses the rows (of every process's file,
    under a launch); a file with another key is replaced. The file is created with the first
    finished chunk, so a scoring that fails before one leaves nothing."""

    def __init__(self, out: str | os.PathLike, key: str, samples: Sequence[QASample], *, rank: int = 0):
        self.out, self.key = Path(out), key
        self.path = partial_path(out, rank).absolute()
        self.done: dict[int, dict] = {}
        own = None
        for path in self.files():
            rows = self._read(path, samples)
            if path == self.path:
                own = rows
                if rows is None:
                    print(
                        f"notice: {path} was left by a scoring with other settings (scorer, options, data "
                        f"or model); starting afresh",
                        file=sys.stderr,
                        flush=True,
                    )
            self.done.update(rows or {})
        if own:  # rewritten without a line cut by a kill, so appends start on a fresh line
            self._write_all(own)
        else:
            self.path.unlink(missing_ok=True)

    def files(self) -> list[Path]:
        pattern = glob.escape(self.out.name) + ".partial*.jsonl"
        return sorted(p for p in self.out.absolute().parent.glob(pattern) if p.is_file())

    def _read(self, path: Path, samples: Sequence[QASample]) -> dict[int, dict] | None:
        """The rows of ``path`` that match these samples; None when the key differs."""
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            header = json.loads(lines[0]) if lines else {}
        except (OSError, ValueError):
            return None
        if not isinstance(header, dict) or header.get("partial") != self.key:
            return None
        rows = {}
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                pos, row = int(entry["pos"]), entry["row"]
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a kill
            if (
                0 <= pos < len(samples)
                and isinstance(row, dict)
                and row.get("index") == samples[pos].index
                and row.get("question") == samples[pos].question
            ):
                rows[pos] = row
        return rows

    def _lines(self, rows: dict[int, dict]) -> str:
        return "".join(json.dumps({"pos": i, "row": row}, ensure_ascii=False) + "\n" for i, row in sorted(rows.items()))

    def _write_all(self, rows: dict[int, dict]) -> None:
        from .files import atomic_open

        with atomic_open(self.path) as handle:
            handle.write(json.dumps({"partial": self.key}) + "\n" + self._lines(rows))

    def add(self, rows: dict[int, dict]) -> None:
        """Record finished rows (appended and synced to disk)."""
        if not rows:
            return
        try:
            fresh = not self.path.exists()
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write((json.dumps({"partial": self.key}) + "\n" if fresh else "") + self._lines(rows))
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            kept = f"; the {len(self.done)} rows finished before are kept in it" if self.done else ""
            raise UnlearnError(f"--out {self.out}: cannot write {self.path} ({exc.strerror or exc}){kept}") from None
        self.done.update(rows)

    def remove(self) -> None:
        """The scores are in ``out``: delete every process's partial file."""
        for path in self.files():
            path.unlink(missing_ok=True)


def score_rows(
    scorer: Any,
    samples: Sequence[QASample],
    positions: Sequence[int] | None = None,
    *,
    model: Any,
    tokenizer: Any,
    scorer_name: str = "?",
    journal: ScoreJournal | None = None,
    chunk_size: int | None = None,
) -> list[dict]:
    """:func:`score_samples` of ``samples[positions]`` (default: all), rows in that order,
    recorded in ``journal`` as they finish and taken from it when already there.

    A per-sample scorer is called on chunks of :data:`CHUNK_SIZE` positions (``pos //
    size``); a scorer whose scores depend on the whole set (``prepare_shard``) is called
    once, on all of them."""
    positions = list(range(len(samples))) if positions is None else list(positions)
    done = journal.done if journal is not None else {}
    if getattr(scorer, "prepare_shard", None) is not None:
        chunks = [positions]
    else:
        size = chunk_size or CHUNK_SIZE
        groups: dict[int, list[int]] = {}
        for i in positions:
            groups.setdefault(i // size, []).append(i)
        chunks = list(groups.values())
    rows: dict[int, dict] = {}
    for chunk in chunks:
        if all(i in done for i in chunk):
            rows.update((i, done[i]) for i in chunk)
            continue
        fresh = dict(
            zip(
                chunk,
                score_samples(
                    scorer, [samples[i] for i in chunk], model=model, tokenizer=tokenizer, scorer_name=scorer_name
                ),
            )
        )
        if journal is not None:
            journal.add({i: row for i, row in fresh.items() if i not in done})
        rows.update(fresh)
    return [rows[i] for i in positions]


def score_sharded(
    scorer: Any,
    samples: Sequence[QASample],
    *,
    model: Any,
    tokenizer: Any,
    group: Any,
    scorer_name: str = "?",
    journal: ScoreJournal | None = None,
) -> list[dict] | None:
    """:func:`score_samples` split over the processes of ``group`` (:mod:`unlearn_plugins.sharding`);
    the rows, in sample order, on the main process, None on the others.

    Scorers with ``prepare_shard`` (see :class:`~unlearn_plugins.interfaces.ShardedScorer`) do their
    share of the work on every process, then the main process scores all samples; the others
    are per-sample: each process scores its contiguous shard and the main process merges.
    """
    shard = group.shard(len(samples))
    prepare = getattr(scorer, "prepare_shard", None)
    if prepare is not None:
        if journal is not None and len(journal.done) == len(samples):  # all finished by an earlier run
            return [journal.done[i] for i in range(len(samples))] if group.is_main else None
        group.everywhere(
            lambda: prepare(samples, shard, model=model, tokenizer=tokenizer, group=group),
            f"scorer {scorer_name!r} (shared work)",
        )
        main_rows: list[dict] = []

        def score_all():  # the main process only; the others wait for its outcome
            if group.is_main:
                main_rows.extend(
                    score_rows(
                        scorer, samples, model=model, tokenizer=tokenizer, scorer_name=scorer_name, journal=journal
                    )
                )

        group.everywhere(score_all, f"scorer {scorer_name!r}")
        return main_rows if group.is_main else None
    parts = group.everywhere(
        lambda: (
            score_rows(
                scorer, samples, shard, model=model, tokenizer=tokenizer, scorer_name=scorer_name, journal=journal
            )
            if shard
            else []
        ),
        f"scorer {scorer_name!r}",
    )
    if not group.is_main:
        return None
    rows = [row for part in parts for row in part]
    if len(rows) != len(samples):  # the shards are contiguous and in process order
        raise UnlearnError(
            f"scorer {scorer_name!r}: the processes returned {len(rows)} rows for {len(samples)} samples"
        )
    return rows
