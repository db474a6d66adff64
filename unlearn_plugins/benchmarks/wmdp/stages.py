"""A WMDP study's evaluation stage (``wmdp_evaluate``): the study's lm-eval tasks on one model
(with its adapter), with the task metadata of the benchmark (the synthetic folder or the real
questions' folder, the MMLU subset's size); beside lm-eval's outputs, ``wmdp_summary.json``:
per task the accuracy, its 95% Wilson interval over the questions, and every question's
correctness (for the report's paired tests)."""

from __future__ import annotations

import math
from pathlib import Path

SUMMARY = "wmdp_summary.json"


def wilson(correct: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ``correct / n``."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def per_question(samples: list[dict], metric: str = "acc") -> list[int]:
    """Each question's 0/1 correctness, in document order."""
    rows = sorted(samples, key=lambda s: s.get("doc_id", 0))
    return [int(round(float(s[metric]))) for s in rows if metric in s]


def summarize(samples: dict[str, list[dict]]) -> dict:
    out = {}
    for task, rows in sorted(samples.items()):
        for metric in ("acc", "acc_norm"):
            values = per_question(rows, metric)
            if not values:
                continue
            name = task if metric == "acc" else f"{task}:acc_norm"
            low, high = wilson(sum(values), len(values))
            out[name] = {
                "acc": sum(values) / len(values),
                "n": len(values),
                "low": low,
                "high": high,
                "correct": values,
            }
    return out


def build_evaluate(tmp: Path, p: dict) -> None:
    from unlearn_plugins.evaluation import lm_eval_runner as runner
    from unlearn_plugins.files import write_json
    from unlearn_plugins.study.cells import need_stage

    need_stage(p["model"], "the model to evaluate")
    if p["adapter"]:
        need_stage(p["adapter"], "the unlearning run's adapter")
    from unlearn_plugins.models import merge_is_exact

    evaluation = runner.evaluate_model(
        p["model"],
        list(p["tasks"]),
        adapter=p["adapter"],
        device=p["device"],
        dtype=p["dtype"],
        batch_size=p["batch_size"],
        merge_adapter=merge_is_exact(p["device"], p["dtype"]),
        metadata=p["metadata"],
        scoring=p["scoring"],
    )
    runner.write_outputs(tmp, evaluation)
    write_json(tmp / SUMMARY, {"model": p["model"], "adapter": p["adapter"], "tasks": summarize(evaluation.samples)})


__all__ = ["build_evaluate", "wilson", "summarize", "SUMMARY"]
