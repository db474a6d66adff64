"""A study's records: the results of its finished cells, small enough to keep in a repository,
so that a study can resume on another machine (or after its cache is lost) without rebuilding
what it already measured (``unlearn study --records DIR``).

Recorded per stage folder (``DIR/<stage folder name>/``):

- an evaluation stage: everything the report and later evaluations read: lm-eval's results file
  (with our summary), the retain model's ``reference.json`` (the Forget Quality reference),
  the extraction strengths, ``resources.json`` and the stage marker, and the samples files
  slimmed to their numbers (``doc_id`` and the per-sample metrics; the prompts, documents and
  raw responses, most of the bytes, are left out);
- an operating-point stage (an author-unit study's): ``operating_point.json`` and its Model
  Utility evaluations, as an evaluation's files;
- a traced sweep run: its ``trace/trace.jsonl`` (the measures per epoch) and ``resources.json``;
- a fine-tune or unlearning stage: its ``resources.json`` only (wall time, peak memory). Models
  and adapters are never recorded.

An evaluation's files are in lm-eval's layout, ``<model>/results_<date>.json`` beside the samples,
where lm-eval names ``<model>`` after the model's path (``__work__cache__studies__run-...__run``:
a machine's cache folder in a committed file name). They are recorded under a name made of the
cell and the stage instead (``grad_diff-forget1-seed0-evaluate``), every such folder of the stage
(the robustness measurement's and its attacks' too); records written before keep their names
and are read as they are (an evaluation is found by its ``results_<date>.json``, whatever its
folder's name).

Restoring puts an evaluation (or an operating point) back as a finished stage. A model stage
comes back hollow: its ``resources.json`` (and a sweep run's trace) in a folder without the stage
marker, so the report still has its wall time and traces, and anything that needs the model
rebuilds it. A cell whose evaluation is finished is done; a
target or retain model that no unfinished cell needs is not built.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..stages import DONE
from .cells import CPU_FP32, RESOURCES, CellPlan, Plan

#: what an evaluation stage keeps besides its slimmed samples
KEPT_SUFFIXES = (".json",)


def _slim_row(row: dict) -> dict:
    """A samples row with its numbers only (what the report's per-QA intervals read)."""
    return {
        k: v for k, v in row.items() if k == "doc_id" or k == "filter" or isinstance(v, (int, float, bool)) or v is None
    }


def _slim_samples(source: Path, target: Path) -> None:
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    target.write_text("".join(json.dumps(_slim_row(r), sort_keys=True) + "\n" for r in rows), encoding="utf-8")


def recorded_name(cell_id: str, build: str) -> str:
    """The name an evaluation's lm-eval model folder is recorded under: the cell and the stage."""
    return f"{cell_id.replace('/', '-')}-{build}"


def _renamed(stage_folder: Path, name: str) -> dict[Path, Path]:
    """lm-eval's model folders in a stage (those holding a ``results_<date>.json``, relative to the
    stage folder) and the name each is recorded under: ``name``, then ``name-2``, ... for two in
    one folder."""
    folders = sorted({p.parent.relative_to(stage_folder) for p in stage_folder.rglob("results_*.json")})
    out: dict[Path, Path] = {}
    for folder in folders:
        if folder == Path(".") or any(part.startswith(".") for part in folder.parts):
            continue
        taken = {new.name for old, new in out.items() if old.parent == folder.parent}
        new, n = name, 1
        while new in taken:
            n += 1
            new = f"{name}-{n}"
        out[folder] = folder.parent / new
    return out


def _record_path(relative: Path, renamed: dict[Path, Path]) -> Path:
    """``relative`` (a file in the stage) with its lm-eval model folder renamed."""
    for old, new in renamed.items():
        if relative.parent == old:
            return new / relative.name
    return relative


#: stages recorded whole, as an evaluation is (their files slimmed), and restored as finished
WHOLE = ("evaluate", "operating_point")
#: a traced sweep run's trace, recorded beside its resources
TRACE = Path("trace") / "trace.jsonl"


def _record_files(stage_folder: Path, kind: str, into: Path, name: str = "") -> None:
    if kind not in WHOLE:
        if (stage_folder / RESOURCES).is_file():
            shutil.copy2(stage_folder / RESOURCES, into / RESOURCES)
        if kind == "sweep" and (stage_folder / TRACE).is_file():
            (into / TRACE).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(stage_folder / TRACE, into / TRACE)
        return
    renamed = _renamed(stage_folder, name) if name else {}
    for path in sorted(stage_folder.rglob("*")):
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(stage_folder).parts):
            continue
        target = into / _record_path(path.relative_to(stage_folder), renamed)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".jsonl":
            _slim_samples(path, target)
        elif path.suffix in KEPT_SUFFIXES:
            shutil.copy2(path, target)


def _write_folder(final: Path, fill) -> bool:
    """``fill(tmp)`` then rename ``tmp`` to ``final``; False when ``final`` exists already."""
    if final.exists():
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        fill(tmp)
        os.replace(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if final.exists():  # recorded or restored by another process meanwhile
            return False
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def save(cp: CellPlan, records: Path) -> list[str]:
    """Record the finished stages of one cell (those already recorded are left as they are);
    returns the folder names recorded now."""
    saved = []
    for stage in cp.stages:
        folder = Path(stage.folder)
        if not (folder / DONE).is_file():
            continue
        name = recorded_name(cp.cell.id, stage.build)
        if _write_folder(
            records / folder.name,
            lambda tmp, folder=folder, kind=stage.build, name=name: _record_files(folder, kind, tmp, name),
        ):
            saved.append(folder.name)
    return saved


def _hollow(record: Path, tmp: Path) -> None:
    """A model stage's recorded files, without its stage marker."""
    shutil.copy2(record / RESOURCES, tmp / RESOURCES)
    if (record / TRACE).is_file():
        (tmp / TRACE).parent.mkdir(parents=True)
        shutil.copy2(record / TRACE, tmp / TRACE)


def identities(records: Path) -> set[tuple[str, str]]:
    """The (device type, dtype) the records in ``records`` were made with, as their
    resources.json says; one that does not say was made on CPU in fp32 (every record made
    before they were recorded was)."""
    found = set()
    for path in records.glob(f"*/{RESOURCES}"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            found.add((str(data.get("device_type", CPU_FP32[0])), str(data.get("dtype", CPU_FP32[1]))))
    return found


def restore(plan: Plan, records: Path, other: dict[str, str] | None = None) -> list[str]:
    """Put the recorded stages of the plan's cells into the cache where they are missing;
    returns the folder names restored. ``other``: {stage folder: record name} of records
    made under other keys to restore in their place (another device, ``--records-any-device``)."""
    restored = []
    if not records.is_dir():
        return restored
    other = other or {}
    for cp in plan.cells.values():
        for stage in cp.stages:
            folder = Path(stage.folder)
            record = records / other.get(stage.folder, folder.name)
            if not record.is_dir() or (folder / DONE).is_file():
                continue
            if stage.build in WHOLE:
                if not (record / DONE).is_file():
                    continue  # not a finished evaluation: ignore it
                if folder.exists():  # a hollow or unfinished folder: the record replaces it
                    shutil.rmtree(folder)
                if _write_folder(folder, lambda tmp, record=record: shutil.copytree(record, tmp, dirs_exist_ok=True)):
                    restored.append(folder.name)
            elif not folder.exists() and (record / RESOURCES).is_file():
                if _write_folder(folder, lambda tmp, record=record: _hollow(record, tmp)):
                    restored.append(folder.name)
    return restored


__all__ = ["save", "restore", "recorded_name", "identities"]
