"""A TOFU study's cells as stages of the shared cache (:mod:`unlearn_plugins.study.cells`):
:func:`plan_study` turns the grid (target, retain model and evaluations per forget size, then
seed x forget size x method) into stages keyed by everything their result depends on; the
builders of TOFU's own stage kinds (``evaluate``; an author-unit study's ``sweep`` and
``operating_point``) are registered as the benchmark's ``stage_kinds``."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.files import write_json
from unlearn_plugins.models import merge_is_exact
from unlearn_plugins.stages import DONE, Stages, digest
from unlearn_plugins.study.cells import (
    EXTRACTION,
    MIA_REFERENCE,
    REALLY_FORGOTTEN,
    STUDY_FORMAT,
    CellPlan,
    Plan,
    Stage,
    base_model,
    cache_folder,
    evaluation_settings,
    finetune_stage,
    initializer_seed,
    method_run,
    need_stage,
    run_setting_key,
    run_stage,
    unlearn_key,
    unlearn_stage,
)
from unlearn_plugins.study.spec import Study

from .source import expand


def tofu_data():
    """The benchmark's data module (:mod:`..data`): the N-author benchmark folders a TOFU study is
    cut from."""
    from .. import data

    return data


def study_tofu(study: Study):
    """The TOFU data a TOFU study's benchmarks are cut from (the TOFU benchmark's ``find_tofu``),
    a missing folder or a bad source named in one error."""
    from unlearn_plugins.errors import DataError

    find_tofu = tofu_data().find_tofu

    # (source auto: a folder that is not there falls back to the generated authors, as find_tofu does)
    if study.tofu_dir and study.source == "tofu" and not Path(study.tofu_dir).expanduser().is_dir():
        raise UnlearnError(f"{study.path}: [benchmark] tofu_dir: TOFU folder not found: {study.tofu_dir}")
    try:
        return find_tofu(study.source, study.tofu_dir, study.authors)
    except DataError as exc:
        raise UnlearnError(f"{study.path}: [benchmark] source: {exc}") from None


def benchmark_stage(stages: Stages | None, label: str, folder: Path, build, scratch: Path, key: str) -> dict:
    """A TOFU benchmark folder built as a cached stage (a dry run, ``stages`` None, builds a
    missing one in ``scratch`` only, to know its content) and its description, folder, key and
    file digests."""
    from unlearn_plugins.files import file_digest

    load_benchmark = tofu_data().load_benchmark
    if stages is not None:
        run_stage(stages, label, folder, build)
    elif not (folder / DONE).is_file():
        folder = scratch / folder.name
        build(folder)
        (folder / DONE).write_text("{}")
    bench = load_benchmark(folder)
    if bench is None:
        raise UnlearnError(f"{folder}: benchmark folder unreadable; delete it and run again")
    return {
        **bench.describe(),
        "folder": str(folder),
        "key": key,
        "content": {n: file_digest(folder / f"{n}.json") for n in ("full", "retain", "forget")},
    }


def prepare_benchmarks(study: Study, cache: Path, stages: Stages | None, scratch: Path) -> dict[int, dict]:
    """The benchmark folder of every forget size (cached stages; a dry run builds missing ones
    in ``scratch`` only, to know their content)."""
    data = tofu_data()
    build_benchmark, source_fingerprint, build_holdout = (
        data.build_benchmark,
        data.source_fingerprint,
        data.build_holdout,
    )
    tofu = study_tofu(study)
    out = {}
    for k in study.forget_sizes:
        key = digest(STUDY_FORMAT, "bench", source_fingerprint(tofu), study.authors, k, study.evaluation.mu_size)
        folder = cache / f"bench-{study.source}-{key}"

        def build(tmp: Path, k=k) -> None:
            build_benchmark(tmp, tofu=tofu, n_authors=study.authors, n_forget=k, eval_size=study.evaluation.mu_size)

        out[k] = benchmark_stage(stages, f"benchmark: {study.authors} authors, forget {k}", folder, build, scratch, key)
    if study.evaluation.robustness:  # membership inference's holdout: an author in no model's data
        key = digest(STUDY_FORMAT, "holdout", source_fingerprint(tofu), study.authors)
        folder = cache / f"holdout-{study.source}-{key}"

        def build_holdout_stage(tmp: Path) -> None:
            write_json(tmp / "author.json", build_holdout(tmp / "holdout.json", tofu=tofu, n_authors=study.authors))

        if stages is not None:
            run_stage(stages, "holdout author for membership inference", folder, build_holdout_stage)
        elif not (folder / DONE).is_file():
            folder = scratch / folder.name
            folder.mkdir(parents=True)
            build_holdout_stage(folder)
        for bench in out.values():
            bench["holdout"] = str(folder / "holdout.json")
    return out


def plan_study(study: Study, *, cache: Path, device: str | None = None, dry_run: bool = False, stream=None) -> Plan:
    """Every cell with its stages and their cache folders. A real run builds the base model (if
    it is ``tiny-llama``) and the benchmark folders here (seconds); a dry run writes nothing."""
    stream = stream or sys.stderr
    stages = None if dry_run else Stages(cache, total=1 + len(study.forget_sizes), stream=stream)
    with tempfile.TemporaryDirectory(prefix="unlearn-study-") as scratch:
        base_path, base_key = base_model(study, stages, cache, device)
        benches = prepare_benchmarks(study, cache, stages, Path(scratch))
        if dry_run:  # the scratch folder goes away: keep only what the keys need
            for bench in benches.values():
                bench["folder"] = None
    plan = Plan(study, cache, device, benches)
    ev = study.evaluation
    eval_settings = evaluation_settings(study, device)

    def folder(kind: str, name: str, key: str) -> str:
        return cache_folder(cache, kind, name, key)

    # models: the target and the retain model of every forget size
    first = benches[study.forget_sizes[0]]
    model_keys: dict[str, str] = {}
    for cell in expand(study):
        if cell.kind not in ("target", "retain"):
            continue
        target = cell.kind == "target"
        bench, split = (first, "full") if target else (benches[cell.forget], "retain")
        model = "the target" if target else "the retain model"
        authors = study.authors if target else len(bench["retain_authors"])
        stage = finetune_stage(
            study,
            f"fine-tune {model} on {authors} authors ({bench['sizes'][split]} QA)",
            (cache, "target", split),
            study.target if target else study.retain,
            (base_path, base_key),
            (bench_file(bench, split), bench["content"][split]),
            device,
        )
        plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder, model=_made_model(stage))
        model_id = "target" if target else cell.id
        model_keys[model_id] = stage.params["key"]
        plan.models[model_id] = plan.cells[cell.id].model
    if study.target.given is not None:
        plan.models["target"] = study.target.given
        model_keys["target"] = given_key(study.target.given, study, device)
    for k, given in study.retain_given.items():
        plan.models[f"retain/forget{k}"] = given
        model_keys[f"retain/forget{k}"] = given_key(given, study, device)

    # CUD scores of each forget set on the target ([cud])
    for cell in expand(study):
        if cell.kind != "cud":
            continue
        bench = benches[cell.forget]
        cud = study.cud
        unlearn = dict(cud.unlearn)
        key = digest(
            STUDY_FORMAT,
            "cud",
            model_keys["target"],
            bench["content"]["forget"],
            bench["content"]["retain"],
            cud.describe(),
            study.max_length,
        )
        stage = Stage(
            f"CUD scores of the {bench['sizes']['forget']} forget samples (forget {cell.forget})",
            folder("cud", f"forget{cell.forget}", key),
            "cud",
            {
                "bench": bench["folder"],
                "model": plan.models["target"],
                "device": device,
                "scorer": dict(cud.scorer),
                "unlearn": unlearn,
                "anchor_pool": cud.anchor_pool,
                "strata": cud.strata,
                "max_length": study.max_length,
            },
        )
        plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)

    # evaluations and methods
    eval_keys: dict[int, str] = {}
    for cell in expand(study):
        if cell.kind in ("target", "retain", "cud"):
            continue
        k = cell.forget
        bench = benches[k]
        common = {
            "bench": bench["folder"],
            "evaluation": ev,
            "max_length": study.max_length,
            "device": device,
        }
        reference = (
            None if cell.kind == "eval_retain" else str(Path(folder("eval", "retain", eval_keys[k])) / "reference.json")
        )
        if ev.robustness:
            common["robustness"] = {
                "holdout": bench.get("holdout"),
                # the retain model's evaluation saves it, the others read it (privleak)
                "mia_reference": None if reference is None else str(Path(reference).parent / MIA_REFERENCE),
            }
        if cell.kind == "eval_retain":
            key = digest(STUDY_FORMAT, "eval", model_keys[f"retain/forget{k}"], bench["key"], eval_settings)
            eval_keys[k] = key
            stage = Stage(
                f"evaluate the retain model (forget {k}; the Forget Quality reference)",
                folder("eval", "retain", key),
                "evaluate",
                {
                    **common,
                    "model": plan.models[f"retain/forget{k}"],
                    "adapter": None,
                    "references": [],
                    "save_reference": True,
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        elif cell.kind == "eval_full":
            key = digest(STUDY_FORMAT, "eval", model_keys["target"], eval_keys[k], bench["key"], eval_settings)
            stage = Stage(
                f"evaluate the target (forget {k})",
                folder("eval", "full", key),
                "evaluate",
                {
                    **common,
                    "model": plan.models["target"],
                    "adapter": None,
                    "references": [reference],
                    "save_reference": False,
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [stage], result=stage.folder)
        else:
            method, config, no_retain = method_run(study, cell)
            config["initializer_options"] = initializer_seed(config, cell.seed)
            content = bench["content"]
            no = ("no-retain",) if no_retain else ()
            run_key = unlearn_key(
                "unlearn", model_keys["target"], [content["forget"], content["retain"]], config, last=no
            )
            run_folder = folder("run", f"{method.name}-forget{k}-seed{cell.seed}", run_key)
            retain = {"retain": None} if no_retain else {}
            unlearn = unlearn_stage(
                cell, run_folder, config, plan.models["target"], {"bench": bench["folder"]}, device, **retain
            )
            # the adapter is evaluated merged into the weights where that is exact (fp32 weights);
            # a method trained with full_finetune (LUNAR, T3) leaves a whole model instead
            full = bool(config.get("full_finetune"))
            merged = ("merged",) if merge_is_exact(device, ev.dtype) and not full else ()
            key = digest(STUDY_FORMAT, "eval", run_key, eval_keys[k], bench["key"], eval_settings, *merged)
            evaluate = Stage(
                f"evaluate: {cell.label}",
                folder("eval", f"{method.name}-forget{k}-seed{cell.seed}", key),
                "evaluate",
                {
                    **common,
                    "model": str(Path(run_folder) / "run") if full else plan.models["target"],
                    "adapter": None if full else str(Path(run_folder) / "run"),
                    "references": [reference],
                    "save_reference": False,
                },
            )
            plan.cells[cell.id] = CellPlan(cell, [unlearn, evaluate], result=evaluate.folder)
    return plan


def _made_model(stage: Stage) -> str:
    """The model folder a fine-tuning stage leaves: the merged LoRA model, or the model itself
    after full fine-tuning."""
    run = Path(stage.folder) / "run"
    return str(run if stage.params["finetune"].get("full_finetune") else run / "merged")


def bench_file(bench: dict, name: str) -> str | None:
    return str(Path(bench["folder"]) / f"{name}.json") if bench["folder"] else None


def given_key(model: str, study: Study, device: str | None) -> str:
    from unlearn_plugins.models import resolve_model, weights_fingerprint

    key = digest(STUDY_FORMAT, "weights", weights_fingerprint(resolve_model(model)) or model)
    return run_setting_key(key, study, device)


def build_evaluate(tmp: Path, p: dict) -> None:
    """An evaluation of ``model`` (with ``adapter``) on the benchmark folder ``bench`` as the
    study's ``evaluation`` (:class:`.spec.Evaluation`) says."""
    data = tofu_data()
    generation_cap, load_benchmark = data.generation_cap, data.load_benchmark
    from unlearn_plugins.evaluation import lm_eval_runner as runner
    from unlearn_plugins.models import load_tokenizer

    ev = p["evaluation"]
    need_stage(p["model"], "the model to evaluate")
    for ref in p["references"]:
        need_stage(ref, "the retain model's Forget Quality reference")
    bench = load_benchmark(p["bench"])
    if bench is None:
        raise UnlearnError(f"{p['bench']}: benchmark folder missing or unreadable; run the study again")
    max_gen_toks = generation_cap(load_tokenizer(p["model"]), bench, ev.gen_margin)
    evaluation = runner.evaluate_model(
        p["model"],
        list(ev.tasks),
        adapter=p["adapter"],
        device=p["device"],
        dtype=ev.dtype,
        batch_size=ev.batch_size,
        merge_adapter=merge_is_exact(p["device"], ev.dtype),
        retain_references=p["references"],
        tofu_dir=str(bench.folder),
        forget_split=str(bench.forget),
        max_gen_toks=max_gen_toks,
        scoring=ev.scoring,
    )
    if p["save_reference"]:
        runner.save_reference(evaluation, tmp / "reference.json", model=p["model"], adapter=p["adapter"])
    runner.write_outputs(tmp, evaluation)
    robust = p.get("robustness")
    if robust:  # is it really forgotten? membership inference and the attacks, beside it
        from unlearn_plugins.evaluation import really_forgotten

        if robust["mia_reference"]:
            need_stage(robust["mia_reference"], "the retain model's MIA reference")
        really_forgotten.measure(
            p["model"],
            p["adapter"],
            tmp / REALLY_FORGOTTEN,
            forget_split=str(bench.forget),
            holdout_split=robust["holdout"],
            tofu_dir=str(bench.folder),
            batch_size=ev.batch_size,
            device=p["device"],
            dtype=ev.dtype,
            mia_reference=robust["mia_reference"],
            save_mia_reference=None if robust["mia_reference"] else str(tmp / MIA_REFERENCE),
            max_gen_toks=max_gen_toks,  # the evaluation's own cap: the same plain ROUGE-L
        )
    if not ev.extraction_from_task:
        values = extraction_strengths(
            p["model"], p["adapter"], str(bench.forget), p["max_length"], p["device"], ev.batch_size, ev.dtype
        )
        write_json(
            tmp / EXTRACTION,
            {
                "definition": "1 - k/n, teacher-forced greedy predictions (tofu_metrics)",
                "mean": sum(values) / len(values),
                "per_sample": values,
            },
        )


