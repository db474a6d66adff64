"""Run lm-eval tasks on a model or adapter and summarise them TOFU-style.

lm-eval has no entry-point task discovery, so the TaskManager is given every task folder
that a plugin registers (kind ``lm_eval_task_dir``; the built-in one is ``unlearn``).
Forget Quality comes from the forget truth-ratio tasks themselves (a retain reference in
the task metadata); Model Utility, a harmonic mean that lm-eval groups cannot express,
is computed here from the results. Outputs follow lm_eval's own habits: its EvaluationTracker
writes the files (results_<date>.json, samples_<task>_<date>.jsonl), its make_table prints them.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import DataError, UnlearnError
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
        from ..host import get_host

        raise UnlearnError(
            f"unknown lm-eval task(s): {'; '.join(hints)}. TOFU: tofu_forget01 (tag: all forget01 and Model "
            "Utility tasks), tofu_forget01_nogen (without generation), tofu_forget01_truth_ratio, ...; "
            "offline: mmlu_local, wmdp_local. `lm_eval ls tasks --include_path $(unlearn eval --print-tasks-dir)` "
            f"lists all{get_host().not_loaded(LM_EVAL_TASK_DIR)}"
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
    """lm-eval's output and our summary of it. ``tracker``: lm-eval's EvaluationTracker, started
    with the evaluation and naming the model (``model_args``), which writes the files."""

    results: dict[str, Any]
    summary: dict[str, Any]
    samples: dict[str, list[dict]] = field(default_factory=dict)
    tracker: Any = None


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
        from .tofu_tasks import TofuForgetTruthRatioTask

        forget = sorted(n for n, t in leaves.items() if isinstance(t, TofuForgetTruthRatioTask))
        if len(forget) != 1:
            raise DataError(
                f"--save-reference needs exactly one forget truth-ratio task in the run (found: "
                f"{', '.join(forget) or 'none'}); e.g. --tasks tofu_forget01_truth_ratio"
            )
    return Prepared(manager, specs, leaves, limit)


#: lm-eval's notices that say nothing a user of this package can act on: every TOFU task builds
#: its documents in Python (custom_dataset), and the model is always handed over loaded
NOISE = {
    "lm_eval.api.task": ("Custom kwargs can be passed to `--metadata`",),
    "lm_eval.models.huggingface": (
        "`pretrained` model kwarg is not of type `str`",
        "Passed an already-initialized model through `pretrained`",
    ),
}


class _DropNoise(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        if os.environ.get("UNLEARN_VERBOSITY"):  # --verbosity asked for lm-eval's own words
            return True
        message = record.getMessage()
        return not any(start in message for start in self.starts)


for _name, _starts in NOISE.items():
    logging.getLogger(_name).addFilter(_DropNoise(_starts))


@contextlib.contextmanager
def _git_quiet():
    """lm-eval records ``git describe`` of the working folder in its results, and outside a
    repository git prints "fatal: not a git repository" on every evaluation: its stderr is
    silenced (lm-eval already falls back when it fails)."""
    import subprocess

    import lm_eval.evaluator as evaluator

    original = getattr(evaluator, "get_git_commit_hash", None)
    if original is None:
        yield
        return

    def quiet():
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, FileNotFoundError, OSError):
            return None

    evaluator.get_git_commit_hash = quiet
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


@contextlib.contextmanager
def _exact_shared_logits():
    """lm-eval's HFLM computes requests that share their tokens (context + continuation, split at
    different points) in one forward and hands each the logits of the longest continuation. Its
    greedy check takes each request's trailing positions, but its log-probability gathers the
    LEADING ones, so a shorter continuation in such a group gets another token's log-probability:
    the MIA task's one-token request for an answer's last token shares its tokens with the
    extraction strength's whole-answer request, and got the first token's log-probability. Here
    each request of a group is given the trailing positions of its own continuation."""
    import lm_eval.models.huggingface as hf

    original = getattr(hf, "Collator", None)
    if original is None or not hasattr(original, "get_cache"):
        yield
        return

    class Collator(original):
        def get_cache(self, req_str, cxt_toks, cont_toks, logits):
            for request, cont, member_logits in super().get_cache(
                req_str=req_str, cxt_toks=cxt_toks, cont_toks=cont_toks, logits=logits
            ):
                if member_logits.dim() == 3 and member_logits.shape[1] > len(cont):
                    member_logits = member_logits[:, member_logits.shape[1] - len(cont) :, :]
                yield request, cont, member_logits

    hf.Collator = Collator
    try:
        yield
    finally:
        hf.Collator = original


#: lm-eval's HFLM generates this many new tokens for a task that sets no max_gen_toks
DEFAULT_MAX_GEN_TOKS = 256


def capped(manager, cap: int | None, default: int = DEFAULT_MAX_GEN_TOKS):
    """``manager`` whose loaded generation tasks generate at most ``cap`` new tokens: a task's own
    ``max_gen_toks`` is lowered to the cap, never raised (lm_eval's ``gen_kwargs`` would set every
    task's to the value given, a 1-token task's too). None: the manager itself."""
    if not cap:
        return manager
    cap = int(cap)

    class Capped(type(manager)):
        def load(self, *args, **kwargs):
            loaded = super().load(*args, **kwargs)
            for task in loaded["tasks"].values():
                if task.get_config("output_type") != "generate_until":
                    continue
                gen = dict(task.get_config("generation_kwargs") or {})
                own = gen.get("max_gen_toks", default)
                if own is None or int(own) > cap:
                    gen["max_gen_toks"] = cap
                    task.set_config(key="generation_kwargs", value=gen, update=False)
            return loaded

    wrapped = copy.copy(manager)
    wrapped.__class__ = Capped
    return wrapped


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
    task's own limit is lowered to it, never raised (:func:`capped`);
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
    with _git_quiet(), _exact_shared_logits():
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=prepared.specs,
            task_manager=capped(prepared.manager, max_gen_toks, getattr(lm, "max_gen_toks", DEFAULT_MAX_GEN_TOKS)),
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
    results = _json_safe(out)
    summary = summarize(results, prepared.tasks, describe=describe)
    summary["elapsed_s"] = round(elapsed, 3)
    return Evaluation(results, summary, samples, tracker)


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


def summarize(
    results: dict[str, Any], leaves: dict[str, Any] | None = None, *, describe: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Task metrics plus Forget Quality (per forget truth-ratio task) and Model Utility."""
    from .tofu_tasks import TofuForgetTruthRatioTask

    metrics = metrics_of(results)
    fq: dict[str, Any] = {}
    for name, task in (leaves or {}).items():
        if not isinstance(task, TofuForgetTruthRatioTask):
            continue
        value = metrics.get(name, {}).get("forget_quality")
        entry = {
            "value": value,
            "split": task.split_label,
            "reference": task.reference.path if task.reference else None,
        }
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
        "versions": {
            "lm_eval": results.get("versions", {}),
            "lm_eval_package": _version("lm_eval"),
            "unlearn_plugins": _version("unlearn-plugins"),
        },
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
    ((task, samples),) = rows.items()
    samples = sorted(samples, key=lambda s: s["doc_id"])
    keys = [s["forget_quality"][0] for s in samples]
    ratios = [float(s["forget_quality"][1]) for s in samples]
    split = samples[0]["doc"]["split"]
    return task, split, keys, ratios


