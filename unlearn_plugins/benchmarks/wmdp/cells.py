"""A WMDP study's cells as stages of the shared content-keyed cache, as
:mod:`unlearn_plugins.study.cells` plans a TOFU study's.

The synthetic benchmark folder (forget and retain documents, the questions) is written while
planning (seconds; a cached stage keyed by the generator's settings and source); the real corpora
are resolved to ``text:`` specs (a missing one is a one-line error before any work). Then the
core's ``finetune`` stage teaches the base model the forget documents (synthetic), the core's
``unlearn`` stage runs every method on the raw forget and retain text, and ``wmdp_evaluate``
(:mod:`.stages`) evaluates each model. Each key digests what its stage's result depends on. A
grid study unlearns parts of the forget corpus (:mod:`.parts`, written while planning as the
synthetic folder is); a sustainability request's unlearning starts from the previous request's
output, so its key holds that stage's key."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from unlearn_plugins.data.text import read_documents
from unlearn_plugins.models import merge_is_exact
from unlearn_plugins.stages import DONE, Stages, digest
from unlearn_plugins.study.cells import (
    STUDY_FORMAT,
    CellPlan,
    Plan,
    Stage,
    base_model,
    evaluation_settings,
    run_stage,
)
from unlearn_plugins.study.spec import Study, StudyError, expand

from . import parts, synthetic


def _source_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def _content(spec: str) -> str:
    """What a ``text:`` spec's data is, for a key: a file's digest, else the spec itself."""
    path = Path(spec.removeprefix("text:"))
    if path.is_file():
        return _source_digest(path)
    if path.is_dir():
        return _source_digest(*sorted(path.glob("*.txt")))
    return spec


def prepare_data(study: Study, cache: Path, stages: Stages | None, scratch: Path) -> dict:
    """{"forget", "retain": text specs, "content": their digests, "metadata": the evaluation's
    task metadata, "key"}: the synthetic folder (a cached stage; a dry run writes a missing one in
    ``scratch`` only) or the real corpora."""
    wmdp = study.benchmark
    if wmdp.corpus == "real":
        from . import data as wmdp_data

        forget = wmdp_data.corpus_spec(wmdp.forget_corpus, wmdp.wmdp_dir)
        retain = wmdp_data.corpus_spec(wmdp.retain_corpus, wmdp.wmdp_dir)
        questions = wmdp_data.questions_folder(wmdp.wmdp_dir)
        content = {"forget": _content(forget), "retain": _content(retain)}
        key = digest(STUDY_FORMAT, "wmdp-real", content, _source_digest(*sorted(questions.glob("wmdp-*.json*"))))
        metadata = {"wmdp_dir": str(questions)}
    else:
        settings = synthetic.Settings(**wmdp.synthetic)
        # keyed by what the generator writes (not its source: a reformatted file keeps the key)
        key = digest(STUDY_FORMAT, "wmdp-synthetic", wmdp.synthetic, synthetic.generate(settings))
        folder = cache / f"wmdp-synthetic-{key}"
        if stages is not None:
            run_stage(
                stages,
                f"synthetic WMDP benchmark: {settings.pathogens} pathogens, {settings.compounds} compounds",
                folder,
                lambda tmp: synthetic.write(tmp / "data", settings),
            )
        elif not (folder / DONE).is_file():
            folder = scratch / folder.name
            synthetic.write(folder / "data", settings)
        data = folder / "data"
        forget, retain = f"text:{data / synthetic.FORGET}", f"text:{data / synthetic.RETAIN}"
        content = {"forget": _content(forget), "retain": _content(retain)}
        metadata = {"wmdp_synthetic_dir": str(data)}
    metadata["mmlu_per_subject"] = wmdp.mmlu_per_subject
    return {"forget": forget, "retain": retain, "content": content, "metadata": metadata, "key": key}


def prepare_parts(study: Study, data: dict, cache: Path, stages: Stages | None, scratch: Path) -> dict:
    """The forget corpus's parts for the study's grid (:mod:`.parts`; a cached stage, as the
    synthetic folder): {"documents": n, part name: {"forget": spec, "content": digest,
    "indices": its documents}}; fraction 1.0 is the forget corpus itself (its runs are the
    one-forget-set study's)."""
    wmdp = study.benchmark
    key = digest(STUDY_FORMAT, "wmdp-parts", data["content"]["forget"], wmdp.forget_fractions, wmdp.sequential_folds)
    folder = cache / f"wmdp-parts-{key}"
    if not (folder / DONE).is_file():  # a real corpus's documents are counted here, before any work
        why = parts.check(len(read_documents(data["forget"])), wmdp.forget_fractions, wmdp.sequential_folds)
        if why:
            key = "forget_fractions" if wmdp.forget_fractions else "sequential_folds"
            raise StudyError(f"{study.path}: [benchmark] {key}: {why} (forget corpus {data['forget']})")

    def write(tmp: Path) -> None:
        parts.write(tmp / "parts", data["forget"], parts.SEED, wmdp.forget_fractions, wmdp.sequential_folds)

    if stages is not None:
        run_stage(stages, f"forget corpus parts: {wmdp.grid}", folder, write)
    elif not (folder / DONE).is_file():
        folder = scratch / folder.name
        write(folder)
    info = json.loads((folder / "parts" / parts.INFO).read_text())
    out: dict = {"documents": info["documents"]}
    for name, indices in info["parts"].items():
        spec = f"text:{folder / 'parts' / f'{name}.jsonl'}"
        out[name] = {"forget": spec, "content": _content(spec), "indices": indices}
        if len(indices) == info["documents"]:  # the whole corpus: the study's own forget data
            out[name].update(forget=data["forget"], content=data["content"]["forget"])
    return out


def plan_wmdp_study(
    study: Study, *, cache: Path, device: str | None = None, dry_run: bool = False, stream=None
) -> Plan:
    """Every cell of a WMDP study with its stages and their cache folders."""
    from unlearn_plugins.study.cells import cache_folder, finetune_stage, method_run, unlearn_key, unlearn_stage

    stream = stream or sys.stderr
    grid = study.benchmark.grid
    stages = None if dry_run else Stages(cache, total=3 if grid else 2, stream=stream)
    with tempfile.TemporaryDirectory(prefix="unlearn-study-") as scratch:
        base_path, base_key = base_model(study, stages, cache, device)
        data = prepare_data(study, cache, stages, Path(scratch))
        if grid:
            data["parts"] = prepare_parts(study, data, cache, stages, Path(scratch))
    plan = Plan(study, cache, device, {0: data})
    ev = study.evaluation
    eval_settings = (*evaluation_settings(study, device), data["key"], data["metadata"]["mmlu_per_subject"])

    def folder(kind: str, name: str, key: str) -> str:
        return cache_folder(cache, kind, name, key)

    def evaluate(label: str, name: str, key: str, model: str, adapter: str | None) -> Stage:
        return Stage(
            label,
            folder("wmdpeval", name, key),
            "wmdp_evaluate",
            {
                "model": model,
                "adapter": adapter,
                "tasks": list(ev.tasks),
                "batch_size": ev.batch_size,
                "dtype": ev.dtype,
                "scoring": ev.scoring,
                "device": device,
                "metadata": data["metadata"] if not dry_run else {},
            },
        )

    model_keys = {"base": base_key}
    plan.models["base"] = base_path
    plan.models["target"] = base_path
    model_keys["target"] = base_key
    for cell in expand(study):
        if cell.kind == "eval_base":
            key = digest(STUDY_FORMAT, "wmdp-eval", base_key, eval_settings)
            stage = evaluate("evaluate the base model", "base", key, base_path, None)
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "target":
            stage = finetune_stage(
                study,
                "teach the synthetic facts (fine-tune on the forget documents)",
                (cache, "wmdpteach", "target"),
                study.target,
                (base_path, base_key),
                (data["forget"], data["content"]["forget"]),
                device,
                kind="wmdp-teach",
            )
            run = Path(stage.folder) / "run"
            plan.models["target"] = str(run if study.target.finetune.get("full_finetune") else run / "merged")
            model_keys["target"] = stage.params["key"]
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder, model=plan.models["target"])
        elif cell.kind == "eval_full":
            key = digest(STUDY_FORMAT, "wmdp-eval", model_keys["target"], eval_settings)
            stage = evaluate("evaluate the taught model", "target", key, plan.models["target"], None)
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "method":
            method, config, no_retain = method_run(study, cell)
            part = cell.id.rsplit("/", 1)[1] if grid else None
            forget = data["parts"][part] if part else {"forget": data["forget"], "content": data["content"]["forget"]}
            chained = grid == "sustainability"
            start = cell.deps[0] if chained and cell.deps else "target"  # request k: where request k-1 left
            model, model_key = plan.models[start], model_keys[start]
            if chained:
                config["merge"] = True  # a LoRA run leaves run/merged too: the next request's model
            texts = [forget["content"], *([] if no_retain else [data["content"]["retain"]])]
            run_key = unlearn_key("wmdp-unlearn", model_key, texts, config, study.max_length)
            whole = forget["forget"] == data["forget"]  # the one-forget-set study's run: its folders too
            name = f"{method.name}-seed{cell.seed}" if whole else cell.id.replace("/", "-")
            run_folder = folder("wmdprun", name, run_key)
            texts = {"forget": forget["forget"], "retain": None if no_retain else data["retain"]}
            unlearn = unlearn_stage(cell, run_folder, {**config, "max_length": study.max_length}, model, texts, device)
            full = bool(config.get("full_finetune"))
            run = Path(run_folder) / "run"
            if chained:  # evaluated as the next request gets it
                plan.models[cell.id] = str(run if full else run / "merged")
                model_keys[cell.id] = run_key
                key = digest(STUDY_FORMAT, "wmdp-eval", run_key, eval_settings)
                stage = evaluate(f"evaluate: {cell.label}", name, key, plan.models[cell.id], None)
            else:
                merged = ("merged",) if merge_is_exact(device, ev.dtype) and not full else ()
                key = digest(STUDY_FORMAT, "wmdp-eval", run_key, eval_settings, *merged)
                stage = evaluate(
                    f"evaluate: {cell.label}", name, key, str(run) if full else model, None if full else str(run)
                )
            plan.cells[cell.id] = CellPlan(cell, [unlearn, stage], result=stage.folder, model=plan.models.get(cell.id))
    return plan


__all__ = ["plan_wmdp_study", "prepare_data"]
