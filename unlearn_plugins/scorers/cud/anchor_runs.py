"""CUD's anchor runs: unlearn the anchor pool with each (objective, seed) and return every
sample's answer loss after unlearning. :class:`AnchorRunner` is the interface; the default,
:class:`TrainerAnchorRunner`, calls :func:`unlearn_plugins.training.run.run_unlearning` for the
whole budget, as the paper's runs do (optionally stopped at the first check where the pool's
mean answer probability falls below ``stop_prob``, :func:`forget_prob_watch`: a deviation).
:data:`PAPER_ANCHOR_RUNS` holds each objective's settings in the CUD code."""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol, Sequence

from ...errors import UnlearnError
from ...interfaces import QASample

#: The CUD code's anchor runs (chengjiali/Explain-Sample-Unlearnability,
#: ``open-unlearning/scripts/compute_sample_difficulty.sh`` and ``tofu_unlearn.sh``): the per-sample
#: losses come from open-unlearning's full-parameter TOFU forget10 checkpoints named there
#: (``..._GradDiff_lr1e-05_alpha5_epoch10``, ``..._NPO_lr1e-05_beta0.5_alpha1_epoch10``,
#: ``..._SimNPO_lr5e-05_b3.5_a1_d1_g0.25_ep5``, ``..._RMU_lr2e-05_layer10_scoeff100_epoch5``,
#: ``..._UNDIAL_lr0.0001_beta10_alpha2_epoch10``), trained for their whole budget.
PAPER_ANCHOR_RUNS: dict[str, dict[str, Any]] = {
    "grad_diff": {"lr": 1e-5, "epochs": 10.0, "objective_options": {"alpha": 5.0}},
    "npo": {"lr": 1e-5, "epochs": 10.0, "objective_options": {"beta": 0.5, "alpha": 1.0}},
    "simnpo": {
        "lr": 5e-5,
        "epochs": 5.0,
        "objective_options": {"beta": 3.5, "alpha": 1.0, "delta": 1.0, "gamma": 0.25},
    },
    "rmu": {"lr": 2e-5, "epochs": 5.0, "objective_options": {"layer": 10, "steering_coeff": 100.0}},
    "undial": {"lr": 1e-4, "epochs": 10.0, "objective_options": {"beta": 10.0, "alpha": 2.0}},
}
#: the schedule of those runs (``tofu_unlearn.sh``: batch 4 x 8; open-unlearning's TOFU unlearning
#: experiment: one warmup epoch, weight decay 0.01, transformers' default linear decay), all weights
PAPER_ANCHOR_SCHEDULE: dict[str, Any] = {
    "full_finetune": True,
    "batch_size": 4,
    "grad_accum": 8,
    "weight_decay": 0.01,
    "lr_scheduler": "linear",
    "warmup_epochs": 1.0,
}
#: ``anchor_recipe``: ``paper`` (the settings above under the caller's options) or ``none``
ANCHOR_RECIPES = ("paper", "none")


def anchor_run_options(
    objective: str,
    *,
    recipe: str = "paper",
    shared: dict | None = None,
    by_objective: dict | None = None,
    base: dict | None = None,
) -> dict[str, Any]:
    """The UnlearnConfig options of ``objective``'s anchor runs, lowest precedence first: ``base``
    (e.g. the pool's tofu_dir), the recipe's settings (the paper's five objectives only), the
    ``shared`` options of every run, ``by_objective[objective]``. ``objective_options`` merge key by key."""
    layers = [dict(base or {})]
    if recipe == "paper" and objective in PAPER_ANCHOR_RUNS:
        layers.append({**PAPER_ANCHOR_SCHEDULE, **PAPER_ANCHOR_RUNS[objective]})
    layers += [dict(shared or {}), dict((by_objective or {}).get(objective) or {})]
    out: dict[str, Any] = {}
    objective_options: dict[str, Any] = {}
    for layer in layers:
        objective_options.update(layer.pop("objective_options", None) or {})
        out.update(layer)
    if objective_options:
        out["objective_options"] = objective_options
    return out


class AnchorRunner(Protocol):
    """Runs one unlearning method on the samples and returns each sample's mean answer NLL
    after unlearning (same order). Optional: ``describe()`` (a dict, part of the cache key),
    ``last_info`` (a dict about the last run, recorded in the metadata) and
    ``reference_losses(samples, *, model, tokenizer)`` (the losses before unlearning)."""

    def losses(
        self, samples: Sequence[QASample], *, model: Any, tokenizer: Any, objective: str, seed: int
    ) -> list[float]: ...


