"""Cost of one study-protocol TOFU evaluation, and where its time goes: the new scoring path
(:class:`unlearn_plugins.evaluation.prefix_lm.PrefixSharedLM`) against lm-eval's HFLM.

One evaluation as ``reglu_tofu`` runs it for one unlearned adapter: the study's benchmark (20
TOFU authors, the last one forgotten: 20 forget QA, Model Utility on 380 retain, 100 real-author
and 117 world-fact QA), its tasks (forget probability, truth ratio with Forget Quality, ROUGE and
extraction strength; the nine Model Utility parts with ROUGE generations), its generation cap
(the longest answer + 16 tokens) and batch size 32, on SmolLM2-135M with a LoRA adapter (r 32 on
every linear layer, non-zero B: a model that differs from the base), fp32 weights (the adapter
merged, exact in fp32, as the study does). Each round runs the old path then the new one in this
process with the same threads; ``new_over_old`` is the median of the per-round ratios of their
wall times. Per path: the time in model loading, task building, log-likelihood requests,
generation requests and lm-eval's own work (the rest), the requests and tokens of each kind per
task, and whether every metric of the two paths agrees (1e-5 relative on probabilities and truth
ratios, exact on ROUGE and extraction strength).

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/eval_protocol.py [--rounds 2] [--threads 2]
    # a reglu_tofu cell from a study cache (its target model, an unlearned adapter, its benchmark)
    python bench/eval_protocol.py --model CACHE/target-full-KEY/run/merged \
        --adapter CACHE/run-ihl-forget1-seed0-KEY/run --benchmark CACHE/bench-tofu-KEY
    python bench/eval_protocol.py --quick          # the tiny model, --limit 8 (a smoke test)
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from rounds import load_average, machine, median, ratios, spread

TASKS = [
    "tofu_forget_prob",
    "tofu_forget_rouge",
    "tofu_forget_truth_ratio",
    "tofu_forget_extraction_strength",
    "tofu_model_utility",
]
EXACT = ("rouge", "extraction_strength")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="the model (a study's target: its run/merged folder)")
    parser.add_argument("--adapter", default=None, help="an unlearned adapter (default: a random LoRA adapter)")
    parser.add_argument("--benchmark", default=None, help="a study's benchmark folder (default: built here)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each timing both paths")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    parser.add_argument("--gen-margin", type=int, default=16)
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--tofu-dir",
        default=os.environ.get("UNLEARN_TOFU_DIR")
        or str(Path(__file__).resolve().parents[2] / "shared" / "data" / "tofu"),
    )
    parser.add_argument("--quick", action="store_true", help="the tiny model, --limit 8, 1 round (a smoke test)")
    parser.add_argument(
        "--only",
        choices=("new", "old"),
        default=None,
        help="time one path only (its breakdown; no ratio, no agreement): for profiling",
    )
    args = parser.parse_args(argv)
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="unlearn-bench-") as tmp:
        model = args.model
        if args.quick:
            from unlearn_plugins.testing import save_tiny_model

            args.rounds, args.limit = 1, args.limit or 8
            model = str(save_tiny_model(Path(tmp) / "tiny-model"))
        return measure(args, model, Path(tmp), load_start)


def make_adapter(model: str, folder: Path, seed: int = 0) -> str:
    """A LoRA adapter (r 32, alpha 64, every linear layer) with small random B: a model that
    differs from its base, as an unlearned adapter does."""
    import torch
    from peft import LoraConfig, get_peft_model

    from unlearn_plugins.models import load_model

    base, _ = load_model(model, dtype="float32")
    config = LoraConfig(r=32, lora_alpha=64, target_modules="all-linear", lora_dropout=0.0)
    peft = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 1e-3)
    peft.save_pretrained(folder)
    return str(folder)


class Timed:
    """Wall time and token counts of an lm-eval model class's request methods."""

    def __init__(self):
        self.seconds = {"loglikelihood": 0.0, "generate_until": 0.0}
        self.requests: dict[str, dict[str, int]] = {}
        self.tokens: dict[str, dict[str, int]] = {}
        self.generation: dict[str, int] = {}

    def wrap(self, cls):
        timed = self

        class Wrapped(cls):
            def loglikelihood(self, requests, disable_tqdm=False):
                started = time.perf_counter()
                try:
                    return super().loglikelihood(requests, disable_tqdm=True)
                finally:
                    timed.seconds["loglikelihood"] += time.perf_counter() - started
                    timed.count(self, "loglikelihood", requests)

            def generate_until(self, requests, disable_tqdm=False):
                started = time.perf_counter()
                try:
                    out = super().generate_until(requests, disable_tqdm=True)
                finally:
                    timed.seconds["generate_until"] += time.perf_counter() - started
                timed.count(self, "generate_until", requests, out)
                timed.generation = dict(getattr(self, "counts", {}))
                return out

        Wrapped.__name__ = cls.__name__
        return Wrapped

    def count(self, lm, kind, requests, outputs=None):
        requests_of = self.requests.setdefault(kind, {})
        tokens_of = self.tokens.setdefault(kind, {})
        for i, req in enumerate(requests):
            task = req.task_name or "?"
            requests_of[task] = requests_of.get(task, 0) + 1
            n = len(lm.tok_encode(req.args[0] + (req.args[1] if kind == "loglikelihood" else "")))
            if outputs is not None:
                n += len(lm.tok_encode(outputs[i]))
            tokens_of[task] = tokens_of.get(task, 0) + n


