"""The benchmarks of bench/gpu_check.sh: one JSON line each, measured on the device given.

- ``evaluate``: lm-eval's TOFU tasks (forget01 probability, truth ratio and ROUGE; retain
  probability; real authors; world facts) of one model, prompt-shared scoring;
- ``eap_ig``: EAP-IG scores (inputs mode, 5 steps) of 20 forget01 QA;
- ``unlearn_epoch``: one epoch of GradDiff (LoRA r 8) on forget01 with 40 retain QA.

Each line: the benchmark, model, device, dtype, wall seconds, the CUDA allocator's peak (None
on CPU), the GPU's name and a result that says the run was real (a metric, a score, a loss).

    UNLEARN_TOFU_DIR=DIR python bench/gpu_check.py [--model smollm2-135m] [--device cuda]
    python bench/gpu_check.py --dry-run --tofu-dir DIR     # tiny model, tiny sizes, CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path


def gpu_name(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else None


class Measure:
    """Wall time and the CUDA allocator's peak of a block."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def __enter__(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = round(time.perf_counter() - self.start, 2)
        self.peak_cuda_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1) if self.cuda else None


def line(benchmark: str, args, measure: Measure, dtype: str, **result) -> None:
    row = {
        "benchmark": benchmark,
        "model": args.model,
        "device": args.device,
        "gpu": gpu_name(args.device),
        "dtype": dtype,
        "seconds": measure.seconds,
        "peak_cuda_mb": measure.peak_cuda_mb,
        **result,
    }
    print(json.dumps(row), file=sys.__stdout__, flush=True)  # the libraries' own output went to stderr


def bench_evaluate(args) -> None:
    from unlearn_plugins.evaluation.lm_eval_runner import evaluate_model
    from unlearn_plugins.models import pick_dtype

    tasks = ["tofu_forget01_prob", "tofu_forget01_truth_ratio", "tofu_forget01_rouge", "tofu_retain_prob"]
    tasks += ["tofu_real_authors", "tofu_world_facts"]
    with Measure(args.device) as m:
        evaluation = evaluate_model(
            args.model,
            tasks,
            device=args.device,
            batch_size=args.batch_size,
            tofu_dir=args.tofu_dir,
            limit=args.limit,
            max_gen_toks=args.max_gen_toks,
        )
    metrics = evaluation.summary["metrics"]
    prob = next(v for k, v in metrics["tofu_forget01_prob"].items() if isinstance(v, float))
    dtype = str(pick_dtype(args.device)).removeprefix("torch.")
    line("evaluate", args, m, dtype, tasks=len(tasks), forget01_prob=prob)


def bench_eap_ig(args) -> None:
    from unlearn_plugins.circuits.eap_ig import EAPIG
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_model

    model, tok = load_model(args.model, device=args.device)
    for p in model.parameters():
        p.requires_grad_(False)
    samples = load_split(f"tofu:forget01[0:{args.qa}]", args.tofu_dir)
    examples = encode_samples(tok, samples)
    engine = EAPIG(model, steps=5, max_rows=20, pad_token_id=tok.pad_token_id)
    with Measure(args.device) as m:
        scores = engine.score(examples)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    line("eap_ig", args, m, dtype, qa=len(examples), scores_finite=bool(scores.isfinite().all()))


def bench_unlearn_epoch(args) -> None:
    from unlearn_plugins.training import UnlearnConfig, run_unlearning

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        config = UnlearnConfig(
            out=str(Path(tmp) / "run"),
            model=args.model,
            tofu_dir=args.tofu_dir,
            forget=f"tofu:forget01[0:{args.qa}]" if args.dry_run else "tofu:forget01",
            retain=f"tofu:retain99[0:{2 * args.qa if args.dry_run else 40}]",
            objective="grad_diff",
            lora_r=8,
            epochs=1,
            batch_size=4,
            grad_accum=1,
            max_length=128 if args.dry_run else 256,
            save_steps=0,
            device=args.device,
        )
        with Measure(args.device) as m:
            result = run_unlearning(config)
    record = result.record
    line(
        "unlearn_epoch",
        args,
        m,
        record.get("weight_dtype", "?"),
        mixed_precision=record.get("mixed_precision"),
        steps=record.get("steps"),
        final_loss=record.get("final_loss"),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=None, help="default: cuda if available (--dry-run: cpu)")
    parser.add_argument("--tofu-dir", default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dry-run", action="store_true", help="the tiny model, tiny sizes, on the CPU")
    parser.add_argument("--only", choices=("evaluate", "eap_ig", "unlearn_epoch"), action="append")
    args = parser.parse_args(argv)
    from unlearn_plugins.models import pick_device

    args.qa, args.limit, args.max_gen_toks = 20, None, None
    if args.dry_run:
        args.model, args.device = "tiny-llama", args.device or "cpu"
        args.qa, args.limit, args.max_gen_toks, args.batch_size = 2, 2, 8, 2
    args.device = pick_device(args.device)
    for name in args.only or ("evaluate", "eap_ig", "unlearn_epoch"):
        with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON lines only
            globals()[f"bench_{name}"](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
