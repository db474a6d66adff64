"""How much CUD's ranking and anchors move with the paper's choices.

CUD scores one query set four ways from the same EAP-IG matrices and the same anchor runs (the
CUD cache holds both, so only the first variant computes anything):

- ``paper``: circuits compared as 0/1 edge masks, anchors voted by the paper's five methods
  (GradDiff, NPO, SimNPO, RMU, UNDIAL x 3 seeds, kept when 3 methods choose them): the default;
- ``signed``: the same anchors, circuits compared as signed edge scores;
- ``two``: binary masks, anchors voted by GradDiff and NPO alone (threshold 1: the union);
- ``old``: signed scores and the two-method vote, this package's default before it followed the paper.

Prints one JSON line: Spearman between the paper's scores and each other variant's, and the
anchors each vote chose (pool indices) with their overlap. Anchor runs use the demo's settings
(LoRA r 16, lr 1e-3, at most 3 epochs, stopped when the pool's mean answer probability falls
below 0.1, checked every 2 steps).

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/cud_fidelity.py --target MODEL_FOLDER \\
        --query 'tofu:forget10_perturbed[80:180]' --anchor-pool 'tofu:forget10_perturbed[0:40]' \\
        --anchor-retain 'tofu:forget10_perturbed[40:80]'
"""

from __future__ import annotations

import argparse
import json
import sys
import time

PAPER = ("grad_diff", "npo", "simnpo", "rmu", "undial")
TWO = ("grad_diff", "npo")
ANCHOR_UNLEARN = dict(lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0, batch_size=2, grad_accum=1, save_steps=0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the model scored and unlearned (a folder or hub id)")
    parser.add_argument("--query", required=True, help="the scored QA (tofu:SPLIT[a:b] or a file)")
    parser.add_argument("--anchor-pool", required=True, help="QA the anchors are chosen from (disjoint from --query)")
    parser.add_argument("--anchor-retain", required=True, help="retain QA of the anchor runs")
    parser.add_argument("--k", type=int, default=None, help="easy/hard per anchor run (CUD's default when unset)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--dtype", default="bf16", help="training dtype of the anchor runs (the demo's)")
    parser.add_argument("--max-rows", type=int, default=6, help="EAP-IG rows per pass (the demo's 6)")
    parser.add_argument("--cache-dir", default=None, help="CUD cache (default $UNLEARN_CACHE_DIR/cud)")
    parser.add_argument("--out", default=None, help="also write the JSON line here")
    args = parser.parse_args(argv)

    from scipy.stats import spearmanr

    from unlearn_plugins.data.qa import load_split
    from unlearn_plugins.models import load_model
    from unlearn_plugins.scorers.cud import CUDScorer
    from unlearn_plugins.scoring import score_samples

    query = load_split(args.query)
    pool = load_split(args.anchor_pool)
    options = {**ANCHOR_UNLEARN, "retain": args.anchor_retain, "max_length": args.max_length, "dtype": args.dtype}
    model, tok = load_model(args.target)
    started = time.perf_counter()

    def score(objectives, vector):
        scorer = CUDScorer(
            anchor_data=list(pool),
            objectives=list(objectives),
            seeds=[0, 1, 2],
            k=args.k,
            model_spec=args.target,
            unlearn_options=options,
            anchor_recipe="none",  # the recorded runs' own settings (ANCHOR_UNLEARN)
            stop_prob=0.1,
            check_steps=2,
            steps=5,
            n_edges=75,
            vector=vector,
            max_rows=args.max_rows,
            max_length=args.max_length,
            cache_dir=args.cache_dir,
            progress=True,
        )
        rows = score_samples(scorer, query, model=model, tokenizer=tok, scorer_name="cud")
        anchors = scorer.last_metadata["anchors"]["all"]
        chosen = {kind: sorted(a["pool_index"] for a in anchors[kind]) for kind in ("easy", "hard")}
        return [r["score"] for r in rows], chosen, scorer.last_metadata["settings"]["min_objectives"]

    variants = {
        "paper": score(PAPER, "binary"),
        "signed": score(PAPER, "signed"),
        "two": score(TWO, "binary"),
        "old": score(TWO, "signed"),
    }
    paper_scores = variants["paper"][0]

    def overlap(a, b):
        a, b = set(a), set(b)
        return {"shared": len(a & b), "jaccard": round(len(a & b) / len(a | b), 3) if a | b else None}

    result = {
        "bench": "cud_fidelity",
        "target": args.target,
        "query": args.query,
        "n_query": len(query),
        "anchor_pool": args.anchor_pool,
        "n_pool": len(pool),
        "spearman_with_paper": {
            name: round(float(spearmanr(paper_scores, scores).statistic), 4)
            for name, (scores, _, _) in variants.items()
            if name != "paper"
        },
        "anchors": {name: {"threshold": t, **chosen} for name, (_, chosen, t) in variants.items()},
        "anchor_overlap_five_vs_two": {
            kind: overlap(variants["paper"][1][kind], variants["two"][1][kind]) for kind in ("easy", "hard")
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
