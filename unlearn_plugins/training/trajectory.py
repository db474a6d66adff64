"""The training trajectory `unlearn finetune --record-trajectory` writes, and its reader
(LMCleaner, :mod:`unlearn_plugins.objectives.lmcleaner`, replays it).

Layout, in ``OUT/trajectory/`` (format ``unlearn-trajectory/1``)::

    trajectory.json     {"format", "steps": N, "lora": bool, "update": "...", "parameters":
                         {name: shape}, "bytes_per_step": int, "records": [{"step": t, "lr": float,
                         "batches": [[dataset index, ...] per micro-batch]}, ...]}; written last
    steps/000000.safetensors ...   u[t] = theta[t+1] - theta[t] of every trainable parameter, the
                         update of optimizer step t (float32; its metadata repeats step, lr, batches)
    examples.jsonl      one line per training example, in dataset order: {"key", "input_ids",
                         "attention_mask", "labels"}; ``key`` = sha256(question + NUL + answer),
                         first 32 hex digits (:func:`example_key`)
    final.safetensors   theta[N], the trainable parameters at the end
    adapter_config.json the LoRA adapter's config (LoRA runs only)

The parameter names are the trained model's own (``base_model.model....lora_A.default.weight``
under LoRA). ``lr`` is the learning rate the optimizer stepped with. ``bytes_per_step`` is the
size of one step file's tensors (4 bytes per trainable parameter).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Sequence

from ..errors import UnlearnError

FORMAT = "unlearn-trajectory/1"
FOLDER = "trajectory"
UPDATE = "steps/NNNNNN.safetensors: theta[t+1] - theta[t], the update of optimizer step t"
INDEX_KEY = "example_index"  # the collated batch's dataset indices (removed before the loss)


class TrajectoryError(UnlearnError):
    """A recorded trajectory that is missing, of another format or incomplete."""


def example_key(sample: Any) -> str:
    """The key of a training example: sha256 of ``question + "\\0" + answer`` (first 32 hex
    digits); an example without a question and answer is keyed by its token ids."""
    question, answer = getattr(sample, "question", None), getattr(sample, "answer", None)
    if isinstance(question, str) and isinstance(answer, str):
        text = f"{question}\x00{answer}"
    else:
        text = json.dumps(list(sample["input_ids"]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def step_file(folder: Path, step: int) -> Path:
    return Path(folder) / "steps" / f"{step:06d}.safetensors"


class IndexedCollator:
    """The run's collator, plus each example's dataset index (``example_index``, a list) so the
    trainer can tell the recorder which examples each micro-batch held."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, examples):
        batch = self.collator([{k: v for k, v in e.items() if k != "index"} for e in examples])
        batch[INDEX_KEY] = [int(e["index"]) for e in examples]
        return batch


class IndexedExamples:
    """Encoded examples, each with its ``index`` (what :class:`IndexedCollator` passes on)."""

    def __init__(self, examples: Sequence[dict]):
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return {**self.examples[i], "index": i}