def one_evaluation(args, model: str, adapter: str, bench, scoring: str) -> tuple[dict, object, float, float]:
    """(time breakdown, Evaluation, wall seconds, CPU seconds of this process) of one evaluation on
    ``scoring``'s path."""
    import unlearn_plugins.evaluation.lm_eval_runner as runner
    from unlearn_plugins.benchmarks.tofu.data import generation_cap
    from unlearn_plugins.models import load_model, load_tokenizer

    timed = Timed()
    original_class, original_prepare = runner.lm_class_for, runner.prepare_for_model
    spent = {"load_model": 0.0, "build_tasks": 0.0}

    def prepare(*a, **k):
        started = time.perf_counter()
        try:
            return original_prepare(*a, **k)
        finally:
            spent["build_tasks"] += time.perf_counter() - started

    started, cpu_started = time.perf_counter(), time.process_time()
    loaded = load_model(model, dtype=args.dtype, adapter=adapter, merge_adapter=args.dtype == "float32")
    spent["load_model"] = time.perf_counter() - started
    runner.lm_class_for = lambda name: timed.wrap(original_class(name))
    runner.prepare_for_model = prepare
    try:
        cap = generation_cap(load_tokenizer(model), bench, args.gen_margin)
        evaluation = runner.evaluate_model(
            model,
            TASKS,
            adapter=adapter,
            dtype=args.dtype,
            batch_size=args.batch_size,
            device=args.device,
            tofu_dir=str(bench.folder),
            forget_split=str(bench.forget),
            max_gen_toks=cap,
            limit=args.limit,
            loaded=loaded,
            merge_adapter=args.dtype == "float32",
            scoring=scoring,
        )
    finally:
        runner.lm_class_for, runner.prepare_for_model = original_class, original_prepare
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    seconds = {**spent, **timed.seconds}
    seconds["lm_eval_other"] = wall - sum(seconds.values())
    breakdown = {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "requests": timed.requests,
        "tokens": timed.tokens,
        "generated_tokens": timed.generation,  # new path: read from the scoring / decoded
    }
    return breakdown, evaluation, wall, cpu


def same_responses(old: list, new: list) -> bool:
    """Generations equal; log-likelihood answers with the same greedy flag (their log-probabilities
    differ by rounding: the metrics built from them are compared to 1e-5)."""
    if len(old) != len(new):
        return False
    for a, b in zip(old, new):
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if bool(a[1]) != bool(b[1]):
                return False
        elif a != b:
            return False
    return True


