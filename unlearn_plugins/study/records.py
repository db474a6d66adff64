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

Packed records (what a repository commits): ``unlearn records pack DIR`` stores DIR's loose
files in one pack, ``DIR/records-<digest>.tar.xz`` (an xz-compressed tar of the files under DIR,
paths relative to DIR, in name order, with no owner or time, so one set of files packs to the
same bytes; ``<digest>``: the first 12 hex digits of the pack's SHA-256, so two different packs
never share a name). The files are slimmed JSON, alike from folder to folder: solid
compression over all of them keeps a study's records about 17 times smaller than the files,
in one file rather than thousands. A pack is written beside DIR's files and renamed into place,
read back and compared with them before they are removed. Records written later (a resumed
run) are loose files beside the packs; packing again puts them in a new pack and leaves the
old ones as they are (a committed pack never changes). ``unlearn records unpack DIR`` puts the
files back in the loose layout (to remove one record, say) and removes the packs.

Everything that reads records reads both layouts: a recorded stage is ``DIR/<name>/`` when loose
(the loose copy wins), else the folder of that name in the first pack holding it, unpacked once
per process into a temporary folder (removed at exit); :func:`unpacked` gives all of DIR's
records as one folder (for scripts that read them as files). A pack that cannot be read
(truncated, damaged, not a tar of plain files) is one error naming it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import json
import lzma
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from ..errors import UnlearnError
from ..files import atomic_open, folder_lock
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


# ----------------------------------------------------------------------------- packs

#: a pack's file name: ``records-<the first 12 hex digits of its SHA-256>.tar.xz``
PACK_PREFIX, PACK_SUFFIX = "records-", ".tar.xz"
#: {pack as found: (its size and time, the folder it is unpacked in)}, for this process
_UNPACKED: dict[Path, tuple[tuple[int, int], Path]] = {}
_TEMP: list[Path] = []


def packs(records: Path) -> list[Path]:
    """The packs in ``records``, in the order they are read (name order)."""
    records = Path(records)
    if not records.is_dir():
        return []
    return sorted(p for p in records.glob(f"{PACK_PREFIX}*{PACK_SUFFIX}") if p.is_file())


def loose_files(records: Path) -> list[str]:
    """The loose files of ``records`` (paths relative to it, ``/``-separated, in name order);
    hidden ones (a record being written, a lock file) and the packs are left out."""
    records = Path(records)
    found = []
    for path in records.rglob("*"):
        relative = path.relative_to(records)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        if len(relative.parts) == 1 and path.name.startswith(PACK_PREFIX) and path.name.endswith(PACK_SUFFIX):
            continue
        found.append(relative.as_posix())
    return sorted(found)


def _members(pack: Path) -> dict[str, bytes]:
    """The files of ``pack``, by path; one that is not an xz-compressed tar of plain files under
    its folder (truncated, damaged, another kind of file) is an UnlearnError naming it."""
    try:
        data = lzma.decompress(pack.read_bytes(), format=lzma.FORMAT_XZ)  # checks the whole stream
        files = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if not member.isfile() or not parts or parts[0] == "/" or ".." in parts:
                    raise tarfile.TarError(f"{member.name!r} is not a plain file under the records folder")
                files[PurePosixPath(member.name).as_posix()] = tar.extractfile(member).read()
    except (OSError, EOFError, lzma.LZMAError, tarfile.TarError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise UnlearnError(
            f"{pack}: the records pack cannot be read, it is truncated or damaged ({type(exc).__name__}: {why}); "
            "restore it (git checkout, or a copy) or remove it to rebuild the records it held"
        ) from None
    return files


def _temp_root() -> Path:
    if not _TEMP:
        root = Path(tempfile.mkdtemp(prefix="unlearn-records-"))
        atexit.register(shutil.rmtree, root, True)
        _TEMP.append(root)
    return _TEMP[0]


def _unpacked_pack(pack: Path) -> Path:
    """The folder holding ``pack``'s files, unpacked on first use in this process (again when
    the pack changed since); read it, never write to it."""
    stat = pack.stat()
    signature = (stat.st_size, stat.st_mtime_ns)
    known = _UNPACKED.get(pack)
    if known is not None and known[0] == signature and known[1].is_dir():
        return known[1]
    files = _members(pack)
    into = Path(tempfile.mkdtemp(prefix=f"{pack.name.removesuffix(PACK_SUFFIX)}-", dir=_temp_root()))
    try:
        for name, data in files.items():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).write_bytes(data)
    except BaseException:
        shutil.rmtree(into, ignore_errors=True)
        raise
    _UNPACKED[pack] = (signature, into)
    return into


def _packed(records: Path) -> dict[str, list[tuple[Path, Path]]]:
    """Each packed file of ``records``: [(pack, folder it is unpacked in), ...] in reading order."""
    found: dict[str, list[tuple[Path, Path]]] = {}
    for pack in packs(records):
        folder = _unpacked_pack(pack)
        for path in folder.rglob("*"):
            if path.is_file():
                found.setdefault(path.relative_to(folder).as_posix(), []).append((pack, folder))
    return found


