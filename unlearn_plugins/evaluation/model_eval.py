"""One evaluation of a model, as `unlearn eval` runs it once its options are checked: the lm-eval
tasks (with Forget Quality and Model Utility), with ``mia`` membership inference (the attacks
lm-eval cannot express computed on the loaded model first), with ``robustness`` the forget
metrics after every attack and under the probes; the references it saves; its files in
lm_eval's layout. The command (:mod:`unlearn_plugins.commands.eval`) parses and checks the
options and prints :func:`report`; the studies' and the demo's robustness stage
(:func:`.really_forgotten.measure`) calls :func:`evaluate` directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..options import attributes
from .config import EvaluationConfig


@dataclass
class Request:
    """One evaluation: the options (:class:`.config.EvaluationConfig`) and what they resolve to
    (every task to run, with the MIA and robustness tasks; the attacks and their options)."""

    config: EvaluationConfig
    #: the lm-eval tasks to run (``config.tasks`` and those ``mia`` and ``robustness`` need)
    tasks: list[str]
    #: the attacks ``robustness`` runs, and their options ({attack: {key: value}})
    attacks: list[str] = field(default_factory=list)
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Outcome:
    request: Request
    evaluation: Any  # lm_eval_runner's Evaluation (summary, samples, results)
    paths: dict
    failed: bool = False  # an attack of ``robustness`` failed (its error is in the summary)
    reference_task: str | None = None  # the task whose truth ratios ``save_reference`` holds


def evaluate(req: Request) -> Outcome:
    """Run ``req`` (holding the lock on its ``out`` folder throughout) and write its files."""
    from . import lm_eval_runner as runner
    from . import membership, robustness

    tasks, cfg = list(req.tasks), req.config
    # the options every lm-eval run of this evaluation shares (the attacked models' too)
    common = cfg.runner_options(
        runner.evaluate_model, given=("model", "tasks", "adapter", "forget_split", "save_reference")
    )
    metadata = {"holdout_split": cfg.holdout_split, "mia_reference": cfg.mia_reference}
    failed = False
    task = None
    with runner.lock_out(cfg.out):  # the whole evaluation: a second one on --out is refused at once
        loaded = direct = None
        if cfg.mia:  # the model is needed twice: for the attacks lm-eval cannot express, then by lm-eval
            from ..models import load_model_of

            runner.task_manager_for(tasks)  # bad input fails before the model loads
            if cfg.save_reference:  # its truth-ratio task too, as without --mia
                from ..models import resolve_model

                runner.prepare_for_model(
                    resolve_model(cfg.model),
                    tasks,
                    metadata=metadata,
                    save_reference=True,
                    **cfg.runner_options(runner.prepare_for_model, given=("tasks", "save_reference")),
                )
            membership.check_before_loading(
                cfg.forget_split, cfg.holdout_split, tofu_dir=cfg.tofu_dir, limit=cfg.limit, reference=cfg.mia_reference
            )
            loaded = load_model_of(cfg)
            direct = membership.direct_attacks(
                *loaded,
                forget_split=cfg.forget_split,
                holdout_split=cfg.holdout_split,
                tofu_dir=cfg.tofu_dir,
                limit=cfg.limit,
                system_prompt=cfg.system_prompt,
                batch_size=cfg.batch_size,
            )
        evaluation = runner.evaluate_model(
            cfg.model,
            tasks,
            adapter=cfg.adapter,
            retain_references=cfg.retain_reference,
            forget_split=cfg.forget_split,
            metadata=metadata,
            loaded=loaded,
            save_reference=bool(cfg.save_reference),
            **common,
        )
        loaded = None
        summary = membership.mia_summary(evaluation.summary["metrics"], direct, reference_path=cfg.mia_reference)
        if summary is not None:
            evaluation.summary["mia"] = summary
        if cfg.save_reference:
            task = runner.save_reference(evaluation, cfg.save_reference, model=cfg.model, adapter=cfg.adapter)
            evaluation.summary["saved_reference"] = {"path": cfg.save_reference, "task": task}
        if cfg.save_mia_reference:
            membership.save_mia_reference(
                cfg.save_mia_reference,
                evaluation.samples,
                evaluation.summary["metrics"],
                direct,
                model=cfg.model,
                adapter=cfg.adapter,
            )
            evaluation.summary["saved_mia_reference"] = {"path": cfg.save_mia_reference}
        if cfg.robustness:

            def evaluate_attacked(model_dir: str, split: str):
                return runner.evaluate_model(model_dir, list(robustness.PLAIN_TASKS), forget_split=split, **common)

            attacked = robustness.run_attacks(
                Path(cfg.out),
                req.attacks,
                req.attack_options,
                evaluate=evaluate_attacked,
                **attributes(
                    cfg, "model adapter forget_split tofu_dir device dtype trust_remote_code allow_other_base"
                ),
                keep_models=cfg.keep_attacked_models,
                write=runner.write_outputs,
            )
            failed = any(isinstance(r, str) for r in attacked.values())
            evaluation.summary["robustness"] = robustness.robustness_summary(evaluation, attacked)
        paths = runner.write_outputs(cfg.out, evaluation)
    return Outcome(req, evaluation, paths, failed, task)


def report(outcome: Outcome) -> str:
    """What `unlearn eval` prints: lm-eval's tables and ours, then where the files went."""
    from . import lm_eval_runner as runner
    from . import membership, robustness

    cfg, evaluation = outcome.request.config, outcome.evaluation
    lines = [runner.format_tables(evaluation)]
    if evaluation.summary.get("mia"):
        lines.append(membership.mia_table(evaluation.summary["mia"]))
    if evaluation.summary.get("robustness"):
        lines.append(robustness.robustness_table(evaluation.summary["robustness"]))
    if cfg.save_reference:
        lines.append(f"retain reference ({outcome.reference_task}) -> {cfg.save_reference}")
    if cfg.save_mia_reference:
        lines.append(f"MIA reference -> {cfg.save_mia_reference}")
    lines.append(f"results -> {outcome.paths['results']} (samples beside it)")
    return "\n".join(lines)


__all__ = ["EvaluationConfig", "Request", "Outcome", "evaluate", "report"]