def compare(old, new) -> dict:
    """The largest relative difference of each metric, and whether it is within the bench's tolerances."""
    worst: dict[str, float] = {}
    for task, metrics in old.summary["metrics"].items():
        for name, a in metrics.items():
            b = new.summary["metrics"].get(task, {}).get(name)
            if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
                if a != b:
                    worst[f"{task}:{name}"] = math.inf
                continue
            worst[f"{task}:{name}"] = abs(a - b) / max(abs(a), 1e-12) if a != b else 0.0
    for task, rows in old.samples.items():  # every sample's responses: generations exactly
        others = {r["doc_id"]: r for r in new.samples.get(task, [])}
        for row in rows:
            other = others.get(row["doc_id"])
            if other is None or not same_responses(row["filtered_resps"], other["filtered_resps"]):
                worst[f"{task}:responses"] = math.inf
    exact_ok = all(v == 0.0 for k, v in worst.items() if any(e in k for e in EXACT) or k.endswith(":responses"))
    close_ok = all(v <= 1e-5 for k, v in worst.items())
    finite = {k: (v if math.isfinite(v) else "differs") for k, v in worst.items()}
    largest = max((v for v in worst.values() if math.isfinite(v)), default=0.0)
    return {"same_numbers": exact_ok and close_ok, "largest_rel_diff": largest, "per_metric": finite}


def measure(args, model: str, tmp: Path, load_start) -> int:
    import logging

    import torch

    from unlearn_plugins.benchmarks.tofu.data import build_benchmark, find_tofu, load_benchmark

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.benchmark:
        bench = load_benchmark(args.benchmark)
        if bench is None:
            raise SystemExit(f"--benchmark {args.benchmark}: not a benchmark folder")
    else:
        tofu = find_tofu("tofu", args.tofu_dir, 20)
        bench = build_benchmark(tmp / "bench", tofu=tofu, n_authors=20, n_forget=1, eval_size=400)
    adapter = args.adapter or make_adapter(model, tmp / "adapter")
    old_s, new_s, old_cpu, new_cpu, rounds = [], [], [], [], []
    agreement = None
    if args.only:
        for _ in range(args.rounds):
            breakdown, _, wall, _ = one_evaluation(
                args, model, adapter, bench, "prefix" if args.only == "new" else "hf"
            )
            rounds.append(breakdown)
        line = {
            "bench": "eval_protocol",
            "only": args.only,
            "limit": args.limit,
            "wall_s": [r["wall_s"] for r in rounds],
        }
        print(json.dumps({**line, "threads": torch.get_num_threads(), "breakdown_last_round": rounds[-1]}))
        return 0
    for _ in range(args.rounds):
        old, old_eval, old_wall, old_c = one_evaluation(args, model, adapter, bench, "hf")
        new, new_eval, new_wall, new_c = one_evaluation(args, model, adapter, bench, "prefix")
        old_s.append(old_wall)
        new_s.append(new_wall)
        old_cpu.append(old_c)
        new_cpu.append(new_c)
        rounds.append({"old": old, "new": new})
        agreement = compare(old_eval, new_eval)
    per_round = ratios(new_s, old_s)
    line = {
        "bench": "eval_protocol",
        "model": "tiny" if args.quick else args.model,
        "adapter": args.adapter or "random LoRA r 32",
        "benchmark": args.benchmark or "built: 20 TOFU authors, forget 1",
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "limit": args.limit,
        "threads": torch.get_num_threads(),
        "new_over_old": median(per_round),
        "new_over_old_spread": spread(per_round),
        "new_over_old_cpu": median(ratios(new_cpu, old_cpu)),
        "old_wall_s": spread(old_s, 2),
        "new_wall_s": spread(new_s, 2),
        "agreement": agreement,
        "breakdown_last_round": rounds[-1],
        "target": "new_over_old <= 0.33 with the same numbers",
        "machine": machine(load_start),
    }
    print(json.dumps(line))
    return 0 if agreement and agreement["same_numbers"] else 1


if __name__ == "__main__":
    sys.exit(main())
