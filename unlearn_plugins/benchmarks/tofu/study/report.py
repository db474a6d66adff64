"""A study's report: per method and forget size, the mean and 95% confidence interval over the
seeds of Forget Quality, Model Utility, forget probability, forget ROUGE-L, extraction
strength, retain probability, wall time and peak memory; the full and retain models as
reference rows; a Pareto plot (Forget Quality vs Model Utility with error bars); Markdown
(``summary.md``) and JSON (``study.json``), each written to a temporary file and renamed.

Intervals: ``t`` (Student-t on the seed means, n - 1 degrees of freedom) or ``bootstrap``
(percentile, 10,000 resamples of the seeds); the study file says which. A group whose seeds
all gave the same value has **no spread**: no interval (a zero-width one is no estimate of
precision) and no Welch p-value against it. Each evaluation's
Model Utility also gets a 95% percentile bootstrap interval over its QA (the sampling error
of the evaluation set, which seeds do not show). Reads only the cache's stage folders.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from unlearn_plugins import tables
from unlearn_plugins.data.jsonl import json_lines
from unlearn_plugins.errors import DataError, UnlearnError
from unlearn_plugins.files import atomic_open
from unlearn_plugins.study import report_writer
from unlearn_plugins.study.cells import EXTRACTION, REALLY_FORGOTTEN, RESOURCES, Plan, read_json
from unlearn_plugins.study.report_writer import Report, Section, format_value

from ..metrics import MU_PARTS
from .statistics import NO_SPREAD, has_spread, holm

#: (key, column title) of the numbers reported per cell and aggregated over seeds
METRICS = (
    ("forget_quality", "Forget Quality"),
    ("model_utility", "Model Utility"),
    ("forget_prob", "forget prob"),
    ("forget_rougeL", "forget ROUGE-L"),
    ("extraction_strength", "extraction strength"),
    ("retain_prob", "retain prob"),
    ("wall_s", "wall time (s)"),
    ("peak_rss_mb", "peak memory (MB)"),
)
#: with ``[evaluation] robustness``: is it really forgotten? (privleak in percent, >= -100)
ROBUSTNESS_METRICS = (
    ("privleak", "privleak"),
    ("auc_min_k", "MIA AUC (Min-K%)"),
    ("exact_memorization", "exact memorization"),
    ("forget_prob_worst", "forget prob, worst attack"),
)
MU_BOOTSTRAP = 2000
REPORT_FORMAT = 1


# ----------------------------------------------------------------------------- one evaluation


class CorruptEvaluation(DataError, ValueError):
    """An evaluation whose files parse but hold what no evaluation writes (a damaged or
    hand-edited record or cache): a string, list or NaN where a number belongs, a number out of
    its range, a list where an object belongs, a reported number missing. The message names the
    file and the field; the cell is failed (never averaged), a run rebuilds a cached one."""


#: the range of each TOFU metric an evaluation summary holds per task
METRIC_RANGES: dict[str, tuple[float | None, float | None]] = {
    "prob": (0.0, 1.0),
    "rouge1_recall": (0.0, 1.0),
    "rougeL_recall": (0.0, 1.0),
    "extraction_strength": (0.0, 1.0),
    "forget_quality": (0.0, 1.0),
    "truth_ratio": (0.0, None),
}
#: the numbers every study evaluation has (its tasks are required by the study file): one
#: missing is a damaged file, not a value to leave out of the seeds' mean
REQUIRED_METRICS = (
    "forget_quality",
    "model_utility",
    "forget_prob",
    "forget_rougeL",
    "extraction_strength",
    "retain_prob",
)


def _shown(path: Path, root: Path) -> str:
    """A file of an evaluation, named from its stage folder (``eval-.../…/results_<date>.json``)."""
    try:
        return str(Path(path).relative_to(root.parent))
    except ValueError:
        return str(path)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    shown = json.dumps(value) if isinstance(value, (str, int, float, bool)) else type(value).__name__
    return shown if len(shown) <= 40 else shown[:37] + "..."


def checked_number(
    value: Any, where: str, bounds: tuple[float | None, float | None] = (None, None), *, required: bool = False
) -> float | None:
    """``value`` as a float when it is a finite number within ``bounds`` (None stays None unless
    ``required``); otherwise :class:`CorruptEvaluation` naming ``where`` (file and field)."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CorruptEvaluation(f"{where} must be a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise CorruptEvaluation(f"{where} is {_kind(value)}, not a finite number")
    lo, hi = bounds
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        span = f"[{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
        raise CorruptEvaluation(f"{where} is {value!r}, outside its range {span}")
    return number


def _object(value: Any, where: str, default: Any = None) -> dict:
    """``value`` when it is a JSON object (a missing one is ``default``); else CorruptEvaluation."""
    if value is None and default is not None:
        return default
    if not isinstance(value, dict):
        raise CorruptEvaluation(f"{where} must be a JSON object, got {_kind(value)}")
    return value


def _check_summary(summary: Any, where: str, prefix: str) -> dict:
    """The shapes and numbers of an evaluation summary that the report reads."""
    summary = _object(summary, f"{where}: field {prefix.rstrip('.') or 'the summary'!r}")
    field = lambda *keys: f"{where}: field '{prefix}{'.'.join(map(str, keys))}'"  # noqa: E731
    for task, entry in _object(summary.get("metrics"), field("metrics"), {}).items():
        for metric, value in _object(entry, field("metrics", task)).items():
            if metric in METRIC_RANGES:  # TOFU's metrics (what the report reads); others are not read
                checked_number(value, field("metrics", task, metric), METRIC_RANGES[metric])
    for task, entry in _object(summary.get("forget_quality"), field("forget_quality"), {}).items():
        entry = _object(entry, field("forget_quality", task))
        checked_number(entry.get("value"), field("forget_quality", task, "value"), (0.0, 1.0))
    mu = _object(summary.get("model_utility"), field("model_utility"), {})
    checked_number(mu.get("value"), field("model_utility", "value"), (0.0, 1.0))
    return summary


