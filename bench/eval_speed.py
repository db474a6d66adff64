"""Cost of running TOFU through lm-eval.

eval_over_forward = wall time of the lm-eval tasks tofu_forget01_prob + tofu_forget01_truth_ratio
(task loading, tokenisation, requests, metrics) / wall time of plain batched forward passes
(unlearn_plugins.likelihood.answer_nll) over exactly the same (question, answer) token
sequences: per forget01 sample the answer, the paraphrased answer and the 5 perturbed ones.
Each round times both sides; the figure is the median of the per-round ratios, with its spread.
Target: <= 1.5 (``--scoring prefix``, the default, scores each prompt once and can go below 1:
the plain forward passes run every sequence whole).

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/eval_speed.py [--rounds 3]
    python bench/eval_speed.py --quick --tofu-dir DIR     # the tiny model (a smoke test)
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from rounds import add_rounds_argument, load_average, machine, median, ratios, spread

TASKS = ["tofu_forget01_prob", "tofu_forget01_truth_ratio"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=8)
    add_rounds_argument(parser, 3, "rounds, each timing both sides (the figure is the median of their ratios)")
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--scoring", choices=("prefix", "hf"), default="prefix", help="the lm-eval model class (unlearn eval --scoring)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--tofu-dir",
        default=os.environ.get("UNLEARN_TOFU_DIR")
        or str(Path(__file__).resolve().parents[2] / "shared" / "data" / "tofu"),
    )
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 rounds (a smoke test)")
    args = parser.parse_args(argv)
    load_start = load_average()
    if args.quick:
        args.rounds = 2
        with tempfile.TemporaryDirectory(prefix="unlearn-bench-") as tmp:
            from unlearn_plugins.testing import save_tiny_model

            return measure(args, str(save_tiny_model(Path(tmp) / "tiny-model")), load_start)
    return measure(args, args.model, load_start)


def measure(args, model_spec: str, load_start) -> int:
    """Time both sides for ``args.rounds`` rounds on ``model_spec``; print the line."""
    import logging

    import torch

    from unlearn_plugins.data.qa import encode_qa, load_split
    from unlearn_plugins.evaluation.lm_eval_runner import evaluate, lm_class_for
    from unlearn_plugins.likelihood import answer_nll
    from unlearn_plugins.models import load_model, pick_device, resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    model, tok = load_model(model_spec, device=args.device)
    where = resolve_model(model_spec)

    forget = load_split("tofu:forget01", args.tofu_dir)
    perturbed = load_split(
        "tofu:forget01_perturbed",
        args.tofu_dir,
        require=("question", "answer", "paraphrased_answer", "perturbed_answer"),
    )
    examples = [encode_qa(tok, s.question, s.answer) for s in forget]
    for s in perturbed:
        for answer in [s.extra["paraphrased_answer"], *s.extra["perturbed_answer"]]:
            examples.append(encode_qa(tok, s.question, answer))

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    answer_nll(model, examples[: args.batch_size], tok.pad_token_id, batch_size=args.batch_size)  # warm-up
    forward_times, eval_times = [], []
    for _ in range(args.rounds):
        sync()
        t0 = time.perf_counter()
        answer_nll(model, examples, tok.pad_token_id, batch_size=args.batch_size)
        sync()
        forward_times.append(time.perf_counter() - t0)

        lm = lm_class_for(args.scoring)(pretrained=model, tokenizer=tok, batch_size=args.batch_size)
        sync()
        t0 = time.perf_counter()
        evaluation = evaluate(lm, TASKS, metadata={"tokenizer": where, "tofu_dir": args.tofu_dir}, bootstrap_iters=0)
        sync()
        eval_times.append(time.perf_counter() - t0)
    metrics = evaluation.summary["metrics"]
    round_ratios = ratios(eval_times, forward_times)
    line = {
        "bench": "eval_speed",
        "eval_over_forward": median(round_ratios, 3),
        "spread": {"eval_over_forward": spread(round_ratios, 3)},
        "eval_s": spread(eval_times, 3),
        "forward_s": spread(forward_times, 3),
        "sequences": len(examples),
        "tokens": sum(len(e["input_ids"]) for e in examples),
        "batch_size": args.batch_size,
        "scoring": args.scoring,
        "rounds": args.rounds,
        "model": "tiny-llama" if args.quick else args.model,
        "device": pick_device(args.device),
        "threads": torch.get_num_threads(),
        "forget01_prob": metrics["tofu_forget01_prob"]["prob"],
        "forget01_truth_ratio": metrics["tofu_forget01_truth_ratio"]["truth_ratio"],
        "machine": machine(load_start),
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
