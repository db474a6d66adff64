"""E2URec (Wang et al., 2024): unlearning an LLM recommender with two teachers.

Reference: justarter/E2URec, ``unlearning_e2urec.py`` and ``utils.py`` (``compute_forced_kl``,
``compute_kl``, ``get_answer_loss``). Per answer token, with z_o the original (reference)
model's logits, z_a the *augmented* model's (the original fine-tuned further on the forget
data) and p_theta the model being trained:

* forgetting teacher: q = softmax(z_o - alpha * relu(z_a - z_o)) - the logits the forget data
  pushed up are pushed down by as much (alpha = 1);
* forget term: CE(q, p_theta) = -sum_v q_v log p_theta,v;
* retain term: NLL(retain answers) + CE(softmax(z_o), p_theta) on retain answers;
* loss = weight * retain + (1 - weight) * forget (weight = 0.5); during the first
  ``forget_epochs`` epochs (1) the loss is the forget term alone.

Deviations (docs/methods.md): the cross-entropies average over answer tokens only (the
reference, a T5 decoder, averages over every target position, padding included);
log-probabilities come from log_softmax instead of log(p + 1e-12); the augmented model is a
LoRA fine-tune (the reference fine-tunes every weight), trained in :meth:`E2URec.prepare`
unless one is given (``augmented_model`` / ``augmented_adapter``).
"""

from __future__ import annotations

import copy
import math
from typing import Annotated, Any

from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.objectives.base import (
    ObjectiveContext,
    check_option,
    forward,
    masked_mean,
    reference_outputs,
    shifted,
    token_nll,
)
from unlearn_plugins.options import options_repr


def forced_teacher_logits(original, augmented, alpha: float):
    """z_o - alpha * relu(z_a - z_o): the original's logits less what the forget data added."""
    import torch.nn.functional as F

    return original - alpha * F.relu(augmented - original)


def answer_cross_entropy(logits, teacher_logits, labels):
    """Mean over answer tokens of CE(softmax(teacher), softmax(logits)) (next-token positions)."""
    import torch.nn.functional as F

    cur, _, mask = shifted(logits, labels)
    teacher = teacher_logits[:, :-1, :][mask].float()
    ce = -(F.softmax(teacher, dim=-1) * F.log_softmax(cur, dim=-1)).sum(-1)
    return ce.sum() / max(ce.numel(), 1)


