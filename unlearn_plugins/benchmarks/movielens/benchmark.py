"""The MovieLens unlearning benchmark: prompts of every part, as files the rest of the
toolkit reads unchanged.

Each interaction with at least ``min_history`` (3) earlier ratings becomes one sample: a
:class:`~unlearn_plugins.interfaces.QASample` whose question is the prompt over the user's
last K ratings before it and whose answer is "Yes" or "No" (its extra fields: user_id,
item_id, rating, timestamp, part, label, forgotten). The parts, written by
:meth:`RecBenchmark.write` as TOFU-format JSON-lines files (so ``unlearn finetune --data``,
``unlearn run --forget/--retain``, ``unlearn score --data`` and the lm-eval tasks take them)::

    train.json          training prompts of every user (the target model's data)
    train_retain.json   training prompts of the retained users (the retrained model's data)
    train_forget.json   training prompts of the forgotten users (the forget request)
    valid.json          validation prompts of every user
    test_retain.json    test prompts of the retained users   (lm-eval: movielens_rec)
    test_forget.json    test prompts of the forgotten users
    anchor_pool.json    training prompts of CUD's anchor users (retained users, disjoint
                        from the forget request)
    anchor_retain.json  train_retain.json without the anchor users (the anchor runs' retain set)
    benchmark.json      settings, data source, user lists, counts (written last)

Budget knobs (``users``, ``max_train_per_user``, ``max_eval_per_user``) keep a seeded sample
of users and each user's most recent prompts; the defaults keep everything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unlearn_plugins.errors import DataError
from unlearn_plugins.interfaces import QASample

from .forget import DEFAULT_FORGET_FRACTION, choose_anchor_users, choose_forget_users
from .prompts import DEFAULT_HISTORY, answer_for, build_prompt, liked
from .split import DEFAULT_TEST_FRACTION, DEFAULT_VALID_FRACTION, chronological_split, user_timelines

FILES = {
    "train": "train.json",
    "train_retain": "train_retain.json",
    "train_forget": "train_forget.json",
    "valid": "valid.json",
    "test_retain": "test_retain.json",
    "test_forget": "test_forget.json",
    "anchor_pool": "anchor_pool.json",
    "anchor_retain": "anchor_retain.json",
}
INFO_FILE = "benchmark.json"
FORMAT = "unlearn-plugins/movielens-benchmark"
#: an interaction becomes a prompt once the user has rated this many movies before it: with
#: fewer, two users' prompts coincide (on MovieLens-100K, 33 forget prompts with one or two
#: earlier ratings equal retained users' prompts, question and answer; none from 3 on)
DEFAULT_MIN_HISTORY = 3


@dataclass(frozen=True)
class BenchmarkSettings:
    """How the benchmark is cut. ``anchor_users`` None: as many anchor users as forgotten ones."""

    history: int = DEFAULT_HISTORY
    min_history: int = DEFAULT_MIN_HISTORY
    valid_fraction: float = DEFAULT_VALID_FRACTION
    test_fraction: float = DEFAULT_TEST_FRACTION
    forget_fraction: float = DEFAULT_FORGET_FRACTION
    seed: int = 0
    users: int | None = None
    max_train_per_user: int | None = None
    max_eval_per_user: int | None = None
    anchor_users: int | None = None

    def check(self) -> None:
        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise DataError(f"benchmark setting {name!r} must be {expected}, got {getattr(self, name)!r}")

        need(self.history >= 1, "history", "an integer >= 1")
        need(1 <= self.min_history <= self.history, "min_history", "between 1 and history")
        for name in ("users", "max_train_per_user", "max_eval_per_user", "anchor_users"):
            value = getattr(self, name)
            need(value is None or (isinstance(value, int) and value >= 1), name, "None or an integer >= 1")
        need(self.users is None or self.users >= 3, "users", "None or at least 3 (forgotten, retained, anchor)")


@dataclass
class RecBenchmark:
    """The samples of each part (see the module docstring) and how they were made."""

    settings: BenchmarkSettings
    source: dict[str, Any]
    users: list[int]
    forget_users: list[int]
    anchor_users: list[int]
    parts: dict[str, list[QASample]] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": 1,
            "settings": dataclasses.asdict(self.settings),
            "source": self.source,
            "users": self.users,
            "forget_users": self.forget_users,
            "anchor_users": self.anchor_users,
            "counts": {name: len(items) for name, items in self.parts.items()},
            "files": FILES,
        }

    def write(self, folder: str | os.PathLike) -> Path:
        """Every part as a JSON-lines file (temp-then-rename), then benchmark.json."""
        from unlearn_plugins.files import write_json, write_jsonl

        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise DataError(f"{folder}: is a file, not a folder")
        for name, file in FILES.items():
            write_jsonl(folder / file, [s.to_record() for s in self.parts[name]])
        write_json(folder / INFO_FILE, self.info())
        return folder


def _sample(prompt: str, rating, part: str, forgotten: bool, index: int) -> QASample:
    extra = {
        "user_id": rating.user_id,
        "item_id": rating.item_id,
        "rating": rating.rating,
        "timestamp": rating.timestamp,
        "part": part,
        "label": int(liked(rating.rating)),
        "forgotten": forgotten,
    }
    return QASample(prompt, answer_for(rating.rating), index, "<movielens>", 0, extra)


def build_benchmark(movielens, settings: BenchmarkSettings | None = None) -> RecBenchmark:
    """Split, sample, choose the forget request and the anchor users, build every prompt."""
    settings = settings or BenchmarkSettings()
    settings.check()
    timelines = user_timelines(movielens.ratings)
    users = list(timelines)
    if settings.users is not None and settings.users < len(users):
        users = sorted(random.Random(f"users:{settings.seed}").sample(users, settings.users))
    forget_users = choose_forget_users(users, settings.forget_fraction, settings.seed)
    n_anchor = settings.anchor_users if settings.anchor_users is not None else len(forget_users)
    anchor_users = choose_anchor_users(users, forget_users, n_anchor, settings.seed)
    forgotten, anchors = set(forget_users), set(anchor_users)

    by_part: dict[str, list[tuple[int, str, Any]]] = {"train": [], "valid": [], "test": []}
    for user in users:
        timeline = timelines[user]
        parts = chronological_split(timeline, settings.valid_fraction, settings.test_fraction)
        rows: dict[str, list[tuple[int, str, Any]]] = {"train": [], "valid": [], "test": []}
        for t, (rating, part) in enumerate(zip(timeline, parts)):
            if t < settings.min_history:
                continue
            history = [(movielens.movies[r.item_id], r.rating) for r in timeline[max(0, t - settings.history) : t]]
            rows[part].append((user, build_prompt(history, movielens.movies[rating.item_id]), rating))
        caps = {
            "train": settings.max_train_per_user,
            "valid": settings.max_eval_per_user,
            "test": settings.max_eval_per_user,
        }
        for part, items in rows.items():
            cap = caps[part]
            by_part[part].extend(items[-cap:] if cap else items)  # the most recent ones

    def collect(part: str, keep) -> list[QASample]:
        out = []
        for user, prompt, rating in by_part[part]:
            if keep(user):
                out.append(_sample(prompt, rating, part, user in forgotten, len(out)))
        return out

    parts = {
        "train": collect("train", lambda u: True),
        "train_retain": collect("train", lambda u: u not in forgotten),
        "train_forget": collect("train", lambda u: u in forgotten),
        "valid": collect("valid", lambda u: True),
        "test_retain": collect("test", lambda u: u not in forgotten),
        "test_forget": collect("test", lambda u: u in forgotten),
        "anchor_pool": collect("train", lambda u: u in anchors),
        "anchor_retain": collect("train", lambda u: u not in forgotten and u not in anchors),
    }
    retained = {(s.question, s.answer) for s in parts["train_retain"]}
    shared = sum((s.question, s.answer) in retained for s in parts["train_forget"])
    if shared:
        import warnings

        from unlearn_plugins.data.qa import DataWarning

        warnings.warn(
            f"{shared} forget prompt(s) equal a retained user's prompt (question and answer): `unlearn run` "
            f"refuses such overlaps; raise min_history (now {settings.min_history})",
            DataWarning,
            stacklevel=2,
        )
    for name in ("train_forget", "test_retain", "test_forget", "anchor_pool"):
        if not parts[name]:
            raise DataError(
                f"benchmark part {name!r} is empty: too few users or ratings for these settings "
                f"({dataclasses.asdict(settings)})"
            )
    return RecBenchmark(settings, movielens.describe(), users, forget_users, anchor_users, parts)


def read_info(folder: str | os.PathLike) -> dict[str, Any]:
    """benchmark.json of a benchmark folder, checked."""
    path = Path(folder) / INFO_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(
            f"{path}: not found; {folder} is not a MovieLens benchmark folder (write one with "
            f"unlearn_plugins.benchmarks.movielens.benchmark.build_benchmark(...).write(folder))"
        ) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise DataError(f"{path}: field 'format' must be {FORMAT!r}")
    return info


def part_path(folder: str | os.PathLike, part: str) -> Path:
    """The file of one part (checked against the known part names)."""
    if part not in FILES:
        raise DataError(f"unknown benchmark part {part!r}; parts: {', '.join(FILES)}")
    return Path(folder) / FILES[part]


def load_part(folder: str | os.PathLike, part: str) -> list[QASample]:
    """The samples of one part of a written benchmark."""
    from unlearn_plugins.data.qa import read_jsonl

    read_info(folder)
    return read_jsonl(part_path(folder, part))