def _trainable(model) -> list[tuple[str, Any]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def _callback_base():
    from transformers.trainer_callback import TrainerCallback

    return TrainerCallback


class TrajectoryRecorder(_callback_base()):
    """A Trainer callback writing the trajectory of the run into ``folder`` (main process only).

    ``micro_batch(indices)`` is called by the trainer for each micro-batch; at each optimizer
    step (``on_optimizer_step``, after ``optimizer.step()`` and before the scheduler moves the
    lr) the update of every trainable parameter since the previous step is written.
    """

    def __init__(self, folder, samples: Sequence[Any], encoded: Sequence[dict]):
        self.folder = Path(folder)
        self.samples, self.encoded = samples, encoded
        self.records: list[dict[str, Any]] = []
        self._pending: list[list[int]] = []
        self._previous: dict[str, Any] = {}
        self._model = None

    def micro_batch(self, indices: Sequence[int]) -> None:
        self._pending.append([int(i) for i in indices])

    def start(self, model) -> None:
        """Write the examples (and the adapter config) and keep theta[0]."""
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)
        (self.folder / "steps").mkdir(parents=True)
        with open(self.folder / "examples.jsonl", "w", encoding="utf-8") as f:
            for sample, e in zip(self.samples, self.encoded):
                row = {"key": example_key(sample), **{k: list(e[k]) for k in ("input_ids", "attention_mask", "labels")}}
                f.write(json.dumps(row) + "\n")
        self._model = model
        peft_config = getattr(model, "peft_config", None)
        if peft_config:
            config = next(iter(peft_config.values()))
            config.save_pretrained(str(self.folder))
        self._previous = {name: p.detach().to("cpu", dtype=_f32(), copy=True) for name, p in _trainable(model)}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._model is None:
            self.start(model)

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        from safetensors.torch import save_file

        step = len(self.records)
        lr = float(optimizer.param_groups[0]["lr"]) if optimizer is not None else float("nan")
        current = {name: p.detach().to("cpu", dtype=_f32(), copy=True) for name, p in _trainable(self._model)}
        update = {name: (current[name] - self._previous[name]).contiguous() for name in current}
        record = {"step": step, "lr": lr, "batches": self._pending}
        save_file(
            update,
            str(step_file(self.folder, step)),
            metadata={"step": str(step), "lr": str(lr), "batches": json.dumps(self._pending)},
        )
        self.records.append(record)
        self._previous, self._pending = current, []

    def on_train_end(self, args, state, control, **kwargs):
        self.finish()

    def finish(self) -> None:
        from safetensors.torch import save_file

        if self._model is None:
            return
        save_file({k: v.contiguous() for k, v in self._previous.items()}, str(self.folder / "final.safetensors"))
        shapes = {name: list(t.shape) for name, t in self._previous.items()}
        meta = {
            "format": FORMAT,
            "steps": len(self.records),
            "lora": bool(getattr(self._model, "peft_config", None)),
            "update": UPDATE,
            "parameters": shapes,
            "bytes_per_step": 4 * sum(math.prod(s) for s in shapes.values()),
            "records": self.records,
        }
        (self.folder / "trajectory.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        self._model = None


def _f32():
    import torch

    return torch.float32


# ----------------------------------------------------------------------------- reading


class Trajectory:
    """A recorded trajectory, read lazily: ``update(t)`` loads u[t] from its file."""

    def __init__(self, folder):
        self.folder = Path(folder)
        path = self.folder / "trajectory.json"
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TrajectoryError(f"{path}: no recorded trajectory (trajectory.json is missing)") from None
        except (OSError, ValueError) as exc:
            raise TrajectoryError(f"{path}: cannot read the trajectory: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise TrajectoryError(f"{path}: format {got!r}, expected {FORMAT!r}")
        self.meta = meta
        try:
            self.steps = int(meta["steps"])
            self.lora = bool(meta["lora"])
            self.parameters: dict[str, list[int]] = dict(meta["parameters"])
            self.records = sorted(meta["records"], key=lambda r: r["step"])
            for r in self.records:
                float(r["lr"]), [[int(i) for i in b] for b in r["batches"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise TrajectoryError(f"{path}: malformed ({type(exc).__name__}: {exc})") from None
        if [r["step"] for r in self.records] != list(range(self.steps)):
            raise TrajectoryError(f"{path}: records do not cover steps 0..{self.steps - 1}")
        for t in range(self.steps):
            if not step_file(self.folder, t).is_file():
                raise TrajectoryError(f"{step_file(self.folder, t)}: missing (the trajectory is incomplete)")
        self._examples: list[dict] | None = None

    @property
    def examples(self) -> list[dict]:
        if self._examples is None:
            path = self.folder / "examples.jsonl"
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
                self._examples = [json.loads(line) for line in lines if line.strip()]
            except (OSError, ValueError) as exc:
                raise TrajectoryError(f"{path}: cannot read the training examples: {exc}") from None
            top = max((i for r in self.records for b in r["batches"] for i in b), default=-1)
            if top >= len(self._examples) or not all(isinstance(e, dict) and "input_ids" in e for e in self._examples):
                raise TrajectoryError(
                    f"{path}: {len(self._examples)} examples, but the steps' batches name example {top}"
                    if top >= len(self._examples)
                    else f"{path}: an example without input_ids"
                )
        return self._examples

    def lr(self, t: int) -> float:
        return float(self.records[t]["lr"])

    def batches(self, t: int) -> list[list[int]]:
        return [list(b) for b in self.records[t]["batches"]]

    def update(self, t: int) -> dict[str, Any]:
        from safetensors.torch import load_file

        path = step_file(self.folder, t)
        try:
            tensors = load_file(str(path))
        except Exception as exc:  # a truncated or garbled file: safetensors' own error
            raise TrajectoryError(f"{path}: cannot read: {exc}") from None
        missing = [n for n in self.parameters if n not in tensors]
        if missing:
            raise TrajectoryError(f"{path}: no update of {missing[0]!r} ({len(missing)} parameters missing)")
        return tensors

    def final(self) -> dict[str, Any]:
        from safetensors.torch import load_file

        path = self.folder / "final.safetensors"
        if not path.is_file():
            raise TrajectoryError(f"{path}: missing (the trajectory is incomplete)")
        try:
            return load_file(str(path))
        except Exception as exc:  # a truncated or garbled file: safetensors' own error
            raise TrajectoryError(f"{path}: cannot read: {exc}") from None

    def adapter_config(self) -> dict[str, Any]:
        path = self.folder / "adapter_config.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TrajectoryError(f"{path}: a LoRA trajectory needs its adapter config: {exc}") from None


def find_trajectory(model_path: str | None) -> Path | None:
    """The trajectory next to a fine-tuned target: ``X/run/merged`` (a merged LoRA target) ->
    ``X/run/trajectory``; ``X/run`` (a full fine-tune) -> ``X/run/trajectory``; None if neither."""
    if not model_path:
        return None
    path = Path(model_path)
    for candidate in (path / FOLDER, path.parent / FOLDER if path.name == "merged" else None):
        if candidate is not None and (candidate / "trajectory.json").is_file():
            return candidate
    return None


__all__ = [
    "FORMAT",
    "FOLDER",
    "INDEX_KEY",
    "IndexedCollator",
    "IndexedExamples",
    "Trajectory",
    "TrajectoryError",
    "TrajectoryRecorder",
    "example_key",
    "find_trajectory",
    "step_file",
]
