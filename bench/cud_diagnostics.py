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


def log(msg: str, started: float = time.perf_counter()) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} {time.perf_counter() - started:7.0f} s] {msg}", file=sys.stderr, flush=True)


# ============================================================================= the matrices


def v2_settings() -> dict:
    """The EAP-IG and circuit settings of v2's scorings (as recorded in scoring-A012.json)."""
    rec = json.loads((V2_RECORDS / "scoring-A012.json").read_text())
    s = rec["settings"]
    return {k: s[k] for k in ("mode", "steps", "baseline", "metric", "max_rows", "max_length", "n_edges")}


def compute_matrices(cache: Path | None, device: str | None) -> Path:
    """Rebuild v2's target (checked against its fingerprint), compute (or read from CUD's cache)
    the EAP-IG matrices of the query and pool QA, and save their real-edge vectors together."""
    import torch

    from unlearn_plugins.models import cache_dir
    from unlearn_plugins.scorers.cud import CUDScorer, model_fingerprint

    cache = cache or cache_dir() / "study" / "cud_stratification_v2"
    started = time.perf_counter()
    study = v2.Phase1(v2.StudyConfig(device=device), cache, V2_RECORDS)
    log(f"target: {cache} (rebuilt when missing) ...")
    study.target()
    log(f"target ready ({time.perf_counter() - started:.0f} s)")
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
    }
    (cache / "diagnostics" / "timing.json").write_text(json.dumps(timing, indent=1))
    log(f"matrices: {out} {tuple(edges.shape)}; {json.dumps(timing)}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("matrices", "run", "report"))
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    if args.command == "matrices":
        from unlearn_plugins.process import quiet_libraries

        with quiet_libraries():
            compute_matrices(args.cache, args.device)
        return 0
    raise SystemExit(f"error: {args.command} not written yet")


if __name__ == "__main__":
    sys.exit(main())
