"""A TOFU study's tables and cells: :func:`read` the study file's TOFU tables ([benchmark]
source ``tofu``, ``generated`` or ``auto``, authors, forget sizes; an author-unit study's tables
through :mod:`.design`) and :func:`expand` its grid."""

from __future__ import annotations

import dataclasses

from unlearn_plugins.study.spec import Cell, Recipe, Study, StudyError

from . import design as author_design
from .design import _show


def read(reader, data: dict, bench: dict, design_data: dict, **head) -> Study:
    """A study of TOFU's authors (``reader``: the study file's reader,
    :mod:`unlearn_plugins.study.spec`; ``design_data``: the author-unit tables)."""
    name, description, seeds, ci, one_budget = (head[k] for k in ("name", "description", "seeds", "ci", "one_budget"))
    model, max_length = head["model"], head["max_length"]
    run_fields = {k: head[k] for k in ("prompt_format", "workers_per_gpu")}
    source = bench.get("source", "tofu")
    if "sharded" in data:
        raise StudyError(f"{reader.path}: [sharded]: a sharded recommender needs [benchmark] source = 'movielens'")
    reader.keys("benchmark", bench, ("source", "tofu_dir", "authors", "forget_authors", *author_design.BENCHMARK_KEYS))
    tofu_dir = reader.get("benchmark", bench, "tofu_dir", "str")
    if tofu_dir is not None:
        if source == "generated":
            raise reader.error("benchmark", "tofu_dir", "only applies to source = 'tofu' or 'auto'")
        tofu_dir = str(reader.relative(tofu_dir))
    authors = reader.get("benchmark", bench, "authors", "int", required=True, minimum=2)
    if authors > 20:
        raise reader.error(
            "benchmark",
            "authors",
            f"must be <= 20 (the TOFU authors with paraphrased and "
            f"perturbed answers, forget10_perturbed), got {authors}",
        )
    forget_sizes = reader.int_list("benchmark", bench, "forget_authors", minimum=1, maximum=authors - 1, scalar_ok=True)

    target, retain, retain_given = models(
        reader, data, forget_sizes, author_unit="unit" in design_data.get("benchmark", {})
    )
    budget = reader.budget(data)
    methods = reader.methods(data, budget, max_length, one_budget)
    evaluation = reader.evaluation(data)
    cud = reader.cud(data)
    study = Study(
        name=name,
        path=str(reader.path),
        description=description,
        model=model,
        max_length=max_length,
        source=source,
        tofu_dir=tofu_dir,
        authors=authors,
        forget_sizes=forget_sizes,
        target=target,
        retain=retain,
        retain_given=retain_given,
        budget=budget,
        methods=methods,
        seeds=seeds,
        evaluation=evaluation,
        ci=ci,
        cud=cud,
        one_budget=one_budget,
        **run_fields,
    )
    design = author_design.read_design(reader, design_data, study)
    return study if design is None else dataclasses.replace(study, design=design)


def models(reader, data: dict, forget_sizes, author_unit: bool = False) -> tuple[Recipe, Recipe, dict]:
    """[target] and [retain]: a recipe each, or given models (the target, and a retain model per
    forget size); returns (target, retain recipe, {forget size: given retain model})."""
    target_t = reader.table(data, "target", required=True)
    retain_t = reader.table(data, "retain")
    if "given" in target_t:
        given = reader.get("target", target_t, "given", "str")
        extra = [k for k in target_t if k != "given"]
        if extra:
            raise reader.error("target", extra[0], "a given target has no recipe; remove it or 'given'")
        target = Recipe(given=reader.given_model("target", "given", given))
    else:
        target = reader.recipe("target", target_t, None)
    retain_given: dict[int, str] = {}
    if "given" in retain_t:
        table = reader.get("retain", retain_t, "given", "table")
        extra = [k for k in retain_t if k != "given"]
        if extra:
            raise reader.error("retain", extra[0], "given retain models have no recipe; remove it or 'given'")
        for key, value in table.items():
            if not key.isdigit() or int(key) not in forget_sizes:
                raise reader.error(
                    "retain.given",
                    key,
                    f"must be a forget size of [benchmark] forget_authors ({', '.join(map(str, forget_sizes))})",
                )
            if not isinstance(value, str) or not value:
                raise reader.error("retain.given", key, f"must be a model folder or hub id, got {_show(value)}")
            retain_given[int(key)] = reader.given_model("retain.given", key, value)
        missing = [k for k in forget_sizes if k not in retain_given]
        if missing:
            raise reader.error("retain.given", str(missing[0]), "missing: give a retain model for every forget size")
        return target, Recipe(), retain_given
    if target.given is not None and not retain_t:
        raise reader.error(
            "retain",
            None,
            "the target is given, so the retain models need a recipe ([retain.finetune], seed)"
            + (
                ": an author-unit study fine-tunes a retain model per author"
                if author_unit
                else ' or given folders (given = {"1" = "..."})'
            ),
        )
    base = None if target.given is not None else target
    return target, reader.recipe("retain", retain_t, base), retain_given


def expand(study: Study) -> list[Cell]:
    """Every cell of the grid, each after the cells it needs: the target, per forget size the
    retain model and the evaluations of both (the retain model's truth ratios are the Forget
    Quality reference), then seed x forget size x method; an author-unit study's:
    :func:`.design.cells`."""
    if study.design is not None:  # authors as the unit
        return [Cell(**cell) for cell in author_design.cells(study)]
    cells: list[Cell] = []
    target_id = None
    if study.target.given is None:
        target_id = "target"
        cells.append(Cell("target", "target", f"fine-tune the target on {study.authors} authors"))
    for k in study.forget_sizes:
        retain_id = None
        if k not in study.retain_given:
            retain_id = f"retain/forget{k}"
            cells.append(Cell(retain_id, "retain", f"fine-tune the retain model (forget {k})", forget=k))
        if study.cud is not None:
            cells.append(
                Cell(
                    f"cud/forget{k}",
                    "cud",
                    f"CUD scores of the forget set (forget {k})",
                    forget=k,
                    deps=tuple(d for d in (target_id,) if d),
                )
            )
        ref = f"eval-retain/forget{k}"
        cells.append(
            Cell(
                ref,
                "eval_retain",
                f"evaluate the retain model (forget {k})",
                forget=k,
                deps=tuple(d for d in (retain_id,) if d),
            )
        )
        cells.append(
            Cell(
                f"eval-full/forget{k}",
                "eval_full",
                f"evaluate the target (forget {k})",
                forget=k,
                deps=tuple(d for d in (target_id, ref) if d),
            )
        )
    # seed-major: a study stopped early has every method and size at its first seeds
    for seed in study.seeds:
        for k in study.forget_sizes:
            for method in study.methods:
                deps = tuple(d for d in (target_id, f"eval-retain/forget{k}") if d)
                label = f"{method.label}, forget {k}, seed {seed}"
                cells.append(Cell.run(f"{method.name}/forget{k}/seed{seed}", label, method, seed, deps, forget=k))
    return cells
