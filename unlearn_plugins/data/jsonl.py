"""JSON-lines reading shared by every loader: one place that turns a bad line into an
error naming the file and the line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import DataError


def json_lines(path: str | os.PathLike, fail: Callable[[int, str], Exception]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line of a recorded JSON-lines file (read
    as UTF-8 text, split at line breaks); a malformed line raises ``fail(line number, "malformed
    JSON (the parser's first words)")``, the caller's error naming its file."""
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise fail(lineno, f"malformed JSON ({str(exc).splitlines()[0][:80]})") from None
        yield lineno, value


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line of a JSON-lines file (UTF-8; a
    leading byte-order mark is allowed). Bytes that are not UTF-8, and values Python's JSON
    parser cannot hold (nesting too deep, integers too long), are errors naming the line."""
    try:
        handle = open(path, "rb")
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a JSON-lines file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1}); save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
            except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
                raise DataError(f"{path}:{lineno}: unreadable JSON value: {str(exc).splitlines()[0][:120]}") from None
            yield lineno, value
