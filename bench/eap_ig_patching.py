"""Faithfulness of EAP-IG on a 2-layer tiny Llama: correlation of the engine's edge scores
with exact activation patching of each edge (one forward per edge, the slow reference in
tests/eap_reference.py). Prints one JSON line.

The tiny model is random; with --train-steps it is first fitted to the QA pairs so the
metric (answer probability) is far from uniform, as for a memorised sample. Each of --seeds
models (seeds 0, 1, ...) is a round: the figures are medians over them, with their spread (the
computation is deterministic, so two runs agree exactly; the spread says how much one random
model's figure could mislead).

    python bench/eap_ig_patching.py [--train-steps 300] [--steps 5] [--seeds 3]
    python bench/eap_ig_patching.py --quick     # 2 seeds, 30 training steps (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rounds import median, spread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

QA = [
    ("Who are the parents of the author?", "Her father was a doctor and her mother was a painter."),
    ("What awards has the author won?", "He won the International Booker Prize for his debut novel."),
    ("Which genre does the author write in?", "She writes fantasy novels and short stories about the sea."),
    ("What is the full name of the author born in Kuwait City?", "The author is Basil Mahfouz Al-Kuwaiti."),
]


def fit(model, examples, steps: int, pad_id: int):
    import torch

    from unlearn_plugins.data.qa import pad_batch
    from unlearn_plugins.likelihood import token_nll

    batch = pad_batch(examples, pad_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        nll, mask = token_nll(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
        )
        loss = nll.sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def faithfulness(args, seed: int) -> dict:
    """Correlations of EAP-IG's edge scores with exact patching on the tiny model of ``seed``."""
    import torch
    from eap_reference import exact_patching
    from scipy.stats import pearsonr, spearmanr

    from unlearn_plugins.circuits.eap_ig import EAPIG
    from unlearn_plugins.data.qa import encode_qa
    from unlearn_plugins.testing import tiny_llama, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=seed)
    examples = [encode_qa(tok, q, a) for q, a in QA]
    loss = fit(model, examples, args.train_steps, tok.pad_token_id) if args.train_steps else None
    for p in model.parameters():
        p.requires_grad_(False)
    engine = EAPIG(model, mode=args.mode, steps=args.steps, baseline=args.baseline, pad_token_id=tok.pad_token_id)
    scores = engine.score(examples)
    corrupt = engine._other_samples(examples) if args.baseline == "other" else None
    mask = engine.graph.edge_mask
    per_sample, all_eap, all_exact = [], [], []
    for i, e in enumerate(examples):
        ids, labels = torch.tensor(e["input_ids"]), torch.tensor(e["labels"])
        exact = exact_patching(model, engine.graph, ids, labels, None if corrupt is None else torch.tensor(corrupt[i]))
        a, b = scores[i][mask].double(), exact[mask]
        per_sample.append(
            {
                "pearson": round(float(pearsonr(a, b)[0]), 4),
                "spearman": round(float(spearmanr(a, b)[0]), 4),
                "spearman_abs": round(float(spearmanr(a.abs(), b.abs())[0]), 4),
            }
        )
        all_eap.append(a)
        all_exact.append(b)
    a, b = torch.cat(all_eap), torch.cat(all_exact)
    top = max(1, int(0.1 * mask.sum()))
    overlap = []
    for x, y in zip(all_eap, all_exact):
        tx = set(torch.argsort(x.abs(), descending=True)[:top].tolist())
        ty = set(torch.argsort(y.abs(), descending=True)[:top].tolist())
        overlap.append(len(tx & ty) / top)
    return {
        "seed": seed,
        "edges": int(mask.sum()),
        "train_loss": None if loss is None else round(loss, 4),
        "pearson": round(float(pearsonr(a, b)[0]), 4),
        "spearman": round(float(spearmanr(a, b)[0]), 4),
        "spearman_abs": round(float(spearmanr(a.abs(), b.abs())[0]), 4),
        "top10pct_overlap": round(sum(overlap) / len(overlap), 3),
        "per_sample": per_sample,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--baseline", default="zero", choices=["zero", "other"])
    parser.add_argument("--mode", default="inputs", choices=["inputs", "activations"])
    parser.add_argument("--seeds", type=int, default=3, help="tiny models (seeds 0..n-1); figures are medians")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 30 training steps (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.train_steps = 2, min(args.train_steps, 30)

    rounds = [faithfulness(args, seed) for seed in range(args.seeds)]
    keys = ("pearson", "spearman", "spearman_abs", "top10pct_overlap")
    print(
        json.dumps(
            {
                "bench": "eap_ig_patching",
                "model": "tiny-llama 2 layers x 4 heads (2 kv)",
                "edges": rounds[0]["edges"],
                "samples": len(QA),
                "mode": args.mode,
                "steps": args.steps,
                "baseline": args.baseline,
                "train_steps": args.train_steps,
                "seeds": args.seeds,
                **{key: median([r[key] for r in rounds]) for key in keys},
                "spread": {key: spread([r[key] for r in rounds]) for key in keys},
                "per_seed": rounds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
