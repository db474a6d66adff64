"""Offline data for the MMLU task variant (tasks/mmlu_local), and the folder and text helpers
that WMDP's reader (:mod:`unlearn_plugins.benchmarks.wmdp.data`) shares with it.

The loader returns the hub dataset's schema (cais/mmlu: question, choices, answer index), so
the tasks reuse lm-eval's own prompt format and their numbers are comparable with lm-eval's
``mmlu``. Every malformed record is reported with its file and line.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Iterator

from ..errors import DataError

MMLU_HEADER = ["question", "choice0", "choice1", "choice2", "choice3", "answer"]


def data_folder(value: str | os.PathLike | None, env: str, key: str, what: str, layout: str) -> Path:
    """The data folder a task's metadata ``key`` or the variable ``env`` names; missing, a one-line
    error saying what to set (MMLU here, WMDP's questions in its own home)."""
    chosen = value or os.environ.get(env)
    if not chosen:
        raise DataError(f"{what}: no data folder; set {env} (or task metadata '{key}') to {layout}")
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise DataError(f"{what}: data folder not found: {path} (from {'metadata' if value else env})")
    return path


def read_utf8(path: Path) -> str:
    """The file's text; bytes that are not UTF-8 are an error naming the line."""
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):  # a byte-order mark
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None


# ----------------------------------------------------------------------------- MMLU


def read_mmlu_csv(path: Path, subject: str) -> list[dict[str, Any]]:
    """One MMLU CSV (header question,choice0..choice3,answer; answer = index 0-3)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = []
    with io.StringIO(read_utf8(path), newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"{path}: empty file") from None
        except csv.Error as exc:
            raise DataError(f"{path}:1: malformed CSV: {exc}") from None
        if header != MMLU_HEADER:
            raise DataError(f"{path}:1: header must be {','.join(MMLU_HEADER)}, got {','.join(header)}")
        start = reader.line_num + 1
        for record in _csv_records(reader, path):
            where = f"{path}:{start}"
            start = reader.line_num + 1
            if not record:
                continue
            if len(record) != len(MMLU_HEADER):
                raise DataError(f"{where}: expected {len(MMLU_HEADER)} fields, got {len(record)}")
            question, *choices, answer = record
            if not question.strip():
                raise DataError(f"{where}: field 'question' is empty")
            try:
                index = int(answer)
            except ValueError:
                raise DataError(f"{where}: field 'answer' must be an index 0-3, got {answer!r}") from None
            if not 0 <= index <= 3:
                raise DataError(f"{where}: field 'answer' must be an index 0-3, got {index}")
            rows.append({"question": question, "subject": subject, "choices": choices, "answer": index})
    if not rows:
        raise DataError(f"{path}: no questions")
    return rows


def _csv_records(reader, path: Path) -> Iterator[list[str]]:
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # e.g. a field over the csv module's size limit
            raise DataError(f"{path}:{reader.line_num}: malformed CSV: {exc}") from None


def mmlu_dataset(*, mmlu_subject: str, mmlu_dir: str | None = None, **_metadata: Any):
    """lm-eval ``custom_dataset``: one MMLU subject as {"test", "dev"} from
    ``<dir>/test/<subject>_test.csv`` and ``<dir>/dev/<subject>_dev.csv``."""
    import datasets

    folder = data_folder(
        mmlu_dir,
        "UNLEARN_MMLU_DIR",
        "mmlu_dir",
        f"MMLU subject {mmlu_subject}",
        "a folder with test/<subject>_test.csv and dev/<subject>_dev.csv",
    )
    test = read_mmlu_csv(folder / "test" / f"{mmlu_subject}_test.csv", mmlu_subject)
    dev = read_mmlu_csv(folder / "dev" / f"{mmlu_subject}_dev.csv", mmlu_subject)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(test), "dev": datasets.Dataset.from_list(dev)})
