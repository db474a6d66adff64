"""CUD's defaults are the paper's: circuits compared as 0/1 edge masks, anchors voted by five
unlearning methods with threshold 3 (docs/methods.md, "cud")."""

from __future__ import annotations

import pytest

from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.scorers.cud import CUDScorer
from unlearn_plugins.scorers.cud.anchors import vote_anchors
from unlearn_plugins.scorers.cud.scorer import PAPER_OBJECTIVES


def test_cud_defaults_are_the_papers_vote_and_binary_circuits():
    scorer = CUDScorer(runner=object())
    assert scorer.vector == "binary"
    assert tuple(scorer.objectives) == ("grad_diff", "npo", "simnpo", "rmu", "undial") == PAPER_OBJECTIVES
    assert CUDScorer(runner=object(), vector="signed").vector == "signed"
    with pytest.raises(UnlearnError, match="vector"):
        CUDScorer(runner=object(), vector="weighted")


def test_five_objective_vote_keeps_what_three_choose():
    # 4 samples, k = 1: per objective (one run each) the highest loss is easy, the lowest hard
    runs = {
        "grad_diff": [[0.9, 0.1, 0.5, 0.4]],  # easy 0, hard 1
        "npo": [[0.9, 0.5, 0.1, 0.4]],  # easy 0, hard 2
        "simnpo": [[0.1, 0.9, 0.5, 0.4]],  # easy 1, hard 0
        "rmu": [[0.9, 0.1, 0.5, 0.4]],  # easy 0, hard 1
        "undial": [[0.5, 0.4, 0.9, 0.1]],  # easy 2, hard 3
    }
    vote = vote_anchors(runs, k=1)
    assert vote.min_objectives == 3
    assert (sorted(vote.easy), sorted(vote.hard)) == ([0], [])  # sample 0 easy 3 times; no hard by 3
    two = vote_anchors({o: runs[o] for o in ("grad_diff", "npo")}, k=1)
    assert two.min_objectives == 1  # the two-objective vote is the union
    assert (sorted(two.easy), sorted(two.hard)) == ([0], [1, 2])
