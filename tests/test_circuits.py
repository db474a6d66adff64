"""Circuit selection and pruning, similarities and the CUD formula, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from unlearn_plugins.circuits.circuit import Circuit, greedy, prune, select, threshold, top_n
from unlearn_plugins.circuits.graph import Graph
from unlearn_plugins.circuits.similarity import circuit_similarity, cosine, cud, hamming, jaccard

G = Graph(2, 2)  # sources: input, a0.h0, a0.h1, m0, a1.h0, a1.h1, m1


def scores_from(edges: dict[str, float]):
    """A score matrix with the named edges set, e.g. {'m1->logits': 5.0}."""
    s = torch.zeros(G.n_src, G.n_dst)
    src = {G.src_name(i): i for i in range(G.n_src)}
    dst = {G.dst_name(j): j for j in range(G.n_dst)}
    for name, value in edges.items():
        a, b = name.split("->")
        assert G.edge_mask[src[a], dst[b]], f"{name} is not an edge"
        s[src[a], dst[b]] = value
    return s


def names(mask):
    return {G.edge_name(int(i), int(j)) for i, j in zip(*torch.nonzero(mask, as_tuple=True))}


HAND = {
    "m1->logits": 5.0,
    "a0.h1->logits": -0.5,
    "input->m1": 4.0,
    "a1.h0->m1": 3.0,
    "m0->m1": 0.1,
    "input->a1.h0<q>": 2.0,
    "a0.h0->a1.h0<v>": -2.5,
    "input->a0.h0<k>": 0.2,
    "m0->a1.h1<q>": 9.0,  # high, but a1.h1 never reaches the logits
}


def test_greedy_grows_from_the_logits_and_pruning_drops_dangling_nodes():
    s = scores_from(HAND)
    assert names(greedy(s, G, 3)) == {"m1->logits", "input->m1", "a1.h0->m1"}
    # a1.h0 entered without an incoming edge: pruning removes its edge, so fewer than n remain
    c = select(s, G, n=3)
    assert names(c.mask) == {"m1->logits", "input->m1"} and c.n_edges == 2
    # with budget 5: a1.h0's parents come in by |score| (the negative -2.5 first)
    assert names(greedy(s, G, 5)) == {"m1->logits", "input->m1", "a1.h0->m1", "a0.h0->a1.h0<v>", "input->a1.h0<q>"}
    c5 = select(s, G, n=5)  # a0.h0 has no incoming edge: its edge goes, a1.h0 keeps input->q
    assert names(c5.mask) == {"m1->logits", "input->m1", "a1.h0->m1", "input->a1.h0<q>"}
    # signed ranking: the negative edge is never preferred
    assert "a0.h0->a1.h0<v>" not in names(greedy(s, G, 5, absolute=False))


def test_topn_and_threshold_ignore_connectivity_until_pruned():
    s = scores_from(HAND)
    assert names(top_n(s, G, 3)) == {"m0->a1.h1<q>", "m1->logits", "input->m1"}
    assert names(select(s, G, method="topn", n=3).mask) == {"m1->logits", "input->m1"}
    assert names(select(s, G, method="topn", n=3, prune_nodes=False).mask) == names(top_n(s, G, 3))
    assert names(threshold(s, G, 3.0)) == {"m0->a1.h1<q>", "m1->logits", "input->m1", "a1.h0->m1"}
    assert names(select(s, G, method="threshold", tau=1.9).mask) == {
        "m1->logits",
        "input->m1",
        "a1.h0->m1",
        "input->a1.h0<q>",
    }
    with pytest.raises(ValueError, match="tau"):
        select(s, G, method="threshold")
    with pytest.raises(ValueError, match="method"):
        select(s, G, method="random")
    with pytest.raises(ValueError, match="shape"):
        select(torch.zeros(3, 3), G)


def test_prune_cascades_and_keeps_complete_paths():
    mask = torch.zeros_like(G.edge_mask)
    for name in [
        "input->a0.h0<q>",
        "a0.h0->m0",
        "m0->a1.h1<k>",
        "a1.h1->logits",  # complete path
        "a0.h1->m1",  # m1 has no way out
        "m0->a1.h0<v>",
    ]:  # a1.h0 has no way out
        s = scores_from({name: 1.0})
        mask |= s != 0
    kept = names(prune(mask, G))
    assert kept == {"input->a0.h0<q>", "a0.h0->m0", "m0->a1.h1<k>", "a1.h1->logits"}
    # cutting the first edge makes the whole chain dangle: everything goes
    mask2 = mask.clone()
    mask2[0, G.dst_qkv(0, "q", 0)] = False
    assert names(prune(mask2, G)) == set()


def test_circuit_knows_layers_types_and_vectors():
    s = scores_from(HAND)
    c = select(s, G, n=5)
    table = {r["src"] + "->" + r["dst"]: r for r in c.edge_table()}
    r = table["input->a1.h0<q>"]
    assert (r["src_layer"], r["dst_layer"], r["src_type"], r["dst_type"], r["score"]) == (-1, 1, "input", "q", 2.0)
    r = table["m1->logits"]
    assert (r["src_layer"], r["dst_layer"], r["src_type"], r["dst_type"]) == (1, 2, "mlp", "logits")
    assert c.edges()[0] == (G.src_mlp(1), G.dst_logits)  # highest |score| first
    place = c.placement()
    assert int(place["by_destination"].sum()) == c.n_edges == 4
    assert int(place["by_destination"][2, 4]) == 1  # one edge into the logits
    assert int(place["by_destination"][1, 3]) == 2  # two into m1
    assert int(place["by_source"][0, 0]) == 2  # two from the input
    assert c.depth() == pytest.approx((2 + 1 + 1 + 1) / 4)
    vec = c.vector()
    assert vec.numel() == G.n_edges and float(vec.abs().sum()) == pytest.approx(5 + 4 + 3 + 2)
    assert int(c.edge_vector().sum()) == 4
    nodes = c.nodes()
    assert nodes[0] and nodes[G.src_mlp(1)] and nodes[G.src_head(1, 0)] and nodes[G.n_src]
    assert not nodes[G.src_head(1, 1)]


# ----------------------------------------------------------------------------- similarity + CUD


def test_similarities_against_hand_values():
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(1 / math.sqrt(2))
    assert cosine([1.0, -2.0, 0.0], [-1.0, 2.0, 0.0]) == pytest.approx(-1.0)
    assert cosine([0.0, 0.0], [1.0, 2.0]) == 0.0  # degenerate: a zero vector
    assert jaccard([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(1 / 3)
    assert jaccard([0, 0, 0], [0, 0, 0]) == 1.0  # two empty sets are identical
    assert jaccard([0, 0], [1, 0]) == 0.0
    assert hamming([1, 1, 0, 0], [1, 0, 1, 0]) == pytest.approx(0.5)
    assert hamming([1, 0], [1, 0]) == 1.0
    with pytest.raises(ValueError, match="different sizes"):
        cosine([1.0], [1.0, 2.0])


def test_cud_formula_and_degenerate_cases():
    assert cud(1.0, 0.3) == 0.0  # identical to the easy anchor
    assert cud(0.3, 1.0) == 1.0  # identical to the hard anchor
    assert cud(1.0, 1.0) == 0.5  # both distances 0
    assert cud(0.2, 0.6) == pytest.approx(0.8 / (0.8 + 0.4))
    assert cud(-0.5, 0.5) == pytest.approx(1.5 / 2.0)  # d = 1 - s is not capped at 1
    assert cud(1.0000001, 0.0) == 0.0  # d is clamped at 0
    assert cud(0.0, 0.0) == 0.5
    with pytest.raises(ValueError, match="NaN"):
        cud(float("nan"), 0.5)


def test_hamming_cud_reduces_to_xor_counts():
    q = torch.tensor([1, 1, 0, 0, 1, 0], dtype=torch.bool)
    e = torch.tensor([1, 0, 0, 0, 1, 1], dtype=torch.bool)
    h = torch.tensor([0, 1, 1, 1, 0, 0], dtype=torch.bool)
    qe, qh = int((q ^ e).sum()), int((q ^ h).sum())
    assert cud(hamming(q, e), hamming(q, h)) == pytest.approx(qe / (qe + qh))


def test_circuit_similarity_dispatch():
    s = scores_from(HAND)
    a = select(s, G, n=5)
    b = Circuit(G, a.mask.clone(), -a.scores)
    assert circuit_similarity(a, a) == pytest.approx(1.0)
    # the CUD paper compares circuits as 0/1 edge masks (vectorize_circuit_binary): the same
    # edges are the same circuit whatever their scores; signed scores are the option
    assert circuit_similarity(a, b, "cosine") == pytest.approx(1.0)
    assert circuit_similarity(a, b, "cosine", "signed") == pytest.approx(-1.0)
    c = select(scores_from({"m1->logits": 5.0, "input->m1": 4.0, "m0->m1": 0.1}), G, n=2)
    shared = int((a.edge_vector() & c.edge_vector()).sum())
    assert circuit_similarity(a, c) == pytest.approx(shared / math.sqrt(a.n_edges * c.n_edges))
    assert circuit_similarity(a, b, "jaccard") == 1.0 and circuit_similarity(a, b, "hamming") == 1.0
    with pytest.raises(ValueError, match="similarity"):
        circuit_similarity(a, b, "euclid")
    with pytest.raises(ValueError, match="vector"):
        circuit_similarity(a, b, "cosine", "weighted")