def _read_samples(path: Path, where: str, checks: Sequence[str]) -> list[dict]:
    """The rows of a samples file; each a JSON object with an integer ``doc_id`` and, for the
    ``checks`` metrics (the ones Model Utility is recomputed from), a number in its range."""
    rows = []
    for lineno, row in json_lines(path, lambda n, why: CorruptEvaluation(f"{where}:{n}: {why}")):
        if not isinstance(row, dict):
            raise CorruptEvaluation(f"{where}:{lineno}: must be a JSON object, got {_kind(row)}")
        if checks:
            doc_id = row.get("doc_id")
            if isinstance(doc_id, bool) or not isinstance(doc_id, int):
                raise CorruptEvaluation(f"{where}:{lineno}: field 'doc_id' must be an integer, got {_kind(doc_id)}")
            for metric in checks:
                checked_number(
                    row.get(metric), f"{where}:{lineno}: field {metric!r}", METRIC_RANGES[metric], required=True
                )
        rows.append(row)
    if checks:  # lm-eval numbers its documents 0..n-1; the QA of the parts are paired by them
        ids = sorted(row["doc_id"] for row in rows)
        if ids != list(range(len(rows))):
            i = next(i for i, d in enumerate(ids) if i != d)
            found = ids[i] if abs(ids[i]) < 10**12 else f"a {len(str(abs(ids[i])))}-digit number"
            raise CorruptEvaluation(
                f"{where}: field 'doc_id' must number the {len(rows)} rows 0..{len(rows) - 1} once each "
                f"(expected {i}, found {found})"
            )
    return rows


def _results_file(folder: Path) -> Path:
    """The results file ``read_outputs`` reads (lm-eval's latest ``results_<date>.json``)."""
    from lm_eval.utils import get_latest_filename, get_results_filenames

    found = get_results_filenames(
        [str(p) for p in sorted(folder.glob("*/*.json*")) if not p.parent.name.startswith(".")]
    )
    return Path(get_latest_filename(found)) if found else folder / "summary.json"


def read_evaluation(folder: Path, root: Path | None = None) -> tuple[dict, dict[str, list[dict]]]:
    """(summary, samples per task) of an evaluation stage folder (``root``: the stage folder
    that holds it, which errors name files from). Every shape and number the report reads is
    checked: :class:`CorruptEvaluation` names the file and the field (JSON that does not parse
    is a ValueError)."""
    from unlearn_plugins.evaluation import lm_eval_runner as runner

    folder = Path(folder)
    root = Path(root) if root is not None else folder
    reader = getattr(runner, "read_outputs", None)
    if reader is not None:
        try:
            written = reader(folder)
        except (AttributeError, TypeError):  # the results file holds no JSON object
            name = _shown(_results_file(folder), root)
            raise CorruptEvaluation(f"{name}: must hold a JSON object of lm-eval results") from None
        except DataError as exc:  # no results file at all
            raise CorruptEvaluation(str(exc)) from None
        except ValueError as exc:
            name = _shown(_results_file(folder), root)
            raise CorruptEvaluation(f"{name}: malformed JSON ({str(exc).splitlines()[0][:80]})") from None
        summary, files = written.summary, written.samples
        results = written.results
        name = _shown(_results_file(folder), root)
        if isinstance(results, dict) and runner.SUMMARY_KEY not in results:
            raise CorruptEvaluation(f"{name}: no field {runner.SUMMARY_KEY!r} (the evaluation's summary)")
        summary = _check_summary(summary, name, f"{runner.SUMMARY_KEY}.")
    else:  # results.json / summary.json / samples/<task>.jsonl
        summary = _check_summary(
            json.loads((folder / "summary.json").read_text()), _shown(folder / "summary.json", root), ""
        )
        files = {p.stem: p for p in (folder / "samples").glob("*.jsonl")}
    checks: dict[str, list[str]] = {"tofu_forget_truth_ratio": ["truth_ratio"]}  # Forget Quality's, per QA
    for parts in MU_PARTS.values():
        for task, metric in parts:
            checks.setdefault(task, []).append(metric)
    samples = {
        task: _read_samples(Path(path), _shown(Path(path), root), checks.get(task, ())) for task, path in files.items()
    }
    return summary, samples


def _values(samples: dict[str, list[dict]], task: str, metric: str) -> list[float]:
    rows = sorted(samples.get(task, []), key=lambda r: r["doc_id"])
    return [float(r[metric]) for r in rows]


