"""`unlearn eval --robustness`: is the forgetting still there when the model is attacked?

The model is measured as it is (``tofu_forget_prob``, ``tofu_forget_rouge``), through the probes
(``tofu_forget_probes``: paraphrased questions, a plain few-shot format) and after every attack
plugin (relearn, quantize, third parties'), each attacked model measured with the same two tasks
(on ``measure.json`` when the attack was shown part of the forget set). Per metric, the
attack-aware value is the worst case: the highest forget probability and ROUGE-L any attack
reaches, reported next to the plain value.

Outputs: the attacked models' evaluations in ``OUT/attacks/<attack>/`` (lm-eval's layout, with
``model/attack.json``; the attacked weights are removed after their evaluation unless kept), the
summary under ``robustness`` in the plain evaluation's results file.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

from ..errors import UnlearnError

PLAIN_TASKS = ("tofu_forget_prob", "tofu_forget_rouge")
PROBE_TASKS = {
    "paraphrase": ("tofu_forget_paraphrase_prob", "tofu_forget_paraphrase_rouge"),
    "format": ("tofu_forget_format_prob", "tofu_forget_format_rouge"),
}
#: metric -> (its place in a (prob task, ROUGE task) pair, the metric's name in that task)
METRICS = {"prob": (0, "prob"), "rougeL_recall": (1, "rougeL_recall")}


def tasks_needed() -> list[str]:
    return [*PLAIN_TASKS, *(t for pair in PROBE_TASKS.values() for t in pair)]


def attack_options(pairs: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    """``--attack-option NAME.KEY=VALUE`` pairs (already parsed) as {attack: {key: value}}."""
    out: dict[str, dict[str, Any]] = {name: {} for name in names}
    for dotted, value in pairs.items():
        name, sep, key = dotted.partition(".")
        if not sep or not key:
            raise UnlearnError(f"--attack-option {dotted}={value!r}: expected NAME.KEY=VALUE, e.g. quantize.bits=8")
        if name not in out:
            raise UnlearnError(
                f"--attack-option {dotted}: {name!r} is not one of the attacks run ({', '.join(names) or 'none'})"
            )
        out[name][key] = value
    return out


def _per_key(evaluation, task: str, metric: str) -> dict[str, float]:
    return {row["doc"]["key"]: row[metric] for row in evaluation.samples.get(task, [])}


def _value(evaluation, task: str, metric: str) -> float | None:
    return evaluation.summary["metrics"].get(task, {}).get(metric)


def run_attacks(
    out: Path,
    names: list[str],
    options: dict[str, dict[str, Any]],
    *,
    evaluate: Callable,
    model: str,
    adapter: str | None,
    forget_split: str,
    tofu_dir: str | None,
    device: str | None,
    dtype: str | None,
    trust_remote_code: bool,
    allow_other_base: bool,
    keep_models: bool,
    write: Callable,
) -> dict[str, Any]:
    """Attack the model with each named attack, evaluate each attacked model with the plain tasks
    (``evaluate(model_dir, forget_split) -> Evaluation``) and write it under ``out/attacks/NAME``.
    Returns {name: (Evaluation, attack record) or an error line}."""
    from ..attacks.run import run_attack
    from ..data.qa import parse_spec

    name, _ = parse_spec(forget_split)
    forget = (
        forget_split
        if name.endswith((".json", ".jsonl")) or Path(name).expanduser().is_file() or forget_split.startswith("tofu:")
        else f"tofu:{forget_split}"
    )
    results: dict[str, Any] = {}
    for attack in names:
        folder = out / "attacks" / attack
        try:
            attacked = run_attack(
                attack,
                model=model,
                out=folder / "model",
                options=options.get(attack, {}),
                adapter=adapter,
                forget=forget,
                tofu_dir=tofu_dir,
                device=device,
                dtype=dtype,
                trust_remote_code=trust_remote_code,
                allow_other_base=allow_other_base,
                overwrite=True,
            )
            evaluation = evaluate(str(attacked.folder), attacked.measure_split or forget_split)
            evaluation.summary["attack"] = attacked.record
            write(folder, evaluation)
            results[attack] = (evaluation, attacked.record)
        except UnlearnError as exc:
            warnings.warn(
                f"--robustness: attack {attack!r} failed: {exc}; the other attacks go on", RuntimeWarning, stacklevel=2
            )
            results[attack] = f"{exc}"
        finally:
            if not keep_models:
                _drop_weights(folder / "model")
    return results


def _drop_weights(folder: Path) -> None:
    """Remove an attacked model's files but attack.json and measure.json (what was done, and on what)."""
    from ..attacks.run import MEASURE, RECORD

    if not folder.is_dir():
        return
    for item in folder.iterdir():
        if item.name in (RECORD, MEASURE):
            continue
        if item.is_dir():
            shutil.rmtree(item)
        else:
            item.unlink()


