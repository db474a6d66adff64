"""Overhead of the Trainer-based `unlearn run` over a bare PyTorch loop.

Per round: the median optimizer-step time of `run_unlearning` (grad_diff, LoRA r=8, batch 4,
64-token sequences; the wall time between consecutive steps, so data loading, logging and
callbacks count) over that of a bare loop computing the same loss on the same batches with the
same model (same LoRA init, AdamW, gradient clipping). The bare loop replays the exact examples
the Trainer's sampler drew and collates them itself. Rounds alternate the two to spread machine
noise. Prints one JSON line: {"trainer_over_bare_loop": median of the per-round ratios (target
<= 1.10), "spread": ..., ...}.

    python bench/trainer_overhead.py [--model smollm2-135m] [--steps 10] [--rounds 5]
    python bench/trainer_overhead.py --quick --tofu-dir DIR     # the tiny model (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rounds import load_average, machine, median, spread


def run_config(out: str, model: str, tofu_dir: str | None, steps: int, seed: int, device: str | None = None):
    """The unlearning run both loops replay: grad_diff on forget01 with 200 retain QA, LoRA r 8,
    batch 4, 64 tokens, ``steps`` optimizer steps, no checkpoints (also bench/scaling.py's)."""
    from unlearn_plugins.training import UnlearnConfig

    return UnlearnConfig(
        out=out,
        model=model,
        tofu_dir=tofu_dir,
        forget="tofu:forget01",
        retain="tofu:retain99[0:200]",
        objective="grad_diff",
        lora_r=8,
        lora_alpha=16,
        batch_size=4,
        grad_accum=1,
        max_length=64,
        max_steps=steps,
        save_steps=0,
        seed=seed,
        device=device,
    )


def trainer_steps(config, recorded: list) -> tuple[list[float], list[float]]:
    """Step times and losses of run_unlearning; records the examples of every batch it collates."""
    from transformers import TrainerCallback

    from unlearn_plugins.data import qa
    from unlearn_plugins.training import run_unlearning

    marks: list[float] = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            recorded.clear()  # run_unlearning's check of the first loss collated a batch before training
            marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            marks.append(time.perf_counter())

    original = qa.PaddingCollator.__call__

    def recording_call(self, examples):
        recorded.append(list(examples))
        return original(self, examples)

    qa.PaddingCollator.__call__ = recording_call
    try:
        result = run_unlearning(config, callbacks=[StepTimer()])
    finally:
        qa.PaddingCollator.__call__ = original
    return [b - a for a, b in zip(marks, marks[1:])], [e["loss"] for e in result.record["losses"]]


def bare_steps(config, batches: list) -> tuple[list[float], list[float]]:
    """The same computation as a plain loop: LoRA model, objective loss, backward, clip, AdamW."""
    import torch
    from transformers import AutoModelForCausalLM, set_seed

    from unlearn_plugins import UNLEARNING_OBJECTIVE, create
    from unlearn_plugins.data.qa import PaddingCollator
    from unlearn_plugins.initializers.peft_builtin import KaimingInit
    from unlearn_plugins.models import load_tokenizer, resolve_model
    from unlearn_plugins.training.lora import build_lora_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    set_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(config.model), dtype=torch.float32).to(device)
    model.config.use_cache = False
    tokenizer = load_tokenizer(config.model)
    set_seed(config.seed)
    model = build_lora_model(
        model, r=config.lora_r, alpha=config.lora_alpha, dropout=config.lora_dropout, target_modules=None
    )
    KaimingInit().initialize(model)  # run_unlearning's default init, drawn from the same seed
    objective = create(UNLEARNING_OBJECTIVE, config.objective)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    collate = PaddingCollator(tokenizer.pad_token_id)
    model.train()
    times, losses = [], []
    start = time.perf_counter()
    for examples in batches:
        batch = {k: {n: t.to(device) for n, t in v.items()} for k, v in collate(examples).items()}
        loss = objective.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - start)
        losses.append(loss.detach())
        start = now
    return times, [float(v) for v in losses]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tofu-dir", default=None)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the figure is the median of their ratios)")
    parser.add_argument("--quick", action="store_true", help="the tiny model, 3 steps, 2 rounds (a smoke test)")
    args = parser.parse_args(argv)
    load_start = load_average()

    import torch

    if args.quick:
        args.steps, args.warmup, args.rounds = 3, 1, 2
    trainer_times, bare_times, round_ratios, loss_gap = [], [], [], 0.0
    with tempfile.TemporaryDirectory(prefix="unlearn-bench-") as tmp:
        model = args.model
        if args.quick:
            from unlearn_plugins.testing import save_tiny_model

            model = str(save_tiny_model(Path(tmp) / "tiny-model"))
        for round_ in range(args.rounds):
            config = run_config(str(Path(tmp) / f"run{round_}"), model, args.tofu_dir, args.warmup + args.steps, round_)
            recorded: list = []
            times, trainer_losses = trainer_steps(config, recorded)
            trainer = times[args.warmup :]
            times, bare_losses = bare_steps(config, recorded[: args.warmup + args.steps])  # not a prefetched one
            bare = times[args.warmup :]
            trainer_times += trainer
            bare_times += bare
            round_ratios.append(statistics.median(trainer) / statistics.median(bare))
            # same computation: the per-step losses agree
            loss_gap = max(loss_gap, max(abs(a - b) / max(abs(a), 1e-8) for a, b in zip(trainer_losses, bare_losses)))
    print(
        json.dumps(
            {
                "bench": "trainer_overhead",
                "trainer_over_bare_loop": median(round_ratios),
                "spread": {"trainer_over_bare_loop": spread(round_ratios)},
                "trainer_step_s": spread(trainer_times),
                "bare_step_s": spread(bare_times),
                "timed_steps": len(trainer_times),
                "max_relative_loss_gap": float(f"{loss_gap:.2e}"),
                "model": "tiny-llama" if args.quick else args.model,
                "objective": "grad_diff",
                "lora_r": 8,
                "batch_size": 4,
                "max_length": 64,
                "device": "cuda" if torch.cuda.is_available() else "cpu",
                "threads": torch.get_num_threads(),
                "machine": machine(load_start),
            }
        )
    )


if __name__ == "__main__":
    main()
