"""Run lm-eval tasks on a model or adapter and summarise them TOFU-style.

lm-eval has no entry-point task discovery, so the TaskManager is given every task folder
that a plugin registers (kind ``lm_eval_task_dir``; the built-in one is ``unlearn``).
Forget Quality comes from the forget truth-ratio tasks themselves (a retain reference in
the task metadata); Model Utility, a harmonic mean that lm-eval groups cannot express,
is computed here from the results.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import DataError, UnlearnError
from ..files import atomic_open, write_json
from ..interfaces import LM_EVAL_TASK_DIR
from . import tofu_metrics as tm
from .reference import HINT, read_reference, write_reference


def task_dirs() -> list[Path]:
    """Every registered lm-eval task folder (built-in and plugins), as paths."""
    from ..host import list_components

    return [Path(c.obj) for c in list_components(LM_EVAL_TASK_DIR)]


def builtin_task_dir() -> Path:
    """This package's task folder (TOFU, mmlu_local, wmdp_local), as registered by the
    built-in plugin: the path to give lm_eval's --include_path."""
    from ..host import get_component

    return Path(get_component(LM_EVAL_TASK_DIR, "unlearn")).resolve()


def task_manager(metadata: dict[str, Any] | None = None, *, include_defaults: bool = True):
    """A TaskManager that knows our tasks and every plugin's (include_path must be a list)."""
    from lm_eval.tasks import TaskManager

    dirs = [str(d) for d in task_dirs()]
    return TaskManager(include_path=dirs, include_defaults=include_defaults, metadata=dict(metadata or {}))


def task_manager_for(names: Sequence[str], metadata: dict[str, Any] | None = None):
    """The cheapest TaskManager that knows ``names``: lm-eval's ~15k built-in tasks are
    indexed (seconds) only when a name is not one of the registered folders' tasks."""
    manager = task_manager(metadata, include_defaults=False)
    if all(n in manager.all_tasks for n in names):
        return manager
    manager = task_manager(metadata, include_defaults=True)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        import difflib

        hints = []
        for n in unknown:
            close = difflib.get_close_matches(n, manager.all_tasks, n=4, cutoff=0.6)
            hints.append(f"{n}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise UnlearnError(
            f"unknown lm-eval task(s): {'; '.join(hints)}. TOFU: tofu_forget01 (tag: all forget01 and Model "
            "Utility tasks), tofu_forget01_nogen (without generation), tofu_forget01_truth_ratio, ...; "
            "offline: mmlu_local, wmdp_local. `lm_eval ls tasks --include_path $(unlearn eval --print-tasks-dir)` "
            "lists all"
        )
    return manager


# ----------------------------------------------------------------------------- loading


def load_tasks(manager, names: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """(objects to hand to simple_evaluate, leaf tasks by name), building each task once."""
    loaded = manager.load(list(names))
    tasks, groups = loaded["tasks"], loaded["groups"]
    specs: list[Any] = []
    for name in names:
        if name in groups:
            specs.append(groups[name])
        elif name in tasks:
            specs.append(tasks[name])
        else:  # a tag: its member tasks
            members = manager.task_index[name].tags
            specs.extend(tasks[m] for m in sorted(members) if m in tasks)
    return specs, tasks


def _n_evaluated(task, limit: int | float | None) -> int:
    n = len(task.eval_docs)
    if limit is None:
        return n
    return min(n, int(limit) if limit >= 1 else int(math.ceil(n * limit)))


def check_references(tasks: dict[str, Any], paths: Sequence[str], limit: int | float | None) -> None:
    """Before any compute: every reference must belong to a forget truth-ratio task of the
    run, and cover exactly the documents that --limit selects."""
    from .tofu_tasks import TofuForgetTruthRatioTask

    forget = {n: t for n, t in tasks.items() if isinstance(t, TofuForgetTruthRatioTask)}
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


# ----------------------------------------------------------------------------- running


@dataclass
class Evaluation:
    """lm-eval's output and our summary of it."""

    results: dict[str, Any]
    summary: dict[str, Any]
    samples: dict[str, list[dict]] = field(default_factory=dict)


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
) -> Prepared:
    """Build the tasks (``metadata`` reaches each one; the TOFU tasks need ``tokenizer``)
    and check the retain references, so bad input fails before the model is loaded."""
    names = [t for t in tasks if t]
    if not names:
        raise UnlearnError("no tasks given")
    meta = {k: v for k, v in (metadata or {}).items() if v is not None}
    if retain_references:
        meta["retain_reference"] = [str(p) for p in retain_references]
    manager = task_manager_for(names, meta)
    specs, leaves = load_tasks(manager, names)
    check_references(leaves, [str(p) for p in retain_references], limit)
    return Prepared(manager, specs, leaves, limit)


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
) -> Evaluation:
    """Evaluate an lm-eval LM (e.g. HFLM) on task/group/tag names (or :func:`prepare`'s result).
    ``max_gen_toks`` caps the generation tasks' new tokens (TOFU's ROUGE tasks allow 200)."""
    import lm_eval

    prepared = tasks if isinstance(tasks, Prepared) else prepare(
        tasks, metadata=metadata, retain_references=retain_references, limit=limit)
    started = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=prepared.specs,
        task_manager=prepared.manager,
        limit=prepared.limit,
        num_fewshot=num_fewshot,
        log_samples=True,
        bootstrap_iters=bootstrap_iters,
        gen_kwargs={"max_gen_toks": int(max_gen_toks)} if max_gen_toks else None,
    )
    elapsed = time.perf_counter() - started
    samples = out.pop("samples", None) or {}
    results = _json_safe(out)
    summary = summarize(results, prepared.tasks, describe=describe)
    summary["elapsed_s"] = round(elapsed, 3)
    return Evaluation(results, summary, samples)


