"""The output folder of `unlearn run` / `unlearn finetune` (``config.out``): its layout, the
checks of --resume / --overwrite against what is already there, and what run.json records.

Layout::

    adapter_config.json, adapter_model.safetensors   the LoRA adapter (standard PEFT format)
      or config.json, model.safetensors              the model, with full_finetune
    tokenizer files
    merged/                                          base + adapter folded in (merge = true)
    trajectory/                                      per-step updates (finetune --record-trajectory)
    run.json                                         config, versions, seed, steps, losses, wall time
    checkpoints/                                     Trainer checkpoints while running (removed at
                                                     the end unless keep_checkpoints), run_config.json

A run killed while saving leaves a checkpoint that is incomplete: --resume continues from the
newest intact one (:func:`last_complete_checkpoint`) and removes the newer ones.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .config import ConfigError, TrainingConfig

if TYPE_CHECKING:
    from .objective import Initializer

CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run_config.json"
RUN_JSON = "run.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / CHECKPOINTS


def checkpoint_problem(path: Path, step: int) -> str | None:
    """Why a checkpoint cannot be resumed from (None: it can): trainer_state.json (written
    last by the Trainer) missing, truncated or of another step, or a weight, optimizer,
    scheduler or RNG file that is truncated or garbled."""
    from ..errors import ModelError
    from ..models import check_safetensors

    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return "trainer_state.json is missing or truncated"
    if not isinstance(state, dict) or state.get("global_step") != step:
        return "trainer_state.json is of another step"
    for file in sorted(path.rglob("*")):
        if not file.is_file():
            continue
        if file.suffix == ".safetensors":
            try:
                check_safetensors(file, "checkpoint")
            except (ModelError, OSError):
                return f"{file.relative_to(path)} is truncated or corrupted"
        elif file.suffix in (".pt", ".pth", ".bin"):  # torch.save's zip format
            try:
                with zipfile.ZipFile(file) as archive:
                    archive.infolist()
            except (OSError, zipfile.BadZipFile, ValueError):
                return f"{file.relative_to(path)} is truncated or corrupted"
    return None


def last_complete_checkpoint(folder: str | Path, *, report: bool = False) -> Path | None:
    """The newest checkpoint that :func:`checkpoint_problem` finds intact.

    A run killed while saving leaves a checkpoint without trainer_state.json, or with a
    truncated file: that one is skipped (``report``: with a notice on stderr saying why).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = []
    for path in folder.iterdir():
        match = _CHECKPOINT_RE.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    for step, path in sorted(found, reverse=True):
        problem = checkpoint_problem(path, step)
        if problem is None:
            return path
        if report:
            print(f"notice: skipping {path}: {problem}", file=sys.stderr, flush=True)
    return None


