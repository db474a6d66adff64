"""Similarity of circuits and the CUD formula (pure functions, tested by hand).

- cosine: of the circuits' 0/1 edge masks over the real edges (``vector="binary"``, default: the
  CUD paper's table, ``vectorize_circuit_binary``), or of the signed masked score vectors
  (``vector="signed"``, the repository's later ``vectorize_circuit``); 0 when either is ~0;
- jaccard: |A and B| / |A or B| of the edge sets (1 for two empty sets);
- hamming: 1 - |A xor B| / n over the n real edges, so that with d = 1 - s,
  CUD = |Q xor E| / (|Q xor E| + |Q xor H|).

CUD = d_E / (d_E + d_H) with d = max(1 - s, 0); 0.5 when both distances are 0.
Range [0, 1]: 0 = like the easy anchors, 1 = like the hard anchors (hard to unlearn).
"""

from __future__ import annotations

import math

SIMILARITIES = ("cosine", "jaccard", "hamming")
#: what cosine compares: 0/1 edge masks (the paper's scores) or the signed edge scores in the circuit
VECTORS = ("binary", "signed")


def cosine(a, b, eps: float = 1e-12) -> float:
    import torch

    a = torch.as_tensor(a).reshape(-1).double()
    b = torch.as_tensor(b).reshape(-1).double()
    if a.shape != b.shape:
        raise ValueError(f"cosine: vectors of different sizes {a.numel()} and {b.numel()}")
    na, nb = a.norm(), b.norm()
    if na < eps or nb < eps:
        return 0.0
    return float(torch.dot(a, b) / (na * nb))


def jaccard(a, b) -> float:
    import torch

    a = torch.as_tensor(a).reshape(-1).bool()
    b = torch.as_tensor(b).reshape(-1).bool()
    if a.shape != b.shape:
        raise ValueError(f"jaccard: masks of different sizes {a.numel()} and {b.numel()}")
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def hamming(a, b) -> float:
    import torch

    a = torch.as_tensor(a).reshape(-1).bool()
    b = torch.as_tensor(b).reshape(-1).bool()
    if a.shape != b.shape:
        raise ValueError(f"hamming: masks of different sizes {a.numel()} and {b.numel()}")
    if a.numel() == 0:
        return 1.0
    return 1.0 - int((a ^ b).sum()) / a.numel()


def circuit_similarity(query, anchor, metric: str = "cosine", vector: str = "binary") -> float:
    """Similarity of two :class:`~unlearn_plugins.circuits.circuit.Circuit` objects; ``vector``
    (cosine only): ``binary`` edge masks or ``signed`` edge scores."""
    if metric == "cosine":
        if vector not in VECTORS:
            raise ValueError(f"vector {vector!r}: choose one of {', '.join(VECTORS)}")
        if vector == "binary":
            return cosine(query.edge_vector().float(), anchor.edge_vector().float())
        return cosine(query.vector(), anchor.vector())
    if metric == "jaccard":
        return jaccard(query.edge_vector(), anchor.edge_vector())
    if metric == "hamming":
        return hamming(query.edge_vector(), anchor.edge_vector())
    raise ValueError(f"similarity {metric!r}: choose one of {', '.join(SIMILARITIES)}")


def cud(s_easy: float, s_hard: float) -> float:
    """CUD from the similarities to the easy and hard anchor circuits."""
    if math.isnan(s_easy) or math.isnan(s_hard):
        raise ValueError(f"CUD of NaN similarities ({s_easy}, {s_hard})")
    d_easy = max(1.0 - s_easy, 0.0)
    d_hard = max(1.0 - s_hard, 0.0)
    total = d_easy + d_hard
    return 0.5 if total == 0 else d_easy / total
