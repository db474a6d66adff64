"""The one writer of every study's report: a TOFU method study's, an author-unit study's, the
demos' and each benchmark's (``Benchmark.report``). A kind builds its record (``study.json``, a
demo's ``results.json``) and its :class:`Section` s, each a block of ``summary.md`` with the files
it shows or names (a plot beside its image link); `write` writes them all together
(temporaries renamed at the end: a failed write leaves the previous report whole, never a new
study.json beside an old summary.md). Also the parts the demos' reports share: their table,
number format, stage timings, wall-time line and CUD's files."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import tables
from ..data.jsonl import iter_jsonl
from ..errors import UnlearnError
from ..files import atomic_open, write_json, write_jsonl

#: writes one file of a report to the path it is given (a temporary, renamed by the writer)
FileWriter = Callable[[Path], None]


@dataclass(frozen=True)
class Section:
    """A block of ``summary.md`` (its lines, joined by newlines with the other sections') and the
    files that go with it (name -> its writer), so a plot cannot be linked and not written."""

    lines: Sequence[str] = ()
    files: Mapping[str, FileWriter] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """What one report holds: its JSON ``record`` (under ``record_name``) and the sections of
    its ``summary.md``, whose files follow the two in the order the sections give them."""

    record: Any
    sections: Sequence[Section]
    record_name: str = "study.json"

    def summary(self) -> str:
        return "\n".join(line for section in self.sections for line in section.lines)

    def writers(self) -> dict[str, FileWriter]:
        text = self.summary()
        writers = {self.record_name: lambda path: write_json(path, self.record), "summary.md": text_file(text)}
        for section in self.sections:
            writers.update(section.files)
        return writers


def write(out: Path, report: Report) -> dict[str, str]:
    """``report``'s files in ``out``, written together; returns file name -> path."""
    return write_together(Path(out), report.writers())


def write_together(out: Path, writers: dict[str, FileWriter]) -> dict[str, str]:
    """The report's files in ``out`` (name -> a function writing it to a given path): each to a
    temporary first, renamed together at the end, so that a write that fails (a full disk) leaves
    the previous report whole, never a new study.json beside an old summary.md."""
    out.mkdir(parents=True, exist_ok=True)
    files = {name: out / name for name in writers}
    staged = {name: path.with_name(f".{name}.{os.getpid()}.new") for name, path in files.items()}
    try:
        for name, write in writers.items():
            current = name
            write(staged[name])
    except BaseException as exc:  # a full disk, a bad value, Ctrl-C: no temporary is left behind
        for path in staged.values():
            path.unlink(missing_ok=True)
        if not isinstance(exc, OSError):
            raise
        raise UnlearnError(
            f"study report: cannot write {files[current]}: {exc.strerror or exc}; the report in {out} is unchanged"
        ) from exc
    for name, path in files.items():
        os.replace(staged[name], path)
    return {k: str(v) for k, v in files.items()}


def text_file(text: str) -> FileWriter:
    """A writer of ``text`` as it is (UTF-8)."""

    def write(path: Path) -> None:
        with atomic_open(path) as handle:
            handle.write(text)

    return write


# ----------------------------------------------------------------------------- the demos' shared parts


def format_value(value: Any) -> str:
    """A number as the reports show it: 3 decimals, scientific below 1e-3; None is n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.2e}" if value != 0 and abs(value) < 1e-3 else f"{value:.3f}"
    return str(value)


def render_table(
    rows: Sequence[dict], *, columns: Sequence[str], cells: Callable[[dict], list[str]], markdown: bool = False
) -> str:
    """A demo's table of ``rows`` (``cells(row)``: a row's cells under ``columns``), for the
    terminal or as Markdown."""
    return (tables.markdown_table if markdown else tables.text_table)(columns, [cells(r) for r in rows])


def jsonl_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file."""
    return [row for _, row in iter_jsonl(path)]


def stage_seconds(folder: str | Path) -> float | None:
    """A stage's wall time (its resources.json); None where that file is missing or says none."""
    try:
        return json.loads((Path(folder) / "resources.json").read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        return None


def stage_timings(cells: dict, results: dict) -> dict[str, dict]:
    """Each stage of a study's ``cells``: the seconds it took in this run (0 where it came from
    the cache) and whether it was cached (``results``: the run's cell results, their sources)."""
    timings = {}
    for cell, cp in cells.items():
        sources = (results.get(cell) or {}).get("sources") or []
        for i, stage in enumerate(cp.stages):
            cached = i >= len(sources) or sources[i] == "cached"
            timings[stage.label] = {
                "seconds": 0.0 if cached else (stage_seconds(stage.folder) or 0.0),
                "cached": cached,
            }
    return timings


def wall_time_line(results: dict) -> str:
    """A demo summary's last line: the run's wall time and each stage's (cached: 0 s)."""
    stages = results["stages"].items()
    return (
        f"Wall time {results['wall_time_s']:.0f} s; stages: "
        + ", ".join(f"{k} {v['seconds']:.0f} s" + (" (cached)" if v["cached"] else "") for k, v in stages)
        + "."
    )


def cud_meta(cud_dir: Path) -> dict:
    """What CUD's scorer recorded beside its scores (anchor pool, votes, runs), {} when absent."""
    path = cud_dir / "scores.jsonl.meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def anchor_runs(meta: dict) -> list[dict]:
    """CUD's anchor runs as the report records them."""
    keys = ("objective", "seed", "steps", "stopped_at_step", "forget_prob")
    return [{k: r.get(k) for k in keys} for r in meta.get("runs") or []]


def cud_files(cud_dir: Path, scores: Sequence[dict]) -> Section:
    """A demo's copy of CUD's scores and of its CUD-easy / CUD-hard splits (files, no lines)."""
    files = {"cud_scores.jsonl": lambda path: write_jsonl(path, scores)}
    for part in ("easy", "hard"):
        files[f"cud_{part}.json"] = lambda path, part=part: write_jsonl(path, jsonl_rows(cud_dir / f"{part}.json"))
    return Section(files=files)


def write_demo(
    out: Path, results: dict, table: str, *, sections: Sequence[Section], cud_dir: Path, scores: Sequence[dict]
) -> tuple[dict, str, dict]:
    """A demo's report in ``out``, written together: results.json, summary.md of ``sections``
    (with their plots), and CUD's scores and CUD-easy / CUD-hard splits from ``cud_dir``.
    Returns (results, table, file name -> path)."""
    report = Report(results, [*sections, cud_files(cud_dir, scores)], record_name="results.json")
    return results, table, write(Path(out), report)


__all__ = [
    "Section",
    "Report",
    "write",
    "write_together",
    "text_file",
    "format_value",
    "render_table",
    "jsonl_rows",
    "stage_seconds",
    "stage_timings",
    "wall_time_line",
    "cud_meta",
    "anchor_runs",
    "cud_files",
    "write_demo",
]