def stage_record(records: Path, name: str) -> Path:
    """The folder of the recorded stage ``name``: ``records/name`` when loose, else that folder
    unpacked from the first pack holding it (``records/name``, which does not exist, when
    neither holds it)."""
    loose = Path(records) / name
    if loose.is_dir():
        return loose
    for pack in packs(records):
        folder = _unpacked_pack(pack) / name
        if folder.is_dir():
            return folder
    return loose


def shown(path: Path) -> str:
    """A path in a recorded stage as the user finds it: ``PACK:member`` for one unpacked from a
    pack, else the path itself."""
    for pack, (_, folder) in _UNPACKED.items():
        if Path(path).is_relative_to(folder):
            return f"{pack}:{Path(path).relative_to(folder).as_posix()}"
    return str(path)


def removal(records: Path, path: Path) -> str:
    """How the user removes the recorded stage ``path`` (to rebuild it)."""
    if shown(path) == str(path):
        return "remove that folder"
    return f"unpack the records (unlearn records unpack {records}), remove that folder and pack them again"


def unpacked(records: Path) -> Path:
    """All of ``records``' files in one folder to read (never write to): ``records`` itself when
    it holds no pack, else a temporary folder of this process with the packs' files and the
    loose ones (a loose file wins, then the first pack holding it)."""
    records = Path(records)
    found = packs(records)
    if not found:
        return records
    loose = loose_files(records)
    if len(found) == 1 and not loose:
        return _unpacked_pack(found[0])
    view = Path(tempfile.mkdtemp(prefix="view-", dir=_temp_root()))
    for pack in reversed(found):
        shutil.copytree(_unpacked_pack(pack), view, dirs_exist_ok=True)
    for name in loose:
        (view / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(records / name, view / name)
    return view


def _write_pack(records: Path, files: dict[str, bytes]) -> Path:
    """A new pack of ``files`` in ``records`` (written beside, then renamed into place)."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)  # owner 0, no user or group name
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    data = lzma.compress(tar_bytes.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=6)
    final = records / f"{PACK_PREFIX}{hashlib.sha256(data).hexdigest()[:12]}{PACK_SUFFIX}"
    with atomic_open(final, "wb") as handle:
        handle.write(data)
    return final


def _remove_files(records: Path, names: list[str]) -> None:
    """Remove loose files, then the folders they leave empty."""
    folders = set()
    for name in names:
        (records / name).unlink()
        folders.update((records / name).parents)
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        if folder.is_relative_to(records) and folder != records:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


def pack(records: Path) -> Path | None:
    """Store the loose files of ``records`` in a new pack and remove them (the pack read back
    and compared first); returns the pack, None when nothing was loose. A loose file a pack
    already holds is removed when it is the same, and is an error when not (nothing changed)."""
    records = Path(records)
    if not records.is_dir():
        raise UnlearnError(f"{records}: no such records folder")
    with folder_lock(records, f"unlearn records pack {records}"):
        packed = _packed(records)
        new, same = {}, []
        for name in loose_files(records):
            data = (records / name).read_bytes()
            if name not in packed:
                new[name] = data
                continue
            pack, folder = packed[name][0]
            if (folder / name).read_bytes() != data:
                raise UnlearnError(
                    f"{records / name}: differs from its copy in {pack} (a record is never replaced): remove one of them"
                )
            same.append(name)
        made = None
        if new:
            made = _write_pack(records, new)
            if _members(made) != new:
                made.unlink()
                raise UnlearnError(f"{made}: read back, the pack does not hold the files packed; nothing removed")
        _remove_files(records, [*new, *same])
    return made


def unpack(records: Path) -> list[str]:
    """Put the packs' files back in ``records`` as loose files, then remove the packs; returns
    the files written. A packed file whose loose copy or other packed copy differs is an error
    (nothing changed)."""
    records = Path(records)
    if not records.is_dir():
        raise UnlearnError(f"{records}: no such records folder")
    with folder_lock(records, f"unlearn records unpack {records}"):
        found = packs(records)
        packed = _packed(records)
        for name, copies in packed.items():
            data = (copies[0][1] / name).read_bytes()
            others = [(str(pack), folder / name) for pack, folder in copies[1:]]
            if (records / name).is_file():
                others.append((str(records / name), records / name))
            for where, path in others:
                if path.read_bytes() != data:
                    raise UnlearnError(f"{name}: {copies[0][0]} and {where} hold different copies; remove one of them")
        written = []
        for name, copies in sorted(packed.items()):
            if not (records / name).is_file():
                with atomic_open(records / name, "wb") as handle:
                    handle.write((copies[0][1] / name).read_bytes())
                written.append(name)
        for pack in found:
            pack.unlink()
    return written


def save(cp: CellPlan, records: Path) -> list[str]:
    """Record the finished stages of one cell (those already recorded are left as they are);
    returns the folder names recorded now."""
    saved = []
    for stage in cp.stages:
        folder = Path(stage.folder)
        if not (folder / DONE).is_file() or stage_record(records, folder.name).is_dir():
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
    folders = [records, *(_unpacked_pack(pack) for pack in packs(records))]
    for path in (p for folder in folders for p in folder.glob(f"*/{RESOURCES}")):
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
            record = stage_record(records, other.get(stage.folder, folder.name))
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


__all__ = [
    "save",
    "restore",
    "recorded_name",
    "identities",
    "pack",
    "unpack",
    "packs",
    "unpacked",
    "stage_record",
    "shown",
    "removal",
]
