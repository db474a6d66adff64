"""A MovieLens study's cells (``[benchmark] source = "movielens"``) as stages of the shared
content-keyed cache, as :mod:`.cells` plans a TOFU study's.

The benchmark (:mod:`.movielens`) is built while planning (the cells' keys read its content);
then the target and retrain models (``rec_finetune``, :mod:`.rec_models`), CUD's forget users
(``cud_users``, :mod:`.cud`), every method's unlearning run (``unlearn``, the forget users' training
prompts against the retained users', or none with ``retain = false``), the sharded recommender's
shards and unlearning (``sharded_train``, ``sharded_unlearn``, :mod:`.sharded`), and each model's
recommendation evaluation (``rec_evaluate``, :mod:`.rec_eval`): the retrain model's first, its
forget predictions the JSD reference of the others. Each key digests what its stage's result
depends on (the base model's weights, the parts' content, the options, the keys of the stages
it reads)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from unlearn_plugins.stages import DONE, Stages, digest
from unlearn_plugins.study.cells import STUDY_FORMAT, CellPlan, Plan, Stage, base_model, run_stage
from unlearn_plugins.study.spec import Study, expand

from . import source as movielens
from .evaluate import REFERENCE
from .models import PARTS, merged


def prepare_benchmark(study: Study, cache: Path, stages: Stages | None, scratch: Path) -> dict:
    """The benchmark folder (a cached stage; a dry run builds a missing one in ``scratch`` only, to
    know its content) and its description: info, part content digests, key."""
    from ..benchmark import read_info

    rec = study.movielens
    params = rec.describe()
    key = digest(STUDY_FORMAT, "bench-movielens", movielens.fingerprint(rec), rec.settings().__dict__)
    folder = cache / f"bench-movielens-{key}"
    if stages is not None:
        run_stage(
            stages,
            f"MovieLens benchmark: {rec.users} users, {rec.forget_users} to forget",
            folder,
            lambda tmp: movielens.build(tmp, params),
        )
    elif not (folder / DONE).is_file():
        folder = scratch / folder.name
        movielens.build(folder, params)
    info = read_info(folder)
    return {"folder": str(folder), "key": key, "info": info, "content": movielens.content(folder)}


def plan_movielens_study(
    study: Study, *, cache: Path, device: str | None = None, dry_run: bool = False, stream=None
) -> Plan:
    """Every cell of a MovieLens study with its stages and their cache folders. A real run builds
    the base model (``tiny-llama``) and the benchmark here; a dry run writes nothing."""
    from unlearn_plugins.study.cells import cache_folder, method_run, unlearn_key, unlearn_stage

    stream = stream or sys.stderr
    if problem := movielens.too_many_users(study.movielens.users, study.movielens.movielens_dir):
        from unlearn_plugins.errors import UnlearnError

        raise UnlearnError(f"{study.path}: [benchmark] users: {problem}")  # before the base model is made
    stages = None if dry_run else Stages(cache, total=2, stream=stream)
    with tempfile.TemporaryDirectory(prefix="unlearn-study-") as scratch:
        base_path, base_key = base_model(study, stages, cache, device)
        bench = prepare_benchmark(study, cache, stages, Path(scratch))
        if dry_run:  # the scratch folder goes away: keep only what the keys need
            bench["folder"] = None
    bench_dir = bench["folder"]
    plan = Plan(study, cache, device, {0: bench})
    content, info = bench["content"], bench["info"]
    counts = info["counts"]
    ev = study.evaluation
    eval_settings = (list(ev.tasks), ev.batch_size)
    if ev.dtype:
        eval_settings += (ev.dtype,)
    model = study.model  # as given (alias, folder or hub id): the recipes resolve it

    def folder(kind: str, name: str, key: str) -> str:
        return cache_folder(cache, kind, name, key)

    def evaluate(label: str, name: str, key: str, reference: str | None, **where) -> Stage:
        return Stage(
            label,
            folder("receval", name, key),
            "rec_evaluate",
            {
                "bench": bench_dir,
                "tasks": list(ev.tasks),
                "batch_size": ev.batch_size,
                "device": device,
                "base": base_path,
                "base_name": model,
                "reference": reference,
                "model": None,
                "adapter": None,
                "sharded": None,
                **where,
            },
        )

    model_keys: dict[str, str] = {}
    reference = None
    ref_key = None
    for cell in expand(study):
        if cell.kind in ("target", "retain"):
            name = "target" if cell.kind == "target" else "retrain"
            recipe = study.target if cell.kind == "target" else study.retain
            part = PARTS[name]
            key = digest(
                STUDY_FORMAT, "rec-finetune", base_key, content[part], recipe.finetune, recipe.seed, study.max_length
            )
            stage = Stage(
                f"fine-tune the {name} model on {counts[part]} prompts",
                folder("rec", name, key),
                "rec_finetune",
                {
                    "bench": bench_dir,
                    "part": part,
                    "model": model,
                    "finetune": dict(recipe.finetune),
                    "seed": recipe.seed,
                    "max_length": study.max_length,
                    "device": device,
                    "key": key,
                },
            )
            model_keys[name] = key
            plan.models[name] = merged(stage.folder)
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder, model=plan.models[name])
        elif cell.kind == "cud":
            cud = study.cud
            key = digest(
                STUDY_FORMAT,
                "cud-users",
                model_keys["target"],
                content["train_forget"],
                content["anchor_pool"],
                content["anchor_retain"],
                cud.describe(),
                study.max_length,
            )
            stage = Stage(
                f"CUD scores of the {counts['train_forget']} prompts of the {study.movielens.forget_users} forget users",
                folder("reccud", "forget", key),
                "cud_users",
                {
                    "bench": bench_dir,
                    "model": plan.models["target"],
                    "device": device,
                    "scorer": dict(cud.scorer),
                    "unlearn": dict(cud.unlearn),
                    "strata": cud.strata,
                    "max_length": study.max_length,
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "eval_retain":
            key = digest(STUDY_FORMAT, "rec-eval", model_keys["retrain"], bench["key"], eval_settings)
            stage = evaluate(
                "evaluate the retrain model (and save the JSD reference)",
                "retrain",
                key,
                None,
                model=plan.models["retrain"],
            )
            reference = str(Path(stage.folder) / REFERENCE)
            ref_key = key  # the reference is this evaluation's: its key stands for its content
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "eval_full":
            key = digest(STUDY_FORMAT, "rec-eval", model_keys["target"], ref_key, bench["key"], eval_settings)
            stage = evaluate("evaluate the target model", "target", key, reference, model=plan.models["target"])
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "method":
            # (the initializer keeps its own seed: a MovieLens study's runs are the demo's)
            method, config, no_retain = method_run(study, cell)
            parts = [content["train_forget"], *([] if no_retain else [content["train_retain"]])]
            run_key = unlearn_key(
                "rec-unlearn", model_keys["target"], parts, config, *(["no-retain"] if no_retain else [])
            )
            run_folder = folder("recrun", f"{method.name}-seed{cell.seed}", run_key)
            data = {
                "forget": _part(bench_dir, "train_forget"),
                "retain": None if no_retain else _part(bench_dir, "train_retain"),
            }
            unlearn = unlearn_stage(cell, run_folder, config, plan.models["target"], data, device)
            key = digest(STUDY_FORMAT, "rec-eval", run_key, ref_key, bench["key"], eval_settings)
            stage = evaluate(
                f"evaluate: {cell.label}",
                f"{method.name}-seed{cell.seed}",
                key,
                reference,
                model=plan.models["target"],
                adapter=str(Path(run_folder) / "run"),
            )
            plan.cells[cell.id] = CellPlan(cell, [unlearn, stage], result=stage.folder)
        elif cell.kind == "sharded":
            s = study.sharded
            finetune = {**study.target.finetune, "max_length": study.max_length}
            key = digest(STUDY_FORMAT, "sharded", base_key, content["train"], s.describe(), finetune)
            stage = Stage(
                cell.label,
                folder("recshards", "trained", key),
                "sharded_train",
                {"bench": bench_dir, "model": model, "sharded": s.describe(), "finetune": finetune, "device": device},
            )
            model_keys["sharded"] = key
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "sharded_unlearn":
            users = list(info["forget_users"])
            trained = plan.cells[cell.deps[0]].result
            key = digest(STUDY_FORMAT, "sharded-unlearn", model_keys["sharded"], users)
            unlearn = Stage(
                f"{cell.label} (retrain their shards)",
                folder("recshards", "unlearned", key),
                "sharded_unlearn",
                {"trained": trained, "users": users, "device": device},
            )
            evaluated = evaluate(
                f"evaluate the {study.sharded.method} ensemble after unlearning",
                study.sharded.name,
                digest(STUDY_FORMAT, "rec-eval", key, ref_key, bench["key"], eval_settings),
                reference,
                sharded=str(Path(unlearn.folder) / "sharded"),
            )
            plan.cells[cell.id] = CellPlan(cell, [unlearn, evaluated], result=evaluated.folder)
    return plan


def _part(bench_dir: str | None, part: str) -> str | None:
    from ..benchmark import part_path

    return str(part_path(bench_dir, part)) if bench_dir else None


__all__ = ["plan_movielens_study", "prepare_benchmark"]