def extraction_strengths(
    model: str,
    adapter: str | None,
    data: str,
    max_length: int,
    device: str | None,
    batch_size: int = 8,
    dtype: str | None = None,
) -> list[float]:
    """Per forget sample, extraction strength ``1 - k/n`` (:mod:`..metrics`): ``k``
    the first answer position from which every teacher-forced greedy prediction equals the
    answer's tokens (not the end token, as open-unlearning), in one forward pass per batch; for studies whose
    evaluation does not run the ``tofu_forget_extraction_strength`` task."""
    import torch

    from unlearn_plugins.data.qa import IGNORE_INDEX, encode_samples, load_split, pad_batch
    from unlearn_plugins.models import load_model

    from .. import metrics as tm

    loaded, tok = load_model(
        model, device=device, dtype=dtype, adapter=adapter, merge_adapter=merge_is_exact(device, dtype)
    )
    encoded = encode_samples(tok, load_split(data), max_length=max_length)
    out: list[float] = []
    dev = next(loaded.parameters()).device
    with torch.inference_mode():
        for i in range(0, len(encoded), batch_size):
            batch = {k: v.to(dev) for k, v in pad_batch(encoded[i : i + batch_size], tok.pad_token_id).items()}
            logits = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            predicted, labels = logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
            for row_pred, row_labels in zip(predicted.tolist(), labels.tolist()):
                # the last label is the end token: open-unlearning ignores its prediction
                pairs = [(p, y) for p, y in zip(row_pred, row_labels) if y != IGNORE_INDEX][:-1]
                if not pairs:
                    out.append(0.0)
                    continue
                k = tm.first_matching_suffix([p for p, _ in pairs], [y for _, y in pairs])
                out.append(tm.extraction_strength(k, len(pairs)))
    return out


def build_sweep(tmp: Path, p: dict) -> None:
    from .trace import build_sweep as build  # an author-unit study's traced run

    build(tmp, p)


def build_operating_point(tmp: Path, p: dict) -> None:
    from .operating_cell import choose_operating_point  # an author-unit study's method

    choose_operating_point(tmp, p, evaluate=build_evaluate)


__all__ = [
    "plan_study",
    "prepare_benchmarks",
    "benchmark_stage",
    "study_tofu",
    "tofu_data",
    "bench_file",
    "given_key",
    "build_evaluate",
    "build_sweep",
    "build_operating_point",
    "extraction_strengths",
]
