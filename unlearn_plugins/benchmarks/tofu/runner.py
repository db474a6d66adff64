"""A TOFU study as `unlearn study` reaches it, the study part of the benchmark
(:class:`unlearn_plugins.interfaces.Benchmark`): :func:`read` its tables, :func:`expand` its
cells, :func:`plan` their stages, :func:`grid` for `unlearn study --list`. The core's runner runs
it, as every study (records, ``--report-only``, a report while it runs), and writes
:func:`write_report`, checking evaluations with :func:`check_evaluation` and an author-unit
study's recorded operating points with :func:`check_records`. As the default source it also
reads the author-unit tables any study file may hold (:data:`TABLES`, :func:`split_tables`)."""

from __future__ import annotations

from pathlib import Path

from .study.design import TABLES, split_tables
from .study.source import expand, read


def plan(study, *, cache: Path, device: str | None = None, records: Path | None = None, **options):
    """The cells' stages: by forget size (:func:`.study.cells.plan_study`), or for an author-unit
    study :func:`.study.design_plan.plan_design` (``records``: a dry run keys test cells at the
    operating points recorded there, as a run restoring them would)."""
    if study.design is not None:
        from .study.design_plan import plan_design

        return plan_design(study, cache=cache, device=device, records=records, **options)
    from .study.cells import plan_study

    return plan_study(study, cache=cache, device=device, **options)


def grid(study) -> str:
    """methods x forget sizes x seeds, or an author-unit study's grid."""
    if study.design is not None:  # authors as the unit
        from .study.design import describe_grid

        return describe_grid(study)
    runs = len(study.methods) * len(study.forget_sizes) * len(study.seeds)
    return f"{len(study.methods)} methods x {len(study.forget_sizes)} forget sizes x {len(study.seeds)} seeds = {runs} runs"


def write_report(out: Path, plan, results: dict, run: dict) -> tuple[dict, str, dict, str | None]:
    """The study's report in ``out``: (files, terminal table, the finished cells it could not use
    with why, why it states no verdict)."""
    if plan.study.design is None:
        from .study import report

        files, table = report.write_report(out, plan, results, run)
        return files, table, {}, None
    from .study import author_report

    files, table, written = author_report.write_report(out, plan, results, run)
    left_out = {
        cid: cell.get("error") or "not usable"
        for cid, cell in written["cells"].items()
        if cell["status"] == "failed" and results.get(cid, {}).get("status") == "done"
    }
    return files, table, left_out, written.get("lacking")


def check_evaluation(folder: Path) -> None:
    """An evaluation stage's folder read as the report reads it (an error when it cannot be)."""
    from .study.report import check_evaluation as check

    check(folder)


def check_records(plan, records: Path) -> None:
    """An author-unit study's recorded operating points and sweep traces, checked as its
    evaluations are before any is restored: a point outside the sweep's grid, a number out of its
    range or a choice the rule does not make from the recorded points is an error naming the file
    and the field (restored, it would key the method's test cells at a point never chosen)."""
    if plan.study.design is None or plan.study.design.sweep is None:
        return
    import json

    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.stages import DONE
    from unlearn_plugins.study.records import removal, shown, stage_record

    from .study.operating_cell import RESULT_FILE, check_result, check_trace_file
    from .study.operating_point import OperatingPointError

    epochs = plan.study.design.sweep.epochs
    for cp in plan.cells.values():
        stage = cp.stages[-1]
        record = stage_record(records, Path(stage.folder).name)
        if stage.build == "sweep" and (record / "trace" / "trace.jsonl").is_file():
            path = record / "trace" / "trace.jsonl"
            try:
                check_trace_file(record, epochs)
            except (OSError, UnicodeDecodeError, OperatingPointError) as exc:
                raise UnlearnError(
                    f"--records {records}: the recorded trace of {cp.cell.id}, {shown(path)}: {exc}; "
                    f"{removal(records, record)} to rebuild the cell"
                ) from None
        elif stage.build == "operating_point" and (record / DONE).is_file():
            path = record / RESULT_FILE
            try:
                result = json.loads(path.read_text(encoding="utf-8"))
                check_result(
                    result,
                    grid=[r["setting"] for r in stage.params["runs"]],
                    epochs=epochs,
                    rule=stage.params["rule"],
                    max_evaluations=stage.params["max_evaluations"],
                )
            except (OSError, UnicodeDecodeError, ValueError) as exc:  # OperatingPointError is a ValueError
                text = " ".join(str(exc).split())[:600]
                raise UnlearnError(
                    f"--records {records}: the recorded operating point of {cp.cell.id}, {shown(path)}: {text}; "
                    f"{removal(records, record)} to choose it again"
                ) from None


__all__ = [
    "read",
    "expand",
    "plan",
    "grid",
    "write_report",
    "check_evaluation",
    "check_records",
    "TABLES",
    "split_tables",
]
