"""The content-keyed stage cache shared by the demo and the studies (bench/cud_stratification.py).

A stage is one step of a pipeline whose result is a folder: ``<root>/<kind>-<name>-<key>/``.
The key digests everything the result depends on, so a change of any of it recomputes that
stage and nothing else. A stage is built in ``<folder>.tmp-<pid>`` and renamed into place when
complete (``stage.json`` marks it), so an interrupted pipeline leaves finished stages and a
temporary folder that the next run deletes, and a rerun continues with the first unfinished
stage. A stage being built holds an exclusive lock (``.<folder>.lock`` beside it): two
processes never build one stage at once; the second is refused, naming the holder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .files import exclusive_lock, write_json

DONE = "stage.json"
CACHE_FORMAT = 1


def digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


class Stages:
    """Numbered stage headers with timings, and the build-then-rename cache of a stage."""

    def __init__(self, root: Path, total: int, stream=None):
        self.root, self.total, self.n = root, total, 0
        self.stream = stream or sys.stderr
        self.timings: dict[str, dict] = {}
        self.remove_orphans()

    def remove_orphans(self) -> None:
        """Temporary stage folders of processes that are gone (killed without a chance to
        clean up, e.g. SIGKILL or a power cut; Ctrl-C cleans up after itself)."""
        if not self.root.is_dir():
            return
        for path in self.root.glob("*.tmp-*"):
            pid = path.name.rsplit(".tmp-", 1)[1]
            if not pid.isdigit() or not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)

    def folder(self, kind: str, name: str, key: str) -> Path:
        return self.root / f"{kind}-{name}-{key}"

    def run(self, label: str, folder: Path, build: Callable[[Path], Any]) -> Path:
        """``build(tmp)`` fills a temporary folder, which becomes ``folder`` when it returns."""
        self.n += 1
        head = f"[{self.n}/{self.total}] {label}"
        if (folder / DONE).is_file():
            print(f"{head}: cached ({folder.name})", file=self.stream, flush=True)
            self.timings[label] = {"seconds": 0.0, "cached": True}
            return folder
        with exclusive_lock(folder.with_name(f".{folder.name}.lock"), f"stage {folder}"):
            if (folder / DONE).is_file():  # finished by another demo meanwhile
                print(f"{head}: cached ({folder.name})", file=self.stream, flush=True)
                self.timings[label] = {"seconds": 0.0, "cached": True}
                return folder
            print(f"{head} ...", file=self.stream, flush=True)
            self.remove_orphans()  # e.g. this stage's folder from a killed run
            tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
            tmp.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            try:
                build(tmp)
                write_json(tmp / DONE, {"format": CACHE_FORMAT, "label": label,
                                        "seconds": round(time.perf_counter() - started, 2)})
                if folder.exists():
                    shutil.rmtree(folder)
                os.replace(tmp, folder)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        seconds = time.perf_counter() - started
        self.timings[label] = {"seconds": round(seconds, 2), "cached": False}
        print(f"{head}: done in {seconds:.0f} s", file=self.stream, flush=True)
        return folder
