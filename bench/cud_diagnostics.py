"""CUD reliability diagnostics on cud_stratification_v2's setting: where is the test-retest
agreement of CUD's scores lost? No new anchor runs: every variant rescores the same 560 query
QA from EAP-IG matrices computed once, with the anchors the three v2 scorings chose (A012, A345,
B012, ``bench/results/cud_stratification_v2/scoring-*.json``) or with anchors chosen without
any unlearning run (the pool's pre-unlearning loss, a control).

What is varied, one factor at a time from v2's setting (binary cosine, greedy 75-edge circuits,
the anchor circuit of the mean matrix of the voted anchors):

- ``similarity``: cosine, Jaccard, Hamming (the paper's robustness check);
- ``vector``: binary edge masks vs signed edge scores (cosine);
- ``n_edges``: circuit sizes 50, 75, 100, 200, 400 (query and anchor circuits alike);
- ``loo``: leave one anchor out, every anchor of every scoring in turn (how much one anchor
  moves the scores: Spearman of each leave-one-out scoring with the full one, and the
  test-retest Spearman of the variants);
- ``fixed``: the A012 anchors for all three scorings (the query circuits are identical, so
  Spearman 1 by construction, shown as the check that the disagreement is all anchors) and the
  anchors of one scoring with those of another's easy or hard side (which side carries it);
- ``loss_k``: anchors = the k lowest-loss (easy) and k highest-loss (hard) pool QA before
  unlearning, k = 10, 25, 50 (pool A vs pool B: a test-retest of anchors chosen without any
  anchor run, and with as many anchors as a pool allows).

Test-retest: Spearman of the 560 scores between the scorings A012 vs A345 (same pool, other
anchor-run seeds), A012 vs B012 (another pool) and A345 vs B012, and the top-40 hard / easy
overlaps (v2's declared measures), per variant.

Running::

    UNLEARN_TOFU_DIR=... OMP_NUM_THREADS=2 python bench/cud_diagnostics.py matrices  # target + EAP-IG
    OMP_NUM_THREADS=1 python bench/cud_diagnostics.py run      # records, then the table
    python bench/cud_diagnostics.py report                     # the table from the records alone

``matrices`` rebuilds v2's target (bit-identical with 2 threads; checked against v2's recorded
fingerprint) in v2's cache layout (``$UNLEARN_CACHE_DIR/study/cud_stratification_v2``) and
computes the EAP-IG matrices of the 560 query QA and the 160 pool QA with v2's settings into
CUD's matrix cache there, then one file of all 720 edge vectors (``diagnostics/edges.pt``).
``run`` writes one small JSON record per variant family under
``bench/results/cud_stratification_v3/diagnostics/`` and the table
``docs/study/cud_stratification_v3_diagnostics.md``.

Cost, measured on a 2-core AMD EPYC without AMX or AVX-512 (AVX2 only), shared with other jobs:
EAP-IG (inputs mode, 5 steps, fp32, 2 threads) takes about 11 CPU-seconds per QA (25 s wall
under the load), so the 720 matrices are about 2.2 CPU-hours; v2's target trains its LoRA over
frozen bf16 base weights, and a bf16 matmul there is about 50 times slower than fp32 (a
256 x 576 by 576 x 1536 product: 15 ms fp32, 725 ms bf16), so the bit-identical rebuild needs a
CPU with bf16 units (AMX, as v2's machine had). A GPU rebuild trains another target: it misses
v2's fingerprint unless shown otherwise (``--accept-other-target`` goes on and records the gap).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cud_stratification_v2 as v2  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "results" / "cud_stratification_v3" / "diagnostics"
V2_RECORDS = v2.RECORDS
REPORT = ROOT / "docs" / "study" / "cud_stratification_v3_diagnostics.md"
SCORINGS = ("A012", "A345", "B012")
PAIRS = (("A012", "A345"), ("A012", "B012"), ("A345", "B012"))
PAIR_NAMES = {("A012", "A345"): "seeds", ("A012", "B012"): "pools", ("A345", "B012"): "seeds+pools"}
TOP_K = 40


def v2_records() -> Path:
    """v2's finished records, read only (packed or loose)."""
    from unlearn_plugins.study.records import unpacked

    return unpacked(V2_RECORDS)


