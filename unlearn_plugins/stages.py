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

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .files import exclusive_lock, json_digest, write_json

DONE = "stage.json"
CACHE_FORMAT = 1


def digest(*parts: Any) -> str:
    """A stage's key: :func:`~unlearn_plugins.files.json_digest` of ``parts``, 12 hex digits."""
    return json_digest(parts, length=12)


def host_name() -> str:
    """This machine's name as it goes into temporary folder names (letters, digits, '.', '_')."""
    import re
    import socket

    return re.sub(r"[^A-Za-z0-9._]", "_", socket.gethostname()) or "host"


def temporary_folder(folder: Path) -> Path:
    """Where a stage is built: beside it, named after this host and process."""
    return folder.with_name(f"{folder.name}.tmp-{host_name()}-{os.getpid()}")


def remove_own_temporaries(root: Path) -> list[str]:
    """Remove the temporary stage folders this process is building in ``root`` (an interrupted
    worker's backstop: a second SIGINT arriving while its stage cleans up can cut the removal
    short before it starts); returns their names."""
    removed = []
    for path in Path(root).glob(f"*.tmp-{host_name()}-{os.getpid()}"):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


def orphaned(path: Path) -> bool:
    """A temporary stage folder whose builder is gone: its process on this host is not running
    (folders of other hosts are not this machine's to judge; the old ``.tmp-<pid>`` names
    are this host's)."""
    owner = path.name.rsplit(".tmp-", 1)[1]
    host, _, pid = owner.rpartition("-")
    if host and host != host_name():
        return False
    return not pid.isdigit() or not _alive(int(pid))


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


@contextlib.contextmanager
def _uninterrupted():
    """SIGINT ignored for the block (main thread only): a second Ctrl-C, or the parent's
    SIGINT to a worker that the terminal's already reached, must not stop the removal of an
    interrupted stage's temporary folder half-way."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def unreadable(folder: Path) -> str | None:
    """Why a finished stage folder cannot be used (a JSON or JSON-lines file in it that does not
    parse: a truncated ``results_*.json``, say), or None when it can. A ``.json`` file may hold
    JSON lines (TOFU's splits do)."""
    import json

    for path in sorted(folder.rglob("*.json*")):
        if path.suffix not in (".json", ".jsonl") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            try:
                json.loads(text)
            except ValueError:
                if path.suffix == ".json" and "\n" not in text.strip():
                    raise
                for line in text.splitlines():
                    if line.strip():
                        json.loads(line)
        except (OSError, ValueError) as exc:
            return f"{path.relative_to(folder)}: {' '.join(str(exc).split())[:200]}"
    return None


def usable(folder: Path, stream=None) -> bool:
    """Whether ``folder`` is a finished stage whose files can be read. A finished one that cannot
    is removed, with a warning, so that it is built again (it would fail the report later)."""
    if not (folder / DONE).is_file():
        return False
    problem = unreadable(folder)
    if problem is None:
        return True
    print(
        f"warning: the cached stage {folder} is unreadable ({problem}): rebuilding it",
        file=stream or sys.stderr,
        flush=True,
    )
    shutil.rmtree(folder, ignore_errors=True)
    return False


class Stages:
    """Numbered stage headers with timings, and the build-then-rename cache of a stage."""

    def __init__(self, root: Path, total: int, stream=None):
        self.root, self.total, self.n = root, total, 0
        self.stream = stream or sys.stderr
        self.timings: dict[str, dict] = {}
        self.remove_orphans()

    def remove_orphans(self) -> None:
        """Temporary stage folders of this host's processes that are gone (killed without a
        chance to clean up, e.g. SIGKILL or a power cut; Ctrl-C cleans up after itself)."""
        if not self.root.is_dir():
            return
        for path in self.root.glob("*.tmp-*"):
            if orphaned(path):
                shutil.rmtree(path, ignore_errors=True)

    def folder(self, kind: str, name: str, key: str) -> Path:
        return self.root / f"{kind}-{name}-{key}"

    def say(self, number: int, text: str) -> None:
        """One stage line, ``[number/total] text`` (a pipeline that runs stages in parallel
        numbers them itself, in the order a sequential run would take)."""
        print(f"[{number}/{self.total}] {text}", file=self.stream, flush=True)

    def run(self, label: str, folder: Path, build: Callable[[Path], Any]) -> Path:
        """``build(tmp)`` fills a temporary folder, which becomes ``folder`` when it returns."""
        self.n += 1
        n = self.n
        if (folder / DONE).is_file() and unreadable(folder) is None:
            self.say(n, f"{label}: cached ({folder.name})")
            self.timings[label] = {"seconds": 0.0, "cached": True}
            return folder
        with exclusive_lock(folder.with_name(f".{folder.name}.lock"), f"stage {folder}"):
            if usable(folder, self.stream):  # finished by another demo meanwhile (or unreadable: removed)
                self.say(n, f"{label}: cached ({folder.name})")
                self.timings[label] = {"seconds": 0.0, "cached": True}
                return folder
            self.say(n, f"{label} ...")
            self.remove_orphans()  # e.g. this stage's folder from a killed run
            tmp = temporary_folder(folder)
            tmp.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            try:
                build(tmp)
                write_json(
                    tmp / DONE,
                    {"format": CACHE_FORMAT, "label": label, "seconds": round(time.perf_counter() - started, 2)},
                )
                if folder.exists():
                    shutil.rmtree(folder)
                os.replace(tmp, folder)
            except BaseException:
                with _uninterrupted():
                    shutil.rmtree(tmp, ignore_errors=True)
                raise
        seconds = time.perf_counter() - started
        self.timings[label] = {"seconds": round(seconds, 2), "cached": False}
        self.say(n, f"{label}: done in {seconds:.0f} s")
        return folder
