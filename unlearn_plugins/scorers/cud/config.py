"""The ``cud`` scorer's options, defined once with their help and checks (:class:`CUDConfig`):
the host lists and type-checks them from here (`unlearn plugins`, ``--option``, a study's
[cud.scorer]) and :class:`.scorer.CUDScorer` runs with them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from ...circuits.eap_ig import BASELINES, METRICS, MODES
from ...circuits.similarity import SIMILARITIES, VECTORS
from ...errors import UnlearnError
from ...options import config_field as option
from .anchor_runs import ANCHOR_RECIPES, AnchorRunner
from .anchors import ANCHOR_BY

#: the CUD paper's anchor vote (``find_easy_hard_samples.py``): five unlearning methods, a sample
#: kept when 3 of them choose it (the default min_objectives, ceil(5 / 2))
PAPER_OBJECTIVES = ("grad_diff", "npo", "simnpo", "rmu", "undial")
CIRCUITS = ("greedy", "topn", "threshold")


@dataclass
class CUDConfig:
    """Every option of the ``cud`` difficulty scorer (the package docstring describes the method)."""

    anchor_data: str | Sequence[Any] | None = option(
        None,
        "the anchor pool: a split spec, 'self' (the scored samples, circular) or a list of samples "
        "(default: a TOFU pool disjoint from the scored samples)",
    )
    tofu_dir: str | None = option(None, "local TOFU folder the anchor pool's split specs read")
    objectives: Sequence[str] = option(PAPER_OBJECTIVES, "the anchor runs' unlearning objectives (the paper's five)")
    seeds: Sequence[int] = option((0, 1, 2), "the anchor runs' seeds, per objective")
    k: int | None = option(None, "easy and hard anchors each run chooses (default: from the pool's size)")
    min_votes: int | None = option(None, "seeds that must choose a sample (default: half of them)")
    min_objectives: int | None = option(None, "objectives that must choose a sample (default: half of them)")
    per_objective: bool = option(False, "score against each objective's anchors separately (mean over objectives)")
    anchor_by: str = option(
        "loss",
        "loss: anchors by post-unlearning loss; increase: by the loss increase",
        choices=ANCHOR_BY,
    )
    anchor_recipe: str = option(
        "paper",
        "paper: each objective's settings of the CUD code under unlearn_options; none: unlearn_options only",
        choices=ANCHOR_RECIPES,
    )
    stop_prob: float | None = option(
        None, "stop an anchor run once the pool's mean answer probability falls below this (a deviation)"
    )
    check_steps: int | None = option(None, "optimizer steps between stop_prob checks (default: ~4 per epoch)")
    anchors: dict | None = option(None, "fixed anchors ({easy: [...], hard: [...]}) instead of anchor runs")
    anchor_losses: Sequence[Sequence[float]] | None = option(
        None, "per-run per-sample losses after unlearning, instead of running them"
    )
    runner: AnchorRunner | None = option(None, "the anchor runs' runner (default: the package's Trainer runs)")
    model_spec: str | None = option(None, "the model the anchor runs unlearn (default: the scored one)")
    unlearn_options: dict | None = option(None, "UnlearnConfig options of every anchor run")
    unlearn_by_objective: dict | None = option(None, "{objective: UnlearnConfig options} of one objective's runs")
    similarity: str = option("cosine", "similarity of two circuits", choices=SIMILARITIES)
    vector: str = option(
        "binary", "binary: 0/1 edge masks (the paper's table); signed: the signed edge scores", choices=VECTORS
    )
    circuit: str = option(
        "greedy", "circuit selection: greedy top-n with pruning, top-n, or threshold", choices=CIRCUITS
    )
    n_edges: int = option(75, "edges in a circuit")
    tau: float | None = option(None, "the edge score threshold of circuit=threshold")
    mode: str = option("inputs", "EAP-IG's integration over the inputs or the activations", choices=MODES)
    steps: int = option(5, "EAP-IG integration steps")
    baseline: str = option("zero", "EAP-IG's baseline", choices=BASELINES)
    metric: str = option("prob", "the answer's probability or log-probability, attributed", choices=METRICS)
    max_rows: int = option(20, "rows per EAP-IG batch")
    max_length: int = option(512, "max tokens per sample")
    answer_tokens: int | None = option(
        None, "the metric on the first N answer tokens only (1: a Yes/No answer; default: all)"
    )
    cache: bool = option(True, "keep anchor losses and score matrices on disk ($UNLEARN_CACHE_DIR/cud)")
    cache_dir: str | None = option(None, "that cache's folder")
    progress: bool = option(False, "report the anchor runs and the scoring on stderr")

    def __post_init__(self) -> None:
        """The checks no type says: choices, the options that need each other, lists as lists."""
        for f in dataclasses.fields(self):
            value, allowed = getattr(self, f.name), f.metadata.get("choices")
            if allowed is not None and value not in allowed:
                raise UnlearnError(f"scorer cud: option {f.name}={value!r}; choose one of {', '.join(allowed)}")
        if self.circuit == "threshold" and self.tau is None:
            raise UnlearnError("scorer cud: circuit=threshold needs the option tau")
        if isinstance(self.objectives, str) or isinstance(self.seeds, (str, int)):
            raise UnlearnError('scorer cud: objectives and seeds are lists, e.g. objectives=["npo"] seeds=[0,1,2]')
        for name, values in (("objectives", list(self.objectives)), ("seeds", [int(s) for s in self.seeds])):
            if not values or len(set(values)) != len(values):
                raise UnlearnError(f"scorer cud: option {name}={values} must be a non-empty list without repeats")
        if self.anchor_data is not None and not isinstance(self.anchor_data, (str, list, tuple)):
            raise UnlearnError(
                f"scorer cud: anchor_data must be a split spec, 'self' or a list of samples, "
                f"got {type(self.anchor_data).__name__}"
            )
        if self.per_objective and self.anchors is not None:
            raise UnlearnError(
                "scorer cud: per_objective=true chooses anchors per objective from anchor runs; "
                "it cannot be combined with fixed anchors"
            )
        answer_tokens = self.answer_tokens
        if answer_tokens is not None and (
            isinstance(answer_tokens, bool) or not isinstance(answer_tokens, int) or answer_tokens < 1
        ):
            raise UnlearnError(f"scorer cud: option answer_tokens={answer_tokens!r} must be an integer >= 1 or none")


__all__ = ["CUDConfig", "PAPER_OBJECTIVES", "CIRCUITS"]
