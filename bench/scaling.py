"""How EAP-IG, a trainer step and RILA init scale with depth: one JSON line.

Tiny Llamas of --layers depths (default 4, 8, 16, 32; the same width), each method against its
plain baseline on the same model and data, in alternating rounds:

  eap_ig_over_fwd_bwd      EAP-IG (inputs mode, --steps) / forward+backward with input-embedding
                           gradients over the same rows (bench/eap_ig.py's measure; bound 1.5)
  trainer_over_bare_loop   median `run_unlearning` optimizer step / bare-loop step on the same
                           batches (bench/trainer_overhead.py's measure; bound 1.10)
  rila_over_forward        RILA init / no-grad forward of the LoRA model over the same data
                           (bench/init_cost.py's measure; bound 1.3)

Per depth: the median of the per-round ratios and their spread. ``exponent``: the slope of
log(median time) against log(layers) (numpy polyfit) for each method and each baseline; a
method whose exponent exceeds its baseline's grows faster than the model (a hidden quadratic
term shows as ~2).

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/scaling.py [--layers 4 8 16 32] [--rounds 3]
    python bench/scaling.py --quick --tofu-dir DIR     # depths 2 and 4 of a width-64 model (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from rounds import load_average, machine, median, parse_run_arguments, ratios, spread

BOUNDS = {"eap_ig_over_fwd_bwd": 1.5, "trainer_over_bare_loop": 1.10, "rila_over_forward": 1.3}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def eap_ig_rounds(folder: str, args) -> tuple[list[float], list[float], dict]:
    """(EAP-IG seconds, plain forward+backward seconds) per round, and EAP-IG's mean seconds per
    round in each part (the engine's own timings: sources, forward, backward; hooks, the
    gradient reductions and edge contractions, run inside the backward)."""
    from eap_ig import plain_passes

    from unlearn_plugins.circuits.eap_ig import EAPIG
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_model

    model, tok = load_model(folder, device=args.device)
    model.requires_grad_(False)
    examples = encode_samples(tok, load_split(f"tofu:forget01[0:{args.samples}]", args.tofu_dir), max_length=128)
    pad = tok.pad_token_id
    engine = EAPIG(model, steps=args.steps, max_rows=args.max_rows, pad_token_id=pad)
    engine.score(examples[:1])  # warm-up
    plain_passes(model, examples[:1], args.steps, pad, args.max_rows)
    engine.timings = dict.fromkeys(engine.timings, 0.0)
    eap, plain = [], []
    for _ in range(args.rounds):
        eap.append(timed(lambda: engine.score(examples)))
        plain.append(timed(lambda: plain_passes(model, examples, args.steps, pad, args.max_rows)))
    return eap, plain, {part: round(t / args.rounds, 4) for part, t in engine.timings.items()}


def rila_rounds(folder: str, args) -> tuple[list[float], list[float]]:
    """(RILA init seconds, LoRA-model no-grad forward seconds) per round, each init from the
    same starting weights (restored, untimed)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.initializers.residual import batches
    from unlearn_plugins.initializers.rila import RILAInit
    from unlearn_plugins.models import load_model

    warnings.filterwarnings("ignore", "rila: fewer than r positive")  # few samples: expected, not the measure
    base, tok = load_model(folder, device=args.device)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS)).eval()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    forget = encode_samples(tok, load_split(f"tofu:forget10[0:{args.samples}]", args.tofu_dir), max_length=128)
    retain = encode_samples(tok, load_split(f"tofu:retain90[0:{args.samples}]", args.tofu_dir), max_length=128)
    device = next(model.parameters()).device
    rila = RILAInit()

    def forward():
        with torch.no_grad():
            for batch in batches(forget + retain, tok.pad_token_id, 8, device):
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    def init():
        rila.initialize(model, forget=forget, retain=retain, tokenizer=tok)

    forward()  # warm-up
    init()
    model.load_state_dict(start)
    inits, forwards = [], []
    for _ in range(args.rounds):
        forwards.append(timed(forward))
        inits.append(timed(init))
        model.load_state_dict(start)
        model.eval()
    return inits, forwards


