"""WMDP's real data, where the user has it: the forget and retain corpora (raw text, as RMU's
reference trains on them) and the multiple-choice questions (the task ``wmdp_local``:
``tasks/wmdp_local/`` reads them with :func:`wmdp_dataset`).

Sources, in order: a local folder with the hub's layout (``[benchmark] wmdp_dir``, else
``$UNLEARN_WMDP_DIR``), else the hub (the ``datasets`` cache, read offline by ``text:hf:``):

=========================  =====================================================  ============================
corpus                     file in the folder (JSON lines, field ``text``)        on the hub
=========================  =====================================================  ============================
``bio-forget-corpus``      ``bio-forget-corpus.jsonl``                            ``cais/wmdp-bio-forget-corpus``
                                                                                  (gated: request access)
``cyber-forget-corpus``    ``cyber-forget-corpus.jsonl``                          ``cais/wmdp-corpora``, config
                                                                                  ``cyber-forget-corpus``
``bio-retain-corpus``      ``bio-retain-corpus.jsonl``                            ``cais/wmdp-corpora``
``cyber-retain-corpus``    ``cyber-retain-corpus.jsonl``                          ``cais/wmdp-corpora``
questions                  ``wmdp-bio.jsonl``, ``wmdp-chem.jsonl``,               ``cais/wmdp``, configs
                           ``wmdp-cyber.jsonl`` (question, choices, answer)       ``wmdp-bio`` ...
=========================  =====================================================  ============================

The folder form is what the WMDP reference code reads (``data/NAME.jsonl``); a hub corpus is
reached as ``text:hf:ID:SPLIT:COLUMN`` once it is in the local datasets cache. The reference
RMU run's retain corpus is WikiText (``text:hf:wikitext...``), which a study may name instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from unlearn_plugins.data.jsonl import iter_jsonl
from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation.local_data import data_folder, read_utf8

FORGET_CORPORA = ("bio-forget-corpus", "cyber-forget-corpus")
RETAIN_CORPORA = ("bio-retain-corpus", "cyber-retain-corpus")
CORPORA = FORGET_CORPORA + RETAIN_CORPORA
QUESTION_FILES = ("wmdp-bio.jsonl", "wmdp-chem.jsonl", "wmdp-cyber.jsonl")
WMDP_CONFIGS = ("wmdp-bio", "wmdp-chem", "wmdp-cyber")

#: where each corpus is on the hub (for the error that says what to download)
HUB = {
    "bio-forget-corpus": "cais/wmdp-bio-forget-corpus (gated: request access on its hub page)",
    "cyber-forget-corpus": "cais/wmdp-corpora (config cyber-forget-corpus)",
    "bio-retain-corpus": "cais/wmdp-corpora (config bio-retain-corpus)",
    "cyber-retain-corpus": "cais/wmdp-corpora (config cyber-retain-corpus)",
}


def wmdp_folder(wmdp_dir: str | os.PathLike | None = None) -> Path | None:
    """The local WMDP folder: ``wmdp_dir``, else ``$UNLEARN_WMDP_DIR``; None when neither is set."""
    chosen = wmdp_dir or os.environ.get("UNLEARN_WMDP_DIR")
    return Path(chosen).expanduser() if chosen else None


def corpus_spec(name: str, wmdp_dir: str | os.PathLike | None = None) -> str:
    """The ``text:`` spec of one WMDP corpus: ``NAME.jsonl`` in the folder, or a spec passed
    through (``text:...``: a hub column or another file). A missing corpus is one line naming
    what to download and where to put it."""
    if name.startswith("text:"):
        return name
    if name not in CORPORA:
        raise DataError(f"WMDP corpus {name!r}: expected one of {', '.join(CORPORA)} or a text: spec")
    folder = wmdp_folder(wmdp_dir)
    if folder is not None and (folder / f"{name}.jsonl").is_file():
        return f"text:{folder / f'{name}.jsonl'}"
    where = f"{folder}" if folder is not None else "a folder named by $UNLEARN_WMDP_DIR (or [benchmark] wmdp_dir)"
    raise DataError(
        f"WMDP corpus {name!r} not found: download it from {HUB[name]} and save it as {name}.jsonl "
        f"(JSON lines with a 'text' field) in {where}"
    )


def corpora(
    forget: tuple[str, ...] | list[str] = FORGET_CORPORA,
    retain: tuple[str, ...] | list[str] = RETAIN_CORPORA,
    wmdp_dir: str | os.PathLike | None = None,
) -> dict[str, list[str]]:
    """{"forget": [spec, ...], "retain": [spec, ...]}: the ``text:`` specs of the chosen corpora
    (:func:`corpus_spec`)."""
    return {
        "forget": [corpus_spec(n, wmdp_dir) for n in forget],
        "retain": [corpus_spec(n, wmdp_dir) for n in retain],
    }


def questions_folder(wmdp_dir: str | os.PathLike | None = None) -> Path:
    """The folder with WMDP's question files (for ``wmdp_local``'s ``wmdp_dir``)."""
    folder = wmdp_folder(wmdp_dir)
    missing = [f for f in QUESTION_FILES if folder is None or not (folder / f).is_file()]
    if missing:
        where = f"{folder}" if folder is not None else "a folder named by $UNLEARN_WMDP_DIR (or [benchmark] wmdp_dir)"
        raise DataError(
            f"WMDP questions {', '.join(missing)} not found: download cais/wmdp (configs wmdp-bio, wmdp-chem, "
            f"wmdp-cyber, split test) and save each as JSON lines (question, choices, answer) in {where}"
        )
    return folder


# ----------------------------------------------------------------------------- wmdp_local


def _json_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) from a JSON array or a JSON-lines file, with line numbers."""
    text = read_utf8(path)
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
    folder = data_folder(
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


__all__ = [
    "corpora",
    "corpus_spec",
    "questions_folder",
    "read_wmdp_json",
    "wmdp_dataset",
    "wmdp_folder",
    "FORGET_CORPORA",
    "RETAIN_CORPORA",
    "WMDP_CONFIGS",
]
