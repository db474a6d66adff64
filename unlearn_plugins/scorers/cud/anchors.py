"""CUD's anchors: the pool of samples the anchor runs unlearn (disjoint from the scored ones by
default), and the two-level vote that turns the runs' per-sample losses into easy and hard
anchors (per objective: a majority of its seeds; then a majority of the objectives)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ...errors import UnlearnError
from ...interfaces import QASample
from .cache import samples_fingerprint


class AnchorError(UnlearnError):
    """Anchor selection left too few easy or hard anchors."""


#: ``anchor_data`` value that chooses anchors among the scored samples (the old, circular way)
IN_SAMPLE = "self"
#: TOFU anchor pools tried in order when ``anchor_data`` is not given: (pool, retain set of its
#: anchor runs); the first pool that shares no sample with the scored data is used
TOFU_ANCHOR_POOLS = (("tofu:forget10", "tofu:retain90"), ("tofu:retain90[3200:3600]", "tofu:retain90[0:3200]"))
ANCHOR_BY = ("loss", "increase")


def qa_key(sample: QASample) -> tuple[str, str]:
    """A sample's identity across files (TOFU has one question asked of two authors)."""
    return (sample.question, sample.answer)


@dataclass
class AnchorPool:
    """The samples the anchor runs unlearn and the anchors are chosen from."""

    samples: list[QASample]
    spec: str
    in_sample: bool = False
    dropped: int = 0  # pool samples left out because they are also scored
    run_options: dict = field(default_factory=dict)  # defaults for the anchor runs (their retain set)

    def describe(self) -> dict:
        return {
            "spec": self.spec,
            "size": len(self.samples),
            "in_sample": self.in_sample,
            "dropped_scored_samples": self.dropped,
            "fingerprint": samples_fingerprint(self.samples),
            "run_defaults": self.run_options,
        }


def tofu_folder_of(samples: Sequence[QASample]) -> Path | None:
    """The TOFU folder the samples were read from (it holds forget10.json and retain90.json), or None."""
    folders = {Path(s.source).parent for s in samples}
    if len(folders) != 1:
        return None
    folder = folders.pop()
    return folder if (folder / "forget10.json").is_file() and (folder / "retain90.json").is_file() else None


def default_anchor_pool(samples: Sequence[QASample]) -> AnchorPool:
    """For samples read from a TOFU folder: the first of :data:`TOFU_ANCHOR_POOLS` that shares
    no sample with them (forget10, the paper's pool; else authors 160-179), with the matching
    retain set for the anchor runs."""
    from ...data.qa import load_split

    folder = tofu_folder_of(samples)
    if folder is None:
        raise UnlearnError(
            "scorer cud: give anchor_data (a split of samples the model knows, disjoint from the "
            "scored ones, e.g. --anchor-data tofu:forget10), or anchor_data=self to choose the anchors "
            "among the scored samples; a default exists only for data read from a TOFU folder"
        )
    scored = {qa_key(s) for s in samples}
    for pool_spec, retain_spec in TOFU_ANCHOR_POOLS:
        pool = load_split(pool_spec, folder)
        if not any(qa_key(p) in scored for p in pool):
            return AnchorPool(pool, pool_spec, run_options={"retain": retain_spec, "tofu_dir": str(folder)})
    raise UnlearnError(
        f"scorer cud: the scored samples overlap every default TOFU anchor pool "
        f"({', '.join(p for p, _ in TOFU_ANCHOR_POOLS)}); pass anchor_data (samples the model knows, "
        f"disjoint from the scored ones) or anchor_data=self"
    )


def as_samples(data: Sequence[Any], where: str) -> list[QASample]:
    """``anchor_data`` given as objects: QASamples, or records with a question and an answer."""
    out = []
    for i, item in enumerate(data):
        if isinstance(item, QASample):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("question"), str) and isinstance(item.get("answer"), str):
            extra = {k: v for k, v in item.items() if k not in ("question", "answer")}
            out.append(QASample(item["question"], item["answer"], i, where, 0, extra))
        else:
            raise UnlearnError(
                f"scorer cud: {where} item {i} is neither a QASample nor a record with 'question' and 'answer'"
            )
    return out


# ----------------------------------------------------------------------------- the vote


