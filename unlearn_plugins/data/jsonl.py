"""JSON-lines reading shared by every loader: one place that turns a bad line into an
error naming the file and the line."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from ..errors import DataError


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line of a JSON-lines file."""
    with open(path, "r", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
