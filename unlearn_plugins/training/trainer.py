"""The transformers Trainer, with the loss delegated to an unlearning objective.

Everything else - checkpoints, resume, gradient accumulation, mixed precision, logging,
accelerate/DeepSpeed/FSDP - is the Trainer's. Additions: a frozen reference model when the
objective needs one, a stop on a non-finite loss (before the optimizer step, so the
checkpoints on disk stay good), the epoch passed to a dataset that redraws per epoch, and a
progress bar that shows the loss instead of printing a line per log.
"""

from __future__ import annotations

import math
import re
import shutil

import torch
from transformers import Trainer
from transformers.trainer_callback import ProgressCallback, TrainerCallback

from ..errors import UnlearnError
from .objective import TrainingStep, check_loss_value, own_training_step


class NonFiniteLossError(UnlearnError):
    """The training loss became NaN or infinite."""

    def __init__(self, step: int, value: float, terms: dict[str, float]):
        self.step, self.value, self.terms = step, value, terms
        detail = ", ".join(f"{k}={v:.4g}" for k, v in terms.items())
        super().__init__(f"loss is {value} at optimizer step {step}" + (f" ({detail})" if detail else ""))


def _write_errors() -> tuple[type[BaseException], ...]:
    """What saving weights raises when a file cannot be written: OSError, safetensors' own
    error, and torch.save's RuntimeError (``unexpected pos``) for a full disk."""
    errors: tuple[type[BaseException], ...] = (OSError, RuntimeError)
    try:
        from safetensors import SafetensorError

        errors += (SafetensorError,)
    except ImportError:  # pragma: no cover
        pass
    return errors


WRITE_ERRORS = _write_errors()


def write_reason(exc: BaseException, folder) -> str:
    """Why a file in ``folder`` could not be written, on one line (torch.save's zip writer says
    only ``unexpected pos``: a disk with next to no space left is named as full)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split())
    text = re.sub(r" \(os error \d+\)$", "", text.removeprefix("Error while serializing: ").removeprefix("I/O error: "))
    if isinstance(exc, RuntimeError):
        try:
            full = shutil.disk_usage(folder).free < 1 << 20
        except OSError:
            full = False
        if full:
            return "No space left on device"
    return text or type(exc).__name__


class CheckpointWriteError(UnlearnError):
    """A checkpoint could not be written (a full disk); the message names its folder."""

    def __init__(self, step: int, folder, reason: str):
        self.step = step
        super().__init__(f"cannot write the checkpoint {folder}: {reason}")


class LossBar(ProgressCallback):
    """Trainer's tqdm bar, with the latest loss as a postfix rather than a printed line per log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs and "loss" in logs:
            self.training_bar.set_postfix(loss=f"{logs['loss']:.4g}", refresh=False)


class EpochToDataset(TrainerCallback):
    """Tells the training dataset which epoch starts (``dataset.set_epoch``), for data drawn
    afresh each epoch (retain partners, IdkDPO refusals).

    accelerate's dataloader forwards its epoch to the dataset only in some set-ups (not when
    its sampler takes the epoch, nor in the batch-skipping dataloader of a resumed epoch), so
    the epoch comes from the Trainer's state: ``state.epoch`` is ``epoch + done/steps``,
    restored from the checkpoint on resume, so its integer part is the epoch about to run.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.set_epoch(int(state.epoch or 0))


class UnlearningTrainer(Trainer):
    """``compute_loss`` = ``objective.loss(model, batch, reference_model)``.

    The objective returns a per-batch mean, so the Trainer divides it by the number of
    accumulation steps (``loss_is_scaled_for_ga = False``).
    """

    loss_is_scaled_for_ga = False

    def __init__(self, *args, objective, reference_model=None, trajectory=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.objective = objective
        self.trajectory = trajectory  # a training.trajectory.TrajectoryRecorder (--record-trajectory)
        self.own_step = own_training_step(objective)  # refuses regularizers on such an objective, before training
        self.reference_model = reference_model
        if isinstance(reference_model, torch.nn.Module):  # a frozen copy (a LoRA run's shares the weights)
            reference_model.to(self.args.device)
            reference_model.eval()
            reference_model.requires_grad_(False)
        if self.args.disable_tqdm is False:
            self.remove_callback(ProgressCallback)
            self.add_callback(LossBar)
        if hasattr(self.train_dataset, "set_epoch"):
            if self.args.dataloader_num_workers > 0 and self.args.dataloader_persistent_workers:
                raise UnlearnError(
                    "dataloader_persistent_workers: the workers' copies of the dataset would not "
                    "see the epoch (retain partners are drawn per epoch); turn it off"
                )
            self.add_callback(EpochToDataset(self.train_dataset))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = self.objective.loss(model, inputs, reference_model=self.reference_model)
        return (loss, None) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        from .trajectory import INDEX_KEY

        indices = inputs.pop(INDEX_KEY, None) if isinstance(inputs, dict) else None
        if indices is not None and self.trajectory is not None:
            self.trajectory.micro_batch(indices)
        own = self.own_step
        if own is None:
            loss = super().training_step(model, inputs, num_items_in_batch)
        else:  # the objective runs its own backward(s) (GRU's gradient rectification, PDU's dual step)
            model.train()
            if callable(getattr(self.optimizer, "train", None)):
                self.optimizer.train()
            inputs = self._prepare_inputs(inputs)
            steps = self.args.gradient_accumulation_steps
            step = TrainingStep(
                epoch=float(self.state.epoch or 0.0),
                global_step=self.state.global_step,
                accumulation_steps=steps,
                last_micro_batch=bool(self.accelerator.sync_gradients),
                backward=lambda value: self.accelerator.backward(value / steps),
            )
            with self.compute_loss_context_manager():
                value = own(model, inputs, self.reference_model, step)
            loss = check_loss_value(value, "objective", needs_grad=False).detach() / steps
        self._stop_if_not_finite(loss)
        return loss

    def _stop_if_not_finite(self, loss) -> None:
        """Raise before the optimizer step when any process saw a NaN/inf loss (one flag per step)."""
        finite = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
        if self.args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        if finite.item() < 1:
            terms = {k: float(v) for k, v in (getattr(self.objective, "last_terms", None) or {}).items()}
            value = float(loss.detach())
            raise NonFiniteLossError(
                self.state.global_step + 1, value if not math.isfinite(value) else float("nan"), terms
            )

    def log(self, logs, start_time=None):
        if "loss" in logs:
            for name, value in (getattr(self.objective, "last_terms", None) or {}).items():
                logs[f"loss_{name}"] = float(value)
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        # Never write a checkpoint with non-finite weights: it would replace a good one.
        for name, param in self.model.named_parameters():
            if param.requires_grad and not torch.isfinite(param.detach()).all():
                raise NonFiniteLossError(self.state.global_step, float("nan"), {f"weights of {name}": float("nan")})
        try:
            super()._save_checkpoint(model, trial)
        except WRITE_ERRORS as exc:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = f"{self.args.output_dir}/{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            if self.is_world_process_zero():  # not left half-written
                shutil.rmtree(folder, ignore_errors=True)
            raise CheckpointWriteError(self.state.global_step, folder, write_reason(exc, self.args.output_dir)) from exc
