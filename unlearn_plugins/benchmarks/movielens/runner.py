"""A MovieLens study (``[benchmark] source = "movielens"``) as `unlearn study` reaches it, the
study part of the benchmark (:class:`unlearn_plugins.interfaces.Benchmark`): :func:`read` its
tables, :func:`expand` its cells, :func:`plan` their stages (:mod:`.study`), :func:`grid` for
`unlearn study --list`. The core's runner runs it and writes :func:`write_report`, the MovieLens
demo's report (:mod:`.report`); :func:`refuse` names the options it does not take yet."""

from __future__ import annotations

from pathlib import Path

from unlearn_plugins.benchmarks.tofu.study import design as author_design
from unlearn_plugins.study.spec import Cell, Study

from .study import sharded as sharded_table
from .study import source as movielens


def read(reader, data: dict, bench: dict, extra: dict, **head) -> Study:
    """A study on the MovieLens benchmark: target and retrain models fine-tuned with the
    recommendation recipe, the methods, [cud] by user, [sharded] (``reader``: the study file's
    reader, :mod:`unlearn_plugins.study.spec`; ``extra``: the author-unit tables, refused)."""
    author_design.refuse_for_movielens(reader, extra)
    rec = movielens.read(reader, bench, strata="cud" in data)
    target_t, retain_t = reader.table(data, "target", required=True), reader.table(data, "retain")
    for table, values in (("target", target_t), ("retain", retain_t)):
        if "given" in values:
            raise reader.error(
                table, "given", "a MovieLens study fine-tunes its models with the recommendation recipe; remove it"
            )
    for table, values in (("target", target_t), ("retain", retain_t)):
        if "threads" in values:
            raise reader.error(table, "threads", "not available in a MovieLens study (its workers' threads are used)")
    target = reader.recipe("target", target_t, None)
    retain = reader.recipe("retain", retain_t, target)
    budget = reader.budget(data)
    methods = reader.methods(data, budget, head["max_length"], head["one_budget"])
    sharded = None
    if "sharded" in data:
        sharded = sharded_table.read(reader, reader.table(data, "sharded"), users=rec.users - rec.forget_users)
        if any(m.name == sharded.name for m in methods):
            raise reader.error("sharded", "name", f"{sharded.name!r} is used by a method")
    return reader.benchmark_study(
        "movielens",
        target=target,
        retain=retain,
        budget=budget,
        methods=methods,
        evaluation=reader.evaluation(data, movielens.TASKS),
        cud=reader.cud(data, movielens=True),
        movielens=rec,
        sharded=sharded,
        **head,
    )


def expand(study: Study) -> list[Cell]:
    """The cells of a MovieLens study: the target and the retrain model, CUD's users ([cud]),
    the retrain model's evaluation (its forget predictions are the JSD reference) and the
    target's, then seed x method, then the sharded recommender ([sharded]): its shards, and its
    unlearning of the forget users with its evaluation."""
    rec = study.movielens
    cells = [
        Cell("target", "target", f"fine-tune the target on the {rec.users} users' prompts"),
        Cell("retrain", "retain", f"fine-tune the retrain model on the {rec.users - rec.forget_users} retained users"),
    ]
    if study.cud is not None:
        cells.append(
            Cell("cud", "cud", f"CUD scores of the {rec.forget_users} forget users' prompts", deps=("target",))
        )
    cells.append(
        Cell("eval-retrain", "eval_retain", "evaluate the retrain model (the JSD reference)", deps=("retrain",))
    )
    cells.append(Cell("eval-target", "eval_full", "evaluate the target", deps=("target", "eval-retrain")))
    for seed in study.seeds:
        for method in study.methods:
            label = f"{method.label}, seed {seed}"
            cells.append(Cell.run(f"{method.name}/seed{seed}", label, method, seed, ("target", "eval-retrain")))
    if study.sharded is not None:
        s = study.sharded
        shards = f"{s.name}/shards"
        cells.append(Cell(shards, "sharded", f"{s.method}: train {s.shards} shards ({s.aggregator} aggregator)"))
        cells.append(
            Cell(
                s.name,
                "sharded_unlearn",
                f"{s.method}: unlearn the {rec.forget_users} forget users",
                method=s.name,
                deps=(shards, "eval-retrain"),
            )
        )
    return cells


def plan(study: Study, **options):
    """The cells' stages (:func:`.study.cells.plan_movielens_study`)."""
    from .study.cells import plan_movielens_study

    return plan_movielens_study(study, **options)


def grid(study: Study) -> str:
    """One forget request (a fraction of the users): methods x seeds, and the sharded recommender."""
    runs = len(study.methods) * len(study.seeds)
    out = f"{len(study.methods)} methods x {len(study.seeds)} seeds = {runs} runs"
    return out + (f", and {study.sharded.method}" if study.sharded else "")


#: where `unlearn study`'s line about failed cells points: no report is written while one failed
FAILED_CELLS_SEE = "logs: {out}/logs"


def refuse(study, args) -> None:
    """What `unlearn study` cannot do with a MovieLens study, refused before any work: its
    report is the MovieLens demo's (of the study's first seed), written once every cell is built,
    from the cache only, and with the CUD-easy and -hard users' columns."""
    from unlearn_plugins.errors import UnlearnError

    for flag, given in (("--report-only", args.report_only), ("--records", args.records)):
        if given:
            raise UnlearnError(f"{flag}: not available for a MovieLens study ({study.path}) yet")
    if study.cud is None:
        raise UnlearnError(f"{study.path}: [cud]: a MovieLens study's report has the CUD-easy and -hard users' columns")


def write_report(out: Path, plan, results: dict, run: dict) -> tuple[dict, str, dict, str | None]:
    """The MovieLens demo's report (its table, results.json, summary.md, the plots) of the
    study's first seed, as the core's runner writes a study's (files, table, cells left out, why
    no verdict); nothing while a cell failed (the report needs every cell)."""
    from . import report as movielens_report

    if any(r["status"] != "done" for r in results.values()):
        return {}, "", {}, None
    study = plan.study
    config = {"study": study.name, "path": study.path, "out": str(out), "model": study.model, "device": plan.device}
    _, table, files = movielens_report.study_report(
        out,
        plan,
        results,
        config=config,
        budget=movielens_report.study_budget(study),
        train_dtype=study.target.finetune.get("dtype") or "library default",
        wall_s=run["wall_time_s"],
    )
    return files, table, {}, None
