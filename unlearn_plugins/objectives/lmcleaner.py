"""LMCleaner, batch level (open-unlearning ``src/trainer/unlearn/lmcleaner_core.py`` and
``lmcleaner_batch.py``): remove the forget samples' influence by replaying the target's recorded
fine-tuning trajectory (``unlearn finetune --record-trajectory``, :mod:`..training.trajectory`).

For each optimizer step ``tz`` of the target's fine-tuning whose batches held a forget sample:

* ``v = -u[tz]`` (the update of that step, ``u[t] = theta[t+1] - theta[t]``);
* for ``s = tz+1 .. min(tz+K, tau-1)``: ``v <- v - lr[s] * H[s] v``, then (damping > 0)
  ``v <- v - lr[s] * damping * v``; ``H[s] v`` is the Hessian-vector product of step ``s``'s
  loss (mean answer-token NLL over all the examples of its micro-batches) at the historical
  weights ``theta[s] = theta[tau] - sum_{t=s}^{tau-1} u[t]`` (``use_historical_params``; else at
  ``theta[tau]``); ``hessian_mode="ggn"`` differentiates ``<grad, v>`` once more (the reference's
  ``hvp_ggn``, an exact HVP), ``"fisher"`` uses ``g (g . v)``;
* the corrections are summed and added once (``apply_mode="sum_then_apply"``, the reference
  config's) or added one after the other, each computed from the weights the previous one left
  (``"sequential"``, the reference code's loop).

``tau`` is the number of recorded steps, so ``theta[tau]`` is the target's final weights. The
correction is computed once, in ``prepare``, before training starts; the run then trains only if
``alpha > 0`` (``alpha * NLL(retain)``, the reference's optional retain fine-tuning; its config
trains 0 epochs): with ``alpha = 0`` no gradient is ever set, so the optimizer steps change nothing.

Needs ``--full-finetune``: the correction changes every weight the target's fine-tuning trained
(for a LoRA target, ``s (B' A' - B A)`` of each adapted layer of the merged model), which an
adapter of the unlearning run could not hold.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any, Sequence

from ..errors import UnlearnError
from ..options import attributes, options_repr
from .base import check_option, mean_nll

HESSIAN_MODES = ("ggn", "fisher")
APPLY_MODES = ("sum_then_apply", "sequential")
_LORA_NAME = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])\.([^.]+)\.weight$")


class LMCleaner:
    """Batch-level LMCleaner: a truncated influence-propagation correction of the target."""

    name = "lmcleaner"
    regularizer = False
    needs_reference_model = False

    def __init__(
        self,
        *,
        trajectory: Annotated[
            str | None,
            "the target's trajectory folder (default: next to the model: MODEL/trajectory, or ../trajectory for MODEL=.../merged)",
        ] = None,
        K: Annotated[int, "truncation window: steps the influence is propagated through"] = 800,
        hessian_mode: Annotated[
            str, "'ggn' (second-order autograd, the reference config's) or 'fisher' (g g^T v)"
        ] = "ggn",
        damping: Annotated[float, "lambda: v <- v - lr * lambda * v after each step"] = 1e-4,
        apply_mode: Annotated[
            str, "'sum_then_apply' (reference config) or 'sequential' (reference code's loop)"
        ] = "sum_then_apply",
        use_historical_params: Annotated[
            bool, "HVP at theta[s] rebuilt from the updates (else at the final weights)"
        ] = True,
        alpha: Annotated[float, "weight of NLL(retain) trained after the correction (0: correction only)"] = 0.0,
    ):
        check_option(self.name, "K", K, isinstance(K, int) and not isinstance(K, bool) and K >= 0, "an integer >= 0")
        check_option(self.name, "hessian_mode", hessian_mode, hessian_mode in HESSIAN_MODES, "'ggn' or 'fisher'")
        check_option(self.name, "damping", damping, damping >= 0, "a number >= 0")
        check_option(self.name, "apply_mode", apply_mode, apply_mode in APPLY_MODES, "'sum_then_apply' or 'sequential'")
        check_option(self.name, "alpha", alpha, alpha >= 0, "a number >= 0")
        self.trajectory = trajectory
        self.K = int(K)
        self.hessian_mode = hessian_mode
        self.damping = float(damping)
        self.apply_mode = apply_mode
        self.use_historical_params = bool(use_historical_params)
        self.alpha = float(alpha)
        self.last_terms: dict[str, Any] = {}

    @property
    def needs_retain_data(self) -> bool:
        return self.alpha > 0

    def retain_data_reason(self) -> str:
        return f"trains NLL(retain) after the correction (alpha={self.alpha}; --objective-option alpha=0 drops it)"

    # ------------------------------------------------------------------ training after the correction

    def loss(self, model, batch, reference_model=None):
        """``alpha * NLL(retain)`` (0 times NLL(forget) when alpha = 0: a loss with a gradient
        for the run's first-batch check; training goes through :meth:`training_step`)."""
        if self.alpha > 0:
            return self.alpha * mean_nll(model, batch["retain"])
        return 0.0 * mean_nll(model, batch["forget"])

    def training_step(self, model, batch, reference_model, step):
        import torch

        if self.alpha <= 0:  # correction only: no forward, no gradient, the weights stay as corrected
            return torch.zeros((), device=batch["forget"]["input_ids"].device)
        retain = self.alpha * mean_nll(model, batch["retain"])
        step.backward(retain)
        self.last_terms = {"retain": retain.detach()}
        return retain

    # ------------------------------------------------------------------ the correction

    def prepare(self, context):
        from ..training.trajectory import Trajectory, find_trajectory

        model = context.model
        if _is_peft(model):
            raise UnlearnError(
                "objective 'lmcleaner' needs --full-finetune: its correction changes every weight the "
                "target's fine-tuning trained, which a LoRA adapter of this run cannot hold"
            )
        folder = Path(self.trajectory).expanduser() if self.trajectory else find_trajectory(context.model_path)
        if folder is None:
            raise UnlearnError(
                f"objective 'lmcleaner': no recorded trajectory next to the model {context.model_path} "
                f"(MODEL/trajectory, or MODEL/../trajectory for a merged LoRA target); fine-tune the target with "
                f"`unlearn finetune --record-trajectory`, or give --objective-option trajectory=PATH"
            )
        trajectory = Trajectory(folder)
        forget = forget_indices(trajectory, context.forget_samples, context.forget)
        if not forget:
            raise UnlearnError(
                f"objective 'lmcleaner': none of the {len(context.forget)} forget samples is among the "
                f"{len(trajectory.examples)} training examples of {folder} (matched by question and answer, "
                f"then by token ids): was the target fine-tuned on them, with the same prompt format?"
            )
        steps = forget_steps(trajectory, forget)
        started = time.time()
        space = trajectory_space(model, trajectory)
        try:
            audit = correct(
                space,
                trajectory,
                steps,
                K=self.K,
                hessian_mode=self.hessian_mode,
                damping=self.damping,
                apply_mode=self.apply_mode,
                use_historical_params=self.use_historical_params,
                pad_token_id=_pad_id(context.tokenizer),
            )
        finally:
            space.close()
        context.info["lmcleaner"] = {
            "trajectory": str(folder),
            "lora_trajectory": trajectory.lora,
            "recorded_steps": trajectory.steps,
            "forget_examples_found": len(forget),
            "forget_samples": len(context.forget),
            "forget_steps": steps,
            "hvp_calls": audit["hvp_calls"],
            "fused": audit["fused"],
            "v_norms": audit["v_norms"],
            "seconds": round(time.time() - started, 3),
        }
        return None

    def options(self) -> dict[str, Any]:
        return attributes(self, "trajectory K hessian_mode damping apply_mode use_historical_params alpha")

    def __repr__(self) -> str:
        return options_repr(self, hidden=("trajectory",))


# ----------------------------------------------------------------------------- matching


def forget_indices(trajectory, forget_samples: Sequence[Any], forget_encoded: Sequence[dict]) -> set[int]:
    """The trajectory's training examples that are forget samples: by key (question and answer),
    else by token ids (the same encoding)."""
    from ..training.trajectory import example_key

    keys = {example_key(s) for s in forget_samples if hasattr(s, "question")}
    ids = {tuple(e["input_ids"]) for e in forget_encoded}
    return {
        i for i, e in enumerate(trajectory.examples) if e.get("key") in keys or tuple(e.get("input_ids", ())) in ids
    }


def forget_steps(trajectory, forget: set[int]) -> list[int]:
    """The optimizer steps whose micro-batches held a forget example (batch-level LMCleaner
    removes those whole steps' updates)."""
    return [t for t in range(trajectory.steps) if any(i in forget for b in trajectory.batches(t) for i in b)]


# ----------------------------------------------------------------------------- parameter spaces


class _Space:
    """The trajectory's parameters as leaf tensors of the model (``tensors``, in trajectory
    order), settable, and the loss of a list of encoded examples through the model."""

    names: list[str]
    tensors: list[Any]

    def __init__(self, model):
        self.model = model
        self._training = model.training
        self._grads = {name: p.requires_grad for name, p in model.named_parameters()}
        model.eval()  # the reference computes HVPs without dropout changes; no dropout in eval

    def get(self) -> list[Any]:
        return [t.detach().clone() for t in self.tensors]

    def set(self, values: Sequence[Any]) -> None:
        import torch

        with torch.no_grad():
            for t, v in zip(self.tensors, values):
                t.copy_(v)

    def loss(self, examples: Sequence[dict], micro_batches: Sequence[Sequence[int]], pad_token_id: int):
        """Yield each micro-batch's summed answer-token NLL divided by the answer tokens of the
        whole step: their sum is the step's mean answer-token NLL (one collated batch's loss)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from ..data.qa import pad_batch
        from ..likelihood import token_nll

        device = next(self.model.parameters()).device
        total = sum(sum(1 for x in examples[i]["labels"][1:] if x != -100) for b in micro_batches for i in b)
        for b in micro_batches:
            part = {k: v.to(device) for k, v in pad_batch([examples[i] for i in b], pad_token_id).items()}
            with sdpa_kernel(SDPBackend.MATH):  # double backward through attention (as the reference)
                logits = self.model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
            nll, _ = token_nll(logits, part["labels"])
            yield nll.sum() / max(total, 1)

    def close(self) -> None:
        for name, p in self.model.named_parameters():
            p.requires_grad_(self._grads.get(name, p.requires_grad))
        self.model.train(self._training)


class FullSpace(_Space):
    """A full fine-tuning trajectory: the model's own parameters, by name."""

    def __init__(self, model, trajectory):
        super().__init__(model)
        params = dict(model.named_parameters())
        missing = [n for n in trajectory.parameters if n not in params]
        if missing:
            raise UnlearnError(
                f"objective 'lmcleaner': the model has no parameter {missing[0]!r} of the trajectory "
                f"{trajectory.folder} ({len(missing)} missing): not the model it was recorded on"
            )
        for name, shape in trajectory.parameters.items():
            if list(params[name].shape) != list(shape):
                raise UnlearnError(
                    f"objective 'lmcleaner': parameter {name!r} has shape {list(params[name].shape)}, the "
                    f"trajectory's {shape}: not the model it was recorded on"
                )
        for p in model.parameters():
            p.requires_grad_(False)
        self.names = list(trajectory.parameters)
        self.tensors = [params[n] for n in self.names]
        for t in self.tensors:
            t.requires_grad_(True)
        final = trajectory.final()
        worst = max(
            float((t.detach().float().cpu() - final[n].float()).abs().max()) for n, t in zip(self.names, self.tensors)
        )
        if worst > 1e-3:
            raise UnlearnError(
                f"objective 'lmcleaner': the model's weights differ from the trajectory's final weights "
                f"(max |diff| {worst:.3g}): --model is not the target {trajectory.folder} was recorded with"
            )

    def write(self) -> None:  # the parameters are the model's: nothing more to do
        return None


class LoraSpace(_Space):
    """A LoRA trajectory on a merged target: fresh A, B leaves added to each adapted linear layer
    by a forward hook (``y + s * B A x``) on the base weights ``W - s * B_final A_final``."""

    def __init__(self, model, trajectory):
        import torch

        super().__init__(model)
        config = trajectory.adapter_config()
        if config.get("rank_pattern") or config.get("alpha_pattern") or config.get("use_dora"):
            raise UnlearnError(
                f"objective 'lmcleaner': {trajectory.folder}/adapter_config.json uses rank/alpha patterns or "
                f"DoRA, which this correction does not model"
            )
        r, lora_alpha = int(config["r"]), float(config["lora_alpha"])
        self.scale = lora_alpha / (r**0.5) if config.get("use_rslora") else lora_alpha / r
        final = trajectory.final()
        for p in model.parameters():
            p.requires_grad_(False)
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        self.names = list(trajectory.parameters)
        self.tensors = []
        self.layers: dict[str, dict[str, Any]] = {}
        for name in self.names:
            match = _LORA_NAME.match(name)
            if not match:
                raise UnlearnError(f"objective 'lmcleaner': trajectory parameter {name!r} is not a LoRA A/B weight")
            path, which = match.group(1), match.group(2)
            try:
                module = model.get_submodule(path)
            except AttributeError:
                raise UnlearnError(
                    f"objective 'lmcleaner': the model has no layer {path!r} of the trajectory {trajectory.folder}"
                ) from None
            if not isinstance(module, torch.nn.Linear):
                raise UnlearnError(f"objective 'lmcleaner': LoRA layer {path!r} is not a linear layer")
            leaf = final[name].to(device=device, dtype=dtype).clone().requires_grad_(True)
            self.tensors.append(leaf)
            layer = self.layers.setdefault(path, {"module": module, "names": {}})
            layer[which], layer["names"][which] = leaf, name
        incomplete = [p for p, layer in self.layers.items() if set(layer["names"]) != {"A", "B"}]
        if incomplete:
            raise UnlearnError(
                f"objective 'lmcleaner': LoRA layer {incomplete[0]!r} lacks its A or B in the trajectory"
            )
        self.final = {p: (final[layer["names"]["A"]], final[layer["names"]["B"]]) for p, layer in self.layers.items()}
        self._hooks = []
        with torch.no_grad():  # W_base = W_merged - s * B_final A_final
            for path, (a, b) in self.final.items():
                w = self.layers[path]["module"].weight
                w.sub_((self.scale * (b.double() @ a.double())).to(w.dtype))
        for layer in self.layers.values():
            self._hooks.append(layer["module"].register_forward_hook(self._hook(layer)))

    def _hook(self, layer):
        import torch.nn.functional as F

        def hook(module, inputs, output):
            return output + self.scale * F.linear(F.linear(inputs[0], layer["A"]), layer["B"])

        return hook

    def write(self) -> None:
        """W = W_base + s * B A of the corrected A, B (the hooks removed)."""
        import torch

        for h in self._hooks:
            h.remove()
        self._hooks = []
        with torch.no_grad():
            for layer in self.layers.values():
                w = layer["module"].weight
                w.add_((self.scale * (layer["B"].detach().double() @ layer["A"].detach().double())).to(w.dtype))

    def close(self) -> None:
        if self._hooks:  # failed before write(): put the target's weights back
            import torch

            for h in self._hooks:
                h.remove()
            self._hooks = []
            with torch.no_grad():
                for path, (a, b) in self.final.items():
                    w = self.layers[path]["module"].weight
                    w.add_((self.scale * (b.double() @ a.double())).to(w.dtype))
        super().close()


def trajectory_space(model, trajectory) -> _Space:
    return LoraSpace(model, trajectory) if trajectory.lora else FullSpace(model, trajectory)


# ----------------------------------------------------------------------------- the algorithm


def hvp(space: _Space, examples, micro_batches, v: Sequence[Any], mode: str, pad_token_id: int) -> list[Any]:
    """``H v`` of one step's loss at the space's current weights: ``grad <grad L, v>`` ("ggn",
    the reference's ``hvp_ggn``) or ``g (g . v)`` ("fisher", its ``hvp_fisher``)."""
    import torch

    params = space.tensors
    with torch.enable_grad():
        if mode == "fisher":
            g = [torch.zeros_like(p) for p in params]
            for loss in space.loss(examples, micro_batches, pad_token_id):
                for acc, part in zip(g, torch.autograd.grad(loss, params, allow_unused=True)):
                    if part is not None:
                        acc.add_(part)
            dot = sum((gi * vi).sum() for gi, vi in zip(g, v))
            return [gi * dot for gi in g]
        out = [torch.zeros_like(p) for p in params]
        for loss in space.loss(examples, micro_batches, pad_token_id):
            grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            pairs = [(gi, vi) for gi, vi in zip(grads, v) if gi is not None]
            gv = sum((gi * vi).sum() for gi, vi in pairs)
            hv = torch.autograd.grad(gv, params, allow_unused=True)
            for acc, part in zip(out, hv):
                if part is not None:
                    acc.add_(part.detach())
        return out


def correct(
    space: _Space,
    trajectory,
    steps: Sequence[int],
    *,
    K: int,
    hessian_mode: str,
    damping: float,
    apply_mode: str,
    use_historical_params: bool,
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """Apply LMCleaner's correction for the forget ``steps`` to ``space`` (then ``space.write()``);
    returns the audit (HVP calls, the norm of each step's correction)."""
    import torch

    tau = trajectory.steps
    examples = trajectory.examples
    dtype, device = space.tensors[0].dtype, space.tensors[0].device

    def update(t: int) -> list[Any]:
        u = trajectory.update(t)
        return [u[n].to(device=device, dtype=dtype) for n in space.names]

    theta = space.get()
    if apply_mode == "sum_then_apply" and steps and all(tz + K >= tau - 1 for tz in steps):
        return _correct_fused(
            space, trajectory, steps, update, theta, hessian_mode, damping, use_historical_params, pad_token_id
        )
    total: list[Any] | None = None
    calls, norms = 0, []
    for tz in steps:
        v = [-u for u in update(tz)]
        start, end = tz + 1, min(tz + K, tau - 1)
        historical = use_historical_params and end >= start
        if historical:
            current = _rewound(space, theta, update, start, tau)
        for s in range(start, end + 1):
            v = _step_map(space, examples, trajectory, s, v, hessian_mode, damping, pad_token_id)
            calls += 1
            if historical:
                for c, u in zip(current, update(s)):
                    c.add_(u)
                space.set(current)
        space.set(theta)
        norms.append(float(torch.sqrt(sum((vi.double() ** 2).sum() for vi in v))))
        if apply_mode == "sequential":
            theta = [t + vi for t, vi in zip(theta, v)]
            space.set(theta)
        else:
            total = v if total is None else [a + b for a, b in zip(total, v)]
    if total is not None:
        space.set([t + vi for t, vi in zip(theta, total)])
    space.write()
    return {"hvp_calls": calls, "v_norms": norms, "fused": False}


def _rewound(space, theta, update, start: int, tau: int) -> list[Any]:
    """``theta[start] = theta[tau] - sum_{t=start}^{tau-1} u[t]``, set in ``space`` and returned
    (the historical parameters, advanced step by step by the caller)."""
    current = [t.clone() for t in theta]
    for t in range(start, tau):
        for c, u in zip(current, update(t)):
            c.sub_(u)
    space.set(current)
    return current


def _step_map(space, examples, trajectory, s: int, v, hessian_mode, damping, pad_token_id) -> list[Any]:
    """``A_s v = v - lr_s H_s v - lr_s damping v``, H_s at the parameters ``space`` holds."""
    hv = hvp(space, examples, trajectory.batches(s), v, hessian_mode, pad_token_id)
    lr = trajectory.lr(s)
    v = [vi - lr * hi for vi, hi in zip(v, hv)]
    if damping > 0:
        v = [vi - lr * damping * vi for vi in v]
    return v


def _correct_fused(space, trajectory, steps, update, theta, hessian_mode, damping, historical, pad_token_id):
    """The summed correction when no window is truncated (``K >= tau-1-tz`` for every forget
    step): every ``v`` goes through the same maps ``A_s v = v - lr_s H_s v - lr_s damping v`` at
    the same ``theta[s]`` (``sum_then_apply`` computes each from ``theta[tau]``), and they are
    linear, so their sum is propagated once (Horner: ``w <- A_s w``, then ``w -= u[s]`` when step
    ``s`` held a forget sample): ``tau-1-tz_first`` products instead of one run per forget step.
    The same sum, up to float rounding (tests/test_lmcleaner.py checks it against the reference)."""
    import torch

    tau = trajectory.steps
    examples = trajectory.examples
    forget = set(steps)
    first = min(steps)
    w = [-u for u in update(first)]
    start = first + 1
    if historical and start <= tau - 1:
        current = _rewound(space, theta, update, start, tau)
    calls = 0
    for s in range(start, tau):
        w = _step_map(space, examples, trajectory, s, w, hessian_mode, damping, pad_token_id)
        calls += 1
        u_s = update(s)
        if historical:
            for c, u in zip(current, u_s):
                c.add_(u)
            space.set(current)
        if s in forget:
            w = [wi - u for wi, u in zip(w, u_s)]
    space.set([t + wi for t, wi in zip(theta, w)])
    space.write()
    norm = float(torch.sqrt(sum((wi.double() ** 2).sum() for wi in w)))
    return {"hvp_calls": calls, "v_norms": [norm], "fused": True}


def _pad_id(tokenizer) -> int:
    """Any id in the vocabulary: padding sits after each example (right padding), outside the
    attention mask and the answer labels, so it changes no loss."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return int(pad or 0)


def _is_peft(model) -> bool:
    from peft import PeftModel

    return isinstance(getattr(model, "module", model), PeftModel)