def _json_safe(value: Any) -> Any:
    """NaN/inf -> None and unknown objects -> str, so the JSON files are valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def metrics_of(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{task or group: {metric: value}} without stderr and bookkeeping entries."""
    table: dict[str, dict[str, Any]] = {}
    for name, row in results.get("results", {}).items():
        for key, value in row.items():
            metric, sep, filt = key.partition(",")
            if not sep or metric.endswith("_stderr"):
                continue
            table.setdefault(name, {})[metric] = value
    return table


def summarize(results: dict[str, Any], leaves: dict[str, Any] | None = None, *,
              describe: dict[str, Any] | None = None) -> dict[str, Any]:
    """Task metrics plus Forget Quality (per forget truth-ratio task) and Model Utility."""
    from .tofu_tasks import TofuForgetTruthRatioTask

    metrics = metrics_of(results)
    fq: dict[str, Any] = {}
    for name, task in (leaves or {}).items():
        if not isinstance(task, TofuForgetTruthRatioTask):
            continue
        value = metrics.get(name, {}).get("forget_quality")
        entry = {"value": value, "split": task.split_label,
                 "reference": task.reference.path if task.reference else None}
        if value is None:
            entry["note"] = "unavailable: no retain reference; " + HINT.format(task=name)
        fq[name] = entry
    mu_value, parts, missing = tm.model_utility(metrics)
    mu: dict[str, Any] = {"value": mu_value, "parts": parts}
    if missing and (parts or any(t.startswith("tofu_") for t in metrics)):
        mu["missing"] = missing
        mu["note"] = "unavailable: add the tasks of the tag tofu_model_utility (they include ROUGE generation)"
    return {
        **(describe or {}),
        "tasks": sorted(metrics),
        "metrics": metrics,
        "forget_quality": fq,
        "model_utility": mu,
        "versions": {"lm_eval": results.get("versions", {}), "lm_eval_package": _version("lm_eval"),
                     "unlearn_plugins": _version("unlearn-plugins")},
    }


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist if dist != "lm_eval" else "lm-eval")
    except md.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- outputs


def reference_rows(evaluation: Evaluation) -> tuple[str, str, list[str], list[float]]:
    """(task, split, keys, truth ratios) of the one forget truth-ratio task of a run."""
    rows = {name: s for name, s in evaluation.samples.items() if s and "forget_quality" in s[0]}
    if len(rows) != 1:
        found = ", ".join(sorted(rows)) or "none"
        raise DataError(
            f"--save-reference needs exactly one forget truth-ratio task in the run (found: {found}); "
            "e.g. --tasks tofu_forget01_truth_ratio"
        )
    (task, samples), = rows.items()
    samples = sorted(samples, key=lambda s: s["doc_id"])
    keys = [s["forget_quality"][0] for s in samples]
    ratios = [float(s["forget_quality"][1]) for s in samples]
    split = samples[0]["doc"]["split"]
    return task, split, keys, ratios


def save_reference(evaluation: Evaluation, path: str | Path, *, model: str | None = None,
                   adapter: str | None = None) -> str:
    task, split, keys, ratios = reference_rows(evaluation)
    write_reference(path, task=task, split=split, keys=keys, truth_ratios=ratios, model=model, adapter=adapter)
    return task


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_file_name(name: str, limit: int = 100) -> str:
    """``name`` as a single file name: task names come from plugins' YAML files, and one such as
    ``../x`` must not write outside --out. Names that change (or are long) get a hash of the
    original, so two tasks never share a file."""
    safe = _UNSAFE.sub("_", str(name)).strip("._-")
    if safe == name and len(safe) <= limit:
        return safe
    return f"{safe[:limit] or 'task'}-{hashlib.sha256(str(name).encode('utf-8', 'replace')).hexdigest()[:10]}"