def trainer_rounds(folder: str, args, tmp: Path) -> tuple[list[float], list[float]]:
    """(median Trainer step seconds, median bare-loop step seconds) per round."""
    from trainer_overhead import bare_steps, run_config, trainer_steps

    trainer, bare = [], []
    for round_ in range(args.rounds):
        config = run_config(
            str(tmp / f"run{round_}"), folder, args.tofu_dir, args.warmup + args.train_steps, round_, args.device
        )
        recorded: list = []
        times, _ = trainer_steps(config, recorded)
        trainer.append(statistics.median(times[args.warmup :]))
        times, _ = bare_steps(config, recorded[: args.warmup + args.train_steps])
        bare.append(statistics.median(times[args.warmup :]))
    return trainer, bare


def exponent(layers: list[int], seconds: list[float]) -> float:
    """Slope of log(seconds) against log(layers)."""
    import numpy as np

    return round(float(np.polyfit(np.log(layers), np.log(seconds), 1)[0]), 3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per depth (figures are medians)")
    parser.add_argument("--samples", type=int, default=8, help="EAP-IG samples; RILA: forget and retain samples each")
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG steps")
    parser.add_argument("--max-rows", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=6, help="timed trainer steps per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed trainer steps per round")
    args = parse_run_arguments(parser, argv, "depths 2 and 4, width 64, 1 round (a smoke test)")
    if args.quick:
        args.layers, args.hidden, args.intermediate, args.rounds = [2, 4], 64, 128, 1
        args.samples, args.steps, args.train_steps, args.warmup = 2, 2, 2, 1
    if len(args.layers) < 2 or min(args.layers) < 1:
        raise SystemExit("error: --layers needs at least two depths >= 1 (the exponent is a fit)")
    load_start = load_average()

    from unlearn_plugins.testing import save_tiny_model

    measures = {
        "eap_ig_over_fwd_bwd": ("eap_ig", "fwd_bwd"),
        "trainer_over_bare_loop": ("trainer_step", "bare_step"),
        "rila_over_forward": ("rila", "forward"),
    }
    ratio_rounds: dict[str, dict[str, list[float]]] = {name: {} for name in measures}
    breakdown: dict[str, dict] = {}
    seconds: dict[str, list[float]] = {side: [] for pair in measures.values() for side in pair}
    with tempfile.TemporaryDirectory(prefix="unlearn-bench-scaling-") as tmp:
        for n_layers in args.layers:
            folder = str(
                save_tiny_model(
                    Path(tmp) / f"llama-{n_layers}",
                    layers=n_layers,
                    hidden=args.hidden,
                    intermediate=args.intermediate,
                    heads=args.heads,
                    kv_heads=args.kv_heads,
                )
            )
            eap, plain, breakdown[str(n_layers)] = eap_ig_rounds(folder, args)
            results = {
                "eap_ig_over_fwd_bwd": (eap, plain),
                "trainer_over_bare_loop": trainer_rounds(folder, args, Path(tmp) / f"runs-{n_layers}"),
                "rila_over_forward": rila_rounds(folder, args),
            }
            for name, (method, baseline) in results.items():
                ratio_rounds[name][str(n_layers)] = ratios(method, baseline)
                seconds[measures[name][0]].append(statistics.median(method))
                seconds[measures[name][1]].append(statistics.median(baseline))

    line = {
        "bench": "scaling",
        "layers": args.layers,
        "width": {
            "hidden": args.hidden,
            "intermediate": args.intermediate,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
        },
        **{name: {depth: median(values, 3) for depth, values in per.items()} for name, per in ratio_rounds.items()},
        "bounds": BOUNDS,
        "within_bounds": {
            name: all(statistics.median(v) <= BOUNDS[name] for v in per.values()) for name, per in ratio_rounds.items()
        },
        "exponent": {side: exponent(args.layers, values) for side, values in seconds.items()},
        "seconds": {
            side: dict(zip(map(str, args.layers), (round(v, 4) for v in values))) for side, values in seconds.items()
        },
        # where EAP-IG's time goes per depth; hooks_share is the part whose edge contraction
        # grows with (sources x destinations), i.e. with layers squared
        "eap_ig_breakdown_s": {
            depth: {
                **parts,
                "hooks_share": round(parts["hooks"] / max(sum(v for k, v in parts.items() if k != "hooks"), 1e-9), 3),
            }
            for depth, parts in breakdown.items()
        },
        "spread": {
            name: {depth: spread(values, 3) for depth, values in per.items()} for name, per in ratio_rounds.items()
        },
        "rounds": args.rounds,
        "machine": machine(load_start),
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
