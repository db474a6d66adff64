"""Measure RILA's retain basis P_B on the embedded model: per module kind, the exact path taken,
how many of P_B's k columns are eigenvectors of Cr (the rest complete a rank-deficient Cr), and
how much of the reference's P_B it spans (reglu-open rila.py: the top-k eigenvectors of the
float64 Cr + 1e-4 I, computed densely here from the same pooled rows).

Two settings, printed as one JSON line per (setting, module kind):
  preset    the `reglu` preset's RILA (beta 0.7, rol_rank 128, 256 forget examples of forget10 with
            one retain90 partner each): at least k retain rows, so P_B should be the reference's.
  author    reglu_tofu_v2's ReGLU cells: one TOFU author (20 QA) forgotten, the other 19 of the
            benchmark's authors (180-199) as retain data, max_length 128, rol_rank 128 and 16 (its
            sweep): 20 retain rows, fewer than 128, the rank-deficient case.
In the rank-deficient case the reference's top-k beyond Cr's rank is an arbitrary basis of its
degenerate ridge eigenspace, so the span figure there measures nothing of ours; `kept` does.
The base SmolLM2 stands in for the studies' fine-tuned targets: paths and row counts depend only
on shapes and counts; the spans are the base model's. Only the first --layers decoder layers run
(default 6; their statistics are those of the whole model, which later layers cannot change).

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/rila_retain_basis.py [--layers 6] [--quick]
"""

from __future__ import annotations

import argparse
import json
import warnings

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RIDGE = 1e-4  # the reference adds 1e-4 I to Cr


def reference_span(rows_retain, pb, k: int) -> float:
    """Fraction of the reference's top-k of Cr (dense, float64, + 1e-4 I) that P_B spans."""
    h = rows_retain.double()
    cr = h.T @ h / h.shape[0] + RIDGE * torch.eye(h.shape[1], dtype=torch.float64)
    reference = torch.linalg.eigh(cr)[1][:, -k:]
    return float((pb.double().T @ reference).pow(2).sum()) / k


def measure(model, tok, forget, retain, rol_rank: int, layers: int, setting: str) -> list[dict]:
    from unlearn_plugins.initializers.rila import RILAInit, collect_stats, select_examples
    from unlearn_plugins.training.lora import lora_layers

    init = RILAInit(beta=0.7, rol_rank=rol_rank, n_samples=256)
    modules, solved, _paths, samples = init.solve_modules(model, forget=forget, retain=retain, tokenizer=tok)
    chosen_f, chosen_r = select_examples(forget, retain, init.n_samples, init.seed)
    rows = collect_stats(model, chosen_f, chosen_r, tok.pad_token_id, mode=init.mode, path="rows")
    kinds: dict[str, dict] = {}
    for name, module in lora_layers(model):
        kind = name.rsplit(".", 1)[-1]
        layer = int(name.split(".layers.")[1].split(".")[0])
        solution = solved[name]
        d_out = module.get_base_layer().weight.shape[0]
        k = min(rol_rank, d_out)
        entry = kinds.setdefault(kind, {"kept": [], "span": [], "path": set(), "k": k})
        entry["kept"].append(solution.retain_kept)
        entry["path"].add(init.path or _path_of(module, samples))
        if layer < layers:  # every layer that ran
            entry["span"].append(reference_span(rows[name][1].matrix(), solution.retain_basis, k))
    out = []
    for kind, e in kinds.items():
        out.append(
            {
                "setting": setting,
                "module": kind,
                "path": sorted(e["path"]),
                "k": e["k"],
                "retain_rows": samples["retain"],
                "kept_min": min(e["kept"]),
                "kept_max": max(e["kept"]),
                "modules": len(e["kept"]),
                "span_of_reference_min": round(min(e["span"]), 4) if e["span"] else None,
            }
        )
    return out


def _path_of(module, samples) -> str:
    from unlearn_plugins.initializers.rila import choose_path

    return choose_path(module, samples["forget"] + samples["retain"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--layers",
        type=int,
        default=6,
        help="measure the first N decoder layers (their inputs do not depend on later ones)",
    )
    parser.add_argument("--author", type=int, default=190, help="the forgotten author of the author setting")
    parser.add_argument("--tofu-dir", default=None)
    parser.add_argument("--quick", action="store_true", help="the tiny model built in code (a smoke test)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", "rila: fewer than r positive")

    from peft import LoraConfig, get_peft_model

    from unlearn_plugins.data.qa import encode_samples, load_split

    if args.quick:
        from unlearn_plugins.testing import tiny_llama, tiny_tokenizer

        tok = tiny_tokenizer()
        base = tiny_llama(len(tok))
    else:
        from unlearn_plugins.models import load_model

        base, tok = load_model(args.model, device="cpu", dtype="fp32")
    base.model.layers = base.model.layers[: args.layers]
    model = get_peft_model(base, LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, target_modules=TARGETS)).eval()

    forget10 = load_split("tofu:forget10", args.tofu_dir)
    settings = [
        ("preset", forget10, load_split("tofu:retain90", args.tofu_dir), 512, [128]),
    ]
    a = args.author - 180  # forget10 holds TOFU authors 180-199, 20 QA each
    author_qa = forget10[20 * a : 20 * (a + 1)]
    others = forget10[: 20 * a] + forget10[20 * (a + 1) :]
    settings.append((f"author{args.author}", author_qa, others, 128, [128, 16]))
    for name, forget, retain, max_length, ranks in settings:
        f = encode_samples(tok, forget, max_length=max_length)
        r = encode_samples(tok, retain, max_length=max_length)
        for rank in ranks:
            for line in measure(model, tok, f, r, rank, args.layers, f"{name}/rol_rank{rank}"):
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
