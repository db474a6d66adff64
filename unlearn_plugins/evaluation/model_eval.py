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


@dataclass
class Request:
    """What to evaluate and how (the fields of `unlearn eval`'s options of the same names)."""

    model: str
    tasks: list[str]
    out: str
    adapter: str | None = None
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    allow_other_base: bool = False
    batch_size: int = 8
    limit: int | float | None = None
    num_fewshot: int | None = None
    max_gen_toks: int | None = None
    use_cache: str | None = None
    scoring: str = "prefix"  # lm_eval_runner.SCORINGS
    tofu_dir: str | None = None
    forget_split: str | None = None
    mmlu_dir: str | None = None
    wmdp_dir: str | None = None
    system_prompt: str | None = None
    retain_reference: list[str] = field(default_factory=list)
    save_reference: str | None = None
    mia: bool = False
    holdout_split: str | None = None
    mia_reference: str | None = None
    save_mia_reference: str | None = None
    robustness: bool = False
    #: the attacks ``robustness`` runs, and their options ({attack: {key: value}})
    attacks: list[str] = field(default_factory=list)
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    keep_attacked_models: bool = False


@dataclass
class Outcome:
    request: Request
    evaluation: Any  # lm_eval_runner's Evaluation (summary, samples, results)
    paths: dict
    failed: bool = False  # an attack of ``robustness`` failed (its error is in the summary)
    reference_task: str | None = None  # the task whose truth ratios ``save_reference`` holds


def evaluate(req: Request) -> Outcome:
    """Run ``req`` (holding the lock on ``req.out`` throughout) and write its files."""
    from . import lm_eval_runner as runner
    from . import membership, robustness

    tasks = list(req.tasks)
    common = dict(
        device=req.device,
        dtype=req.dtype,
        trust_remote_code=req.trust_remote_code,
        batch_size=req.batch_size,
        limit=req.limit,
        num_fewshot=req.num_fewshot,
        tofu_dir=req.tofu_dir,
        mmlu_dir=req.mmlu_dir,
        wmdp_dir=req.wmdp_dir,
        system_prompt=req.system_prompt,
        max_gen_toks=req.max_gen_toks,
        allow_other_base=req.allow_other_base,
        use_cache=req.use_cache,
        scoring=req.scoring,
    )
    metadata = {"holdout_split": req.holdout_split, "mia_reference": req.mia_reference}
    failed = False
    task = None
    with runner.lock_out(req.out):  # the whole evaluation: a second one on --out is refused at once
        loaded = direct = None
        if req.mia:  # the model is needed twice: for the attacks lm-eval cannot express, then by lm-eval
            from ..models import load_model

            runner.task_manager_for(tasks)  # bad input fails before the model loads
            if req.save_reference:  # its truth-ratio task too, as without --mia
                from ..models import resolve_model

                runner.prepare_for_model(
                    resolve_model(req.model),
                    tasks,
                    metadata=metadata,
                    trust_remote_code=req.trust_remote_code,
                    tofu_dir=req.tofu_dir,
                    forget_split=req.forget_split,
                    mmlu_dir=req.mmlu_dir,
                    wmdp_dir=req.wmdp_dir,
                    system_prompt=req.system_prompt,
                    limit=req.limit,
                    save_reference=True,
                )
            membership.check_before_loading(
                req.forget_split, req.holdout_split, tofu_dir=req.tofu_dir, limit=req.limit, reference=req.mia_reference
            )
            loaded = load_model(
                req.model,
                device=req.device,
                dtype=req.dtype,
                trust_remote_code=req.trust_remote_code,
                adapter=req.adapter,
                allow_other_base=req.allow_other_base,
            )
            direct = membership.direct_attacks(
                *loaded,
                forget_split=req.forget_split,
                holdout_split=req.holdout_split,
                tofu_dir=req.tofu_dir,
                limit=req.limit,
                system_prompt=req.system_prompt,
                batch_size=req.batch_size,
            )
        evaluation = runner.evaluate_model(
            req.model,
            tasks,
            adapter=req.adapter,
            retain_references=req.retain_reference,
            forget_split=req.forget_split,
            metadata=metadata,
            loaded=loaded,
            save_reference=bool(req.save_reference),
            **common,
        )
        loaded = None
        summary = membership.mia_summary(evaluation.summary["metrics"], direct, reference_path=req.mia_reference)
        if summary is not None:
            evaluation.summary["mia"] = summary
        if req.save_reference:
            task = runner.save_reference(evaluation, req.save_reference, model=req.model, adapter=req.adapter)
            evaluation.summary["saved_reference"] = {"path": req.save_reference, "task": task}
        if req.save_mia_reference:
            membership.save_mia_reference(
                req.save_mia_reference,
                evaluation.samples,
                evaluation.summary["metrics"],
                direct,
                model=req.model,
                adapter=req.adapter,
            )
            evaluation.summary["saved_mia_reference"] = {"path": req.save_mia_reference}
        if req.robustness:

            def evaluate_attacked(model_dir: str, split: str):
                return runner.evaluate_model(model_dir, list(robustness.PLAIN_TASKS), forget_split=split, **common)

            attacked = robustness.run_attacks(
                Path(req.out),
                req.attacks,
                req.attack_options,
                evaluate=evaluate_attacked,
                model=req.model,
                adapter=req.adapter,
                forget_split=req.forget_split,
                tofu_dir=req.tofu_dir,
                device=req.device,
                dtype=req.dtype,
                trust_remote_code=req.trust_remote_code,
                allow_other_base=req.allow_other_base,
                keep_models=req.keep_attacked_models,
                write=runner.write_outputs,
            )
            failed = any(isinstance(r, str) for r in attacked.values())
            evaluation.summary["robustness"] = robustness.robustness_summary(evaluation, attacked)
        paths = runner.write_outputs(req.out, evaluation)
    return Outcome(req, evaluation, paths, failed, task)


def report(outcome: Outcome) -> str:
    """What `unlearn eval` prints: lm-eval's tables and ours, then where the files went."""
    from . import lm_eval_runner as runner
    from . import membership, robustness

    req, evaluation = outcome.request, outcome.evaluation
    lines = [runner.format_tables(evaluation)]
    if evaluation.summary.get("mia"):
        lines.append(membership.mia_table(evaluation.summary["mia"]))
    if evaluation.summary.get("robustness"):
        lines.append(robustness.robustness_table(evaluation.summary["robustness"]))
    if req.save_reference:
        lines.append(f"retain reference ({outcome.reference_task}) -> {req.save_reference}")
    if req.save_mia_reference:
        lines.append(f"MIA reference -> {req.save_mia_reference}")
    lines.append(f"results -> {outcome.paths['results']} (samples beside it)")
    return "\n".join(lines)


__all__ = ["Request", "Outcome", "evaluate", "report"]
