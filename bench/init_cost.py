"""Benchmark: cost of adapter initialisation on the embedded model.

64 forget (TOFU forget10) + 64 retain (TOFU retain90) samples, LoRA r=32 on every linear
layer of the decoder blocks. Measured in one run:
  forward  = plain no-grad forward passes of the model over the same 128 samples (batch 8)
  rila     = RILAInit.initialize (default token mode)
  fila     = FILAInit.initialize
Prints one JSON line: rila_over_forward (target <= 1.3), fila_over_rila (target >= 3).
Usage: UNLEARN_TOFU_DIR=../shared/data/tofu python bench/init_cost.py [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()

    from peft import LoraConfig, get_peft_model

    from unlearn_plugins.data.tofu import encode_samples, load_split
    from unlearn_plugins.initializers.fila import FILAInit
    from unlearn_plugins.initializers.residual import batches
    from unlearn_plugins.initializers.rila import RILAInit
    from unlearn_plugins.models import load_model

    def fresh():
        model, tok = load_model(args.model, device=args.device)
        config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        return get_peft_model(model, config), tok

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    model, tok = fresh()
    forget = encode_samples(tok, load_split(f"tofu:forget10[0:{args.samples}]"), max_length=256)
    retain = encode_samples(tok, load_split(f"tofu:retain90[0:{args.samples}]"), max_length=256)
    device = next(model.parameters()).device

    def forward_pass():
        with torch.no_grad():
            for batch in batches(forget + retain, tok.pad_token_id, args.batch_size, device):
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    forward_pass()  # warm-up
    sync()
    t = time.perf_counter(); forward_pass(); sync(); forward_s = time.perf_counter() - t

    t = time.perf_counter()
    RILAInit(batch_size=args.batch_size).initialize(model, forget=forget, retain=retain, tokenizer=tok)
    sync(); rila_s = time.perf_counter() - t

    model, tok = fresh()
    t = time.perf_counter()
    FILAInit(batch_size=args.batch_size).initialize(model, forget=forget, retain=retain, tokenizer=tok)
    sync(); fila_s = time.perf_counter() - t

    print(json.dumps({
        "rila_over_forward": round(rila_s / forward_s, 3),
        "fila_over_rila": round(fila_s / rila_s, 3),
        "forward_s": round(forward_s, 2), "rila_s": round(rila_s, 2), "fila_s": round(fila_s, 2),
        "samples": 2 * args.samples, "rank": args.rank, "device": str(device),
    }))


if __name__ == "__main__":
    main()
