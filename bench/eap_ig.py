"""EAP-IG speed on the embedded model: prints one JSON line.

over_fwd_bwd = EAP-IG time (inputs mode, m steps) / time of plain forward+backward passes
of the same model over the same samples x m rows (gradients w.r.t. the input embeddings
only, weights frozen, full logits as a plain pass computes them), measured in the same run:
--rounds alternating rounds, the figure is the median of the per-round ratios (with its
spread; target <= 1.5). peak_rss_mb is read after the first EAP-IG round (model + EAP-IG),
before the plain passes, whose full-vocabulary logits need more (bench/memory.py measures
both in fresh processes).
activations_over_inputs = per-sample time of `activations` mode / per-sample time of
`inputs` mode (the batched measurement above); activations mode is measured on
--activations-samples samples only, with --activations-steps IG steps, and scaled to
--steps (its cost is linear in the steps: (2L+1) x steps rows per sample).

    python bench/eap_ig.py [--model smollm2-135m] [--samples 16] [--steps 5] [--rounds 5]
    python bench/eap_ig.py --quick --tofu-dir DIR     # the tiny model (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

from rounds import add_rounds_argument, load_average, machine, median, ratios, spread


def plain_passes(model, examples, steps, pad_id, rows_per_pass):
    """Forward + backward of every (sample, step) row, grads w.r.t. input embeddings only."""
    import torch

    from unlearn_plugins.data.qa import pad_batch
    from unlearn_plugins.likelihood import token_nll

    device = next(model.parameters()).device
    embed = model.get_input_embeddings()
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    per = max(1, rows_per_pass // steps)
    start = time.perf_counter()
    for k in range(0, len(order), per):
        batch = pad_batch([examples[i] for i in order[k : k + per]], pad_id)
        ids = batch["input_ids"].to(device).repeat(steps, 1)
        mask = batch["attention_mask"].to(device).repeat(steps, 1)
        labels = batch["labels"].to(device).repeat(steps, 1)
        with torch.no_grad():
            emb = embed(ids)
        emb.requires_grad_(True)
        logits = model(inputs_embeds=emb, attention_mask=mask, use_cache=False).logits
        nll, m = token_nll(logits, labels)
        (nll.sum(1) / m.sum(1)).sum().backward()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data", default="tofu:forget01")
    parser.add_argument("--tofu-dir", default=None)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--max-rows", type=int, default=20)
    add_rounds_argument(parser, 5, "alternating EAP-IG / plain rounds (the figure is the median of their ratios)")
    parser.add_argument("--activations-samples", type=int, default=1)
    parser.add_argument(
        "--activations-steps",
        type=int,
        default=None,
        help="IG steps of the activations-mode measurement (default: --steps); "
        "its time is scaled by steps / activations-steps (cost is linear in steps)",
    )
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 samples, 2 rounds (a smoke test)")
    args = parser.parse_args(argv)
    load_start = load_average()
    if args.quick:
        args.samples, args.steps, args.rounds, args.activations_steps = min(args.samples, 2), 2, 2, 1

    import torch

    from unlearn_plugins.circuits.eap_ig import EAPIG
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_model

    if args.quick:
        from unlearn_plugins.testing import tiny_llama, tiny_tokenizer

        tok = tiny_tokenizer()
        model = tiny_llama(len(tok))
    else:
        model, tok = load_model(args.model, device=args.device, dtype=args.dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    samples = load_split(f"{args.data}[0:{args.samples}]" if "[" not in args.data else args.data, args.tofu_dir)
    examples = encode_samples(tok, samples)
    pad = tok.pad_token_id
    sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)

    engine = EAPIG(model, steps=args.steps, max_rows=args.max_rows, pad_token_id=pad)
    engine.score(examples[:1])  # warm-up (allocator, kernels)
    plain_passes(model, examples[:1], args.steps, pad, args.max_rows)
    engine.timings = dict.fromkeys(engine.timings, 0.0)

    # alternate EAP-IG and plain passes: a slow spell of the machine hits both sides of a round
    eap_times, plain_times, rss_eap = [], [], None
    for _ in range(args.rounds):
        sync()
        t0 = time.perf_counter()
        engine.score(examples)
        sync()
        eap_times.append(time.perf_counter() - t0)
        if rss_eap is None:  # before any full plain pass (those hold full-vocabulary logits)
            rss_eap = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        plain_times.append(plain_passes(model, examples, args.steps, pad, args.max_rows))
        sync()
    eap = statistics.median(eap_times)
    round_ratios = ratios(eap_times, plain_times)
    breakdown = {k: round(v / args.rounds, 2) for k, v in engine.timings.items()}

    n_act = max(1, min(args.activations_samples, len(examples)))
    act_steps = args.activations_steps or args.steps
    act_engine = EAPIG(model, mode="activations", steps=act_steps, max_rows=args.max_rows, pad_token_id=pad)
    t0 = time.perf_counter()
    act_engine.score(examples[:n_act])
    sync()
    act = (time.perf_counter() - t0) * args.steps / act_steps
    result = {
        "bench": "eap_ig",
        "model": "tiny-llama" if args.quick else args.model,
        "device": str(next(model.parameters()).device),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "samples": len(examples),
        "steps": args.steps,
        "rows_per_pass": args.max_rows,
        "over_fwd_bwd": median(round_ratios, 3),
        "spread": {"over_fwd_bwd": spread(round_ratios, 3)},
        "activations_over_inputs": round((act / n_act) / (eap / len(examples)), 1),
        "activations_samples": n_act,
        "activations_steps": act_steps,
        "seconds_per_sample": round(eap / len(examples), 3),
        "eap_ig_s": spread(eap_times, 3),
        "plain_fwd_bwd_s": spread(plain_times, 3),
        "eap_ig_breakdown_s": breakdown,
        "activations_s_per_sample": round(act / n_act, 2),
        "peak_rss_mb": round(rss_eap, 1),
        "peak_rss_with_plain_passes_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "threads": torch.get_num_threads(),
        "machine": machine(load_start),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