def _run_votes(loss_runs: Sequence[Sequence[float]], k: int) -> tuple[list[int], list[int]]:
    """Per sample, how many runs put it among their k highest (easy) / k lowest (hard) values."""
    if not loss_runs:
        raise AnchorError("CUD anchors need at least one unlearning run")
    n = len(loss_runs[0])
    if any(len(run) != n for run in loss_runs):
        raise AnchorError("CUD anchors: every run must give one loss per sample")
    if not 1 <= k <= n:
        raise AnchorError(f"CUD anchors: k = {k} must be between 1 and the number of samples ({n})")
    easy_votes, hard_votes = [0] * n, [0] * n
    for run in loss_runs:
        for i in sorted(range(n), key=lambda i: (-run[i], i))[:k]:  # ties: lower index first
            easy_votes[i] += 1
        for i in sorted(range(n), key=lambda i: (run[i], i))[:k]:
            hard_votes[i] += 1
    return easy_votes, hard_votes


def _keep(easy_votes: Sequence[int], hard_votes: Sequence[int], threshold: int) -> tuple[list[int], list[int]]:
    easy = {i for i, v in enumerate(easy_votes) if v >= threshold}
    hard = {i for i, v in enumerate(hard_votes) if v >= threshold}
    both = easy & hard
    return sorted(easy - both), sorted(hard - both)


def select_anchors(loss_runs: Sequence[Sequence[float]], k: int, min_votes: int | None = None):
    """(easy, hard) sample indices from per-run post-unlearning losses.

    Per run: easy = the k highest losses, hard = the k lowest (ties: lower index first).
    A sample is a common anchor when at least ``min_votes`` runs (default ceil(runs / 2),
    the reference code's threshold) chose it; samples in both sets are removed from both.
    """
    easy_votes, hard_votes = _run_votes(loss_runs, k)
    return _keep(easy_votes, hard_votes, min_votes if min_votes is not None else math.ceil(len(loss_runs) / 2))


@dataclass
class AnchorVote:
    """Anchors chosen by runs grouped by objective: ``easy`` / ``hard`` are the common ones,
    ``by_objective[o]`` each objective's own (majority of its seeds); ``easy_runs[i][o]`` /
    ``hard_runs[i][o]``: how many of objective o's runs chose pool sample i."""

    easy: list[int]
    hard: list[int]
    by_objective: dict[str, tuple[list[int], list[int]]]
    easy_runs: dict[int, dict[str, int]]
    hard_runs: dict[int, dict[str, int]]
    min_votes: dict[str, int]
    min_objectives: int


def vote_anchors(
    runs_by_objective: dict[str, Sequence[Sequence[float]]],
    k: int,
    min_votes: int | None = None,
    min_objectives: int | None = None,
) -> AnchorVote:
    """Two-level vote: per objective, anchors chosen by >= ``min_votes`` of its runs (default
    ceil(seeds / 2): 2 of 3); then common anchors chosen by >= ``min_objectives`` objectives
    (default ceil(objectives / 2)). At each level samples in both sets are dropped from both."""
    if not runs_by_objective:
        raise AnchorError("CUD anchors need at least one objective")
    by_objective, thresholds = {}, {}
    easy_runs: dict[int, dict[str, int]] = {}
    hard_runs: dict[int, dict[str, int]] = {}
    for objective, runs in runs_by_objective.items():
        easy_votes, hard_votes = _run_votes(runs, k)
        thresholds[objective] = min_votes if min_votes is not None else math.ceil(len(runs) / 2)
        by_objective[objective] = _keep(easy_votes, hard_votes, thresholds[objective])
        for i, v in enumerate(easy_votes):
            if v:
                easy_runs.setdefault(i, {})[objective] = v
        for i, v in enumerate(hard_votes):
            if v:
                hard_runs.setdefault(i, {})[objective] = v
    n = len(next(iter(runs_by_objective.values()))[0])
    across = min_objectives if min_objectives is not None else math.ceil(len(runs_by_objective) / 2)
    easy_obj, hard_obj = [0] * n, [0] * n
    for easy, hard in by_objective.values():
        for i in easy:
            easy_obj[i] += 1
        for i in hard:
            hard_obj[i] += 1
    easy, hard = _keep(easy_obj, hard_obj, across)
    return AnchorVote(easy, hard, by_objective, easy_runs, hard_runs, thresholds, across)


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman rank correlation (ties: average ranks); None when either side is constant."""
    import warnings

    from scipy.stats import spearmanr

    if len(a) != len(b) or len(a) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant input: reported as None below
        rho = float(spearmanr(a, b).statistic)
    return None if math.isnan(rho) else rho


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
