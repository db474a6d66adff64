"""A study's MovieLens benchmark source (``[benchmark] source = "movielens"``): recommendation
unlearning on an LLM recommender, as the MovieLens demo (``unlearn demo --benchmark movielens``)
runs it.

The benchmark is MovieLens (``movielens_dir``, else ``$UNLEARN_MOVIELENS_DIR``, else recbole's
ML-100K) cut to ``users`` seeded users, each with their ``train_per_user`` latest training and
``eval_per_user`` latest valid / test prompts (``history`` rated movies shown in a prompt); a
``forget_fraction`` of them asks to be forgotten, and ``anchor_users`` retained users' prompts are
CUD's anchor pool (:func:`unlearn_plugins.benchmarks.movielens.benchmark.build_benchmark`). It is a
cached stage of its own, keyed by the MovieLens files' content and these settings; the folder
holds every part (``train``, ``train_retain``, ``train_forget``, ``test_retain``, ...,
``anchor_pool``, ``anchor_retain``) and ``benchmark.json``.

This module reads the ``[benchmark]`` table of such a study (:func:`read`; no study import:
``spec`` reads it through this function) and builds the stage (:func:`build`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

SOURCE = "movielens"
#: the keys of [benchmark] with source = "movielens"
KEYS = (
    "source",
    "movielens_dir",
    "users",
    "train_per_user",
    "eval_per_user",
    "history",
    "forget_fraction",
    "anchor_users",
    "seed",
)
#: the lm-eval tasks of a MovieLens study (test AUC of the retained users; forget AUC and JSD to
#: the retrain model of the forget users' training prompts)
TASKS = ("movielens_rec", "movielens_rec_forget")
FORGET_TASK = "movielens_rec_forget"


@dataclass(frozen=True)
class MovieLensSource:
    """How the MovieLens benchmark is cut (``movielens_dir`` None: $UNLEARN_MOVIELENS_DIR, else
    recbole's ML-100K)."""

    users: int
    train_per_user: int
    eval_per_user: int
    history: int
    forget_fraction: float
    anchor_users: int
    movielens_dir: str | None = None
    seed: int = 0

    @property
    def forget_users(self) -> int:
        """How many users the forget request holds (as choose_forget_users counts them)."""
        return forget_count(self.users, self.forget_fraction)

    def settings(self):
        from ..benchmark import BenchmarkSettings

        return BenchmarkSettings(
            history=self.history,
            forget_fraction=self.forget_fraction,
            seed=self.seed,
            users=self.users,
            max_train_per_user=self.train_per_user,
            max_eval_per_user=self.eval_per_user,
            anchor_users=self.anchor_users,
        )

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def forget_count(users: int, fraction: float) -> int:
    """round(fraction x users) users, at least one and never all (choose_forget_users)."""
    return min(max(1, int(round(fraction * users))), users - 1)


def problems(source: MovieLensSource, *, strata: bool) -> list[tuple[str, str]]:
    """(key, what is wrong) of sizes the stages cannot work with, checked before any of them runs;
    ``strata``: CUD-easy and CUD-hard users are asked for (two forget users at least)."""
    out = []
    if source.users < 4:
        out.append(("users", f"{source.users}: needs at least 4 users (forgotten, retained, anchor)"))
        return out
    if not 0 < source.forget_fraction < 1:
        out.append(("forget_fraction", f"{source.forget_fraction}: must be between 0 and 1 (exclusive)"))
        return out
    forget = source.forget_users
    if strata and forget < 2:
        out.append(
            (
                "forget_fraction",
                f"{source.forget_fraction} of {source.users} users forgets {forget} user; CUD-easy vs "
                f"CUD-hard needs at least 2 forgotten users",
            )
        )
    retained = source.users - forget
    if retained - source.anchor_users < 1:
        out.append(
            (
                "anchor_users",
                f"{forget} forgotten and {source.anchor_users} CUD anchor user(s) of {source.users} leave no "
                f"retained user to train on",
            )
        )
    if source.anchor_users * source.train_per_user < 4:
        out.append(
            (
                "train_per_user",
                f"CUD's anchor pool ({source.anchor_users} user(s) x {source.train_per_user} prompts) needs at "
                f"least 4 prompts",
            )
        )
    return out


def too_many_users(users: int, directory: str | None) -> str | None:
    """What is wrong when ``users`` asks for more users than the MovieLens data in ``directory``
    has (the benchmark would take them all, and its forget request would not be the one
    planned), else None. Reads the ratings (a second or so for ML-100K)."""
    from ..data import load_movielens

    movielens = load_movielens(directory)
    have = len(movielens.users)
    if users > have:
        return f"{users} users asked, but the MovieLens data in {movielens.folder} has {have}"
    return None


def read(reader, values: dict, *, strata: bool) -> MovieLensSource:
    """``[benchmark]`` of a MovieLens study, checked (``reader``: the study file's reader, whose
    errors name the file, the table and the key)."""
    reader.keys("benchmark", values, KEYS)
    directory = reader.get("benchmark", values, "movielens_dir", "str")
    users = reader.get("benchmark", values, "users", "int", required=True, minimum=4)
    forget_fraction = values.get("forget_fraction", 0.1)
    if isinstance(forget_fraction, bool) or not isinstance(forget_fraction, (int, float)):
        raise reader.error("benchmark", "forget_fraction", f"must be a number, got {forget_fraction!r}")
    if not 0 < forget_fraction < 1:
        raise reader.error(
            "benchmark", "forget_fraction", f"must be between 0 and 1 (exclusive), got {forget_fraction}"
        )
    source = MovieLensSource(
        users=users,
        train_per_user=reader.get("benchmark", values, "train_per_user", "int", required=True, minimum=1),
        eval_per_user=reader.get("benchmark", values, "eval_per_user", "int", required=True, minimum=1),
        history=reader.get("benchmark", values, "history", "int", 10, minimum=3),
        forget_fraction=float(forget_fraction),
        anchor_users=reader.get("benchmark", values, "anchor_users", "int", 1, minimum=1),
        movielens_dir=str(reader.relative(directory)) if directory else None,
        seed=reader.get("benchmark", values, "seed", "int", 0, minimum=0),
    )
    for key, what in problems(source, strata=strata):
        raise reader.error("benchmark", key, what)
    return source


def fingerprint(source: MovieLensSource) -> str:
    from ..data import fingerprint as files_fingerprint

    return files_fingerprint(source.movielens_dir)


def build(tmp: Path, p: dict) -> None:
    """The benchmark folder (``p``: the stage's parameters, :meth:`MovieLensSource.describe`)."""
    from ..benchmark import build_benchmark
    from ..data import load_movielens

    source = MovieLensSource(**p)
    build_benchmark(load_movielens(source.movielens_dir), source.settings()).write(tmp)


def content(folder: Path) -> dict[str, str]:
    """The content digest of each part of a benchmark folder (the later stages' keys)."""
    from unlearn_plugins.files import file_digest

    from ..benchmark import FILES

    return {part: file_digest(Path(folder) / name) for part, name in FILES.items()}


__all__ = ["MovieLensSource", "read", "build", "fingerprint", "content", "problems", "forget_count", "TASKS"]
