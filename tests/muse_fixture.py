"""A small MUSE-shaped data folder written in code (the MUSE repository's layout, invented text)."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = "river stone market winter garden lamp harbour copper violin meadow signal orchard".split()


def _sentence(i: int, n: int = 14) -> str:
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(n)).capitalize() + "."


def _passage(i: int) -> str:
    return " ".join(_sentence(i + s) for s in range(3))


def write_muse_fixture(root: Path, corpora=("news", "books"), n: int = 4) -> Path:
    """``root/<corpus>/{verbmem,knowmem,privleak}/*.json`` with ``n`` items each; returns root."""
    for corpus in corpora:
        base = root / corpus
        for sub in ("verbmem", "knowmem", "privleak"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        verbmem = [{"prompt": _sentence(i), "gt": _sentence(i + 1) + " " + _sentence(i + 2)} for i in range(n)]
        files = {
            "verbmem/forget.json": verbmem,
            "privleak/forget.json": [{"text": _passage(i)} for i in range(n)],
            "privleak/retain.json": [{"text": _passage(100 + i)} for i in range(n)],
            "privleak/holdout.json": [{"text": _passage(200 + i)} for i in range(n)],
        }
        for part, off in (("forget", 0), ("retain", 50)):
            qa = [
                {"question": f"Where is the {WORDS[(off + i) % 12]}?", "answer": f"By the {WORDS[(off + i + 1) % 12]}"}
                for i in range(n)
            ]
            files[f"knowmem/{part}_qa.json"] = qa
            files[f"knowmem/{part}_qa_icl.json"] = qa[:2]
        for name, data in files.items():
            (base / name).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return root
