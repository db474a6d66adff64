"""Documents as forget and retain data: ``text:`` specs for `unlearn run`.

WMDP's and MUSE's forget and retain sets are raw text, not question-answer pairs. A corpus
is read (a JSON-lines file with a ``text`` field, a folder of ``.txt`` files, or a hub dataset
column found in the local datasets cache), its documents are joined with a blank line and
tokenised as one stream, and the stream is cut into consecutive windows of ``max_length``
tokens: no prompt or chat template, labels on every token, the last (short) window kept.
This is open-unlearning's ``PretrainingDataset`` (the loader of its MUSE and WMDP configs);
docs/data.md names the commit checked and the differences.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import DataError

PREFIX = "text:"
SEPARATOR = "\n\n"  # between documents, as open-unlearning's PretrainingDataset joins them
SPEC_FORMS = "text:FILE.jsonl, text:FOLDER (of .txt files) or text:hf:ID:SPLIT:COLUMN"


@dataclass(frozen=True)
class Document:
    text: str
    where: str  # file:line, file, or hub id and row, for error messages


@dataclass(frozen=True)
class Window:
    """One training window: token ids with labels on every token (``where`` names its start)."""

    input_ids: tuple[int, ...]
    index: int
    where: str
    source: str = "<memory>"

    def encoded(self) -> dict[str, list[int]]:
        ids = list(self.input_ids)
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)}


def is_text_spec(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


# ----------------------------------------------------------------------------- reading


def _jsonl_documents(path: Path, spec: str) -> list[Document]:
    docs = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"data {spec!r}: cannot read {path}: {exc}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "text" not in row:
            raise DataError(f"{where}: no 'text' field (a text corpus needs one JSON object with 'text' per line)")
        if not isinstance(row["text"], str):
            raise DataError(f"{where}: field 'text' is not a string")
        if row["text"].strip():
            docs.append(Document(row["text"], where))
    return docs


def _folder_documents(folder: Path, spec: str) -> list[Document]:
    docs = []
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise DataError(f"data {spec!r}: folder {folder} holds no .txt files")
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"data {spec!r}: cannot read {path}: {exc}") from None
        if text.strip():
            docs.append(Document(text, str(path)))
    return docs


def _hub_documents(body: str, spec: str) -> list[Document]:
    """A hub dataset's column, only from the local datasets cache (never downloaded here)."""
    parts = body.rsplit(":", 2)
    if len(parts) != 3 or not all(parts):
        raise DataError(f"bad data spec {spec!r}; expected text:hf:ID:SPLIT:COLUMN (e.g. text:hf:org/name:train:text)")
    name, split, column = parts
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.config.HF_HUB_OFFLINE = True  # if datasets was imported before the variables were set
    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as exc:  # noqa: BLE001 - the library raises many kinds for "not cached"
        cache = datasets.config.HF_DATASETS_CACHE
        raise DataError(
            f"data {spec!r}: dataset {name!r} split {split!r} is not in the local datasets cache {cache} "
            f"({type(exc).__name__}); download it where there is network "
            f"(datasets.load_dataset({name!r}, split={split!r})) and copy that cache folder to {cache} "
            f"(or set HF_DATASETS_CACHE), or save the column as JSON lines and give text:FILE.jsonl"
        ) from None
    if column not in data.column_names:
        raise DataError(f"data {spec!r}: dataset {name!r} has no column {column!r}; columns: {data.column_names}")
    docs = []
    for i, text in enumerate(data[column]):
        if not isinstance(text, str):
            raise DataError(f"data {spec!r}: row {i} of column {column!r} is not a string")
        if text.strip():
            docs.append(Document(text, f"{name}[{split}][{i}]"))
    return docs


def read_documents(spec: str) -> list[Document]:
    """The non-empty documents of a ``text:`` spec, in order."""
    if not is_text_spec(spec):
        raise DataError(f"bad data spec {spec!r}; a text corpus is {SPEC_FORMS}")
    body = spec[len(PREFIX) :].strip()
    if not body:
        raise DataError(f"bad data spec {spec!r}; a text corpus is {SPEC_FORMS}")
    if body.startswith("hf:"):
        docs = _hub_documents(body[3:], spec)
    else:
        path = Path(body).expanduser()
        if path.is_dir():
            docs = _folder_documents(path, spec)
        elif path.is_file():
            if path.suffix not in (".jsonl", ".json"):
                raise DataError(f"data {spec!r}: {path} is not a .jsonl file; a text corpus is {SPEC_FORMS}")
            docs = _jsonl_documents(path, spec)
        else:
            raise DataError(f"data {spec!r}: {path} does not exist; a text corpus is {SPEC_FORMS}")
    if not docs:
        raise DataError(f"data {spec!r}: the corpus has no text (every document is empty)")
    return docs


# ----------------------------------------------------------------------------- windows


def windows(tokenizer, documents: Sequence[Document], max_length: int, source: str = "<memory>") -> list[Window]:
    """Documents joined with a blank line, tokenised without special tokens, cut into
    consecutive windows of ``max_length`` tokens (stride = ``max_length``, no overlap); the
    last, shorter window is kept. A tokenizer that adds special tokens of its own (BOS) gets
    them at the start of every window, inside ``max_length``."""
    if max_length < 2:
        raise DataError(f"max_length must be >= 2 for text windows, got {max_length}")
    stream = tokenizer(SEPARATOR.join(d.text for d in documents), add_special_tokens=False)["input_ids"]
    specials = list(tokenizer("", add_special_tokens=True)["input_ids"])
    size = max_length - len(specials)
    if size < 1:
        raise DataError(f"max_length {max_length} leaves no room beside the tokenizer's special tokens {specials}")
    out = []
    for k, start in enumerate(range(0, len(stream), size)):
        body = list(stream[start : start + size])
        where = f"{source} window {k} (stream tokens {start}-{start + len(body) - 1})"
        out.append(Window(tuple(specials + body), k, where, source))
    if not out:
        raise DataError(f"data {source!r}: the corpus tokenises to nothing")
    return out


def load_windows(spec: str, tokenizer, max_length: int) -> list[Window]:
    return windows(tokenizer, read_documents(spec), max_length, source=spec)


def encode_windows(items: Iterable[Window]) -> list[dict[str, list[int]]]:
    return [w.encoded() for w in items]


def are_windows(items: Sequence[Any]) -> bool:
    return bool(items) and isinstance(items[0], Window)


# ----------------------------------------------------------------------------- checks


def refuse_qa_objectives(objective, spec: str, option: str) -> None:
    """Objectives that need a question and an answer span (a refusal for the question, a flipped
    answer) declare ``needs_qa_data = True``; they cannot train on windows of text."""
    parts = getattr(objective, "parts", None) or [objective]
    labels = getattr(objective, "labels", None) or [repr(p) for p in parts]
    for part, label in zip(parts, labels):
        if getattr(part, "needs_qa_data", False):
            raise DataError(
                f"{label} needs question-answer data and cannot train on the text corpus {option} {spec} "
                f"(documents have no answer span); give a QA JSON-lines file or tofu:SPLIT"
            )


def check_disjoint_documents(forget_spec: str, retain_spec: str, *, allow_overlap: bool = False) -> int:
    """Refuse documents that are in both text corpora (same text), as QA splits refuse shared samples."""
    from .qa import shared_verdict

    retained = {d.text: d for d in reversed(read_documents(retain_spec))}
    shared = [(d, retained[d.text]) for d in read_documents(forget_spec) if d.text in retained]
    return shared_verdict(shared, forget_spec, retain_spec, allow_overlap, "document")