def mu_bootstrap(samples: dict[str, list[dict]], *, resamples: int = MU_BOOTSTRAP, seed: int = 0) -> dict | None:
    """Model Utility recomputed from its per-QA values, and its 95% percentile bootstrap
    interval: the QA of each part resampled with replacement (the three metrics of a QA
    together), each part aggregated as TOFU does, then the harmonic mean of the nine."""
    import numpy as np

    rng = np.random.default_rng(seed)
    estimates, draws = [], []
    for parts in MU_PARTS.values():
        columns = [np.asarray(_values(samples, task, metric)) for task, metric in parts]
        n = len(columns[0])
        if n == 0 or any(len(c) != n for c in columns):
            return None
        idx = rng.integers(0, n, size=(resamples, n))
        for (_task, metric), col in zip(parts, columns):
            if metric == "truth_ratio":  # true-better aggregate: mean(max(0, 1 - tr))
                col = np.maximum(0.0, 1.0 - col)
            estimates.append(float(col.mean()))
            draws.append(col[idx].mean(axis=1))
    stacked = np.stack(draws)  # (9, resamples)
    with np.errstate(divide="ignore"):
        hm = np.where((stacked > 0).all(axis=0), len(draws) / (1.0 / stacked).sum(axis=0), 0.0)
    point = 0.0 if min(estimates) <= 0 else len(estimates) / sum(1.0 / v for v in estimates)
    low, high = np.percentile(hm, [2.5, 97.5])
    return {
        "value": point,
        "low": float(low),
        "high": float(high),
        "width": float(high - low),
        "resamples": resamples,
        "qa": {split: len(_values(samples, parts[0][0], parts[0][1])) for split, parts in MU_PARTS.items()},
    }


