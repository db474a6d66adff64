"""Do difficulty scores predict what unlearning leaves behind? Prints one JSON line with the
Spearman correlations of each score file with the post-unlearning answer loss of the samples
that were not CUD anchors, under unlearning runs that were not used to choose the anchors.

Prepare the score files with the same model and data, e.g. (authors 0 and 1 of TOFU)::

    unlearn finetune --data tofu:full --authors 0,1 --max-length 128 --lora-r 16 --lora-alpha 32 \\
        --lr 1e-3 --epochs 3 --batch-size 8 --grad-accum 1 --save-steps 0 --merge --out FT
    U='unlearn_options={"max_length":128,"lr":5e-4,"epochs":5,"save_steps":0}'
    unlearn score --scorer cud --model FT/merged --data 'tofu:full[0:40]' --option "$U" \\
        --option max_length=128 --out DIR/cud.jsonl
    unlearn score --scorer cud ... --option mode=activations --option steps=1 --out DIR/cud_activations.jsonl
    unlearn score --scorer mrd --model FT/merged --data 'tofu:full[0:40]' --out DIR/mrd.jsonl
    unlearn score --scorer loss --model FT/merged --data 'tofu:full[0:40]' --out DIR/loss.jsonl
    python bench/cud_validation.py --model FT/merged --data 'tofu:full[0:40]' --dir DIR \\
        --unlearn-options '{"max_length":128,"lr":5e-4,"epochs":5,"save_steps":0}'

The held-out runs (grad_diff and npo, ``--seed``, default 3: CUD's anchor runs use seeds 0-2)
go through the same runner as CUD's anchor runs and are cached in DIR/post_seed<S>.json. For the
stratification experiment (easy / hard / random sets unlearned and compared), see
bench/cud_stratification.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_scores(path: Path) -> dict[int, dict]:
    from unlearn_plugins.stratify import read_scores as rows

    return {r["index"]: r for r in rows(path)}


def main(argv: list[str] | None = None) -> int:
    from scipy.stats import spearmanr

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--dir", required=True, type=Path, help="folder with cud.jsonl, mrd.jsonl, loss.jsonl, ...")
    p.add_argument("--unlearn-options", default="{}", help="JSON: the UnlearnConfig fields of CUD's anchor runs")
    p.add_argument("--objectives", default="grad_diff,npo")
    p.add_argument("--seed", type=int, default=3, help="seed of the held-out runs (not one of CUD's anchor seeds)")
    args = p.parse_args(argv)

    cud = read_scores(args.dir / "cud.jsonl")
    held_out = sorted(i for i, r in cud.items() if not r.get("anchor"))
    post_path = args.dir / f"post_seed{args.seed}.json"
    if post_path.is_file():
        post = json.loads(post_path.read_text())
    else:
        from unlearn_plugins.data.qa import load_split
        from unlearn_plugins.files import write_json
        from unlearn_plugins.models import load_model
        from unlearn_plugins.scorers.cud import TrainerAnchorRunner

        samples = load_split(args.data)
        model, tok = load_model(args.model)
        runner = TrainerAnchorRunner(options=json.loads(args.unlearn_options))
        post = {
            o: runner.losses(samples, model=model, tokenizer=tok, objective=o, seed=args.seed)
            for o in args.objectives.split(",")
        }
        write_json(post_path, post)

    def rho(a, b):
        r = spearmanr(a, b)
        return {"rho": round(float(r.statistic), 4), "p": round(float(r.pvalue), 4)}

    out: dict = {"n_samples": len(cud), "n_held_out": len(held_out), "seed": args.seed, "vs_post_loss": {}}
    for path in sorted(args.dir.glob("*.jsonl")):
        scores = read_scores(path)
        if set(scores) != set(cud):
            continue
        for objective, losses in post.items():
            out["vs_post_loss"].setdefault(objective, {})[path.stem] = rho(
                [scores[i]["score"] for i in held_out], [losses[i] for i in held_out]
            )
    if (args.dir / "cud_activations.jsonl").is_file():
        act = read_scores(args.dir / "cud_activations.jsonl")
        out["cud_inputs_vs_activations"] = {
            "all": rho([cud[i]["score"] for i in sorted(cud)], [act[i]["score"] for i in sorted(cud)]),
            "held_out": rho([cud[i]["score"] for i in held_out], [act[i]["score"] for i in held_out]),
        }
    objectives = list(post)
    if len(objectives) == 2:
        a, b = objectives
        out["objectives_agree"] = rho([post[a][i] for i in held_out], [post[b][i] for i in held_out])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
