"""bench/cud_diagnostics.py: its vectorized similarities and CUD formula agree with the library's
(circuits/similarity.py) row by row, the loss-chosen control anchors, and the whole analysis on a
constructed small graph (records written, the v2 setting reproduced, the table regenerated from
the records alone)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from unlearn_plugins.circuits.circuit import select
from unlearn_plugins.circuits.graph import Graph
from unlearn_plugins.circuits.similarity import circuit_similarity, cud

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def diag():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("cud_diagnostics", ROOT / "bench" / "cud_diagnostics.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _matrices(diag, n_rows: int, seed: int = 0):
    graph = Graph(3, 2)
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randn((n_rows, graph.n_edges), generator=gen)
    return diag.Matrices(range(n_rows), edges, graph)


@pytest.mark.parametrize(
    "similarity, vector", [("cosine", "binary"), ("cosine", "signed"), ("jaccard", "binary"), ("hamming", "binary")]
)
def test_similarities_match_the_library_row_by_row(diag, similarity, vector):
    m = _matrices(diag, 12)
    rows = list(range(8))
    n = 6
    q_masks = m.query_masks(rows, n)
    a_mask, a_scores = m.anchor([8, 9, 10], n)
    got = diag.similarities(q_masks, m.edges[rows], a_mask, a_scores, similarity, vector)
    anchor = select(m.full(m.edges[[8, 9, 10]].mean(0)), m.graph, method="greedy", n=n)
    for i in rows:
        query = select(m.full(m.edges[i]), m.graph, method="greedy", n=n)
        assert got[i].item() == pytest.approx(circuit_similarity(query, anchor, similarity, vector), abs=1e-9)


def test_cud_formula_matches_the_library(diag):
    s_e = torch.tensor([0.2, 1.0, 1.3, 0.9, 0.0], dtype=torch.float64)
    s_h = torch.tensor([0.6, 1.0, 0.1, 1.2, 0.0], dtype=torch.float64)
    assert diag.cud_of(s_e, s_h).tolist() == pytest.approx([cud(a, b) for a, b in zip(s_e.tolist(), s_h.tolist())])


def test_loss_anchors_take_the_least_and_best_known_and_drop_both_sides(diag):
    before = {r: float(v) for r, v in zip(range(10, 20), [5, 1, 4, 2, 9, 0, 7, 3, 8, 6])}
    assert diag.loss_anchors(list(range(10, 20)), before, 2) == {"easy": [14, 18], "hard": [11, 15]}
    six = diag.loss_anchors(list(range(10, 20)), before, 6)  # 6 + 6 of 10: the middle 2 on both sides, dropped
    assert six == {"easy": [14, 16, 18, 19], "hard": [11, 13, 15, 17]}


def test_the_whole_analysis_on_a_small_graph(diag, tmp_path):
    m = _matrices(diag, 76, seed=1)
    query = list(range(60))
    pool_rows = {"A": list(range(60, 68)), "B": list(range(68, 76))}
    anchors = {
        "A012": {"easy": [60, 61], "hard": [62, 63, 64]},
        "A345": {"easy": [60, 65], "hard": [62, 66]},
        "B012": {"easy": [68, 69], "hard": [70]},
    }
    before = {r: float((r * 7) % 13) for r in range(76)}
    recorded = {
        n: {str(r): v for r, v in diag.score(m, query, anchors[n], **diag.BASE)["scores"].items()} for n in anchors
    }
    timing = {"n_matrices": 76, "n_edges": m.graph.n_edges, "eap_ig_seconds": 60.0, "threads": 2}
    timing.update(target_and_load_seconds=60.0, target_fingerprint_gap=0.0)
    records = tmp_path / "records"
    diag.diagnose(
        m,
        query=query,
        pool_rows=pool_rows,
        before=before,
        anchors=anchors,
        recorded=recorded,
        matrices=timing,
        records=records,
        loss_k=(2, 3, 5),
    )
    base = json.loads((records / "baseline.json").read_text())
    assert base["reproduction"]["max_abs_score_difference"] < 1e-12
    assert all(v == pytest.approx(1.0) for v in base["reproduction"]["spearman_with_recorded"].values())
    fixed = json.loads((records / "fixed.json").read_text())["variants"]["all A012 anchors for all"]["agreement"]
    assert all(fixed[p]["spearman"] == pytest.approx(1.0) for p in ("seeds", "pools", "seeds+pools"))
    loo = json.loads((records / "loo.json").read_text())["runs"]
    # every anchor of a side with 2 or more: 2 + 3 + 2 + 2 + 2 (B012's single hard anchor cannot be left out)
    assert len(loo) == 11 and {r["scoring"] for r in loo} == {"A012", "A345", "B012"}
    sizes = json.loads((records / "n_edges.json").read_text())["variants"]
    assert list(sizes) == [str(n) for n in diag.SIZES]
    control = json.loads((records / "loss_k.json").read_text())["variants"]
    # k = 5 of 8: the 2 middle QA on both sides are dropped, 3 a side left
    assert control["k=5 binary"]["anchors"] == {"A": {"easy": 3, "hard": 3}, "B": {"easy": 3, "hard": 3}}
    assert list(control) == [f"k={k} {v}" for k in (2, 3, 5) for v in ("binary", "signed")]
    out = tmp_path / "table.md"
    text = diag.write_report(records, out)
    assert out.read_text() == text == diag.write_report(records, tmp_path / "again.md")
    assert "| v2 setting | binary cosine, 75 edges, voted anchors |" in text
    assert "| similarity | hamming |" in text and "| circuit size (binary) | 400 |" in text
    with pytest.raises(SystemExit, match="no record"):
        diag.write_report(tmp_path / "nothing", out)