class E2URec:
    """``e2urec``: distil a forgetting teacher on the forget data, the original model (and the
    answers) on the retain data. Options: ``alpha`` (teacher strength, 1.0), ``weight`` (retain
    share, 0.5), ``forget_epochs`` (forget-only epochs first, 1); the augmented teacher: a model
    (``augmented_model``: a folder, hub id or alias) or a LoRA adapter on the unlearned model's
    base (``augmented_adapter``), else trained in :meth:`prepare` on the forget data
    (``teacher_epochs`` 1.5, ``teacher_lr`` 1e-4, ``teacher_batch_size`` 16, LoRA ``teacher_lora_r`` 16)."""

    name = "e2urec"
    regularizer = False
    needs_reference_model = True

    def __init__(
        self,
        *,
        alpha: Annotated[float, "forgetting-teacher strength: logits z_o - alpha * relu(z_a - z_o)"] = 1.0,
        weight: Annotated[float, "share of the retain term: weight * retain + (1 - weight) * forget"] = 0.5,
        forget_epochs: Annotated[int, "first epochs with the forget term alone"] = 1,
        augmented_model: Annotated[
            str | None,
            "the augmented teacher: a model folder, hub id or alias (None: trained on the forget data in prepare)",
        ] = None,
        augmented_adapter: Annotated[
            str | None, "the augmented teacher: a LoRA adapter on the unlearned model's base"
        ] = None,
        teacher_epochs: Annotated[float, "epochs of the augmented teacher's fine-tune"] = 1.5,
        teacher_lr: Annotated[float, "learning rate of the augmented teacher's fine-tune"] = 1e-4,
        teacher_batch_size: Annotated[int, "batch size of the augmented teacher's fine-tune"] = 16,
        teacher_lora_r: Annotated[int, "LoRA rank of the augmented teacher's fine-tune"] = 16,
    ):
        check_option(
            self.name,
            "alpha",
            alpha,
            isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0,
            "a number >= 0",
        )
        check_option(
            self.name, "weight", weight, isinstance(weight, (int, float)) and 0 <= weight <= 1, "a number in [0, 1]"
        )
        check_option(
            self.name,
            "forget_epochs",
            forget_epochs,
            isinstance(forget_epochs, int) and not isinstance(forget_epochs, bool) and forget_epochs >= 0,
            "an integer >= 0",
        )
        check_option(
            self.name,
            "teacher_epochs",
            teacher_epochs,
            isinstance(teacher_epochs, (int, float)) and teacher_epochs > 0,
            "a number > 0",
        )
        check_option(
            self.name, "teacher_lr", teacher_lr, isinstance(teacher_lr, (int, float)) and teacher_lr > 0, "a number > 0"
        )
        for option, value in (("teacher_batch_size", teacher_batch_size), ("teacher_lora_r", teacher_lora_r)):
            check_option(
                self.name,
                option,
                value,
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                "an integer >= 1",
            )
        if augmented_model is not None and augmented_adapter is not None:
            raise UnlearnError("objective 'e2urec': give option 'augmented_model' or 'augmented_adapter', not both")
        self.alpha, self.weight, self.forget_epochs = float(alpha), float(weight), int(forget_epochs)
        self.augmented_model, self.augmented_adapter = augmented_model, augmented_adapter
        self.teacher_epochs, self.teacher_lr = float(teacher_epochs), float(teacher_lr)
        self.teacher_batch_size, self.teacher_lora_r = int(teacher_batch_size), int(teacher_lora_r)
        self.augmented = None  # the frozen augmented model, set by prepare()
        self.epoch = 0
        self.last_terms: dict[str, Any] = {}

    @property
    def needs_retain_data(self) -> bool:
        return self.weight > 0

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and k not in ("augmented", "last_terms")}

    def __repr__(self) -> str:
        return options_repr(self, hidden=("epoch",))

    # ------------------------------------------------------------------ the augmented teacher
    def prepare(self, context: ObjectiveContext) -> dict[str, Any]:
        """Load or train the augmented model; returns the epoch view that tells the objective
        which phase it is in (the trainer calls ``set_epoch`` on every view)."""
        device = next(context.model.parameters()).device
        if self.augmented_model is not None:
            from unlearn_plugins.models import load_model

            model, _ = load_model(self.augmented_model, device=device.type)
            how = {"model": self.augmented_model}
        else:
            model = _plain_copy(context.model)
            if self.augmented_adapter is not None:
                from unlearn_plugins.models import load_adapter

                model = load_adapter(model, self.augmented_adapter).merge_and_unload()
                how = {"adapter": self.augmented_adapter}
            else:
                model, how = self._train_augmented(model, context), {"trained": self.teacher_options()}
        model.to(device).eval().requires_grad_(False)
        self.augmented = model
        context.info["e2urec_augmented"] = how
        return {"e2urec_epoch": EpochView(self, len(context.forget))}

    def teacher_options(self) -> dict[str, Any]:
        return {key: getattr(self, f"teacher_{key}") for key in ("epochs", "lr", "batch_size", "lora_r")}

    def _train_augmented(self, model, context: ObjectiveContext):
        """The original fine-tuned on the forget answers (LoRA, plain NLL) with the transformers
        Trainer, then merged: finetune_aug.py of the reference, on an adapter."""
        import tempfile

        from transformers import PrinterCallback

        from unlearn_plugins.data.qa import PaddingCollator
        from unlearn_plugins.objectives.gradient import NLL
        from unlearn_plugins.training.config import FinetuneConfig
        from unlearn_plugins.training.lora import build_lora_model
        from unlearn_plugins.training.run import training_arguments
        from unlearn_plugins.training.trainer import UnlearningTrainer

        if not context.forget:
            raise UnlearnError("objective 'e2urec': no forget examples to train the augmented teacher on")
        device = next(model.parameters()).device
        lora = build_lora_model(
            model, r=self.teacher_lora_r, alpha=2.0 * self.teacher_lora_r, dropout=0.0, target_modules=None
        )
        with tempfile.TemporaryDirectory(prefix="e2urec-teacher-") as tmp:
            config = FinetuneConfig(
                out=tmp,
                device=device.type,
                lr=self.teacher_lr,
                epochs=self.teacher_epochs,
                batch_size=self.teacher_batch_size,
                grad_accum=1,
                seed=context.seed,
                save_steps=0,
                lr_scheduler="constant",
            )
            args = training_arguments(config, train_size=len(context.forget))
            args.disable_tqdm = True
            trainer = UnlearningTrainer(
                model=lora,
                args=args,
                train_dataset=list(context.forget),
                data_collator=PaddingCollator(context.tokenizer.pad_token_id),
                objective=NLL(),
            )
            trainer.remove_callback(PrinterCallback)  # no progress bar and no log dicts on stdout for this inner run
            trainer.train()
        return lora.merge_and_unload()

    # ------------------------------------------------------------------ the loss
    def forget_term(self, model, part, reference_model):
        import torch

        if self.augmented is None:
            raise UnlearnError("objective 'e2urec': no augmented teacher (call prepare() before training)")
        logits = forward(model, part).logits
        original = reference_outputs(reference_model, part).logits.float()
        with torch.no_grad():
            augmented = forward(self.augmented, part).logits.float()
        teacher = forced_teacher_logits(original, augmented, self.alpha)
        return answer_cross_entropy(logits, teacher, part["labels"])

    def retain_term(self, model, part, reference_model):
        logits = forward(model, part).logits
        original = reference_outputs(reference_model, part).logits
        nll, mask = token_nll(logits, part["labels"])
        return masked_mean(nll, mask) + answer_cross_entropy(logits, original, part["labels"])

    def loss(self, model, batch, reference_model=None):
        forget = self.forget_term(model, batch["forget"], reference_model)
        terms = {"forget": forget.detach()}
        if self.epoch < self.forget_epochs or self.weight == 0:
            total = forget
        else:
            if batch.get("retain") is None:
                raise UnlearnError(
                    f"objective 'e2urec' has a retain term (weight={self.weight}) but the batch has no "
                    f"retain data: give --retain, or set its weight to 0"
                )
            retain = self.retain_term(model, batch["retain"], reference_model)
            total = self.weight * retain + (1.0 - self.weight) * forget
            terms["retain"] = retain.detach()
        self.last_terms = terms
        return total


class EpochView:
    """A per-forget-example view whose only job is ``set_epoch``: the trainer tells every view
    the epoch that starts, and E2URec's first ``forget_epochs`` epochs are forget-only. Its
    items are empty encodings (one ignored padding token)."""

    def __init__(self, objective: E2URec, n: int):
        self.objective, self.n = objective, n

    def set_epoch(self, epoch: int) -> None:
        self.objective.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        from unlearn_plugins.data.qa import IGNORE_INDEX

        return {"input_ids": [0], "attention_mask": [0], "labels": [IGNORE_INDEX]}


def _plain_copy(model):
    """A frozen copy of the model with any adapter folded in (same function as ``model``)."""
    clone = copy.deepcopy(model)
    if hasattr(clone, "merge_and_unload"):
        clone = clone.merge_and_unload()
    return clone


__all__ = ["E2URec", "EpochView", "forced_teacher_logits", "answer_cross_entropy"]