def robustness_summary(plain, attacked: dict[str, Any]) -> dict[str, Any]:
    """Per metric: the plain value, each probe's and attack's, and the worst case over them."""
    metrics: dict[str, Any] = {}
    for metric, (place, name) in METRICS.items():
        plain_task = PLAIN_TASKS[place]
        entry: dict[str, Any] = {"plain": _value(plain, plain_task, name), "attacks": {}}
        plain_by_key = _per_key(plain, plain_task, name)
        for probe, pair in PROBE_TASKS.items():
            value = _value(plain, pair[place], name)
            if value is not None:
                entry["attacks"][probe] = {"value": value, "kind": "probe", "task": pair[place]}
        for attack, result in attacked.items():
            if isinstance(result, str):
                entry["attacks"][attack] = {"value": None, "kind": "attack", "error": result}
                continue
            evaluation, record = result
            row: dict[str, Any] = {
                "value": _value(evaluation, plain_task, name),
                "kind": "attack",
                "options": record["attack"]["options"],
            }
            if record.get("measure_split"):
                keys = list(_per_key(evaluation, plain_task, name))
                same = [plain_by_key[k] for k in keys if k in plain_by_key]
                row["samples"] = len(keys)
                row["plain_same_samples"] = sum(same) / len(same) if same and len(same) == len(keys) else None
            entry["attacks"][attack] = row
        scored = [(row["value"], label) for label, row in entry["attacks"].items() if row.get("value") is not None]
        if scored:
            value, label = max(scored)
            entry["worst"] = {
                "attack": label,
                "value": value,
                "above_plain": (value - entry["plain"]) if entry["plain"] is not None else None,
            }
        metrics[metric] = entry
    return {
        "metrics": metrics,
        "note": "worst = the highest forget value over the probes and attacks (attack-aware); an attack shown "
        "part of the forget set (relearn) is measured on the rest, with the plain value on the same "
        "samples beside it",
    }


def robustness_table(summary: dict[str, Any]) -> str:
    """The robustness summary as a Markdown table: one row per probe or attack, the worst case last."""
    from ..tables import lm_eval_table

    def fmt(value):
        return "n/a" if value is None else f"{value:.4f}"

    metrics = summary["metrics"]
    labels = list(dict.fromkeys(label for entry in metrics.values() for label in entry["attacks"]))
    rows = [["plain (no attack)", *(fmt(entry["plain"]) for entry in metrics.values())]]
    for label in labels:
        cells = []
        for entry in metrics.values():
            row = entry["attacks"].get(label, {})
            cell = fmt(row.get("value")) if "error" not in row else "failed"
            if row.get("plain_same_samples") is not None:
                cell += f" (plain {fmt(row['plain_same_samples'])} on these {row['samples']})"
            cells.append(cell)
        kind = next(entry["attacks"][label].get("kind") for entry in metrics.values() if label in entry["attacks"])
        rows.append([f"{label} ({kind})", *cells])
    rows.append(
        [
            "worst case (attack-aware)",
            *(
                f"{fmt(e['worst']['value'])} ({e['worst']['attack']})" if e.get("worst") else "n/a"
                for e in metrics.values()
            ),
        ]
    )
    return lm_eval_table(["Robustness", "forget prob", "forget ROUGE-L recall"], rows) + "\nnote: " + summary["note"]