def lock_out(out_dir: str | Path):
    """The exclusive lock on eval's --out (:func:`unlearn_plugins.files.folder_lock`, re-entrant):
    held while :func:`write_outputs` writes, and by ``unlearn eval`` for the whole evaluation,
    so a second evaluation into the same folder is refused, naming the holder's pid."""
    from ..files import folder_lock

    return folder_lock(out_dir, f"--out {out_dir}")


def _under_out_lock(write):
    def locked(out_dir, *args, **kwargs):
        with lock_out(out_dir):
            return write(out_dir, *args, **kwargs)

    locked.__name__, locked.__doc__ = write.__name__, write.__doc__
    return locked


@_under_out_lock
def write_outputs(out_dir: str | Path, evaluation: Evaluation) -> dict[str, Path]:
    """results.json (lm-eval's), summary.json (ours) and samples/<task>.jsonl (the task name made
    a safe file name, :func:`safe_file_name`), each atomic."""
    import json

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UnlearnError(f"--out {out}: is an existing file, not a folder")
    paths = {"results": out / "results.json", "summary": out / "summary.json"}
    write_json(paths["results"], evaluation.results)
    for task, rows in evaluation.samples.items():
        with atomic_open(out / "samples" / f"{safe_file_name(task)}.jsonl") as handle:
            for row in rows:
                handle.write(json.dumps(_json_safe(row), ensure_ascii=False) + "\n")
    write_json(paths["summary"], _json_safe(evaluation.summary))
    return paths


def format_table(summary: dict[str, Any]) -> str:
    """Task | Metric | Value, then Forget Quality and Model Utility."""
    rows: list[tuple[str, str, str]] = []
    for task in summary["tasks"]:
        for metric, value in summary["metrics"][task].items():
            if metric == "forget_quality":  # shown below, with its status
                continue
            rows.append((task, metric, _fmt(value)))
    for task, entry in summary.get("forget_quality", {}).items():
        rows.append(("Forget Quality", task, _fmt(entry["value"]) if entry["value"] is not None else "unavailable"))
    mu = summary.get("model_utility", {})
    if mu.get("value") is not None or mu.get("missing"):
        rows.append(("Model Utility", "harmonic mean of 9", _fmt(mu["value"]) if mu.get("value") is not None
                     else f"unavailable ({len(mu['missing'])} parts missing)"))
    widths = [max(len(r[i]) for r in rows + [("Task", "Metric", "Value")]) for i in range(3)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(("Task", "Metric", "Value"), widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    notes = [e["note"] for e in summary.get("forget_quality", {}).values() if e.get("note")]
    if mu.get("note"):
        notes.append("Model Utility " + mu["note"])
    return "\n".join(lines + [f"note: {n}" for n in notes])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4) else f"{value:.4f}"
    return "n/a" if value is None else str(value)


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
) -> Evaluation:
    """Load ``model`` (folder, hub id or alias; ``adapter`` = PEFT folder) and evaluate it.

    The PeftModel itself goes to HFLM (its ``peft=`` argument is ignored for objects);
    the tasks get the base model's tokenizer through the metadata.
    """
    from lm_eval.models.huggingface import HFLM

    from ..models import load_model, pick_device, pick_dtype, resolve_model

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UnlearnError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    where = resolve_model(model)
    metadata = {"tokenizer": where, "trust_remote_code": trust_remote_code or None, "tofu_dir": tofu_dir,
                "forget_split": forget_split, "mmlu_dir": mmlu_dir, "wmdp_dir": wmdp_dir,
                "system_prompt": system_prompt}
    prepared = prepare(tasks, metadata=metadata, retain_references=retain_references, limit=limit)
    loaded, tokenizer = load_model(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                                   adapter=adapter, allow_other_base=allow_other_base)
    # fp32 log-softmax: TOFU's probabilities stay exact when the weights are bf16 (CUDA default)
    lm = HFLM(pretrained=loaded, tokenizer=tokenizer, batch_size=batch_size, trust_remote_code=trust_remote_code,
              softmax_dtype="float32")
    chosen = pick_device(device)
    describe = {"model": model, "adapter": adapter, "device": chosen, "dtype": str(pick_dtype(chosen, dtype)),
                "limit": limit, "batch_size": batch_size, "retain_references": list(retain_references),
                "max_gen_toks": max_gen_toks}
    return evaluate(lm, prepared, num_fewshot=num_fewshot, describe=describe, max_gen_toks=max_gen_toks)
