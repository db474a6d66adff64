"""Offline data for the MMLU and WMDP task variants (tasks/mmlu_local, tasks/wmdp_local).

Both loaders return the hub datasets' schema (cais/mmlu, cais/wmdp: question, choices,
answer index), so the tasks reuse lm-eval's own prompt format and their numbers are
comparable with lm-eval's ``mmlu`` and ``wmdp_*`` tasks. Every malformed record is
reported with its file and line.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Iterator

from ..data.jsonl import iter_jsonl
from ..errors import DataError

MMLU_HEADER = ["question", "choice0", "choice1", "choice2", "choice3", "answer"]
WMDP_CONFIGS = ("wmdp-bio", "wmdp-chem", "wmdp-cyber")


def _folder(value: str | os.PathLike | None, env: str, key: str, what: str, layout: str) -> Path:
    chosen = value or os.environ.get(env)
    if not chosen:
        raise DataError(f"{what}: no data folder; set {env} (or task metadata '{key}') to {layout}")
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise DataError(f"{what}: data folder not found: {path} (from {'metadata' if value else env})")
    return path


def _read_utf8(path: Path) -> str:
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
    with io.StringIO(_read_utf8(path), newline="") as handle:
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

    folder = _folder(
        mmlu_dir,
        "UNLEARN_MMLU_DIR",
        "mmlu_dir",
        f"MMLU subject {mmlu_subject}",
        "a folder with test/<subject>_test.csv and dev/<subject>_dev.csv",
    )
    test = read_mmlu_csv(folder / "test" / f"{mmlu_subject}_test.csv", mmlu_subject)
    dev = read_mmlu_csv(folder / "dev" / f"{mmlu_subject}_dev.csv", mmlu_subject)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(test), "dev": datasets.Dataset.from_list(dev)})


# ----------------------------------------------------------------------------- WMDP


def _json_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) from a JSON array or a JSON-lines file, with line numbers."""
    text = _read_utf8(path)
    stripped = text.lstrip()
    if stripped.startswith("["):
        decoder = json.JSONDecoder()
        pos = text.index("[") + 1
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text):
                raise DataError(f"{path}:{text.count(chr(10), 0, pos) + 1}: unterminated JSON array")
            if text[pos] == "]":
                return
            line = text.count("\n", 0, pos) + 1
            try:
                record, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
            except (ValueError, RecursionError) as exc:  # too deep, or an integer too long for Python
                raise DataError(f"{path}:{line}: unreadable JSON value: {str(exc).splitlines()[0][:120]}") from None
            yield f"{path}:{line}", record
    else:
        for lineno, record in iter_jsonl(path):
            yield f"{path}:{lineno}", record


def read_wmdp_json(path: Path) -> list[dict[str, Any]]:
    """Questions in the cais/wmdp schema: question (str), choices (4 str), answer (index)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = []
    for where, record in _json_records(path):
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for key in ("question", "choices", "answer"):
            if key not in record:
                raise DataError(f"{where}: field '{key}' is missing")
        question, choices, answer = record["question"], record["choices"], record["answer"]
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}: field 'question' must be a non-empty string")
        if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, str) for c in choices):
            raise DataError(f"{where}: field 'choices' must be a list of 4 strings")
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise DataError(f"{where}: field 'answer' must be an index 0-3, got {answer!r}")
        rows.append({"question": question, "choices": choices, "answer": answer})
    if not rows:
        raise DataError(f"{path}: no questions")
    return rows


def wmdp_dataset(*, wmdp_config: str, wmdp_dir: str | None = None, **_metadata: Any):
    """lm-eval ``custom_dataset``: ``<dir>/<config>.jsonl`` (or .json) as {"test": ...}."""
    import datasets

    if wmdp_config not in WMDP_CONFIGS:
        raise DataError(f"wmdp_config must be one of {', '.join(WMDP_CONFIGS)}, got {wmdp_config!r}")
    folder = _folder(
        wmdp_dir,
        "UNLEARN_WMDP_DIR",
        "wmdp_dir",
        f"WMDP {wmdp_config}",
        "a folder with wmdp-bio.jsonl, wmdp-chem.jsonl, wmdp-cyber.jsonl (cais/wmdp schema)",
    )
    for name in (f"{wmdp_config}.jsonl", f"{wmdp_config}.json"):
        if (folder / name).is_file():
            return datasets.DatasetDict({"test": datasets.Dataset.from_list(read_wmdp_json(folder / name))})
    raise DataError(f"WMDP {wmdp_config}: neither {wmdp_config}.jsonl nor {wmdp_config}.json in {folder}")