def log(msg: str, started: float = time.perf_counter()) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} {time.perf_counter() - started:7.0f} s] {msg}", file=sys.stderr, flush=True)


# ============================================================================= the matrices


def v2_settings() -> dict:
    """The EAP-IG and circuit settings of v2's scorings (as recorded in scoring-A012.json)."""
    rec = json.loads((v2_records() / "scoring-A012.json").read_text())
    s = rec["settings"]
    return {k: s[k] for k in ("mode", "steps", "baseline", "metric", "max_rows", "max_length", "n_edges")}


def fingerprint_gap(folder: Path) -> float:
    """Max |held-out NLL difference| of the target in ``folder`` from v2's recorded fingerprint."""
    now = json.loads((folder / "fingerprint.json").read_text())["heldout_nll"]
    recorded = json.loads((v2_records() / "target_fingerprint.json").read_text())["heldout_nll"]
    return max(abs(a - b) for a, b in zip(now, recorded))


def compute_matrices(cache: Path | None, device: str | None, accept_other_target: bool = False) -> Path:
    """Rebuild v2's target (checked against its fingerprint), compute (or read from CUD's cache)
    the EAP-IG matrices of the query and pool QA, and save their real-edge vectors together.
    ``accept_other_target``: go on with a target that misses the fingerprint (another CPU or a
    GPU trains it otherwise), recording the gap; the reproduction of v2's scores then says how far."""
    import torch

    from unlearn_plugins.models import cache_dir
    from unlearn_plugins.scorers.cud import CUDScorer, model_fingerprint

    cache = cache or cache_dir() / "study" / "cud_stratification_v2"
    started = time.perf_counter()
    study = v2.Phase1(v2.StudyConfig(device=device), cache, v2_records())  # reads v2's records
    log(f"target: {cache} (rebuilt when missing) ...")
    folder = study.stages.folder("target", "target", study.digest(study.key))
    try:
        study.target()
    except SystemExit:
        if not accept_other_target or not (folder / "fingerprint.json").is_file():
            raise
        study._target = str(folder / "run" / "merged")
    gap = fingerprint_gap(folder)
    log(f"target ready ({time.perf_counter() - started:.0f} s; max |held-out NLL - v2's| {gap:.1e})")
    model, tok = study.model()
    settings = v2_settings()
    scorer = CUDScorer(
        anchor_data="self",
        runner=object(),  # never used: matrices only
        steps=settings["steps"],
        mode=settings["mode"],
        baseline=settings["baseline"],
        metric=settings["metric"],
        max_rows=settings["max_rows"],
        max_length=settings["max_length"],
        n_edges=settings["n_edges"],
        cache_dir=str(cache / "cud"),
        progress=True,
    )
    rows = study.rows["query"] + study.rows["anchor_A"] + study.rows["anchor_B"]
    fp = model_fingerprint(model)
    t0 = time.perf_counter()
    matrices, graph = scorer.score_matrices([study.samples[i] for i in rows], model=model, tokenizer=tok, model_fp=fp)
    eap_seconds = time.perf_counter() - t0
    edges = matrices[:, graph.edge_mask].contiguous()
    out = cache / "diagnostics" / "edges.pt"
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rows": rows, "edges": edges, "graph": graph.to_dict(), "model_fp": fp}, out)
    timing = {
        "target_and_load_seconds": round(t0 - started, 1),
        "eap_ig_seconds": round(eap_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
        "threads": torch.get_num_threads(),
        "n_matrices": len(rows),
        "n_edges": int(edges.shape[1]),
        "target_fingerprint_gap": gap,
        "device": str(next(model.parameters()).device),
    }
    (cache / "diagnostics" / "timing.json").write_text(json.dumps(timing, indent=1))
    log(f"matrices: {out} {tuple(edges.shape)}; {json.dumps(timing)}")
    return out


# ============================================================================= the analysis
# (pure functions on tensors: tests/test_cud_diagnostics.py checks them against the library's
# circuit_similarity / cud on constructed inputs)

SIZES = (50, 75, 100, 200, 400)
LOSS_K = (10, 25, 40, 50)
BASE = {"similarity": "cosine", "vector": "binary", "n_edges": 75}


class Matrices:
    """The 720 EAP-IG edge vectors (query, then pools A and B) and their graph; circuits of
    single rows are computed once per size."""

    def __init__(self, rows, edges, graph):
        self.rows, self.edges, self.graph = list(rows), edges, graph
        self.at = {r: i for i, r in enumerate(self.rows)}
        self._masks: dict[int, object] = {}

    @classmethod
    def load(cls, path: Path) -> "Matrices":
        import torch

        from unlearn_plugins.circuits.graph import Graph

        saved = torch.load(path, map_location="cpu", weights_only=False)
        return cls(saved["rows"], saved["edges"].float(), Graph(**saved["graph"]))

    def full(self, vector):
        """The (n_src, n_dst) matrix of one edge vector."""
        import torch

        m = torch.zeros((self.graph.n_src, self.graph.n_dst), dtype=torch.float32)
        m[self.graph.edge_mask] = vector
        return m

    def circuit_mask(self, vector, n_edges: int):
        """The greedy, pruned circuit of an edge vector, as a bool mask over the real edges."""
        from unlearn_plugins.circuits.circuit import select

        return select(self.full(vector), self.graph, method="greedy", n=n_edges).edge_vector()

    def query_masks(self, rows, n_edges: int):
        """(len(rows), E) bool: each row's own circuit of ``n_edges`` edges (cached)."""
        import torch

        key = n_edges
        if key not in self._masks:
            log(f"query circuits of {n_edges} edges ...")
            self._masks[key] = {}
        cache = self._masks[key]
        for r in rows:
            if r not in cache:
                cache[r] = self.circuit_mask(self.edges[self.at[r]], n_edges)
        return torch.stack([cache[r] for r in rows])

    def anchor(self, rows, n_edges: int):
        """(mask, mean edge scores) of the circuit of the mean matrix of ``rows``."""
        mean = self.edges[[self.at[r] for r in rows]].mean(0)
        return self.circuit_mask(mean, n_edges), mean


def similarities(q_masks, q_scores, a_mask, a_scores, similarity: str, vector: str):
    """Each query's similarity to one anchor circuit, as :func:`~unlearn_plugins.circuits.
    similarity.circuit_similarity` computes it (cosine of 0/1 masks or of the masked signed
    scores; Jaccard and Hamming of the masks), for all queries at once (float64)."""
    import torch

    qm, am = q_masks.double(), a_mask.double()
    if similarity == "cosine":
        if vector == "binary":
            q, a = qm, am
        else:
            q, a = q_scores.double() * qm, a_scores.double() * am
        qn, an = q.norm(dim=1), a.norm()
        out = (q @ a) / (qn * an)
        return torch.where((qn < 1e-12) | (an < 1e-12), torch.zeros_like(out), out)
    inter = qm @ am
    if similarity == "jaccard":
        union = qm.sum(1) + am.sum() - inter
        return torch.where(union == 0, torch.ones_like(inter), inter / union.clamp_min(1))
    if similarity == "hamming":
        xor = qm.sum(1) + am.sum() - 2 * inter
        return 1.0 - xor / q_masks.shape[1]
    raise ValueError(f"similarity {similarity!r}")


def cud_of(s_e, s_h):
    """CUD = d_E / (d_E + d_H), d = max(1 - s, 0), 0.5 when both are 0 (vectorized)."""
    import torch

    d_e, d_h = (1.0 - s_e).clamp_min(0.0), (1.0 - s_h).clamp_min(0.0)
    total = d_e + d_h
    return torch.where(total == 0, torch.full_like(total, 0.5), d_e / torch.where(total == 0, 1.0, total))


def score(m: Matrices, query_rows, anchors: dict, *, similarity="cosine", vector="binary", n_edges=75) -> dict:
    """One CUD scoring of ``query_rows`` against ``anchors`` ({"easy": rows, "hard": rows})."""
    qm = m.query_masks(query_rows, n_edges)
    qs = m.edges[[m.at[r] for r in query_rows]]
    circuits = {kind: m.anchor(anchors[kind], n_edges) for kind in ("easy", "hard")}
    sims = {kind: similarities(qm, qs, *circuits[kind], similarity, vector) for kind in circuits}
    scores = cud_of(sims["easy"], sims["hard"])
    e, h = circuits["easy"][0], circuits["hard"][0]
    return {
        "scores": dict(zip(query_rows, scores.tolist())),
        "s_E": dict(zip(query_rows, sims["easy"].tolist())),
        "s_H": dict(zip(query_rows, sims["hard"].tolist())),
        "anchors": {kind: len(anchors[kind]) for kind in ("easy", "hard")},
        "anchor_edges": {"easy": int(e.sum()), "hard": int(h.sum()), "shared": int((e & h).sum())},
    }


def agreements(scorings: dict[str, dict]) -> dict:
    """Per pair of scorings (A012-A345 seeds, A012-B012 pools, A345-B012 both): v2's agreement
    (Spearman, top-40 hard / easy overlaps) of the scores, and the Spearman of s_E and of s_H."""
    from scipy.stats import spearmanr

    out = {}
    for x, y in PAIRS:
        a = v2.agreement(scorings[x]["scores"], scorings[y]["scores"], TOP_K)
        entry = {k: a[k] for k in ("spearman", "spearman_ci", "hard_overlap", "easy_overlap")}
        for part in ("s_E", "s_H"):
            rows = sorted(scorings[x][part])
            rho = spearmanr([scorings[x][part][r] for r in rows], [scorings[y][part][r] for r in rows]).statistic
            entry[f"{part}_spearman"] = None if rho != rho else float(rho)
        out[PAIR_NAMES[(x, y)]] = entry
    return out


def summary(scorings: dict[str, dict]) -> dict:
    """The record of one variant: agreement per pair, and per scoring its anchors and circuits."""
    return {
        "agreement": agreements(scorings),
        "scorings": {n: {k: s[k] for k in ("anchors", "anchor_edges")} for n, s in scorings.items()},
    }


def loss_anchors(pool_rows, before_nll, k: int) -> dict:
    """The control: anchors without any anchor run. Easy = the k pool QA the target knows least
    (highest answer NLL before unlearning), hard = the k it knows best (lowest); a QA on both
    sides (k > pool / 2) is dropped from both, as CUD's vote drops it."""
    order = sorted(pool_rows, key=lambda r: (before_nll[r], r))
    hard, easy = set(order[:k]), set(order[-k:])
    return {"easy": sorted(easy - hard), "hard": sorted(hard - easy)}


def v2_anchors() -> dict[str, dict]:
    out = {}
    for name in SCORINGS:
        rec = json.loads((v2_records() / f"scoring-{name}.json").read_text())
        out[name] = {kind: list(rec["anchors"][kind]) for kind in ("easy", "hard")}
    return out


def run(cache: Path | None, records: Path = RECORDS, report: Path = REPORT) -> None:
    """Every variant on v2's matrices, pools and anchors, one record per family, then the table."""
    import torch

    from unlearn_plugins.models import cache_dir

    torch.set_num_threads(1)
    cache = cache or cache_dir() / "study" / "cud_stratification_v2"
    edges = cache / "diagnostics" / "edges.pt"
    if not edges.is_file():
        raise SystemExit(f"error: {edges}: no EAP-IG matrices; run `python bench/cud_diagnostics.py matrices` first")
    pools = v2.author_pools()
    diagnose(
        Matrices.load(edges),
        query=v2.rows_of(pools["query"]),
        pool_rows={"A": v2.rows_of(pools["anchor_A"]), "B": v2.rows_of(pools["anchor_B"])},
        before=json.loads((v2_records() / "before.json").read_text())["nll"],
        anchors=v2_anchors(),
        recorded={n: json.loads((v2_records() / f"scoring-{n}.json").read_text())["scores"] for n in SCORINGS},
        matrices=json.loads((cache / "diagnostics" / "timing.json").read_text()),
        records=records,
    )
    write_report(records, report)


def diagnose(
    m: Matrices, *, query, pool_rows, before, anchors, recorded, matrices: dict, records: Path, loss_k=LOSS_K
) -> None:
    """Every variant: ``query`` rows scored against ``anchors`` ({scoring: {"easy", "hard"}}) and
    against anchors chosen by ``before`` (answer NLL by row) in ``pool_rows`` ({"A", "B"});
    ``recorded``: v2's scores ({scoring: {"row": score}}), which the v2 setting must reproduce."""
    import torch

    from unlearn_plugins.files import write_json

    started = time.perf_counter()
    records.mkdir(parents=True, exist_ok=True)

    def three(**kw) -> dict[str, dict]:
        return {name: score(m, query, anchors[name], **kw) for name in SCORINGS}

    # the v2 setting: the recorded scores must come back from the rebuilt matrices
    base = three(**BASE)
    gaps = [abs(base[n]["scores"][r] - recorded[n][str(r)]) for n in SCORINGS for r in query]
    from scipy.stats import spearmanr

    rho_rec = {
        n: float(spearmanr([base[n]["scores"][r] for r in query], [recorded[n][str(r)] for r in query]).statistic)
        for n in SCORINGS
    }
    write_json(
        records / "baseline.json",
        {
            "setting": BASE,
            "anchors": anchors,
            "reproduction": {
                "max_abs_score_difference": max(gaps),
                "mean_abs_score_difference": sum(gaps) / len(gaps),
                "spearman_with_recorded": rho_rec,
            },
            "matrices": matrices,
            **summary(base),
        },
    )
    log(f"baseline: reproduction max |diff| {max(gaps):.2e}, Spearman with the recorded {rho_rec}")

    families: dict[str, dict] = {}
    families["similarity"] = {s: summary(three(**{**BASE, "similarity": s})) for s in ("cosine", "jaccard", "hamming")}
    families["vector"] = {v: summary(three(**{**BASE, "vector": v})) for v in ("binary", "signed")}
    families["n_edges"] = {str(n): summary(three(**{**BASE, "n_edges": n})) for n in SIZES}
    families["n_edges_signed"] = {str(n): summary(three(**{**BASE, "vector": "signed", "n_edges": n})) for n in SIZES}
    for name, fam in families.items():
        write_json(records / f"{name}.json", {"setting": BASE, "varied": name, "variants": fam})
        log(f"{name}: recorded")

    # fixed anchors: one side shared between the scorings (which side carries the disagreement?)
    fixed = {}
    for side in ("easy", "hard"):
        shared = {n: {**anchors[n], side: anchors["A012"][side]} for n in SCORINGS}
        fixed[f"A012 {side} anchors for all"] = summary({n: score(m, query, shared[n], **BASE) for n in SCORINGS})
    fixed["all A012 anchors for all"] = summary({n: score(m, query, anchors["A012"], **BASE) for n in SCORINGS})
    write_json(
        records / "fixed.json",
        {"setting": BASE, "varied": "fixed anchors", "variants": fixed},
    )
    log("fixed: recorded")

    # leave one anchor out: every anchor of every scoring
    loo = []
    for name in SCORINGS:
        for kind in ("easy", "hard"):
            for r in anchors[name][kind]:
                left = [x for x in anchors[name][kind] if x != r]
                if not left:
                    continue
                changed = {**anchors, name: {**anchors[name], kind: left}}
                scorings = {n: (score(m, query, changed[n], **BASE) if n == name else base[n]) for n in SCORINGS}
                own = v2.agreement(scorings[name]["scores"], base[name]["scores"], TOP_K)["spearman"]
                loo.append(
                    {
                        "scoring": name,
                        "side": kind,
                        "left_out": r,
                        "spearman_with_full": own,
                        "agreement": agreements(scorings),
                    }
                )
    write_json(records / "loo.json", {"setting": BASE, "varied": "one anchor left out", "runs": loo})
    log("loo: recorded")

    # the control: anchors by the target's loss before unlearning, k per side, pool A vs pool B
    control = {}
    for k in loss_k:
        chosen = {p: loss_anchors(pool_rows[p], before, k) for p in pool_rows}
        if any(not c[kind] for c in chosen.values() for kind in c):
            raise ValueError(f"k={k}: a pool of {min(map(len, pool_rows.values()))} QA leaves a side without anchors")
        for vector in ("binary", "signed"):
            a = score(m, query, chosen["A"], **{**BASE, "vector": vector})
            b = score(m, query, chosen["B"], **{**BASE, "vector": vector})
            agree = v2.agreement(a["scores"], b["scores"], TOP_K)
            control[f"k={k} {vector}"] = {
                "k": k,
                "vector": vector,
                "anchors": {p: {kind: len(v) for kind, v in c.items()} for p, c in chosen.items()},
                "anchor_rows": chosen,
                "pools": {kk: agree[kk] for kk in ("spearman", "spearman_ci", "hard_overlap", "easy_overlap")},
                "with_voted": {
                    n: v2.agreement(a["scores"] if anchors_pool(n) == "A" else b["scores"], base[n]["scores"], TOP_K)[
                        "spearman"
                    ]
                    for n in SCORINGS
                },
            }
    write_json(
        records / "loss_k.json",
        {
            "setting": BASE,
            "varied": "anchors by pre-unlearning loss, k per side (pool A vs pool B)",
            "variants": control,
        },
    )
    log("loss_k: recorded")
    write_json(
        records / "run.json",
        {
            "seconds": round(time.perf_counter() - started, 1),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
    )


def anchors_pool(name: str) -> str:
    return name[0]


# ============================================================================= the report


def _f(x) -> str:
    return "-" if x is None else f"{x:+.2f}"


def read(records: Path) -> dict:
    names = ("baseline", "similarity", "vector", "n_edges", "n_edges_signed", "fixed", "loo", "loss_k", "run")
    missing = [n for n in names if not (records / f"{n}.json").is_file()]
    if missing:
        raise SystemExit(
            f"error: {records}: no record {', '.join(m + '.json' for m in missing)}; run the diagnostics first"
        )
    return {n: json.loads((records / f"{n}.json").read_text()) for n in names}


def _mean(values) -> float | None:
    """The mean, or None when a value is undefined (a constant scoring has no Spearman)."""
    return None if any(v is None for v in values) else sum(values) / len(values)


def table_rows(rec: dict) -> list[dict]:
    """One row per variant: its three test-retest Spearmans, their mean and the change from v2's."""
    rows = []
    base = rec["baseline"]["agreement"]

    def row(family: str, variant: str, agreement: dict, anchors: str = "") -> dict:
        rhos = [agreement[p]["spearman"] for p in ("seeds", "pools", "seeds+pools")]
        mean = _mean(rhos)
        base_mean = _mean([base[p]["spearman"] for p in ("seeds", "pools", "seeds+pools")])
        return {
            "family": family,
            "variant": variant,
            "seeds": rhos[0],
            "pools": rhos[1],
            "both": rhos[2],
            "mean": mean,
            "change": None if mean is None or base_mean is None else mean - base_mean,
            "hard": agreement["seeds"]["hard_overlap"],
            "easy": agreement["seeds"]["easy_overlap"],
            "s_E": agreement["seeds"]["s_E_spearman"],
            "s_H": agreement["seeds"]["s_H_spearman"],
            "anchors": anchors,
        }

    rows.append(row("v2 setting", "binary cosine, 75 edges, voted anchors", base))
    for family, label in (
        ("similarity", "similarity"),
        ("vector", "vector"),
        ("n_edges", "circuit size (binary)"),
        ("n_edges_signed", "circuit size (signed)"),
        ("fixed", "fixed anchors"),
    ):
        for variant, entry in rec[family]["variants"].items():
            rows.append(row(label, variant, entry["agreement"]))
    return rows


def write_report(records: Path = RECORDS, out: Path = REPORT) -> str:
    """The markdown table, from the records alone."""
    rec = read(records)
    b = rec["baseline"]
    rep = b["reproduction"]
    mt = b["matrices"]
    lines = [
        "# CUD reliability diagnostics (cud_stratification_v2's setting, no new anchor runs)",
        "",
        "Generated by `python bench/cud_diagnostics.py report` from the records in "
        "`bench/results/cud_stratification_v3/diagnostics/`. The 560 query QA of `cud_stratification_v2` are "
        "rescored from one set of EAP-IG matrices (the rebuilt v2 target, inputs mode, 5 steps) with the "
        "anchors each v2 scoring chose (A012: pool A, seeds 0-2; A345: pool A, seeds 3-5; B012: pool B, "
        "seeds 0-2), one factor changed at a time. Test-retest = Spearman of the 560 scores between two "
        "scorings: **seeds** A012-A345, **pools** A012-B012, **both** A345-B012.",
        "",
        f"Reproduction of v2's recorded scores from the rebuilt matrices: max |difference| "
        f"{rep['max_abs_score_difference']:.1e}, Spearman with the recorded scores "
        + ", ".join(f"{n} {v:.4f}" for n, v in rep["spearman_with_recorded"].items())
        + f" (target: max |held-out NLL - v2's| {mt['target_fingerprint_gap']:.1e} on {mt.get('device', 'cpu')})"
        + f". Matrices: {mt['n_matrices']} QA x {mt['n_edges']} edges, {mt['eap_ig_seconds'] / 60:.0f} min of EAP-IG "
        f"({mt['threads']} threads; target rebuilt and loaded in {mt['target_and_load_seconds'] / 60:.0f} min); "
        f"the analysis took {rec['run']['seconds'] / 60:.0f} min on 1 thread.",
        "",
        "## Test-retest Spearman per variant",
        "",
        "| factor | variant | seeds | pools | both | mean | change | top-40 hard / easy (seeds) | s_E / s_H seeds |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in table_rows(rec):
        lines.append(
            f"| {r['family']} | {r['variant']} | {_f(r['seeds'])} | {_f(r['pools'])} | {_f(r['both'])} | "
            f"{_f(r['mean'])} | {_f(r['change'])} | {r['hard']:.2f} / {r['easy']:.2f} | "
            f"{_f(r['s_E'])} / {_f(r['s_H'])} |"
        )
    lines += [
        "",
        "Fixed anchors: *A012 easy anchors for all* gives every scoring A012's easy anchors and keeps its own hard "
        "ones (and the other way round); *all A012 anchors for all* is the check that, with identical query "
        "circuits, all the disagreement is the anchors' (Spearman 1 by construction).",
        "",
        "## Leave one anchor out",
        "",
        "Each anchor of each scoring left out in turn (the other scorings as they were): how far the scoring moves "
        "from its full self, and the test-retest Spearmans it then has.",
        "",
        "| scoring | side | left out (row) | Spearman with its full scoring | seeds | pools | both |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rec["loo"]["runs"]:
        a = r["agreement"]
        lines.append(
            f"| {r['scoring']} | {r['side']} | {r['left_out']} | {_f(r['spearman_with_full'])} | "
            f"{_f(a['seeds']['spearman'])} | {_f(a['pools']['spearman'])} | {_f(a['seeds+pools']['spearman'])} |"
        )
    own = [r["spearman_with_full"] for r in rec["loo"]["runs"] if r["spearman_with_full"] is not None]
    lines += [
        "",
        f"Over the {len(own)} leave-one-out scorings, the Spearman with the full scoring ranges "
        f"{min(own):.2f} to {max(own):.2f} (median {sorted(own)[len(own) // 2]:.2f}).",
        "",
        "## Control: anchors chosen by the target's loss before unlearning",
        "",
        "No anchor run: easy = the k pool QA with the highest answer NLL before unlearning, hard = the k with "
        "the lowest, per pool (a QA on both sides dropped: k = 50 leaves 30 a side in an 80-QA pool). "
        "Test-retest is pool A vs pool B (no seeds).",
        "",
        "| k | vector | anchors A (easy / hard) | pools Spearman | top-40 hard / easy | Spearman with the voted "
        "scorings (A012, A345, B012) |",
        "| ---: | --- | --- | ---: | ---: | --- |",
    ]
    for entry in rec["loss_k"]["variants"].values():
        p = entry["pools"]
        a = entry["anchors"]["A"]
        w = entry["with_voted"]
        lines.append(
            f"| {entry['k']} | {entry['vector']} | {a['easy']} / {a['hard']} | {_f(p['spearman'])} | "
            f"{p['hard_overlap']:.2f} / {p['easy_overlap']:.2f} | " + ", ".join(_f(w[n]) for n in SCORINGS) + " |"
        )
    lines += ["", *findings(rec), ""]
    text = "\n".join(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def findings(rec: dict) -> list[str]:
    """What moves the test-retest Spearman, and how far, computed from the records."""
    rows = [
        r
        for r in table_rows(rec)
        if r["family"] != "v2 setting" and not r["variant"].startswith("all A012") and r["change"] is not None
    ]
    base = table_rows(rec)[0]["mean"]
    up = max(rows, key=lambda r: r["change"])
    down = min(rows, key=lambda r: r["change"])
    control = rec["loss_k"]["variants"]
    best_control = max(
        control.values(), key=lambda e: -2.0 if e["pools"]["spearman"] is None else e["pools"]["spearman"]
    )
    loo = [r["spearman_with_full"] for r in rec["loo"]["runs"] if r["spearman_with_full"] is not None]
    return [
        "## Reading",
        "",
        f"- v2's setting: mean test-retest Spearman {base:+.2f}. The largest rise of that mean by one factor: "
        f"{up['family']} = {up['variant']} ({up['change']:+.2f}, to {up['mean']:+.2f}); the largest fall: "
        f"{down['family']} = {down['variant']} ({down['change']:+.2f}).",
        f"- One anchor left out moves a scoring to a Spearman of {min(loo):.2f}-{max(loo):.2f} with its full self.",
        f"- Anchors by pre-unlearning loss (no anchor run): pool A vs pool B Spearman up to "
        f"{_f(best_control['pools']['spearman'])} (k = {best_control['k']}, {best_control['vector']}).",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "command",
        choices=("matrices", "run", "report"),
        help="matrices: rebuild the target and the EAP-IG matrices; run: every variant, its records and the "
        "table; report: the table from the committed records alone",
    )
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--device", default=None)
    p.add_argument(
        "--accept-other-target",
        action="store_true",
        help="matrices: go on when the rebuilt target misses v2's fingerprint (recorded; default: stop)",
    )
    p.add_argument("--records", type=Path, default=RECORDS, help="the records (default: %(default)s)")
    p.add_argument("--out", type=Path, default=REPORT, help="the table (default: %(default)s)")
    args = p.parse_args(argv)
    if args.command == "matrices":
        from unlearn_plugins.process import quiet_libraries

        with quiet_libraries():
            compute_matrices(args.cache, args.device, args.accept_other_target)
        return 0
    if args.command == "run":
        run(args.cache, args.records, args.out)
    else:
        write_report(args.records, args.out)
    print(REPORT if args.out == REPORT else args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
