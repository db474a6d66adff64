"""WMDP's real data, where the user has it: the forget and retain corpora (raw text, as RMU's
reference trains on them) and the multiple-choice questions (tasks/wmdp_local).

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

import os
from pathlib import Path

from unlearn_plugins.errors import DataError

FORGET_CORPORA = ("bio-forget-corpus", "cyber-forget-corpus")
RETAIN_CORPORA = ("bio-retain-corpus", "cyber-retain-corpus")
CORPORA = FORGET_CORPORA + RETAIN_CORPORA
QUESTION_FILES = ("wmdp-bio.jsonl", "wmdp-chem.jsonl", "wmdp-cyber.jsonl")

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
    """The folder with WMDP's question files (for tasks/wmdp_local's ``wmdp_dir``)."""
    folder = wmdp_folder(wmdp_dir)
    missing = [f for f in QUESTION_FILES if folder is None or not (folder / f).is_file()]
    if missing:
        where = f"{folder}" if folder is not None else "a folder named by $UNLEARN_WMDP_DIR (or [benchmark] wmdp_dir)"
        raise DataError(
            f"WMDP questions {', '.join(missing)} not found: download cais/wmdp (configs wmdp-bio, wmdp-chem, "
            f"wmdp-cyber, split test) and save each as JSON lines (question, choices, answer) in {where}"
        )
    return folder


__all__ = ["corpora", "corpus_spec", "questions_folder", "wmdp_folder", "FORGET_CORPORA", "RETAIN_CORPORA"]
