"""Run a study: plan its cells, hand every cell whose inputs are ready to the executor, follow
their progress, and write the report.

Cells found complete in the cache are not run again (a rerun after an interruption continues
with the unfinished ones). A failed cell is reported with its error line and log, the cells
that need its result are reported as not run, and the others go on; the report covers what
finished.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import tables
from ..errors import UnlearnError
from ..files import LockHeld, folder_lock
from ..stages import DONE, unreadable
from .cells import CellTask, Plan, WaitingCellPlan, cell_source, is_evaluation, planned_as, stage_identity
from .progress import Progress
from .spec import Study

#: the status of a test cell whose operating point was chosen after this pass planned it
WAITING = "waiting"


@dataclass
class Outcome:
    plan: Plan
    results: dict[str, dict]
    files: dict[str, str] = field(default_factory=dict)
    table: str = ""
    #: an author-unit report's finished cells it could not use ({cell: why}: an author's retain
    #: or target evaluation missing, say), and why it states no verdict ("N of M comparisons lack data")
    left_out: dict[str, str] = field(default_factory=dict)
    lacking: str | None = None

    @property
    def failed(self) -> list[str]:
        return [cell for cell, r in self.results.items() if r["status"] != "done"]


def plan_cells(study: Study, *, cache: Path, device: str | None = None, records: Path | None = None, **options) -> Plan:
    """The study's cells and stages: its benchmark's study part's ``plan`` (``options``:
    ``dry_run``, ``stream``; ``records``: a dry run keys cells waiting for a result recorded
    there, an author-unit study's test cells at their operating points, as a run restoring them
    would)."""
    from ..host import study_part

    where = {"records": records} if records is not None else {}
    plan = study_part(study.source).plan(study, cache=cache, device=device, **where, **options)
    plan.identity = stage_identity(device)
    return plan


def log_path(out: Path, cell_id: str) -> Path:
    return out / "logs" / (cell_id.replace("/", "_") + ".log")


def check_out(out: Path, study: Study) -> None:
    """Before any work: ``out`` can be written (a read-only one failed every cell's log, and the
    report at the end), and holds no report of another study (two studies of one name replaced
    each other's report in the default --out and mixed their logs). A report's study.json holds
    the study's settings with ``study_digest``, or its name with ``digest``."""
    import json

    try:
        with folder_lock(out, f"--out {out}"):  # creates the folder and a file in it, then removes them
            pass
    except LockHeld:
        pass  # a run of this study writes its report there: it can be written
    existing = out / "study.json"
    if not existing.exists():
        return
    try:
        recorded = json.loads(existing.read_text(encoding="utf-8"))
        if isinstance(recorded["study"], str):
            name, digest = recorded["study"], recorded["digest"]
        else:
            name, digest = recorded["study"]["name"], recorded.get("study_digest")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UnlearnError(
            f"--out {out}: its study.json is not a study report this command can read ({exc}); give another "
            f"--out, or remove {existing}"
        ) from None
    if name != study.name or (digest is not None and digest != study.digest()):
        other = f"another study, {name!r}" if name != study.name else f"another study named {name!r} (other settings)"
        raise UnlearnError(f"--out {out}: holds the report of {other}; give this one another --out (or remove {out})")


def _recorded(cp, records: Path | None) -> bool:
    """Whether a cell not in the cache has its result in ``records`` (an evaluation, an operating
    point: restored as finished by a run)."""
    from .records import WHOLE, stage_record

    last = cp.stages[-1]
    return (
        records is not None
        and not cp.cached
        and not isinstance(cp, WaitingCellPlan)
        and last.build in WHOLE
        and (stage_record(records, Path(last.folder).name) / DONE).is_file()
    )


def dry_run_plan(study: Study, *, cache: Path, device: str | None, records: Path | None) -> Plan:
    """The plan a run would make, writing nothing: with ``records`` checked as a run checks them,
    and an author-unit study's test cells keyed at the operating points recorded there."""
    plan = plan_cells(study, cache=cache, device=device, dry_run=True)
    if records is None:
        return plan
    check_records(plan, records)
    waiting = {cid for cid, cp in plan.cells.items() if isinstance(cp, WaitingCellPlan)}
    if waiting:
        plan = plan_cells(study, cache=cache, device=device, dry_run=True, records=records)
        check_records(plan, records, cells=waiting)
    return plan


def dry_run_table(plan: Plan, records: Path | None = None) -> str:
    """The expanded grid: one line per cell with its stages' cache state, as a run would find it
    (``recorded``: its result is in ``records``, restored rather than built; ``not needed``: a
    model that only cached or recorded cells need, which a run does not build)."""
    rows = [("cell", "needs", "stages", "state")]
    recorded = {cid for cid, cp in plan.cells.items() if _recorded(cp, records)}
    skip = _not_needed(plan, recorded)
    n_cached = n_recorded = n_waiting = n_skipped = 0
    for cp in plan.ordered():
        done = sum(s.done for s in cp.stages)
        if cp.cached:
            state = "cached"
            n_cached += 1
        elif cp.cell.id in recorded:
            state = "recorded"
            n_recorded += 1
        elif cp.cell.id in skip:
            state = "not needed"
            n_skipped += 1
        elif getattr(cp, "waiting", None):  # its stages' keys need another cell's result
            state = f"waits for {cp.waiting}"
            n_waiting += 1
        else:
            state = "to build" if done == 0 else f"{done}/{len(cp.stages)} cached"
        rows.append((cp.cell.id, _needs(cp.cell.deps), " + ".join(s.build for s in cp.stages), state))
    lines = tables.text_table(rows[0], rows[1:], numbers_right=False).splitlines()
    shown = f", {n_recorded} recorded" if records is not None else ""
    shown += f", {n_skipped} not needed (only cached or recorded cells need them)" if n_skipped else ""
    lines.append(
        f"{len(plan.cells)} cells: {n_cached} cached{shown}, {len(plan.cells) - n_cached - n_recorded - n_skipped} "
        f"to build{f' ({n_waiting} waiting for an operating point)' if n_waiting else ''} (cache {plan.cache})"
    )
    return "\n".join(lines)


def _needs(deps, width: int = 80) -> str:
    """A cell's dependencies for the table; when they are longer than ``width`` characters,
    three or more of one folder as ``folder/* (n)`` (an operating point's dozen sweep runs)."""
    text = ", ".join(deps)
    if len(text) <= width:
        return text or "-"
    groups: dict[str, list[str]] = {}
    for dep in deps:
        groups.setdefault(dep.rpartition("/")[0] or dep, []).append(dep)
    shown = [f"{parent}/* ({len(group)})" if len(group) > 2 else ", ".join(group) for parent, group in groups.items()]
    return ", ".join(shown) or "-"


def _not_needed(plan: Plan, recorded: set[str] = frozenset()) -> set[str]:
    """Target, retain and traced sweep cells not built whose every dependent cell is finished
    (its evaluation or operating point restored from records, or in ``recorded``: to be) or
    itself not needed: their models would be built for nothing (the target of a study whose
    sweeps are recorded, say)."""
    dependents: dict[str, list[str]] = {}
    for cp in plan.ordered():
        for dep in cp.cell.deps:
            dependents.setdefault(dep, []).append(cp.cell.id)
    skip: set[str] = set()
    for cp in reversed(plan.ordered()):  # a cell's dependents come after it
        if (
            cp.cell.kind in ("target", "retain", "sweep")
            and not cp.cached
            and dependents.get(cp.cell.id)
            and all(plan.cells[d].cached or d in skip or d in recorded for d in dependents[cp.cell.id])
        ):
            skip.add(cp.cell.id)
    return skip


def run_cells(
    plan: Plan,
    make_executor,
    out: Path,
    *,
    stream=None,
    records: Path | None = None,
    progress: Progress | None = None,
    earlier: dict[str, dict] | None = None,
) -> dict[str, dict]:
    """Every cell of ``plan`` (dependencies first); returns each cell's result. With
    ``records``, each finished cell's results are recorded there as it finishes. A cell waiting
    for an operating point (:class:`.cells.WaitingCellPlan`) is not run: its result says
    ``waiting`` once what it waits for has finished (the next pass keys it). ``earlier``: the
    results of a previous pass over the same study, whose finished cells are not reported again."""
    earlier = earlier or {}
    own_progress = progress is None
    progress = progress or Progress(len(plan.cells), stream=stream)
    results: dict[str, dict] = {}
    pending = []
    skip = _not_needed(plan)
    for cp in plan.ordered():
        before = earlier.get(cp.cell.id, {}).get("status")
        if (before == "done" and (cp.cached or cp.cell.id in skip)) or before == "failed":
            results[cp.cell.id] = earlier[cp.cell.id]  # reported in the previous pass (a failure is not retried)
        elif cp.cached or cp.cell.id in skip:
            results[cp.cell.id] = {
                "status": "done",
                "source": "cached" if cp.cached else "recorded",
                "sources": ["cached"] * len(cp.stages),
            }
            progress.cached(cp.cell.id)
            if records is not None and cp.cached:
                record_cell(cp, records, stream)
        else:
            pending.append(cp)
    executor = None
    running: set[str] = set()
    try:
        while pending or running:
            for cp in list(pending):
                failed = [d for d in cp.cell.deps if results.get(d, {}).get("status") == "failed"]
                if failed:
                    pending.remove(cp)
                    results[cp.cell.id] = {
                        "status": "failed",
                        "sources": [],
                        "error": f"not run: it needs {failed[0]}, which failed",
                    }
                    progress.finished(cp.cell.id, results[cp.cell.id])
            ready = [cp for cp in pending if all(results.get(d, {}).get("status") == "done" for d in cp.cell.deps)]
            for cp in [cp for cp in ready if isinstance(cp, WaitingCellPlan)]:  # keyed in the next pass
                ready.remove(cp)
                pending.remove(cp)
                results[cp.cell.id] = {"status": WAITING, "sources": [], "error": f"waits for {cp.waiting}"}
            if ready and executor is None:
                executor = make_executor()
                progress.line(f"executor: {executor.describe()}")
            for cp in ready[: executor.free() if executor else 0]:
                pending.remove(cp)
                running.add(cp.cell.id)
                executor.submit(
                    CellTask(
                        cp,
                        str(plan.cache),
                        str(log_path(out, cp.cell.id)),
                        identity=plan.identity,
                        prompt_format=plan.study.prompt_format,
                    )
                )
            if not running:
                continue
            for event in executor.events(0.5):
                kind, cell = event[0], event[1]
                if kind == "interrupted":  # Ctrl-C reached a worker (this process may ignore SIGINT)
                    raise KeyboardInterrupt(f"(in {event[2]})")
                if cell not in running:
                    continue
                if kind == "start":
                    progress.start(cell, event[2])
                elif kind == "stage":
                    progress.stage(cell, *event[2:])
                elif kind == "wait":
                    progress.waiting(cell, event[2])
                elif kind == "done":
                    running.discard(cell)
                    result = dict(event[2])
                    result["source"] = cell_source(result.get("sources", []))
                    results[cell] = result
                    progress.finished(cell, result)
                    if records is not None and result["status"] == "done":
                        record_cell(plan.cells[cell], records, stream)
    except BaseException:
        if executor is not None:
            executor.close(interrupted=True)
            executor = None
        raise
    finally:
        if executor is not None:
            executor.close()
        if own_progress:
            progress.close()
    return results


def unreadable_evaluation(folder: Path, study: Study) -> str | None:
    """Why an evaluation stage folder cannot be read, or None when it can: the study part's
    ``check_evaluation`` (TOFU's: a truncated results or samples file, a number out of its
    range), else whether its files parse."""
    from ..host import study_part

    check = getattr(study_part(study.source), "check_evaluation", None)
    if check is None:
        return unreadable(folder)
    try:
        check(folder)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        return f"{type(exc).__name__}: {text}"[:500]  # room for a file named from its stage folder
    return None


def _evaluation_stages(plan: Plan):
    for cp in plan.cells.values():
        for stage in cp.stages:
            if is_evaluation(stage.build):
                yield cp, stage


def check_records(
    plan: Plan, records: Path, cells: set[str] | None = None, other: dict[str, str] | None = None
) -> None:
    """A recorded evaluation that cannot be read is an error naming it (it is never restored
    and averaged away): the user removes it, and the cell is rebuilt. ``cells``: only theirs;
    ``other``: the records of another device to be restored (:func:`foreign_records`)."""
    from ..host import study_part
    from .records import removal, shown, stage_record

    other = other or {}
    for cp, stage in _evaluation_stages(plan):
        if cells is not None and cp.cell.id not in cells:
            continue
        record = stage_record(records, other.get(stage.folder, Path(stage.folder).name))
        if (record / DONE).is_file() and (problem := unreadable_evaluation(record, plan.study)):
            raise UnlearnError(
                f"--records {records}: the recorded evaluation of {cp.cell.id}, {shown(record)}, is unreadable "
                f"({problem}); {removal(records, record)} to rebuild the cell"
            )
    if cells is None and (check := getattr(study_part(plan.study.source), "check_records", None)):
        check(plan, records)  # an author-unit study's operating points and traces


def drop_unreadable(plan: Plan, stream) -> list[str]:
    """Cached evaluations that cannot be read are removed, so this run rebuilds them; returns
    the cells concerned."""
    import shutil

    dropped = []
    for cp, stage in _evaluation_stages(plan):
        folder = Path(stage.folder)
        if (folder / DONE).is_file() and (problem := unreadable_evaluation(folder, plan.study)):
            print(
                f"warning: the cached evaluation of {cp.cell.id} ({folder}) is unreadable ({problem}): rebuilding it",
                file=stream,
                flush=True,
            )
            shutil.rmtree(folder, ignore_errors=True)
            dropped.append(cp.cell.id)
    return dropped


def record_cell(cp, records: Path, stream) -> None:
    """Record a finished cell; a failure to record is said, and the study goes on."""
    from . import records as ledger

    try:
        ledger.save(cp, records)
    except OSError as exc:
        print(f"warning: --records {records}: could not record {cp.cell.id}: {exc}", file=stream, flush=True)


def foreign_records(plan: Plan, records: Path, *, device: str | None, any_device: bool) -> dict[str, str]:
    """Records made on another device type or precision that would answer for this plan's
    stages ({this plan's stage folder: the record's folder name}). They are keyed apart, so a
    GPU run never takes a CPU number for its own; found, they are refused with one line
    unless ``any_device`` (``--records-any-device``) asks to reuse them."""
    import io

    from . import records as ledger

    found: dict[str, str] = {}
    for other in sorted(ledger.identities(records) - {tuple(plan.identity)}):
        with planned_as(other):
            shadow = plan_cells(plan.study, cache=plan.cache, device=device, stream=io.StringIO())
        n = 0
        for cell_id, cp in plan.cells.items():
            twin = shadow.cells.get(cell_id)
            if twin is None or len(twin.stages) != len(cp.stages):
                continue
            for stage, theirs in zip(cp.stages, twin.stages):
                name = Path(theirs.folder).name
                ours = ledger.stage_record(records, Path(stage.folder).name).is_dir()
                if stage.done or ours or not ledger.stage_record(records, name).is_dir():
                    continue
                found[stage.folder] = name
                n += 1
        if n and not any_device:
            raise UnlearnError(
                f"--records {records}: {n} recorded stage(s) were made on {other[0]} in {other[1]}, this run is "
                f"on {plan.identity[0]} in {plan.identity[1]}; pass --records-any-device to reuse their numbers "
                f"as this run's, or leave out --records to build them here"
            )
    return found


def plan_restored(
    study: Study,
    *,
    cache: Path,
    device: str | None,
    stream,
    records: Path | None,
    quiet: bool = False,
    records_any_device: bool = False,
) -> Plan:
    """:func:`plan_cells` with ``records`` restored into the cache (those of another device or
    precision only with ``records_any_device``: :func:`foreign_records`); planned again while a
    restored operating point keys test cells that were waiting for it."""
    from . import records as ledger

    while True:
        plan = plan_cells(study, cache=cache, device=device, stream=stream)
        if records is None:
            return plan
        foreign = foreign_records(plan, records, device=device, any_device=records_any_device)
        check_records(plan, records, other=foreign)
        restored = ledger.restore(plan, records, foreign)
        if restored and not quiet:
            print(f"restored {len(restored)} stage(s) from --records {records}", file=stream, flush=True)
        waiting = [cp for cp in plan.cells.values() if isinstance(cp, WaitingCellPlan)]
        if not restored or not any(plan.cells[cp.waiting].cached for cp in waiting):
            return plan


def run_plan(
    study: Study,
    *,
    out: str | Path,
    cache: Path,
    workers: int = 1,
    executor: str = "local",
    scheduler: str | None = None,
    device: str | None = None,
    threads: int | None = None,
    stream=None,
    records: str | Path | None = None,
    records_any_device: bool = False,
) -> tuple[Plan, dict[str, dict]]:
    """Plan the study's cells and build them (in ``workers`` processes, or on Dask), each cell's
    log in ``out``/logs; returns the plan and each cell's result. ``records``: a folder of
    finished cells' results (:mod:`unlearn_plugins.study.records`), restored into the cache
    first and added to as cells finish. The study's report (:func:`run_study`) and the demo's
    are written from what this returns."""
    from .executors import make_executor

    stream = stream or sys.stderr
    records = Path(records) if records is not None else None
    progress = None
    results: dict[str, dict] = {}
    waited: set[str] = set()
    try:
        while True:  # one pass; an author-unit study plans again once operating points are chosen
            plan = plan_restored(
                study,
                cache=cache,
                device=device,
                stream=stream,
                records=records,
                records_any_device=records_any_device,
            )
            drop_unreadable(plan, stream)
            if progress is None:
                progress = Progress(len(plan.cells), stream=stream)
            passed = run_cells(
                plan,
                lambda plan=plan: make_executor(
                    executor,
                    workers,
                    scheduler=scheduler,
                    threads=threads,
                    per_gpu=study.workers_per_gpu,
                    use_gpus=plan.identity[0] == "cuda",
                ),
                Path(out),
                stream=stream,
                records=records,
                progress=progress,
                earlier=results,
            )
            waiting = {cid for cid, r in passed.items() if r["status"] == WAITING}
            results = passed
            if not waiting or waiting == waited:  # nothing left to key (an operating point that chose nothing)
                return plan, results
            waited = waiting
            progress.line("operating points chosen: planning the test cells at them")
    finally:
        if progress is not None:
            progress.close()


def run_study(study: Study, *, out: str | Path, cache: Path, stream=None, **options) -> Outcome:
    """Build every cell (in ``workers`` processes, or on Dask) and write the report in ``out``;
    ``options`` are :func:`run_plan`'s (``workers``, ``executor``, ``records``, ...): ``records``,
    a folder of finished cells' results (:mod:`unlearn_plugins.study.records`), is restored into
    the cache first and added to as cells finish."""
    stream = stream or sys.stderr
    out = Path(out)
    started = time.perf_counter()
    check_out(out, study)
    plan, results = run_plan(study, out=out, cache=cache, stream=stream, **options)
    return _write_report(
        out,
        plan,
        results,
        {
            "executor": options.get("executor", "local"),
            "workers": options.get("workers", 1),
            "wall_time_s": round(time.perf_counter() - started, 1),
        },
        stream,
    )


def report_study(
    study: Study,
    *,
    out: str | Path,
    cache: Path,
    device: str | None = None,
    stream=None,
    records: str | Path | None = None,
    records_any_device: bool = False,
) -> Outcome:
    """The report of the cells finished so far (cached, or restored from ``records``), building
    no cell: a long study's table while it runs, or of a study stopped before its end."""

    stream = stream or sys.stderr
    out = Path(out)
    check_out(out, study)
    plan = plan_restored(
        study,
        cache=cache,
        device=device,
        stream=stream,
        records=Path(records) if records else None,
        quiet=True,
        records_any_device=records_any_device,
    )
    results = {}
    # an author-unit study's report lists what did not finish: a model only recorded cells
    # needed is reported as recorded (a TOFU study's summary names such models "not run yet")
    skip = _not_needed(plan) if study.design is not None else set()
    for cp in plan.ordered():
        if cp.cell.id in skip:
            results[cp.cell.id] = {"status": "done", "source": "recorded", "sources": []}
        if not cp.cached:
            continue
        last = cp.stages[-1]
        problem = unreadable_evaluation(Path(cp.result), study) if is_evaluation(last.build) else None
        if problem:  # a report never averages it away; a run (not --report-only) rebuilds it
            results[cp.cell.id] = {
                "status": "failed",
                "sources": [],
                "error": f"its evaluation is unreadable ({problem})",
            }
        else:
            results[cp.cell.id] = {"status": "done", "source": "cached", "sources": ["cached"] * len(cp.stages)}
    return _write_report(out, plan, results, {"report_only": True}, stream)


def _write_report(out: Path, plan: Plan, results: dict, run: dict, stream) -> Outcome:
    """The report, under the lock of ``out`` (a concurrent run of the same study writing the
    same folder is waited for: its report is replaced by this one, which has the same cells)."""
    from ..host import study_part

    deadline = time.monotonic() + 600
    while True:
        try:
            with folder_lock(out, f"--out {out}"):
                return Outcome(plan, results, *study_part(plan.study.source).write_report(out, plan, results, run))
        except LockHeld:
            if time.monotonic() > deadline:
                raise
            print(f"waiting for another run writing its report in {out}", file=stream, flush=True)
            time.sleep(2)


__all__ = ["plan_cells", "run_study", "run_plan", "report_study", "run_cells", "dry_run_table", "Outcome"]