def saved_config(out: str | Path) -> dict[str, Any] | None:
    """The config an interrupted run in ``out`` was started with (None if there is none)."""
    path = checkpoint_dir(out) / RUN_CONFIG
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())["config"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{path}: unreadable saved run config ({exc})") from None


def check_output(config: TrainingConfig, *, report: bool = False) -> Path | None:
    """Check the output folder against resume/overwrite (writes nothing); return the
    checkpoint to resume from."""
    out = Path(config.out)
    ckpt_dir = checkpoint_dir(out)
    run_json = out / RUN_JSON
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    holds_run = ckpt_dir.exists() or run_json.exists()
    if config.resume:
        if run_json.exists():
            try:
                status = json.loads(run_json.read_text()).get("status")
            except (OSError, ValueError):
                status = None
            if status == "completed":
                raise ConfigError(f"--resume: {out} holds a completed run (run.json); nothing to resume")
        saved = saved_config(out)
        if saved is not None:
            current = config.to_dict()
            changed = [
                f"{key} ({saved.get(key)!r} -> {current.get(key)!r})"
                for key in sorted(set(saved) | set(current))
                if key not in TrainingConfig.RESUME_MAY_CHANGE and saved.get(key) != current.get(key)
            ]
            if changed:
                raise ConfigError(f"--resume: options differ from the interrupted run in {out}: {', '.join(changed)}")
        return last_complete_checkpoint(ckpt_dir, report=report)
    if holds_run and not config.overwrite:
        raise ConfigError(
            f"--out {out} already holds a run ({CHECKPOINTS}/ or {RUN_JSON}); "
            f"pass --resume to continue it or --overwrite to start again"
        )
    return None


def clear_previous_run(out: Path) -> None:
    """--overwrite: remove the earlier run's checkpoints, merged model and run.json (just
    before training starts, once everything else has been checked)."""
    shutil.rmtree(checkpoint_dir(out), ignore_errors=True)
    shutil.rmtree(out / "merged", ignore_errors=True)
    shutil.rmtree(out / "trajectory", ignore_errors=True)  # --record-trajectory's (training/trajectory.py)
    (out / RUN_JSON).unlink(missing_ok=True)


def drop_incomplete_checkpoints(ckpt_dir: Path, keep: Path | None) -> None:
    """Remove checkpoints newer than the one resumed from (left half-written by a kill)."""
    keep_step = int(_CHECKPOINT_RE.match(keep.name).group(1)) if keep else -1
    if not ckpt_dir.is_dir():
        return
    for path in ckpt_dir.iterdir():
        match = _CHECKPOINT_RE.match(path.name)
        if match and int(match.group(1)) > keep_step:
            shutil.rmtree(path, ignore_errors=True)


def adapter_intact(folder: Path) -> bool:
    """Whether a saved initial adapter (residual inits, kept for --resume) is complete."""
    from ..errors import ModelError
    from ..models import check_safetensors

    try:
        json.loads((folder / "adapter_config.json").read_text())
        check_safetensors(folder / "adapter_model.safetensors", "initial adapter")
    except (OSError, ValueError, ModelError):
        return False
    return True


# ----------------------------------------------------------------------------- run.json


def package_versions() -> dict[str, str | None]:
    """run.json's ``versions``: Python's and the libraries' that decide the result."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("unlearn-plugins", "torch", "transformers", "peft", "accelerate", "datasets"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    return versions


def logged_losses(log_history: Iterable[dict]) -> list[dict[str, float]]:
    """run.json's ``losses``: the step and every loss term of each logged step."""
    return [
        {k: v for k, v in entry.items() if k == "step" or k.startswith("loss")}
        for entry in log_history
        if "loss" in entry
    ]


def reference_record(reference) -> dict[str, Any] | None:
    """run.json's ``reference_model``: how the objective's reference outputs were computed."""
    if reference is None:
        return None
    if hasattr(reference, "record"):
        return reference.record()
    record = {
        "how": "copy",
        "description": "a frozen copy of the starting model (full fine-tuning, or LoRA with "
        "weights sharded by FSDP / DeepSpeed)",
    }
    param = next(iter(reference.parameters()), None) if hasattr(reference, "parameters") else None
    if param is not None:
        record["dtype"] = str(param.dtype).replace("torch.", "")
    return record


def initializer_record(initializer: Initializer | None, init_result) -> dict[str, Any] | None:
    """run.json's ``initializer``: what the init reported (``InitResult.info``, ``residual``) and,
    for a configured one, its name, plugin and options (these win over same-named info keys)."""
    if initializer is None:
        return None
    reported = {} if init_result is None else {"residual": init_result.residual, **init_result.info}
    return {**reported, **(initializer.record or {})} or None


def component_records(objective, initializer: Initializer | None) -> dict[str, Any]:
    """run.json's ``components``: name, plugin, defining object and option values of each part."""
    records = list(getattr(objective, "records", None) or [None])
    return {
        "objective": records[0],
        "regularizers": [r for r in records[1:] if r is not None],
        "initializer": initializer.record if initializer is not None else None,
    }