def save_reference(
    evaluation: Evaluation, path: str | Path, *, model: str | None = None, adapter: str | None = None
) -> str:
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


#: the key of lm-eval's results file under which our summary (Forget Quality, Model Utility, ...) is kept
SUMMARY_KEY = "unlearn_summary"
_TRACKER_LOG = "lm_eval.loggers.evaluation_tracker"


def _model_folder_name(tracker) -> str:
    """lm-eval's folder name for the model (``sanitize_model_name``), unless it is not a single
    safe folder name (``..``, too long)."""
    name = tracker.general_config_tracker.model_name_sanitized or "model"
    if name in (".", "..") or len(name) > 150 or name.startswith("."):
        name = safe_file_name(name)
    tracker.general_config_tracker.model_name_sanitized = name
    return name


class _Records(logging.Handler):
    """The EvaluationTracker's log lines: it logs a failed write instead of raising."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def reason(self) -> str:
        """Why a write failed: the logged exceptions (``OSError(28, 'No space left on device')``
        as its message), each once."""
        reasons = []
        for line in self.lines:
            if line.startswith(("Saving", "Could not")):
                continue
            match = re.fullmatch(r"\w*Error\(\d+, '(.*)'\)", line)
            reasons.append(match.group(1) if match else line)
        return "; ".join(dict.fromkeys(reasons)) or "no reason given"


def _written_completely(path: Path, rows: int | None) -> bool:
    """Whether the tracker's file is whole: the results file parses as JSON; a samples file has
    one complete line per sample (JSON escapes newlines, so lines are counted)."""
    import json

    if rows is None:
        try:
            with open(path, encoding="utf-8") as handle:
                json.load(handle)
        except ValueError:
            return False
        return True
    with open(path, "rb") as handle:
        data = handle.read()
    return data.count(b"\n") == rows and (not data or data.endswith(b"\n"))


@_under_out_lock
def write_outputs(out_dir: str | Path, evaluation: Evaluation) -> dict[str, Any]:
    """lm-eval's own layout, written by lm-eval's EvaluationTracker: ``OUT/<model>/results_<date>.json``
    (lm-eval's results, with our summary under :data:`SUMMARY_KEY`) and
    ``OUT/<model>/samples_<task>_<date>.jsonl`` (a task name that is not a plain file name is made
    one, :func:`safe_file_name`). The tracker writes into a staging folder inside ``OUT``; each
    file is then renamed into place, the results file last, so a results file means a complete set."""
    from lm_eval.loggers import EvaluationTracker

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UnlearnError(f"--out {out}: is an existing file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".lm-eval-", dir=out))
    tracker = evaluation.tracker or EvaluationTracker()
    if evaluation.tracker is None:  # an Evaluation made by hand: name the model from its summary
        tracker.general_config_tracker.log_experiment_args(
            model_source="hf",
            model_args={"pretrained": str(evaluation.summary.get("model") or "model")},
            system_instruction=None,
            chat_template=None,
            fewshot_as_multiturn=False,
        )
    tracker.output_path = str(staging)
    model_dir = _model_folder_name(tracker)
    results = {**copy.deepcopy(evaluation.results), SUMMARY_KEY: _json_safe(evaluation.summary)}
    samples = {safe_file_name(task): [_json_safe(row) for row in rows] for task, rows in evaluation.samples.items()}
    records = _Records()
    logger = logging.getLogger(_TRACKER_LOG)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(records)  # its reasons are logged at INFO: kept here, raised below
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        tracker.save_results_aggregated(results=results, samples=samples or None)
        for task, rows in samples.items():
            tracker.save_results_samples(task_name=task, samples=rows)
        written = staging / model_dir
        date = getattr(tracker, "date_id", None)
        expected = [written / f"samples_{task}_{date}.jsonl" for task in samples]
        expected.append(written / f"results_{date}.json")  # last: it marks the set complete
        missing = [p.name for p in expected if not p.is_file()] if date else ["its results"]
        why = records.reason()
        if missing:
            raise UnlearnError(f"--out {out}: lm-eval's EvaluationTracker did not write {', '.join(missing)} ({why})")
        final = out / model_dir
        counts = [len(rows) for rows in samples.values()]
        for path, count in zip(expected, [*counts, None]):
            try:
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
                complete = _written_completely(path, count)
            except OSError as exc:
                why, complete = exc.strerror or str(exc), False
            if not complete:  # the tracker logs a failed write (a full disk) instead of raising
                raise UnlearnError(
                    f"--out {out}: could not write {final / path.name}: {why}; nothing of this evaluation was kept"
                )
        final.mkdir(exist_ok=True)
        paths: dict[str, Any] = {"folder": final, "samples": {}}
        for path in expected:
            os.replace(path, final / path.name)
        paths["results"] = final / expected[-1].name
        paths["samples"] = {task: final / f"samples_{task}_{date}.jsonl" for task in samples}
        return paths
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
        logger.propagate = propagate
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class WrittenEvaluation:
    """One evaluation as read back from an output folder."""

    results: dict[str, Any]
    summary: dict[str, Any]
    samples: dict[str, Path]  # task (as in the file name) -> samples file


def read_outputs(out_dir: str | Path) -> WrittenEvaluation:
    """The latest evaluation in ``out_dir``, found the way lm-eval finds it
    (``get_results_filenames`` / ``get_latest_filename``), with its samples files (same date).
    Folders written before this layout (results.json, summary.json, samples/<task>.jsonl) are
    read too."""
    import json

    from lm_eval.utils import get_file_task_name, get_latest_filename, get_results_filenames

    out = Path(out_dir)
    files = [str(p) for p in sorted(out.glob("*/*.json*")) if not p.parent.name.startswith(".")]
    found = get_results_filenames(files)
    if found:
        latest = Path(get_latest_filename(found))
        results = json.loads(latest.read_text(encoding="utf-8"))
        date = latest.stem.removeprefix("results_")
        samples = {get_file_task_name(p.name): p for p in latest.parent.glob(f"samples_*_{date}.jsonl")}
        return WrittenEvaluation(results, results.get(SUMMARY_KEY, {}), samples)
    if (out / "summary.json").is_file():  # the layout before lm-eval's
        results = json.loads((out / "results.json").read_text(encoding="utf-8"))
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        return WrittenEvaluation(results, summary, {p.stem: p for p in (out / "samples").glob("*.jsonl")})
    raise DataError(f"{out}: no evaluation results (results_<date>.json) found")


def format_tables(evaluation: Evaluation) -> str:
    """lm-eval's own tables (``make_table``: tasks, then groups), then TOFU's Forget Quality and
    Model Utility when the run has TOFU tasks."""
    from lm_eval.utils import make_table

    tables = [make_table(evaluation.results)]
    if evaluation.results.get("groups"):
        tables.append(make_table(evaluation.results, "groups"))
    tofu = tofu_table(evaluation.summary)
    return "\n".join(tables + ([tofu] if tofu else []))


def tofu_table(summary: dict[str, Any]) -> str:
    """Forget Quality (per forget truth-ratio task) and Model Utility as a Markdown table in
    make_table's style, with a note for each unavailable value ("" when neither applies)."""
    from ..tables import lm_eval_table

    rows: list[list[str]] = []
    for task, entry in summary.get("forget_quality", {}).items():
        rows.append(["Forget Quality", task, _fmt(entry["value"]) if entry["value"] is not None else "unavailable"])
    mu = summary.get("model_utility", {})
    if mu.get("value") is not None or mu.get("missing"):
        rows.append(
            [
                "Model Utility",
                "harmonic mean of 9",
                _fmt(mu["value"])
                if mu.get("value") is not None
                else f"unavailable ({len(mu['missing'])} parts missing)",
            ]
        )
    if not rows:
        return ""
    notes = [e["note"] for e in summary.get("forget_quality", {}).values() if e.get("note")]
    if mu.get("note"):
        notes.append("Model Utility " + mu["note"])
    return "\n".join([lm_eval_table(["TOFU", "Of", "Value"], rows)] + [f"note: {n}" for n in notes])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4) else f"{value:.4f}"
    return "n/a" if value is None else str(value)


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
