"""Run one attack plugin on a model and write what ``unlearn eval`` measures: the attacked model
as a Hugging Face folder, ``attack.json`` (which attack, its options, what it did) and, for an
attack shown part of the forget set, ``measure.json`` (the forget rows it was not shown).

The folder is built beside ``out`` and renamed into place when complete, so an ``out`` that
exists is a finished attack; a second attack on the same ``out`` is refused while one runs.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UnlearnError
from ..interfaces import ATTACK, AttackResult

FORMAT = "unlearn-plugins/attack"
VERSION = 1
RECORD = "attack.json"
MEASURE = "measure.json"


@dataclass
class Attacked:
    """An attacked model on disk: its folder, its attack.json, and the forget split to measure
    it on (``measure.json``, else the forget split the attack was given, else None)."""

    folder: Path
    record: dict[str, Any]

    @property
    def measure_split(self) -> str | None:
        if self.record.get("measure_split"):
            return str(self.folder / self.record["measure_split"])
        return self.record.get("forget")


def create_attack(name: str, options: dict[str, Any]) -> tuple[Any, dict[str, Any], str]:
    """(instance, its record for attack.json, how errors name it); a bad name or option fails here,
    before any model loads."""
    from ..host import component_label, create_with_record

    instance, record = create_with_record(ATTACK, name, **options)
    return instance, record, component_label(ATTACK, name)


def run_attack(
    name: str,
    *,
    model: str,
    out: str | os.PathLike,
    options: dict[str, Any] | None = None,
    adapter: str | None = None,
    forget: str | None = None,
    tofu_dir: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    allow_other_base: bool = False,
    overwrite: bool = False,
) -> Attacked:
    """Attack ``model`` (+ ``adapter``) with the registered attack ``name`` into ``out``."""
    from ..files import file_lock, write_json, write_jsonl
    from ..models import pick_device

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UnlearnError(f"--out {out}: is an existing file, not a folder")
    whole, cwd = Path(os.path.abspath(out)), Path.cwd()  # `--out .` has no name to put a staging folder beside
    if not whole.name or whole == cwd or whole in cwd.parents:
        raise UnlearnError(
            f"--out {out}: is {'the current folder' if whole == cwd else 'a folder holding the current one'}; "
            "the attacked model replaces its --out folder as a whole: give a folder of its own, e.g. --out attacked"
        )
    instance, record, label = create_attack(name, dict(options or {}))
    if getattr(instance, "needs_forget_data", False) and forget is None:
        raise UnlearnError(
            f"{label} needs the forget set: give --forget tofu:SPLIT or a JSON-lines file in TOFU's format"
        )
    with file_lock(out, f"--out {out}"):
        if out.exists() and any(out.iterdir()) and not overwrite:
            raise UnlearnError(
                f"--out {out}: already holds an attacked model or other files; give --overwrite to "
                "replace it, or another --out"
            )
        from .context import Context

        staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        context = Context(
            model=model,
            out=staging,
            adapter=adapter,
            device=pick_device(device),
            dtype=dtype or "float32",
            trust_remote_code=trust_remote_code,
            allow_other_base=allow_other_base,
            forget=forget,
            tofu_dir=tofu_dir,
            label=label,
        )
        started = time.perf_counter()
        try:
            if forget is not None:
                context.forget_samples()  # bad data fails before the model loads
            try:
                result = instance.attack(context)
            except UnlearnError:
                raise
            except Exception as exc:
                from ..errors import one_line

                raise UnlearnError(f"{label} failed: {one_line(exc)}") from exc
            if result is None:
                result = AttackResult()
            if not isinstance(result, AttackResult):
                raise UnlearnError(f"{label} returned {type(result).__name__}, not an AttackResult or None")
            if not context.saved or not (staging / "config.json").is_file():
                raise UnlearnError(f"{label} saved no model: an attack must call context.save_model(model, tokenizer)")
            entry = {
                "format": FORMAT,
                "version": VERSION,
                "attack": record,
                "model": model,
                "adapter": adapter,
                "forget": forget,
                "measure_split": None,
                "device": context.device,
                "dtype": context.dtype,
                "info": _json_ready(result.info, label),
                "wall_time_s": round(time.perf_counter() - started, 3),
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            }
            if result.measure_on is not None:
                samples = context.forget_samples()
                rows = list(result.measure_on)
                bad = [r for r in rows if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < len(samples)]
                if bad or not rows:
                    raise UnlearnError(
                        f"{label}: measure_on must be forget row numbers in [0, {len(samples)}), got {bad[:3] or rows}"
                    )
                write_jsonl(staging / MEASURE, [samples[r].to_record() for r in rows])
                entry.update(measure_split=MEASURE, measure_on=rows)
            write_json(staging / RECORD, entry)
            if out.exists():
                trash = out.with_name(f".{out.name}.old-{os.getpid()}")
                os.replace(out, trash)
                os.replace(staging, out)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(staging, out)
        finally:
            context.close()
            shutil.rmtree(staging, ignore_errors=True)
    return Attacked(out, entry)


def _json_ready(info: Any, label: str) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise UnlearnError(f"{label}: AttackResult.info must be a dict, got {type(info).__name__}")
    try:
        return json.loads(json.dumps(info, allow_nan=False, default=str))
    except ValueError as exc:
        raise UnlearnError(f"{label}: AttackResult.info is not JSON: {exc}") from None