def _mean_prob(losses: Sequence[float]) -> float:
    """TOFU's forget probability of a set: the mean of exp(-mean answer NLL) per sample."""
    return sum(math.exp(-x) for x in losses) / max(len(losses), 1)


def forget_prob_watch(
    encoded: Sequence[dict],
    pad_token_id: int,
    *,
    every: int | None,
    stop_prob: float | None,
    batch_size: int = 8,
    trace: bool = False,
):
    """A Trainer callback: before training and every ``every`` optimizer steps (None: before
    training only), the mean answer probability of ``encoded`` under the model being trained;
    stops training at the first check below ``stop_prob`` (None: never). ``checks`` lists (step,
    forget_prob[, per-sample losses])."""
    from transformers import TrainerCallback

    from ...likelihood import mean_answer_nlls_in_training

    class ForgetProbWatch(TrainerCallback):
        def __init__(self):
            self.checks: list[dict] = []
            self.stopped_at: int | None = None

        def check(self, args, state, model) -> float:
            losses = mean_answer_nlls_in_training(model, args, encoded, pad_token_id, batch_size=batch_size)
            entry = {"step": state.global_step, "forget_prob": _mean_prob(losses)}
            if trace:
                entry["losses"] = losses
            self.checks.append(entry)
            return entry["forget_prob"]

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.check(args, state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if every and self.stopped_at is None and state.global_step % every == 0:
                prob = self.check(args, state, model)
                if stop_prob is not None and prob < stop_prob:
                    self.stopped_at = state.global_step
                    control.should_training_stop = True
            return control

    return ForgetProbWatch()


class TrainerAnchorRunner:
    """Anchor runs with :func:`unlearn_plugins.training.run.run_unlearning`.

    ``model_spec``: what to unlearn (default: the scored model's ``name_or_path``);
    ``options``: UnlearnConfig fields (lr, epochs, max_steps, retain, lora_r, full_finetune,
    objective_options, ...): the run's budget; ``stop_prob``: stop at the first check where the
    mean answer probability of the unlearned samples is below it (None, the default: run the
    whole budget, as the paper does); ``check_steps``: optimizer steps between checks (default:
    about 4 per epoch); ``trace``: check that often also without a stop and keep every check's
    per-sample losses in ``last_info`` (for budget studies). Every run measures the pool's probability
    before training too (``forget_prob_before``: did the objective move its pool?).
    """

    def __init__(
        self,
        model_spec: str | None = None,
        options: dict | None = None,
        batch_size: int = 8,
        stop_prob: float | None = None,
        check_steps: int | None = None,
        trace: bool = False,
    ):
        if stop_prob is not None and not 0 < float(stop_prob) < 1:
            raise UnlearnError(f"CUD anchor runs: stop_prob={stop_prob} must be between 0 and 1 (or none)")
        if check_steps is not None and int(check_steps) < 1:
            raise UnlearnError(f"CUD anchor runs: check_steps={check_steps} must be >= 1")
        self.model_spec = model_spec
        self.options = dict(options or {})
        self.batch_size = batch_size
        self.stop_prob = None if stop_prob is None else float(stop_prob)
        self.check_steps = None if check_steps is None else int(check_steps)
        self.trace = bool(trace)
        self.last_info: dict | None = None

    def describe(self) -> dict:
        return {
            "runner": "run_unlearning",
            "model_spec": self.model_spec,
            "options": self.options,
            "stop_prob": self.stop_prob,
            "check_steps": self.check_steps,
            "trace": self.trace,
        }

    def max_length(self) -> int:
        from ...training.config import UnlearnConfig

        return int(self.options.get("max_length", UnlearnConfig.max_length))

    def reference_losses(self, samples, *, model, tokenizer) -> list[float]:
        """Per-sample answer NLL before unlearning, encoded as the runs encode them."""
        from ...data.qa import encode_samples
        from ...likelihood import answer_nll

        encoded = encode_samples(tokenizer, samples, max_length=self.max_length())
        return [
            s / max(n, 1) for s, n in answer_nll(model, encoded, tokenizer.pad_token_id, batch_size=self.batch_size)
        ]

    def losses(self, samples, *, model, tokenizer, objective, seed):
        from ...sharding import launched_processes

        spec = self.model_spec or getattr(getattr(model, "config", None), "_name_or_path", None)
        if not spec:
            raise UnlearnError("CUD anchor runs need the model's folder or hub id: pass the scorer option model_spec")
        device = next(model.parameters()).device
        gpu = (device.index or 0) if device.type == "cuda" else None
        if launched_processes() > 1 or gpu:  # in a launcher's group, or on a GPU other than the first
            return self.losses_in_child(samples, spec=spec, gpu=gpu, objective=objective, seed=seed)
        # the Trainer takes "cuda" (its first visible GPU), not "cuda:0"
        return self.losses_here(
            samples, spec=spec, device=device.type, tokenizer=tokenizer, objective=objective, seed=seed
        )

    def check_every(self, n_samples: int, config) -> int:
        """Steps between checks: ``check_steps``, else about 4 checks per epoch."""
        if self.check_steps:
            return self.check_steps
        per_epoch = math.ceil(n_samples / (config.batch_size * config.grad_accum))
        return max(1, math.ceil(per_epoch / 4))

    def losses_here(self, samples, *, spec: str, device: str, tokenizer, objective: str, seed: int) -> list[float]:
        """One run in this process (which must not be one of several launched ones: the Trainer
        would join their group)."""
        import torch

        from ...data.qa import encode_samples
        from ...files import write_jsonl
        from ...likelihood import answer_nll
        from ...models import load_model
        from ...process import release_memory
        from ...training.config import UnlearnConfig
        from ...training.run import run_unlearning

        with tempfile.TemporaryDirectory(prefix="cud-anchor-") as tmp:
            forget = Path(tmp) / "forget.json"
            write_jsonl(forget, [s.to_record() for s in samples])
            config = UnlearnConfig(
                out=str(Path(tmp) / "run"),
                model=spec,
                forget=str(forget),
                objective=objective,
                seed=seed,
                device=device,
                **self.options,
            )
            encoded = encode_samples(tokenizer, samples, max_length=config.max_length)
            checking = self.stop_prob is not None or self.trace
            watch = forget_prob_watch(
                encoded,
                tokenizer.pad_token_id,
                every=self.check_every(len(samples), config) if checking else None,
                stop_prob=self.stop_prob,
                batch_size=self.batch_size,
                trace=self.trace,
            )
            result = run_unlearning(config, callbacks=[watch])
            # the trained model is gone: hand its memory back before loading the unlearned one
            # (an anchor run alone peaked at 2.84 GB without this, 2.43 GB with it)
            release_memory()
            if config.full_finetune:
                unlearned, _ = load_model(str(result.out), device=device)
            else:
                unlearned, _ = load_model(spec, device=device, adapter=str(result.out))
            stats = answer_nll(unlearned, encoded, tokenizer.pad_token_id, batch_size=self.batch_size)
            del unlearned
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        losses = [s / max(n, 1) for s, n in stats]
        self.last_info = {
            "steps": result.record.get("steps"),
            "stopped_at_step": watch.stopped_at,
            "forget_prob_before": watch.checks[0]["forget_prob"] if watch.checks else None,
            "forget_prob": _mean_prob(losses),
            "checks": watch.checks if checking else [],
        }
        return losses

    def losses_in_child(self, samples, *, spec: str, gpu: int | None, objective: str, seed: int) -> list[float]:
        """One run in a fresh single-process Python (:mod:`unlearn_plugins.scorers.cud.anchor_job`):
        under ``accelerate launch`` each process does its own anchor runs, and an in-process
        Trainer would join the launcher's group (DDP across unrelated runs). ``gpu``: this
        process's CUDA index, made the child's only visible GPU."""
        import subprocess

        from ...files import write_json
        from ...sharding import single_process_env

        env = single_process_env()
        if gpu is not None:
            import torch

            from ...process import gpu_for

            env["CUDA_VISIBLE_DEVICES"] = gpu_for(gpu, torch.cuda.device_count())
        with tempfile.TemporaryDirectory(prefix="cud-anchor-job-") as tmp:
            job, out = Path(tmp) / "job.json", Path(tmp) / "losses.json"
            write_json(
                job,
                {
                    "model_spec": spec,
                    "options": self.options,
                    "batch_size": self.batch_size,
                    "stop_prob": self.stop_prob,
                    "check_steps": self.check_steps,
                    "trace": self.trace,
                    "device": "cpu" if gpu is None else "cuda",
                    "objective": objective,
                    "seed": seed,
                    "samples": [s.to_record() for s in samples],
                },
            )
            done = subprocess.run(
                [sys.executable, "-m", "unlearn_plugins.scorers.cud.anchor_job", str(job), str(out)],
                env=env,
                check=False,
            )
            if done.returncode != 0 or not out.is_file():
                raise UnlearnError(
                    f"CUD anchor run {objective}/seed {seed} failed in its child process "
                    f"(exit code {done.returncode}; its output is above)"
                )
            result = json.loads(out.read_text())
            self.last_info = result.get("info")
            return result["losses"]
