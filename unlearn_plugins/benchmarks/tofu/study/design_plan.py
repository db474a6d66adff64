"""The cells of an author-unit study (:mod:`.design`) as stages of the shared cache:
what ``unlearn study FILE --dry-run`` lists.

Each author (the reserved one and the test authors) gets its own benchmark folder (the same N
authors, that author forgotten alone), its own retain model and the evaluations of it and of
the target on that split; the target, the retain models and their evaluations are keyed exactly
as :func:`.cells.plan_study` keys them (the same recipe on the same data content is the same
stage: v1's target and its forget-199 retain model are found in a shared cache). The noise
ceiling's retain seeds are evaluated against the seed-0 retain model. The sweep's traced runs
(the ``sweep`` builder, :mod:`.trace`) and each method's operating point (``operating_point``,
:mod:`.operating_cell`: lazy Model Utility evaluations and the rule) are stages like the others;
a test cell's configuration is known only once its method's operating point is, so until that
cell has finished it is a :class:`WaitingCellPlan`: the runner (:func:`.runner.run_plan`) builds
everything else, then plans again, and the test cells come back keyed at their points.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

from unlearn_plugins.stages import DONE, Stages, digest
from unlearn_plugins.study.cells import (
    STUDY_FORMAT,
    CellPlan,
    Plan,
    Stage,
    WaitingCellPlan,
    base_model,
    cache_folder,
    evaluation_settings,
    finetune_stage,
    initializer_seed,
    unlearn_key,
    unlearn_stage,
)
from unlearn_plugins.study.spec import Study

from .cells import bench_file, benchmark_stage, study_tofu, tofu_data
from .design import Design, apply_setting
from .operating_cell import read_result
from .operating_point import MEASURES
from .source import expand

#: the builder of a sweep stage (:data:`.cells.BUILDERS`): one traced run (:func:`.trace.build_sweep`)
SWEEP_BUILDER = "sweep"
#: the part of a folder name of a stage whose key waits for an operating point
PENDING = "pending-operating-point"


def author_benchmarks(study: Study, cache: Path, stages: Stages | None, scratch: Path) -> dict[int, dict]:
    """{author: the benchmark's description, folder, key and file digests}: N authors, that one
    to forget, built as cached stages; a dry run (``stages`` None) builds missing ones in
    ``scratch`` only, to know their content."""
    data = tofu_data()
    build_benchmark, source_fingerprint = data.build_benchmark, data.source_fingerprint

    design: Design = study.design
    tofu = study_tofu(study)
    fingerprint = source_fingerprint(tofu)
    out = {}
    for a in design.authors:
        key = digest(STUDY_FORMAT, "bench-author", fingerprint, study.authors, a, study.evaluation.mu_size)
        folder = cache / f"bench-{study.source}-author{a}-{key}"

        def build(tmp: Path, a=a) -> None:
            build_benchmark(
                tmp, tofu=tofu, n_authors=study.authors, n_forget=1, eval_size=study.evaluation.mu_size, forget_ids=[a]
            )

        label = f"benchmark: {study.authors} authors, forget author {a}"
        out[a] = benchmark_stage(stages, label, folder, build, scratch, key)
        if stages is None:  # a dry run's scratch folder goes away
            out[a]["folder"] = None
    return out


def plan_design(
    study: Study,
    *,
    cache: Path,
    device: str | None = None,
    dry_run: bool = False,
    stream=None,
    records: Path | None = None,
) -> Plan:
    """Every cell of an author-unit study with its stages and their cache folders. A real run
    builds the base model (``tiny-llama``) and the per-author benchmarks here; a dry run writes
    nothing. Test cells whose operating point is not chosen yet are :class:`WaitingCellPlan`
    (``records``: one recorded there is chosen, as a run restoring it would find it)."""
    from unlearn_plugins.models import merge_is_exact

    stream = stream or sys.stderr
    design: Design = study.design
    stages = None if dry_run else Stages(cache, total=1 + len(design.authors), stream=stream)
    with tempfile.TemporaryDirectory(prefix="unlearn-study-") as scratch:
        base_path, base_key = base_model(study, stages, cache, device)
        benches = author_benchmarks(study, cache, stages, Path(scratch))
    plan = Plan(study, cache, device, benches)
    settings = evaluation_settings(study, device)
    ev = study.evaluation

    def folder(kind: str, name: str, key: str) -> str:
        return cache_folder(cache, kind, name, key)

    def finetune(label: str, name: str, recipe, data_key: str, bench: dict, split: str) -> Stage:
        where = (cache, "target", name)
        return finetune_stage(
            study, label, where, recipe, (base_path, base_key), (bench_file(bench, split), data_key), device
        )

    def evaluate(label: str, name: str, key: str, bench: dict, model: str, adapter, references, save: bool) -> Stage:
        return Stage(
            label,
            folder("eval", name, key),
            "evaluate",
            {
                "bench": bench["folder"],
                "evaluation": ev,
                "max_length": study.max_length,
                "device": device,
                "model": model,
                "adapter": adapter,
                "references": references,
                "save_reference": save,
            },
        )

    model_keys: dict[str, str] = {}
    eval_keys: dict[int, str] = {}
    first = benches[design.authors[0]]
    if study.target.given is not None:
        plan.models["target"] = study.target.given
        from .cells import given_key

        model_keys["target"] = given_key(study.target.given, study, device)
    merged = ("merged",) if merge_is_exact(device, ev.dtype) else ()
    runs: dict[str, list[str]] = {}
    for cell in expand(study):
        a = cell.author
        bench = benches.get(a) if a is not None else first
        if cell.kind == "target":
            stage = finetune(
                f"fine-tune the target on {study.authors} authors ({first['sizes']['full']} QA)",
                "full",
                study.target,
                first["content"]["full"],
                first,
                "full",
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder, model=_made(stage))
            model_keys["target"] = stage.params["key"]
            plan.models["target"] = plan.cells[cell.id].model
        elif cell.kind == "retain":
            recipe = study.retain if cell.seed is None else dataclasses.replace(study.retain, seed=cell.seed)
            stage = finetune(
                f"fine-tune the retain model on {len(bench['retain_authors'])} authors ({bench['sizes']['retain']} QA)"
                + (f", seed {cell.seed}" if cell.seed is not None else ""),
                "retain",
                recipe,
                bench["content"]["retain"],
                bench,
                "retain",
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder, model=_made(stage))
            model_keys[cell.id] = stage.params["key"]
            plan.models[cell.id] = plan.cells[cell.id].model
        elif cell.kind in ("eval_retain", "eval_full", "eval_ceiling"):
            reference = (
                None
                if cell.kind == "eval_retain"
                else str(Path(folder("eval", "retain", eval_keys[a])) / "reference.json")
            )
            if cell.kind == "eval_retain":
                model_id = f"retain/author{a}"
                key = digest(STUDY_FORMAT, "eval", model_keys[model_id], bench["key"], settings)
                eval_keys[a] = key
                name = "retain"
            elif cell.kind == "eval_full":
                model_id = "target"
                key = digest(STUDY_FORMAT, "eval", model_keys["target"], eval_keys[a], bench["key"], settings)
                name = "full"
            else:
                model_id = f"retain/author{a}/seed{cell.seed}"
                key = digest(STUDY_FORMAT, "eval", model_keys[model_id], eval_keys[a], bench["key"], settings)
                name = "ceiling"
            stage = evaluate(
                cell.label,
                name,
                key,
                bench,
                plan.models[model_id],
                None,
                [] if reference is None else [reference],
                cell.kind == "eval_retain",
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "sweep":
            method = study.method(cell.method)
            setting = next(s for s in design.sweep.runs(method.name) if cell.id.endswith("/" + _name(s)))
            config = apply_setting({**method.config, "seed": study.seeds[0]}, setting)
            config["epochs"] = float(design.sweep.epochs)
            config["initializer_options"] = initializer_seed(config, study.seeds[0])
            data = [bench["content"]["forget"], bench["content"]["retain"]]
            sweep = (list(design.sweep.trace), design.sweep.heldout, eval_keys[a])
            key = unlearn_key("sweep", model_keys["target"], data, config, *sweep)
            stage = Stage(
                f"traced run: {cell.label}",
                folder("sweep", f"{method.name}-author{a}-{_name(setting)}", key),
                SWEEP_BUILDER,
                {
                    "config": config,
                    "model": plan.models["target"],
                    "bench": bench["folder"],
                    "reference_model": plan.models[f"retain/author{a}"],
                    "trace": list(design.sweep.trace),
                    "heldout": design.sweep.heldout,
                    "max_length": study.max_length,
                    "batch_size": ev.batch_size,
                    "device": device,
                },
            )
            runs.setdefault(method.name, []).append({"folder": stage.folder, "setting": setting, "key": key})
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "operating_point":
            method_runs = runs[cell.method]
            key = digest(
                STUDY_FORMAT,
                "operating-point",
                [r["key"] for r in method_runs],
                design.operating_point,
                design.sweep.model_utility_evaluations_max,
                settings,
            )
            target_eval = plan.cells[f"eval-full/author{a}"].stages[-1]
            stage = Stage(
                cell.label,
                folder("point", f"{cell.method}-author{a}", key),
                "operating_point",
                {
                    "runs": [{"folder": r["folder"], "setting": r["setting"]} for r in method_runs],
                    "target_evaluation": target_eval.folder,
                    "rule": design.operating_point,
                    "max_evaluations": design.sweep.model_utility_evaluations_max,
                    # the evaluation of a point: the target's, with the point's adapter
                    "evaluation": {**target_eval.params, "adapter": None},
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        else:  # a test author's method cell
            method = study.method(cell.method)
            waits = next((d for d in cell.deps if d.startswith("operating-point/")), None)
            name = f"{method.name}-author{a}-seed{cell.seed}"
            config = {**method.config, "seed": cell.seed}
            point = chosen_point(plan.cells[waits], records) if waits is not None else None
            if point is not None:  # the operating point is known: the cell is keyed at it
                waits = None
                config = apply_setting(config, {k: v for k, v in point.items() if k != "epoch"})
                config["epochs"] = float(point["epoch"])
            if waits is not None:
                unlearn = Stage(f"unlearn: {cell.label}", str(cache / PENDING / f"run-{name}"), "unlearn", {})
                check = Stage(f"evaluate: {cell.label}", str(cache / PENDING / f"eval-{name}"), "evaluate", {})
                plan.cells[cell.id] = WaitingCellPlan(cell, [unlearn, check], result=check.folder, waiting=waits)
                continue
            config["initializer_options"] = initializer_seed(config, cell.seed)
            data = [bench["content"]["forget"], bench["content"]["retain"]]
            run_key = unlearn_key("unlearn", model_keys["target"], data, config)
            run_folder = folder("run", name, run_key)
            unlearn = unlearn_stage(cell, run_folder, config, plan.models["target"], {"bench": bench["folder"]}, device)
            key = digest(STUDY_FORMAT, "eval", run_key, eval_keys[a], bench["key"], settings, *merged)
            reference = str(Path(folder("eval", "retain", eval_keys[a])) / "reference.json")
            check = evaluate(
                f"evaluate: {cell.label}",
                name,
                key,
                bench,
                plan.models["target"],
                str(Path(run_folder) / "run"),
                [reference],
                False,
            )
            plan.cells[cell.id] = CellPlan(cell, [unlearn, check], result=check.folder)
    return plan


def chosen_point(cp: CellPlan, records: Path | None = None) -> dict | None:
    """The setting and epoch an operating-point cell chose ({"lr", "epoch", ...}), once it has
    finished (or is finished in ``records``) and found a point to use; else None."""
    stage = cp.stages[-1]
    folder = Path(stage.folder)
    if not stage.done:
        from unlearn_plugins.study.records import stage_record

        if records is None or not (stage_record(records, folder.name) / DONE).is_file():
            return None
        folder = stage_record(records, folder.name)
    result = read_result(folder)
    use = (result or {}).get("use")
    if not use:
        return None
    return {k: v for k, v in use.items() if k not in MEASURES and k not in ("adapter", "index")}


def _name(setting: dict) -> str:
    from .design import setting_name

    return setting_name(setting)


def _made(stage: Stage) -> str:
    run = Path(stage.folder) / "run"
    return str(run if stage.params["finetune"].get("full_finetune") else run / "merged")


__all__ = ["plan_design", "WaitingCellPlan", "author_benchmarks", "chosen_point"]
