"""CUD, Circuit-guided Unlearning Difficulty (arXiv 2601.09624), as a difficulty scorer.

1. Anchor pool: samples the model knows, *disjoint* from the samples being scored (the
   paper's code chooses anchors on TOFU forget10 and scores the other TOFU rows). Default
   for TOFU data: forget10, or retain90[3200:3600] when the scored samples overlap forget10;
   ``anchor_data=self`` chooses anchors among the scored samples (circular: ``unlearn
   stratify`` then drops them).
2. Anchors: unlearning runs on the pool (objectives x seeds, default the paper's five methods,
   GradDiff, NPO, SimNPO, RMU and UNDIAL, x 3 seeds), each with the CUD code's settings of its
   objective (``anchor_recipe=paper``: full-parameter, its lr, epochs and loss weights,
   :data:`~.anchor_runs.PAPER_ANCHOR_RUNS`) under ``unlearn_options`` and
   ``unlearn_by_objective``, for the whole budget (``stop_prob``: stop early, a deviation); per run, easy = the k highest post-unlearning losses (or loss increases), hard = the k
   lowest; a sample is an objective's anchor when at least half its seeds (2 of 3) chose it,
   a common anchor when at least half the objectives did (3 of the paper's 5; with two
   objectives that is 1, the union); samples in both sets are dropped.
   ``per_objective=true`` scores against each objective's anchors separately.
3. Circuits: EAP-IG score matrix per sample (:mod:`unlearn_plugins.circuits.eap_ig`);
   anchor matrix = mean over the anchor samples (the query left out when it is one of
   them); circuit = greedy top-n with pruning (n = 75) by default.
4. Score: s_E, s_H = similarity of the query circuit to the easy / hard anchor circuits
   (cosine of 0/1 edge masks, the paper's table; ``vector=signed``: of the signed edge scores);
   CUD = d_E / (d_E + d_H), d = max(1 - s, 0); 1 = hard to unlearn.

Anchor runs go through a small interface, :class:`AnchorRunner` (``losses(samples, ...)
-> per-sample answer losses after unlearning``); the default one calls
:func:`unlearn_plugins.training.run.run_unlearning`. Anchor losses and per-sample score
matrices are cached on disk (``$UNLEARN_CACHE_DIR/cud``, :mod:`.cache`), keyed by a fingerprint
of the model weights, the samples and the settings, so a second scoring skips both. What the runs
chose (votes per anchor, seed-to-seed rank agreement, where each run stopped) is in
:attr:`CUDScorer.last_metadata` (``unlearn score`` writes it to ``OUT.meta.json``).

Under ``accelerate launch`` (:meth:`CUDScorer.prepare_shard`) the processes share the anchor
runs and the matrices through that cache, then the main process scores from it.
See docs/methods.md for the reference code and every deliberate deviation.

Modules: :mod:`.anchors` (the pool and the vote), :mod:`.anchor_runs` (the unlearning runs),
:mod:`.cache` (fingerprints and the disk cache), :mod:`.scorer` (:class:`CUDScorer`).
"""

from .anchor_runs import (
    ANCHOR_RECIPES,
    PAPER_ANCHOR_RUNS,
    PAPER_ANCHOR_SCHEDULE,
    AnchorRunner,
    TrainerAnchorRunner,
    anchor_run_options,
    forget_prob_watch,
)
from .anchors import (
    ANCHOR_BY,
    IN_SAMPLE,
    TOFU_ANCHOR_POOLS,
    AnchorError,
    AnchorPool,
    AnchorVote,
    default_anchor_pool,
    select_anchors,
    spearman,
    tofu_folder_of,
    vote_anchors,
)
from .cache import default_cache_dir, model_fingerprint, samples_fingerprint
from .scorer import CUDScorer, first_answer_tokens

__all__ = [
    "CUDScorer",
    "AnchorError",
    "AnchorPool",
    "AnchorRunner",
    "AnchorVote",
    "TrainerAnchorRunner",
    "ANCHOR_BY",
    "ANCHOR_RECIPES",
    "PAPER_ANCHOR_RUNS",
    "PAPER_ANCHOR_SCHEDULE",
    "anchor_run_options",
    "IN_SAMPLE",
    "TOFU_ANCHOR_POOLS",
    "default_anchor_pool",
    "default_cache_dir",
    "first_answer_tokens",
    "forget_prob_watch",
    "model_fingerprint",
    "samples_fingerprint",
    "select_anchors",
    "spearman",
    "tofu_folder_of",
    "vote_anchors",
]
