"""The tiny-model demos' results.json as recorded before the demo became a study: a
refactoring of the demo's pipeline must leave every number of its report as it was. Compared
here: everything in results.json but what differs between two runs by nature (paths, stage
cache keys, timings), exactly, on a machine that resolves ``--train-dtype auto`` as the one that
recorded it did and has the same kind of bf16 units (AMX for the files without a suffix).

A change that moves the numbers on purpose re-records them (and says so in its commit):
``UPDATE_DEMO_BASELINE=1 pytest tests/test_demo.py tests/test_demo_movielens.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parent / "fixtures" / "demo_results"
#: what differs between two runs of one demo: stage cache keys (they digest the model folder's
#: file times), timings, the stage list (labels and times)
DROPPED = ("key", "stages", "wall_time_s")


def normalized(value, key: str = ""):
    """``value`` without :data:`DROPPED` keys or timings (``*seconds``), each absolute path as
    ``<path>``."""
    if isinstance(value, dict):
        return {k: normalized(v, k) for k, v in value.items() if k not in DROPPED and not str(k).endswith("seconds")}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return "<path>"
    return value


def check(results_file: Path, name: str) -> None:
    """``results_file`` against the recorded ``name`` (same numbers, exactly)."""
    from unlearn_plugins.models import cpu_bf16_kernels, native_dtype

    now = normalized(json.loads(Path(results_file).read_text()))
    # bf16 runs agree exactly only on CPUs with the same bf16 units: the baselines without a
    # suffix were recorded on AMX; another kind records its own (NAME-KIND.json)
    kernels = cpu_bf16_kernels()
    path = FOLDER / (f"{name}.json" if kernels in ("amx", None) else f"{name}-{kernels}.json")
    if not path.is_file() and not os.environ.get("UPDATE_DEMO_BASELINE"):
        pytest.skip(
            f"no {name} baseline recorded on a CPU with {kernels} bf16 units (UPDATE_DEMO_BASELINE=1 records it)"
        )
    if os.environ.get("UPDATE_DEMO_BASELINE"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(path.read_text())
    dtype = native_dtype("auto", "cpu") or "library default"
    if recorded.get("train_dtype") != dtype:
        pytest.skip(f"{path.name} was recorded where --train-dtype auto is {recorded.get('train_dtype')}, here {dtype}")
    assert now == recorded, _first_difference(recorded, now)


def _first_difference(old, new, where: str = "results") -> str:
    if type(old) is not type(new):
        return f"{where}: recorded {old!r:.200}, now {new!r:.200}"
    if isinstance(old, dict):
        for k in sorted(set(old) | set(new), key=str):
            if old.get(k, "<missing>") != new.get(k, "<missing>"):
                return _first_difference(old.get(k, "<missing>"), new.get(k, "<missing>"), f"{where}.{k}")
    if isinstance(old, list):
        if len(old) != len(new):
            return f"{where}: recorded {len(old)} entries, now {len(new)}"
        for i, (a, b) in enumerate(zip(old, new)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
    return f"{where}: recorded {old!r:.200}, now {new!r:.200}"
