"""Cost of running TOFU through lm-eval.

eval_over_forward = wall time of the lm-eval tasks tofu_forget01_prob + tofu_forget01_truth_ratio
(task loading, tokenisation, requests, metrics) / wall time of plain batched forward passes
(unlearn_plugins.likelihood.answer_nll) over exactly the same (question, answer) token
sequences: per forget01 sample the answer, the paraphrased answer and the 5 perturbed ones.
Each side is timed ``--repeats`` times and the fastest run counts. Target: <= 1.5.

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/eval_speed.py
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

TASKS = ["tofu_forget01_prob", "tofu_forget01_truth_ratio"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--tofu-dir", default=os.environ.get("UNLEARN_TOFU_DIR")
                        or str(Path(__file__).resolve().parents[2] / "shared" / "data" / "tofu"))
    args = parser.parse_args(argv)

    import logging

    import torch
    from lm_eval.models.huggingface import HFLM

    from unlearn_plugins.data.tofu import encode_qa, load_split
    from unlearn_plugins.evaluation.lm_eval_runner import evaluate
    from unlearn_plugins.likelihood import answer_nll
    from unlearn_plugins.models import load_model, pick_device, resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    model, tok = load_model(args.model, device=args.device)
    where = resolve_model(args.model)

    forget = load_split("tofu:forget01", args.tofu_dir)
    perturbed = load_split("tofu:forget01_perturbed", args.tofu_dir,
                           require=("question", "answer", "paraphrased_answer", "perturbed_answer"))
    examples = [encode_qa(tok, s.question, s.answer) for s in forget]
    for s in perturbed:
        for answer in [s.extra["paraphrased_answer"], *s.extra["perturbed_answer"]]:
            examples.append(encode_qa(tok, s.question, answer))

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    answer_nll(model, examples[: args.batch_size], tok.pad_token_id, batch_size=args.batch_size)  # warm-up
    forward_times, eval_times = [], []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        answer_nll(model, examples, tok.pad_token_id, batch_size=args.batch_size)
        sync()
        forward_times.append(time.perf_counter() - t0)

        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=args.batch_size)
        sync()
        t0 = time.perf_counter()
        evaluation = evaluate(lm, TASKS, metadata={"tokenizer": where, "tofu_dir": args.tofu_dir}, bootstrap_iters=0)
        sync()
        eval_times.append(time.perf_counter() - t0)
    metrics = evaluation.summary["metrics"]
    line = {
        "eval_over_forward": round(min(eval_times) / min(forward_times), 3),
        "eval_s": round(min(eval_times), 3),
        "forward_s": round(min(forward_times), 3),
        "sequences": len(examples),
        "tokens": sum(len(e["input_ids"]) for e in examples),
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "model": args.model,
        "device": pick_device(args.device),
        "threads": torch.get_num_threads(),
        "forget01_prob": metrics["tofu_forget01_prob"]["prob"],
        "forget01_truth_ratio": metrics["tofu_forget01_truth_ratio"]["truth_ratio"],
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