def _evaluation_numbers(folder: Path) -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """The reported numbers of one evaluation stage (all but Model Utility's bootstrap) and its
    samples, every one checked (:class:`CorruptEvaluation` names the file and the field)."""
    from unlearn_plugins.evaluation.reference import read_reference

    from .. import metrics as tm

    folder = Path(folder)
    summary, samples = read_evaluation(folder)
    where = _shown(_results_file(folder), folder)
    metrics = summary.get("metrics", {})
    fq_entries = summary.get("forget_quality", {})
    fq = next(iter(fq_entries.values()), {}).get("value")
    if (folder / "reference.json").is_file():  # the retain model's: its own Forget Quality reference
        try:
            ratios = read_reference(folder / "reference.json").truth_ratios
        except DataError as exc:
            raise CorruptEvaluation(str(exc)) from None
        if fq is None:
            fq = tm.forget_quality(ratios, ratios)
    es = metrics.get("tofu_forget_extraction_strength", {}).get("extraction_strength")
    extraction = folder / EXTRACTION
    if extraction.is_file():
        name = _shown(extraction, folder)
        try:
            data = json.loads(extraction.read_text())
        except ValueError as exc:
            raise CorruptEvaluation(f"{name}: malformed JSON ({str(exc).splitlines()[0][:80]})") from None
        mean = checked_number(_object(data, name).get("mean"), f"{name}: field 'mean'", (0.0, 1.0))
        es = mean if es is None else es
    numbers = {
        "forget_quality": fq,
        "model_utility": summary.get("model_utility", {}).get("value"),
        "forget_prob": metrics.get("tofu_forget_prob", {}).get("prob"),
        "forget_rougeL": metrics.get("tofu_forget_rouge", {}).get("rougeL_recall"),
        "forget_truth_ratio": metrics.get("tofu_forget_truth_ratio", {}).get("truth_ratio"),
        "extraction_strength": es,
        "retain_prob": metrics.get("tofu_retain_prob", {}).get("prob"),
    }
    missing = [key for key in REQUIRED_METRICS if numbers[key] is None]
    if missing:
        titles = dict(METRICS)
        raise CorruptEvaluation(
            f"{where}: no {', '.join(titles[k] for k in missing)} (every evaluation of a study has "
            f"{'it' if len(missing) == 1 else 'them'}; the file is damaged or was edited)"
        )
    numbers = {k: None if v is None else float(v) for k, v in numbers.items()}
    for task, values in metrics.items():  # a study's other tasks (a plugin's, say): every number
        if task in BUILTIN_TASK_METRICS or not isinstance(values, dict):
            continue
        for metric, value in sorted(values.items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                numbers[f"{task}:{metric}"] = checked_number(value, f"{where}: field '{task}.{metric}'", (None, None))
    return {**numbers, **_robustness_metrics(folder / REALLY_FORGOTTEN, folder)}, samples


def check_evaluation(folder: Path) -> None:
    """Raise what :func:`evaluation_metrics` would on ``folder`` (files that do not parse, and
    :class:`CorruptEvaluation`), without its bootstrap: whether a finished evaluation can be
    reported, rebuilt or restored."""
    _evaluation_numbers(folder)


def evaluation_metrics(folder: Path) -> dict[str, Any]:
    """The reported numbers of one evaluation stage, each checked: a probability, Forget
    Quality, Model Utility or extraction strength that is not a finite number in [0, 1] (or
    any reported number missing) raises :class:`CorruptEvaluation` naming the file."""
    numbers, samples = _evaluation_numbers(folder)
    return {**numbers, "model_utility_ci": mu_bootstrap(samples)}


def _robustness_metrics(folder: Path, root: Path) -> dict[str, Any]:
    """privleak, the Min-K% AUC, exact memorization and the attack-aware forget probability of an
    evaluation's `unlearn eval --mia --robustness` folder (none without one)."""
    if not folder.is_dir():
        return {}
    from unlearn_plugins.evaluation.really_forgotten import row

    summary = read_evaluation(folder, root)[0]
    where = _shown(_results_file(folder), root)
    try:
        figures = row("", summary)
    except (AttributeError, TypeError):  # a list or a string where an object belongs
        raise CorruptEvaluation(f"{where}: its 'mia' or 'robustness' entries are not JSON objects") from None
    worst = figures["prob:worst_attack"]
    if worst is not None and not isinstance(worst, str):
        raise CorruptEvaluation(f"{where}: the worst attack's name must be a string, got {_kind(worst)}")
    return {
        "privleak": checked_number(figures["privleak"], f"{where}: privleak", RANGES["privleak"]),
        "auc_min_k": checked_number(figures["auc_min_k"], f"{where}: the Min-K% AUC", (0.0, 1.0)),
        "exact_memorization": checked_number(figures["exact_memorization"], f"{where}: exact memorization", (0.0, 1.0)),
        "forget_prob_worst": checked_number(figures["prob:worst"], f"{where}: the worst forget prob", (0.0, 1.0)),
        "forget_prob_worst_attack": worst,
    }


#: the tasks of every study evaluation whose numbers the report has columns for (their metrics
#: are those above); any other task's numbers are reported as "task:metric" (:func:`extra_metrics`)
BUILTIN_TASK_METRICS = frozenset(
    {"tofu_forget_prob", "tofu_forget_rouge", "tofu_forget_truth_ratio", "tofu_forget_extraction_strength"}
    | {task for task, _metric, _kind in MU_PARTS.values()}
    | {"tofu_retain_prob", "tofu_retain_rouge", "tofu_retain_truth_ratio", "tofu_real_authors"}
    | {"tofu_real_authors_rouge", "tofu_world_facts", "tofu_world_facts_rouge", "tofu_mia"}
    | {"tofu_forget_exact_memorization"}
)


def extra_metrics(cells: dict[str, dict]) -> list[str]:
    """The "task:metric" numbers of the study's other tasks (beyond the TOFU ones), as found in
    its finished evaluations."""
    return sorted({k for c in cells.values() for k in (c.get("metrics") or {}) if ":" in k})


def reported_metrics(plan: Plan) -> tuple[tuple[str, str], ...]:
    """The (key, column title) pairs this study reports."""
    return METRICS + (ROBUSTNESS_METRICS if plan.study.evaluation.robustness else ())


def _resources(folders: Sequence[str]) -> dict[str, Any]:
    """Wall time (summed) and peak memory (the highest) of a cell's stages; n/a when a stage's
    resources.json is missing or holds no usable number (never a NaN or a negative time)."""
    records = [read_json(Path(f) / RESOURCES) for f in folders]
    records = [r if isinstance(r, dict) else {} for r in records]

    def usable(value: Any) -> bool:  # a year of wall time, a petabyte of memory: damaged, not measured
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9

    seconds = [r["seconds"] for r in records if usable(r.get("seconds"))]
    peaks = [r["peak_rss_mb"] for r in records if usable(r.get("peak_rss_mb"))]
    return {
        "wall_s": round(sum(seconds), 1) if len(seconds) == len(records) else None,
        "peak_rss_mb": max(peaks) if len(peaks) == len(records) and peaks else None,
        "peak_scope": sorted({r["peak_scope"] for r in records if isinstance(r.get("peak_scope"), str)}),
    }


# ----------------------------------------------------------------------------- intervals


#: the range of each reported number: an interval is cut to it (its intersection with the
#: possible values covers the true value as often as the interval itself)
RANGES = {key: (0.0, None) if key in ("wall_s", "peak_rss_mb") else (0.0, 1.0) for key, _ in METRICS}
RANGES.update({key: (0.0, 1.0) for key, _ in ROBUSTNESS_METRICS}, privleak=(-100.0, None))


def interval(
    values: Sequence[float | None], method: str, bounds: tuple[float | None, float | None] = (None, None)
) -> dict[str, Any]:
    """Mean and 95% interval over the seeds (``t`` or ``bootstrap``), cut to ``bounds``; None
    bounds from one value, and from values that are all equal (``spread`` False: "no spread",
    not an interval of zero width). ``spread`` is None for fewer than 2 values."""
    import numpy as np

    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict[str, Any] = {"mean": None, "low": None, "high": None, "n": len(vals), "values": vals, "spread": None}
    if not vals:
        return out
    mean = float(np.mean(vals))
    out["mean"] = mean
    if len(vals) < 2:
        return out
    out["spread"] = has_spread(vals)
    if not out["spread"]:  # no interval: the seeds agree, which says nothing of the precision
        return out
    sd = float(np.std(vals, ddof=1))
    if method == "t":
        from scipy.stats import t

        half = float(t.ppf(0.975, len(vals) - 1)) * sd / math.sqrt(len(vals))
        out["low"], out["high"] = mean - half, mean + half
    else:
        from scipy.stats import bootstrap

        ci = bootstrap(
            (np.asarray(vals),), np.mean, confidence_level=0.95, n_resamples=10000, method="percentile", random_state=0
        ).confidence_interval
        out["low"], out["high"] = float(ci.low), float(ci.high)
    lo, hi = bounds
    if lo is not None:
        out["low"] = max(out["low"], lo)
    if hi is not None:
        out["high"] = min(out["high"], hi)
    return out


def leader_tests(groups: Sequence[dict], metric: str = "forget_quality", method: str | None = None) -> dict | None:
    """Is the method with the highest mean ``metric`` (or ``method``, a paper's claimant) better
    than each other method? One-sided
    p-values over the seeds: an exact permutation test of the difference in means (every split
    of the pooled seed values, so ties and non-normal values are fine; with 3 seeds a side its
    smallest possible p is 1/20), the same Holm-corrected over the tests in the list
    (``holm_p``; a rival with one seed counts as p = 1), and Welch's t-test (None where either
    side has no spread: against a group of equal values its p-value is an artifact). The leader
    is picked after seeing the means (``post_hoc``), which no correction over its rivals
    accounts for. None without a leader of 2 or more seeds."""
    import warnings

    import numpy as np
    from scipy import stats

    scored = [g for g in groups if g["metrics"][metric]["n"] >= 1]
    if len(scored) < 2:
        return None
    if method is None:
        leader = max(scored, key=lambda g: g["metrics"][metric]["mean"])
    else:
        leader = next((g for g in scored if g["method"] == method), None)
        if leader is None:
            return None
    a = np.asarray(leader["metrics"][metric]["values"], dtype=float)
    if len(a) < 2:
        return None
    against = []
    for g in scored:
        if g is leader:
            continue
        b = np.asarray(g["metrics"][metric]["values"], dtype=float)
        perm = None
        if len(b) >= 2:  # scipy refuses a sample of one value: n/a, and the report is still written
            perm = stats.permutation_test(
                (a, b),
                lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
                permutation_type="independent",
                alternative="greater",
                n_resamples=100_000,  # exact (every split) up to 100,000 splits: 9 seeds a side
                vectorized=True,
                random_state=0,
            ).pvalue
        welch = None
        if len(b) >= 2 and has_spread(a) and has_spread(b):
            with warnings.catch_warnings():  # repeated values (Forget Quality takes few) are expected
                warnings.simplefilter("ignore", RuntimeWarning)
                welch = float(stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue)
        against.append(
            {
                "method": g["method"],
                "label": g["label"],
                "difference": float(a.mean() - b.mean()),
                "permutation_p": None if perm is None else float(perm),
                "smallest_p": 1 / math.comb(len(a) + len(b), len(a)),
                "welch_p": welch,
                "n": [len(a), len(b)],
            }
        )
    for row, corrected in zip(against, holm([row["permutation_p"] for row in against])):
        row["holm_p"] = corrected
    return {
        "metric": metric,
        "leader": leader["method"],
        "label": leader["label"],
        "post_hoc": method is None,
        "correction": f"Holm over the {len(against)} comparisons",
        "against": against,
    }


def _leader_lines(test: dict | None) -> list[str]:
    if not test:
        return []
    against = test["against"]
    lines = [
        "",
        f"Is {test['label']}'s Forget Quality higher than each other method's? A secondary analysis: "
        f"{test['label']} leads by its mean, picked after seeing the results, which no correction below "
        "accounts for. One-sided p-values over the seeds: an exact permutation test of the difference in "
        "means (no normality assumed; its smallest possible value is 1 / C(n_a + n_b, n_a), in the last "
        f"column), the same Holm-corrected over the {len(against)} comparisons of this table, and Welch's "
        f"t-test (none where either method's seeds all gave one value: {NO_SPREAD}).",
        "",
        f"| {tables.markdown_cell(test['label'])} vs | difference in mean | permutation p | Holm p | Welch p | "
        "smallest possible p |",
        "|---|---|---|---|---|---|",
    ]
    corrected = holm([row["permutation_p"] for row in against])  # a study.json written before holm_p
    for row, holm_p in zip(against, corrected):
        n_a, n_b = row["n"]
        welch = f"n/a ({NO_SPREAD})" if row["welch_p"] is None else f"{row['welch_p']:.3f}"
        perm = "n/a (one seed)" if row["permutation_p"] is None else f"{row['permutation_p']:.3f}"
        holm_p = row.get("holm_p", holm_p)
        adjusted = "n/a" if holm_p is None else f"{holm_p:.3f}"
        smallest = row.get("smallest_p", 1 / math.comb(n_a + n_b, n_a))
        lines.append(
            f"| {tables.markdown_cell(row['label'])} | {row['difference']:+.3f} | {perm} | {adjusted} | {welch} "
            f"| {smallest:.3f} |"
        )
    return lines


# ----------------------------------------------------------------------------- the report


def cud_strata(plan: Plan, results: dict[str, dict]) -> dict[int, tuple[list[int], list[int]]]:
    """Forget size -> the forget-set positions of its CUD-easy and CUD-hard QA, where the study
    has [cud] and its cell finished."""
    from unlearn_plugins.study.cud import strata

    found = {}
    for k in plan.study.forget_sizes if plan.study.cud is not None else ():
        cp = plan.cells.get(f"cud/forget{k}")
        if cp is not None and results.get(cp.cell.id, {}).get("status") == "done":
            try:
                found[k] = strata(Path(cp.result))
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return found


def strata_metrics(folder: Path, easy: Sequence[int], hard: Sequence[int]) -> dict[str, float | None]:
    """An evaluation's mean forget probability on the CUD-easy and on the CUD-hard QA."""
    rows = read_evaluation(folder)[1].get("tofu_forget_prob", [])
    probs = {row["doc_id"]: row.get("prob") for row in rows}

    def mean(ids: Sequence[int]) -> float | None:
        values = [float(probs[i]) for i in ids if isinstance(probs.get(i), (int, float))]
        return sum(values) / len(values) if values else None

    return {f"{CUD_EASY}:forget_prob": mean(easy), f"{CUD_HARD}:forget_prob": mean(hard)}


#: the names of the CUD strata in the report's "task:metric" numbers
CUD_EASY, CUD_HARD = "cud_easy", "cud_hard"


def collect(plan: Plan, results: dict[str, dict]) -> dict[str, Any]:
    """Per cell numbers, per (method, forget size) intervals, and the reference models."""
    study = plan.study
    cells: dict[str, dict] = {}
    strata = cud_strata(plan, results)
    for cell_id, cp in plan.cells.items():
        result = results.get(cell_id, {"status": "not run"})
        entry = {
            "kind": cp.cell.kind,
            "forget": cp.cell.forget,
            "method": cp.cell.method,
            "seed": cp.cell.seed,
            "status": result["status"],
            "source": result.get("source"),
            "sources": result.get("sources"),  # per stage: built, cached or waited
            "error": result.get("error"),
            "log": result.get("log"),
            "stages": [s.folder for s in cp.stages],
        }
        if result["status"] == "done" and cp.cell.kind not in ("target", "retain", "cud"):
            try:
                entry["metrics"] = evaluation_metrics(Path(cp.result))
                if cp.cell.forget in strata:  # [cud]: the forget probability per CUD stratum
                    entry["metrics"].update(strata_metrics(Path(cp.result), *strata[cp.cell.forget]))
            except (OSError, ValueError, KeyError, UnlearnError) as exc:
                entry.update(status="failed", error=f"its evaluation is unreadable: {exc}")
        if result["status"] == "done":
            entry["resources"] = _resources([s.folder for s in cp.stages])
        cells[cell_id] = entry

    def model_resources(model_cell: str | None, eval_cell: str) -> dict:
        folders = list(cells[eval_cell]["stages"])
        if model_cell in cells:
            folders = cells[model_cell]["stages"] + folders
        return _resources(folders)

    groups, references = [], []
    extras = extra_metrics(cells)
    for k in study.forget_sizes:
        for name, label, model_cell, eval_cell in (
            ("full", "full (target, before unlearning)", "target", f"eval-full/forget{k}"),
            ("retain", "retain (never saw the forget authors)", f"retain/forget{k}", f"eval-retain/forget{k}"),
        ):
            entry = cells[eval_cell]
            row = {"name": name, "label": label, "forget": k, "status": entry["status"], "error": entry.get("error")}
            if "metrics" in entry:
                row.update(entry["metrics"], **model_resources(model_cell, eval_cell))
            references.append(row)
        for method in study.methods:
            ids = [f"{method.name}/forget{k}/seed{s}" for s in study.seeds]
            done = [cells[i] for i in ids if "metrics" in cells[i]]
            group = {
                "method": method.name,
                "label": method.label,
                "forget": k,
                "seeds": list(study.seeds),
                "seeds_done": [cells[i]["seed"] for i in ids if "metrics" in cells[i]],
                "metrics": {},
            }
            for key, _ in reported_metrics(plan):
                source = "resources" if key in ("wall_s", "peak_rss_mb") else "metrics"
                group["metrics"][key] = interval([c[source].get(key) for c in done], study.ci, RANGES[key])
            for key in extras:  # the study's other tasks: their own scale, no range to cut to
                group["metrics"][key] = interval([c["metrics"].get(key) for c in done], study.ci, (None, None))
            widths = [c["metrics"]["model_utility_ci"]["width"] for c in done if c["metrics"].get("model_utility_ci")]
            group["model_utility_qa_ci_width_max"] = max(widths) if widths else None
            groups.append(group)
    return {"cells": cells, "groups": groups, "references": references, "extra_metrics": extras}


def _fmt(value: Any, key: str = "") -> str:
    if value is not None and key in ("wall_s", "peak_rss_mb"):
        return f"{value:.0f}"
    return format_value(value)


def _ci_text(stat: dict, key: str) -> str:
    if stat["mean"] is None:
        return "n/a"
    if stat.get("spread") is False:  # every seed gave this value: no interval to show
        return f"{_fmt(stat['mean'], key)} ({NO_SPREAD})"
    if stat["low"] is None:
        return f"{_fmt(stat['mean'], key)} (n={stat['n']})"
    return f"{_fmt(stat['mean'], key)} [{_fmt(stat['low'], key)}, {_fmt(stat['high'], key)}]"


def source_used(plan: Plan) -> str:
    """The study's benchmark source as its benchmark folders resolved it (``auto``: TOFU where
    it was found, else the generated authors)."""
    found = {bench.get("source") for bench in plan.benches.values()}
    return found.pop() if plan.study.source == "auto" and len(found) == 1 else plan.study.source


def sections(report: dict, plan: Plan) -> list[Section]:
    """summary.md's sections: the study, a table per forget size, Model Utility's sampling
    error, the Pareto plot (with pareto.png), the cells not run or failed, and the count."""
    study, data = plan.study, report["data"]
    columns = reported_metrics(plan)
    method_ci = (
        "Student-t (n - 1 degrees of freedom)"
        if study.ci == "t"
        else "percentile bootstrap over the seeds (10,000 resamples)"
    )
    budget = ", ".join(f"{k} {v}" for k, v in study.budget.items())
    lines = [f"# Study `{study.name}`", ""]
    if study.description:
        lines += [study.description, ""]
    lines += [
        f"Model `{study.model}`; benchmark: {study.authors} {'TOFU' if source_used(plan) == 'tofu' else 'generated'} "
        f"authors (20 QA each), forgetting the last {', '.join(map(str, study.forget_sizes))}; seeds "
        f"{', '.join(map(str, study.seeds))}; one unlearning budget for every method: {budget}.",
        "",
        f"Each cell: mean over the seeds and its 95% confidence interval [low, high] ({method_ci}; cut to "
        "the metric's range, [0, 1] or >= 0). Forget "
        "Quality: KS-test p-value of the forget truth ratios against the retain model's; Model Utility: "
        "TOFU's harmonic mean of 9 (probability, ROUGE-L, truth ratio on retain QA, real authors, world "
        "facts); extraction strength 1 - k/n on the forget QA; retain prob: answer probability on the "
        "Model Utility retain QA. Wall time and peak memory (resident set) per cell: unlearning + "
        "evaluation (reference rows: fine-tuning + evaluation).",
    ]
    if study.evaluation.robustness:
        lines[-1] += (
            " Is it really forgotten: privleak (MUSE, Min-K%, against the retain model: 0 = as private as "
            "it, negative = the forget set still looks trained on), the Min-K% membership-inference AUC of "
            "forget vs a holdout author's QA, exact memorization of the forget answers, and the highest "
            "forget probability over the paraphrase and format probes and the relearn and int4 attacks."
        )
    out = [Section(lines)]
    for k in study.forget_sizes:
        bench = plan.benches[k]
        rows = []
        for row in (r for r in report["references"] if r["forget"] == k):
            cells = (
                [_fmt(row.get(key), key) for key, _ in columns]
                if row["status"] == "done"
                else [row["status"]] * len(columns)
            )
            rows.append([tables.markdown_cell(row["label"]), "-", *cells])
        groups = [g for g in report["groups"] if g["forget"] == k]
        for g in groups:
            rows.append(
                [
                    tables.markdown_cell(g["label"]),
                    f"{len(g['seeds_done'])}/{len(g['seeds'])}",
                    *(_ci_text(g["metrics"][key], key) for key, _ in columns),
                ]
            )
        header = ["model", "seeds", *(title for _, title in columns)]
        lines = [
            "",
            f"## Forget {k} author(s) ({bench['sizes']['forget']} QA)",
            "",
            tables.markdown_table(header, rows),
        ]
        lines += _extra_lines(report, k)
        lines += _ranking(groups, report["references"], k)
        lines += _leader_lines(report.get("comparisons", {}).get(str(k)))
        out.append(Section(lines))
    widths = [
        (c["metrics"]["model_utility_ci"]["width"], cid)
        for cid, c in data["cells"].items()
        if c.get("metrics", {}).get("model_utility_ci")
    ]
    if widths:
        width, where = max(widths)
        qa = data["cells"][where]["metrics"]["model_utility_ci"]["qa"]
        line = (
            f"Model Utility's sampling error (95% bootstrap over the evaluation QA, {MU_BOOTSTRAP} "
            f"resamples; {qa['retain']} retain, {qa['real_authors']} real-authors, {qa['world_facts']} "
            f"world-facts QA): at most {width:.3f} wide ({where})."
        )
        out.append(Section(["", line]))
    out.append(
        Section(
            ["", "![Forget Quality vs Model Utility](pareto.png)"],
            {"pareto.png": lambda path: plot_pareto(report, plan, path)},
        )
    )
    out.append(Section(_cells_lines(report)))
    return out


def _cells_lines(report: dict) -> list[str]:
    """The cells not run yet and the failed ones, then the count of each source."""
    data = report["data"]
    lines = []
    failed = [(cid, c) for cid, c in data["cells"].items() if c["status"] == "failed"]
    unfinished = [cid for cid, c in data["cells"].items() if c["status"] == "not run"]
    if unfinished:  # a report of a study still running (--report-only), or stopped
        lines += ["", f"Not run yet ({len(unfinished)}): " + ", ".join(f"`{cid}`" for cid in unfinished) + "."]
    if failed:
        lines += ["", f"## Failed cells ({len(failed)})", ""]
        lines += [f"- `{cid}`: {c.get('error')}" + (f" (log: {c['log']})" if c.get("log") else "") for cid, c in failed]
    sources = [c.get("source") for c in data["cells"].values() if c["status"] == "done"]
    run = report["run"]
    how = (
        "report only (nothing built)"
        if run.get("report_only")
        else f"{run['executor']} executor, {run['workers']} worker(s), {run['wall_time_s']:.0f} s"
    )
    lines += [
        "",
        f"{len(data['cells'])} cells: {sources.count('built')} built in this run, "
        f"{sources.count('cached')} cached, {sources.count('waited')} built by a concurrent run, "
        f"{len(failed)} failed, {len(unfinished)} not run; {how}.",
        "",
    ]
    return lines


def _extra_lines(report: dict, k: int) -> list[str]:
    """The study's other tasks (beyond TOFU's): each metric, with its interval over the seeds."""
    extras = report.get("extra_metrics") or []
    if not extras:
        return []
    cud = all(key.startswith((f"{CUD_EASY}:", f"{CUD_HARD}:")) for key in extras)
    lines = [
        "",
        "CUD strata ([cud]): the forget probability on the CUD-easy and on the CUD-hard forget QA (mean and "
        "95% interval over the seeds):"
        if cud
        else "Other tasks of the study (each metric on its own scale; mean and 95% interval over the seeds):",
        "",
    ]
    rows = [
        [
            tables.markdown_cell(row["label"]),
            *(_fmt(row.get(key)) if row["status"] == "done" else row["status"] for key in extras),
        ]
        for row in report["references"]
        if row["forget"] == k
    ]
    rows += [
        [tables.markdown_cell(g["label"]), *(_ci_text(g["metrics"][key], key) for key in extras)]
        for g in report["groups"]
        if g["forget"] == k
    ]
    header = ["model", *(tables.markdown_cell(key) for key in extras)]
    return [*lines, tables.markdown_table(header, rows)]


def _ranking(groups: list[dict], references: list[dict], k: int) -> list[str]:
    """Which method has the highest mean Forget Quality, whether its interval separates it from
    the next, and its Model Utility against the target's."""
    ranked = sorted(
        (g for g in groups if g["metrics"]["forget_quality"]["mean"] is not None),
        key=lambda g: g["metrics"]["forget_quality"]["mean"],
        reverse=True,
    )
    if not ranked:
        return []
    best = ranked[0]
    fq, mu = best["metrics"]["forget_quality"], best["metrics"]["model_utility"]
    text = f"Highest mean Forget Quality: {best['label']} ({_ci_text(fq, '')})"
    if len(ranked) > 1:
        second = ranked[1]["metrics"]["forget_quality"]
        if second["mean"] == fq["mean"]:
            text += f"; tied with {ranked[1]['label']} ({_ci_text(second, '')})"
        elif None in (fq["low"], second["high"]):  # no interval to compare (no spread, one seed)
            text += f"; next: {ranked[1]['label']} ({_ci_text(second, '')})"
        else:
            apart = fq["low"] > second["high"]
            text += (
                f"; its interval {'lies above' if apart else 'overlaps'} that of {ranked[1]['label']} "
                f"({_ci_text(second, '')})"
            )
    full = next((r for r in references if r["forget"] == k and r["name"] == "full"), None)
    if full and full.get("model_utility") is not None and mu["mean"] is not None:
        text += f". Its Model Utility {_ci_text(mu, '')} vs the target's {full['model_utility']:.3f}"
    return ["", text + "."]


def plot_pareto(report: dict, plan: Plan, path: Path) -> None:
    """Forget Quality (log scale) vs Model Utility per method with their intervals, the full and
    retain models as reference points, and the Pareto front of the method means; one panel per
    forget size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study = plan.study
    sizes = study.forget_sizes
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.2 * len(sizes), 4.8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, k in zip(axes[0], sizes):
        # a lower bound of 0 cannot be drawn on a log axis: it goes a decade below the smallest value
        shown = [
            g["metrics"]["forget_quality"][b] for g in report["groups"] if g["forget"] == k for b in ("mean", "low")
        ]
        shown += [r.get("forget_quality") for r in report["references"] if r["forget"] == k]
        floor = min([v for v in shown if v is not None and v > 0] or [1.0]) / 10
        points = []
        for i, g in enumerate(g for g in report["groups"] if g["forget"] == k):
            fq, mu = g["metrics"]["forget_quality"], g["metrics"]["model_utility"]
            if fq["mean"] is None or mu["mean"] is None:
                continue
            x = max(fq["mean"], floor)
            xerr = [
                [x - max(fq["low"], floor) if fq["low"] is not None else 0.0],
                [max(fq["high"] - x, 0.0) if fq["high"] is not None else 0.0],
            ]
            yerr = [
                [mu["mean"] - mu["low"] if mu["low"] is not None else 0.0],
                [mu["high"] - mu["mean"] if mu["high"] is not None else 0.0],
            ]
            ax.errorbar(
                [x],
                [mu["mean"]],
                xerr=xerr,
                yerr=yerr,
                fmt="o",
                capsize=3,
                color=colors[i % len(colors)],
                label=f"{g['label']} (n={fq['n']})",
            )
            points.append((x, mu["mean"]))
        front = sorted(p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points))
        if len(front) > 1:
            ax.plot(*zip(*front), ls="--", lw=0.8, color="gray", label="Pareto front (means)")
        for r in (r for r in report["references"] if r["forget"] == k):
            if r.get("forget_quality") is None or r.get("model_utility") is None:
                continue
            marker = "s" if r["name"] == "full" else "*"
            ax.scatter(
                [max(r["forget_quality"], floor)],
                [r["model_utility"]],
                marker=marker,
                s=140 if marker == "*" else 70,
                color="black",
                zorder=3,
                label=r["label"],
            )
        ax.set_xscale("log")
        ax.set_xlabel("Forget Quality (log scale; higher is better)")
        ax.set_ylabel("Model Utility (higher is better)")
        ax.set_title(f"forget {k} author(s): mean and 95% CI over {len(study.seeds)} seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)


def terminal_table(report: dict, plan: Plan) -> str:
    """Forget Quality and Model Utility per method and forget size, for the terminal."""
    rows = [("forget", "model", "Forget Quality", "Model Utility")]
    for k in plan.study.forget_sizes:
        for r in (r for r in report["references"] if r["forget"] == k):
            rows.append((str(k), r["label"], _fmt(r.get("forget_quality")), _fmt(r.get("model_utility"))))
        for g in (g for g in report["groups"] if g["forget"] == k):
            rows.append(
                (
                    str(k),
                    g["label"],
                    _ci_text(g["metrics"]["forget_quality"], ""),
                    _ci_text(g["metrics"]["model_utility"], ""),
                )
            )
    return tables.text_table(rows[0], rows[1:], numbers_right=False)


def write_report(out: Path, plan: Plan, results: dict[str, dict], run: dict) -> tuple[dict[str, str], str]:
    """study.json, summary.md and pareto.png in ``out``; returns the files and the terminal table.
    (An author-unit study's report: :func:`.author_report.write_report`.)"""
    data = collect(plan, results)
    study = plan.study
    report = {
        "format": REPORT_FORMAT,
        "study": {k: v for k, v in study.settings().items() if k != "methods"},
        "study_digest": study.digest(),  # another study of the same name is refused this --out
        "methods": [
            {"name": m.name, "label": m.label, "settings": m.settings, "config": m.config} for m in study.methods
        ],
        "ci": {"method": study.ci, "level": 0.95},
        "benchmarks": {str(k): {key: v for key, v in b.items() if key != "content"} for k, b in plan.benches.items()},
        "models": plan.models,
        "cache": str(plan.cache),
        "run": run,
        "references": data["references"],
        "groups": data["groups"],
        # the study's other tasks' "task:metric" numbers, in the groups' metrics (only when it has any)
        **({"extra_metrics": data["extra_metrics"]} if data["extra_metrics"] else {}),
        # per forget size: the Forget Quality leader tested against every other method
        "comparisons": {
            str(k): leader_tests([g for g in data["groups"] if g["forget"] == k]) for k in study.forget_sizes
        },
        "cells": data["cells"],
        "failed": [cid for cid, c in data["cells"].items() if c["status"] == "failed"],
        "not_run": [cid for cid, c in data["cells"].items() if c["status"] == "not run"],
    }
    files = report_writer.write(out, Report(report, sections({**report, "data": data}, plan)))
    return files, terminal_table(report, plan)
