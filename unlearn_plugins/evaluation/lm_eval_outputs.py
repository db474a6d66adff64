"""An evaluation's files, in lm-eval's own layout and written by lm-eval's EvaluationTracker
(``OUT/<model>/results_<date>.json``, ``OUT/<model>/samples_<task>_<date>.jsonl``), the lock on
the output folder, and the retain reference saved from a run."""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError, UnlearnError
from .lm_eval_summary import Evaluation, json_safe
from .metrics_reference import write_metrics_reference
from .reference import write_reference


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
    """The retain reference of the run: TOFU's forget truth ratios, else the metrics of the tasks
    that keep one (:mod:`.metrics_reference`, MUSE's); returns what it holds."""
    has_tofu = any(s and "forget_quality" in s[0] for s in evaluation.samples.values())
    rows = evaluation.summary.get("retain_table")
    if rows and not has_tofu:
        tasks = write_metrics_reference(path, rows, limit=evaluation.summary.get("limit"), model=model, adapter=adapter)
        return ", ".join(tasks)
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
    results = {**copy.deepcopy(evaluation.results), SUMMARY_KEY: json_safe(evaluation.summary)}
    samples = {safe_file_name(task): [json_safe(row) for row in rows] for task, rows in evaluation.samples.items()}
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
