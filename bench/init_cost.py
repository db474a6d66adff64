"""Benchmark: cost of adapter initialisation on the embedded model.

64 forget (TOFU forget10) + 64 retain (TOFU retain90) samples, LoRA r=32 on every linear
layer of the decoder blocks. Each round measures, one after the other:
  forward  = plain no-grad forward passes of the LoRA model over the same 128 samples (batch 8)
  rila     = RILAInit.initialize (defaults: faithful pooling)
  fila     = FILAInit.initialize (every --fila-every rounds: it costs several RILAs)
each init on the model as it was before the round (base and adapter weights restored, untimed),
after one untimed warm-up of each. Prints one JSON line: rila_over_forward (target <= 1.05) and
fila_over_rila (target >= 3), medians of the per-round ratios, with their spread.

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/init_cost.py [--model smollm2-135m] [--rounds 5]
    python bench/init_cost.py --quick --tofu-dir DIR     # the tiny model, seconds (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
from rounds import load_average, machine, median, parse_run_arguments, ratios, spread

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=64, help="forget samples (and as many retain samples)")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (the figures are medians)")
    parser.add_argument("--fila-every", type=int, default=2, help="time FILA in every n-th round")
    args = parse_run_arguments(parser, argv, "the tiny model built in code, 8 + 8 samples, 2 rounds")
    if args.quick:
        args.samples, args.rank, args.rounds, args.fila_every = min(args.samples, 8), min(args.rank, 4), 2, 1
    load_start = load_average()
    warnings.filterwarnings("ignore", "rila: fewer than r positive")  # few samples (--quick): not the measure

    from peft import LoraConfig, get_peft_model

    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.initializers.fila import FILAInit
    from unlearn_plugins.initializers.residual import batches
    from unlearn_plugins.initializers.rila import RILAInit

    if args.quick:
        from unlearn_plugins.testing import tiny_llama, tiny_tokenizer

        tok = tiny_tokenizer()
        model, name = tiny_llama(len(tok)), "tiny-llama (2 layers, width 64)"
    else:
        from unlearn_plugins.models import load_model

        model, tok = load_model(args.model, device=args.device)
        name = args.model
    config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=TARGETS)
    model = get_peft_model(model, config).eval()
    start_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    forget = encode_samples(tok, load_split(f"tofu:forget10[0:{args.samples}]", args.tofu_dir), max_length=256)
    retain = encode_samples(tok, load_split(f"tofu:retain90[0:{args.samples}]", args.tofu_dir), max_length=256)
    device = next(model.parameters()).device

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def forward_pass():
        with torch.no_grad():
            for batch in batches(forget + retain, tok.pad_token_id, args.batch_size, device):
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    def timed(init):
        """Seconds of one init from the starting weights (restored afterwards, untimed)."""
        sync()
        t = time.perf_counter()
        init.initialize(model, forget=forget, retain=retain, tokenizer=tok)
        sync()
        seconds = time.perf_counter() - t
        model.load_state_dict(start_state)
        model.eval()
        return seconds

    def time_forward():
        sync()
        t = time.perf_counter()
        forward_pass()
        sync()
        return time.perf_counter() - t

    # warm-up: kernels, allocator, LAPACK and autograd first calls are not the method's cost
    forward_pass()
    rila, fila = RILAInit(batch_size=args.batch_size), FILAInit()
    for init in (rila, fila):
        init.initialize(model, forget=forget[:4], retain=retain[:4], tokenizer=tok)
        model.load_state_dict(start_state)
        model.eval()

    forward_s, rila_s, fila_s, fila_rila = [], [], [], []
    for round_ in range(args.rounds):
        forward_s.append(time_forward())
        rila_s.append(timed(rila))
        if round_ % args.fila_every == 0:
            fila_s.append(timed(fila))
            fila_rila.append(fila_s[-1] / rila_s[-1])
    rila_forward = ratios(rila_s, forward_s)
    print(
        json.dumps(
            {
                "bench": "init_cost",
                "rila_over_forward": median(rila_forward, 3),
                "fila_over_rila": median(fila_rila, 3),
                "spread": {"rila_over_forward": spread(rila_forward, 3), "fila_over_rila": spread(fila_rila, 3)},
                "seconds": {"forward": spread(forward_s, 3), "rila": spread(rila_s, 3), "fila": spread(fila_s, 3)},
                "samples": len(forget) + len(retain),
                "rank": args.rank,
                "model": name,
                "device": str(device),
                "threads": torch.get_num_threads(),
                "machine": machine(load_start),
            }
        )
    )


if __name__ == "__main__":
    main()
