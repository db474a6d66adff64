"""Atomic file writes (write to a temporary file beside the target, then rename, so an
interrupted run never leaves a half-written output that looks complete), content hashes,
and exclusive locks on output folders (two commands never write one folder at once)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from .errors import UnlearnError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary file next to ``path``; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno:  # a failed write (disk full): name the file
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        raise


def write_json(path: str | os.PathLike, data: Any) -> None:
    with atomic_open(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file (symlinks and ``..`` resolved; neither need exist)."""
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


# ----------------------------------------------------------------------------- content hashes

_HASHES: dict[tuple[int, int], tuple[int, int, str]] = {}


def json_digest(value: Any, *, length: int | None = None) -> str:
    """SHA-256 (hex) of ``value`` as JSON with sorted keys, anything JSON lacks as ``str()``: the
    content key of a cached result (a stage folder, a CUD anchor run). ``length``: the first so
    many hex digits (None: all 64). Keys are on users' disks, so this must never change."""
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:length]


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's content. Hashed once per process; later calls trust an unchanged
    size and mtime (a 540 MB model takes about 0.4 s to hash). Known by device and inode,
    so a renamed file (a conversion moved into place) is not hashed again."""
    import hashlib

    st = os.stat(path)
    known = _HASHES.get((st.st_dev, st.st_ino))
    if known and known[:2] == (st.st_size, st.st_mtime_ns):
        return known[2]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    _HASHES[(st.st_dev, st.st_ino)] = (st.st_size, st.st_mtime_ns, digest.hexdigest())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- output locks

LOCK_NAME = ".unlearn.lock"


class LockHeld(UnlearnError):
    """Another process holds the lock (a caller that can wait, e.g. a study, tells it apart)."""


_HELD: dict[str, int] = {}  # lock files this process holds -> nesting depth


def _holder(lock: Path) -> str:
    """'pid N' (and the host, when not this one) from a lock file, for the refusal message."""
    import socket

    try:
        pid, _, host = lock.read_text().strip().partition(" ")
    except OSError:
        pid, host = "", ""
    if not pid.isdigit():
        return "another process"
    return f"pid {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")


def _acquire_fd(lock: Path, what: str) -> Any:
    """An open, exclusively flock-ed descriptor of ``lock`` holding our pid; refuses when held.

    A releasing holder unlinks the file before unlocking it, so after locking we check that
    the path still names the inode we locked (else a third process could lock a new file)."""
    import errno
    import fcntl
    import socket
    import sys

    for _ in range(20):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP):  # a filesystem without locks
                print(
                    f"notice: {lock.parent} does not support file locks; {what} is not protected against "
                    f"a second command writing there",
                    file=sys.stderr,
                    flush=True,
                )
                return fd
            os.close(fd)
            raise LockHeld(
                f"{what} is in use by {_holder(lock)} (lock file {lock}); wait for it to finish or write elsewhere"
            ) from None
        try:
            current = os.stat(lock)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fd), current):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            return fd
        os.close(fd)  # the holder released (and unlinked) it meanwhile: try the new file
    raise UnlearnError(f"{what}: could not take the lock {lock}")


def _acquire_portable(lock: Path, what: str) -> Any:
    """Where fcntl is missing (Windows): the filelock package; the holder is not named."""
    import filelock

    handle = filelock.FileLock(str(lock))
    try:
        handle.acquire(timeout=0)
    except filelock.Timeout:
        raise LockHeld(
            f"{what} is in use by another process (lock file {lock}); wait for it to finish or write elsewhere"
        ) from None
    return handle


def _release(lock: Path, handle: Any) -> None:
    with contextlib.suppress(OSError):
        os.unlink(lock)  # while still holding it: see _acquire_fd
    if isinstance(handle, int):
        os.close(handle)
    else:
        handle.release()


@contextlib.contextmanager
def exclusive_lock(lock: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold ``lock`` (a lock file) exclusively for the block; another process that asks for it
    is refused with an UnlearnError naming the holder's pid (never waits). Re-entrant in one
    process. Folders created for the lock file, and the file itself, are removed afterwards
    when nothing else was written there, so a command that fails early leaves no trace."""
    lock = Path(lock).absolute()
    key = str(lock)
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    created = []
    for parent in reversed(lock.parents):
        if not parent.exists():
            created.append(parent)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnlearnError(f"{what}: cannot create {lock.parent} ({exc.strerror or exc})") from None
    try:
        try:
            import fcntl  # noqa: F401
        except ImportError:
            handle = _acquire_portable(lock, what)
        else:
            try:
                handle = _acquire_fd(lock, what)
            except OSError as exc:  # e.g. no permission, a read-only filesystem
                raise UnlearnError(f"{what}: cannot create the lock file {lock} ({exc.strerror or exc})") from None
    except BaseException:
        _remove_empty(created)
        raise
    _HELD[key] = 1
    try:
        yield
    finally:
        del _HELD[key]
        _release(lock, handle)
        _remove_empty(created)


def _remove_empty(folders: list[Path]) -> None:
    for folder in reversed(folders):  # deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


def folder_lock(folder: str | os.PathLike, what: str | None = None):
    """:func:`exclusive_lock` on an output folder (lock file ``FOLDER/.unlearn.lock``)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UnlearnError(f"{what or folder}: {folder} is a file, not a folder")
    return exclusive_lock(folder / LOCK_NAME, what or str(folder))


def file_lock(path: str | os.PathLike, what: str | None = None):
    """:func:`exclusive_lock` on an output file (lock file ``.NAME.lock`` beside it)."""
    path = Path(path)
    return exclusive_lock(path.with_name(f".{path.name}.lock"), what or str(path))


def file_digest(path: str | os.PathLike) -> str:
    """The first 16 hex digits of a file's SHA-256 (what a cache key holds of a data file)."""
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]
