"""Run lm-eval tasks on a model or adapter: build and check the tasks before the model loads,
evaluate with ``lm_eval.simple_evaluate``, summarise the results TOFU-style.

The other concepts of an evaluation have a module each, and their public names are also
importable from here: where the tasks come from (:mod:`.lm_eval_tasks`), the summary
(:mod:`.lm_eval_summary`), the files and their lock (:mod:`.lm_eval_outputs`), the tables
(:mod:`.lm_eval_tables`) and what is changed in lm-eval (:mod:`.lm_eval_patches`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import DataError, UnlearnError
from .lm_eval_outputs import (
    SUMMARY_KEY,
    WrittenEvaluation,
    lock_out,
    read_outputs,
    reference_rows,
    safe_file_name,
    save_reference,
    write_outputs,
)
from .lm_eval_patches import patched
from .lm_eval_summary import Evaluation, json_safe, metrics_of, summarize
from .lm_eval_tables import format_tables, tofu_table
from .lm_eval_tasks import builtin_task_dir, load_tasks, task_dirs, task_manager, task_manager_for
from .reference import HINT, read_reference

__all__ = [
    # running (this module)
    "DEFAULT_MAX_GEN_TOKS",
    "SCORINGS",
    "Prepared",
    "cap_generation",
    "check_references",
    "check_response_cache",
    "evaluate",
    "evaluate_model",
    "keyed_cache_path",
    "lm_class_for",
    "prepare",
    "prepare_for_model",
    # importable from here, defined in their own modules
    "SUMMARY_KEY",
    "Evaluation",
    "WrittenEvaluation",
    "builtin_task_dir",
    "format_tables",
    "json_safe",
    "load_tasks",
    "lock_out",
    "metrics_of",
    "read_outputs",
    "reference_rows",
    "safe_file_name",
    "save_reference",
    "summarize",
    "task_dirs",
    "task_manager",
    "task_manager_for",
    "tofu_table",
    "write_outputs",
]


def _n_evaluated(task, limit: int | float | None) -> int:
    n = len(task.eval_docs)
    if limit is None:
        return n
    return min(n, int(limit) if limit >= 1 else int(math.ceil(n * limit)))


def check_references(tasks: dict[str, Any], paths: Sequence[str], limit: int | float | None) -> None:
    """Before any compute: every reference must belong to a forget truth-ratio task of the
    run, and cover exactly the documents that --limit selects."""
    from .metrics_reference import check_metrics_references, is_metrics_reference
    from .reference import forget_quality_task

    metric_refs = [p for p in paths if is_metrics_reference(p)]
    check_metrics_references(tasks, metric_refs, limit)
    paths = [p for p in paths if p not in metric_refs]
    forget = {n: t for n, t in tasks.items() if forget_quality_task(t)}
    if paths and not forget:
        raise DataError(
            "--retain-reference given but no forget truth-ratio task is selected "
            "(e.g. tofu_forget01_truth_ratio, or the tag tofu_forget01)"
        )
    used = set()
    for name, task in forget.items():
        ref = task.reference
        if ref is None:
            continue
        used.add(ref.path)
        n = _n_evaluated(task, limit)
        if n != len(ref.keys):
            raise DataError(
                f"retain reference {ref.path} has {len(ref.keys)} samples but {name} will evaluate {n} of split "
                f"{task.split_label!r}: use the --limit the reference was made with, or {HINT.format(task=name)}"
            )
    for path in paths:
        ref = read_reference(path)
        if ref.path not in used:
            raise DataError(f"retain reference {path} ({ref.describe()}) matches none of the selected forget tasks")


@dataclass
class Prepared:
    """Tasks built and checked before any model is loaded."""

    manager: Any
    specs: list[Any]
    tasks: dict[str, Any]
    limit: int | float | None


def prepare(
    tasks: Sequence[str],
    *,
    metadata: dict[str, Any] | None = None,
    retain_references: Sequence[str] = (),
    limit: int | float | None = None,
    save_reference: bool = False,
) -> Prepared:
    """Build the tasks (``metadata`` reaches each one; the TOFU tasks need ``tokenizer``)
    and check the retain references (and, with ``save_reference``, that there is one forget
    truth-ratio task to save), so bad input fails before the model is loaded."""
    names = [t for t in tasks if t]
    if not names:
        raise UnlearnError("no tasks given")
    meta = {k: v for k, v in (metadata or {}).items() if v is not None}
    if retain_references:
        meta["retain_reference"] = [str(p) for p in retain_references]
    manager = task_manager_for(names, meta)
    specs, leaves = load_tasks(manager, names)
    check_references(leaves, [str(p) for p in retain_references], limit)
    if save_reference:
        from .metrics_reference import spec_of
        from .reference import forget_quality_task

        forget = sorted(n for n, t in leaves.items() if forget_quality_task(t))
        kept = [n for n, t in leaves.items() if spec_of(t) is not None]
        if len(forget) != 1 and not (kept and not forget):
            raise DataError(
                f"--save-reference needs exactly one forget truth-ratio task in the run (found: "
                f"{', '.join(forget) or 'none'}), or tasks that keep a retain reference (MUSE's) without "
                "one; e.g. --tasks tofu_forget01_truth_ratio or --tasks muse_news"
            )
    return Prepared(manager, specs, leaves, limit)


#: lm-eval's HFLM generates this many new tokens for a task that sets no max_gen_toks
DEFAULT_MAX_GEN_TOKS = 256


def cap_generation(tasks: Iterable[Any], cap: int | None, default: int = DEFAULT_MAX_GEN_TOKS) -> None:
    """Lower each generation task's ``max_gen_toks`` to ``cap`` (never raise it: lm_eval's
    ``gen_kwargs`` would set every task's to the value given, a 1-token task's too); ``default``:
    the model's limit for a task that sets none. None: nothing changes."""
    if not cap:
        return
    cap = int(cap)
    for task in tasks:
        if task.get_config("output_type") != "generate_until":
            continue
        gen = dict(task.get_config("generation_kwargs") or {})
        own = gen.get("max_gen_toks", default)
        if own is None or int(own) > cap:
            gen["max_gen_toks"] = cap
            task.set_config(key="generation_kwargs", value=gen, update=False)


def evaluate(
    lm,
    tasks: Sequence[str] | Prepared,
    *,
    metadata: dict[str, Any] | None = None,
    retain_references: Sequence[str] = (),
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    bootstrap_iters: int = 1000,
    describe: dict[str, Any] | None = None,
    max_gen_toks: int | None = None,
    model_args: dict[str, Any] | None = None,
    use_cache: str | None = None,
) -> Evaluation:
    """Evaluate an lm-eval LM (e.g. HFLM) on task/group/tag names (or :func:`prepare`'s result).
    ``max_gen_toks`` caps the generation tasks' new tokens (TOFU's ROUGE tasks allow 200): a
    task's own limit is lowered to it, never raised (:func:`cap_generation`);
    ``model_args`` names the model as lm_eval's ``--model_args`` would (``pretrained``, ``peft``:
    the results folder is named after it); ``use_cache`` is lm_eval's ``--use_cache`` (an SQLite
    cache of the model's responses)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker

    prepared = (
        tasks
        if isinstance(tasks, Prepared)
        else prepare(tasks, metadata=metadata, retain_references=retain_references, limit=limit)
    )
    tracker = EvaluationTracker()  # lm-eval's timer starts here; write_outputs gives it the folder
    started = time.perf_counter()
    # the task objects simple_evaluate will run (it flattens the groups the same way)
    leaves = prepared.manager.load(prepared.specs)["tasks"].values()
    cap_generation(leaves, max_gen_toks, getattr(lm, "max_gen_toks", DEFAULT_MAX_GEN_TOKS))
    with patched():
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=prepared.specs,
            task_manager=prepared.manager,
            limit=prepared.limit,
            num_fewshot=num_fewshot,
            log_samples=True,
            bootstrap_iters=bootstrap_iters,
            use_cache=use_cache,
        )
    elapsed = time.perf_counter() - started
    samples = out.pop("samples", None) or {}
    # as lm_eval's CLI records them (not passed to simple_evaluate, which only warns about
    # chat templates from them: the TOFU tasks format the chat prompt themselves)
    model_args = dict(model_args or {"pretrained": out.get("config", {}).get("model")})
    out.setdefault("config", {})["model_args"] = model_args
    tracker.general_config_tracker.log_experiment_args(
        model_source="hf",
        model_args=model_args,
        system_instruction=None,
        chat_template=None,
        fewshot_as_multiturn=False,
    )
    results = json_safe(out)
    summary = summarize(results, prepared.tasks, describe=describe)
    summary["elapsed_s"] = round(elapsed, 3)
    return Evaluation(results, summary, samples, tracker)


def prepare_for_model(
    where: str,
    tasks: Sequence[str],
    *,
    metadata: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    tofu_dir: str | None = None,
    forget_split: str | None = None,
    mmlu_dir: str | None = None,
    wmdp_dir: str | None = None,
    system_prompt: str | None = None,
    retain_references: Sequence[str] = (),
    limit: int | float | None = None,
    save_reference: bool = False,
) -> Prepared:
    """:func:`prepare` with the task metadata of the model folder ``where`` (its tokenizer)."""
    metadata = {
        **(metadata or {}),
        "tokenizer": where,
        "trust_remote_code": trust_remote_code or None,
        "tofu_dir": tofu_dir,
        "forget_split": forget_split,
        "mmlu_dir": mmlu_dir,
        "wmdp_dir": wmdp_dir,
        "system_prompt": system_prompt,
    }
    return prepare(
        tasks, metadata=metadata, retain_references=retain_references, limit=limit, save_reference=save_reference
    )


def evaluate_model(
    model: str,
    tasks: Sequence[str],
    *,
    adapter: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    batch_size: int = 8,
    limit: int | float | None = None,
    retain_references: Sequence[str] = (),
    num_fewshot: int | None = None,
    tofu_dir: str | None = None,
    forget_split: str | None = None,
    mmlu_dir: str | None = None,
    wmdp_dir: str | None = None,
    system_prompt: str | None = None,
    max_gen_toks: int | None = None,
    allow_other_base: bool = False,
    use_cache: str | None = None,
    metadata: dict[str, Any] | None = None,
    loaded: tuple[Any, Any] | None = None,
    merge_adapter: bool = False,
    save_reference: bool = False,
    scoring: str = "prefix",
) -> Evaluation:
    """Load ``model`` (folder, hub id or alias; ``adapter`` = PEFT folder) and evaluate it.

    The PeftModel itself goes to HFLM (its ``peft=`` argument is ignored for objects);
    the tasks get the base model's tokenizer through the metadata. ``metadata``: more task
    metadata (e.g. the MIA tasks' ``holdout_split``); ``loaded``: the (model, tokenizer) that
    :func:`unlearn_plugins.models.load_model` gave for these arguments, when the caller needs it too;
    ``merge_adapter``: evaluate the adapter merged into the weights (:func:`..models.load_model`);
    ``save_reference``: the caller saves a retain reference (:func:`prepare` checks for its task);
    ``scoring``: ``"prefix"`` (:class:`.prefix_lm.PrefixSharedLM`: each prompt scored once, finished
    generations leave their batch) or ``"hf"`` (lm-eval's HFLM as it is: the same numbers, slower).
    """
    lm_class = lm_class_for(scoring)

    from ..data import prompts
    from ..models import load_model, pick_device, pick_dtype, resolve_model

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UnlearnError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    where = resolve_model(model)
    prepared = prepare_for_model(
        where,
        tasks,
        metadata=metadata,
        trust_remote_code=trust_remote_code,
        tofu_dir=tofu_dir,
        forget_split=forget_split,
        mmlu_dir=mmlu_dir,
        wmdp_dir=wmdp_dir,
        system_prompt=system_prompt,
        retain_references=retain_references,
        limit=limit,
        save_reference=save_reference,
    )
    chosen = pick_device(device)
    dtype_name = str(pick_dtype(chosen, dtype))
    if use_cache:  # checked before the model loads
        use_cache = keyed_cache_path(use_cache, where, adapter, dtype_name, merge_adapter, scoring)
        check_response_cache(use_cache + "_rank0.db")
    loaded, tokenizer = loaded or load_model(
        model,
        device=device,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        adapter=adapter,
        allow_other_base=allow_other_base,
        merge_adapter=merge_adapter,
    )
    if scoring == "prefix" and getattr(loaded, "needs_whole_sequences", False):
        # logits that pool the whole sequence (a T3 model) cannot continue from a prompt's cache
        scoring, lm_class = "hf", lm_class_for("hf")
    # fp32 log-softmax: TOFU's probabilities stay exact when the weights are bf16 (CUDA default)
    lm = lm_class(
        pretrained=loaded,
        tokenizer=tokenizer,
        batch_size=batch_size,
        trust_remote_code=trust_remote_code,
        softmax_dtype="float32",
    )
    describe = {
        "model": model,
        "adapter": adapter,
        "device": chosen,
        "dtype": dtype_name,
        "limit": limit,
        "batch_size": batch_size,
        "retain_references": list(retain_references),
        "max_gen_toks": max_gen_toks,
        "scoring": scoring,
        **({"adapter_merged": True} if adapter and merge_adapter else {}),
        **({"prompt_format": fmt.definition()} if not (fmt := prompts.active()).is_default else {}),
    }
    model_args = {"pretrained": model, **({"peft": adapter} if adapter else {}), **({"dtype": dtype} if dtype else {})}
    if use_cache:
        describe["response_cache"] = use_cache + "_rank0.db"
    return evaluate(
        lm,
        prepared,
        num_fewshot=num_fewshot,
        describe=describe,
        max_gen_toks=max_gen_toks,
        model_args=model_args,
        use_cache=use_cache,
    )


from .config import SCORINGS  # noqa: E402 - evaluate_model's ``scoring`` choices, defined with its default


def lm_class_for(scoring: str):
    """The lm-eval model class of a ``scoring`` choice (:data:`SCORINGS`)."""
    if scoring == "prefix":
        from .prefix_lm import PrefixSharedLM

        return PrefixSharedLM
    if scoring == "hf":
        from lm_eval.models.huggingface import HFLM

        return HFLM
    raise UnlearnError(f"scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")


def check_response_cache(path: str) -> None:
    """An existing response cache must be an SQLite database lm-eval can open (sqlitedict fails
    on a corrupt one inside its thread, with two tracebacks)."""
    import sqlite3

    if not os.path.exists(path):
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            db.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.Error as exc:
        raise UnlearnError(
            f"--use-cache: {path} is not a readable SQLite database ({exc}); remove it to start the cache afresh"
        ) from None


def keyed_cache_path(
    use_cache: str, where: str, adapter: str | None, dtype: str, merged: bool = False, scoring: str = "hf"
) -> str:
    """lm-eval's response cache keys requests, not models: ``--use-cache DB`` for another model
    would answer with the first model's numbers. The path given becomes ``DB-<digest>``, the
    digest of the model's and the adapter's weight files (content) and the dtype, so each model
    gets its own cache file and a rerun of the same one finds it; below fp32 also the scoring
    (the two differ by rounding there; a cache made before "prefix" existed is HFLM's)."""
    from ..files import file_sha256, json_digest
    from ..models import ADAPTER_WEIGHTS, weights_fingerprint

    parts = [weights_fingerprint(where) or where, dtype, bool(merged)]
    if scoring != "hf" and dtype.removeprefix("torch.") not in ("float32", "fp32"):
        parts.append(scoring)
    if adapter:
        files = [Path(adapter) / name for name in ADAPTER_WEIGHTS if (Path(adapter) / name).is_file()]
        parts.append([file_sha256(f) for f in files] or adapter)
    return f"{use_cache}-{json_digest(parts, length=12)}"
