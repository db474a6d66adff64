"""Peak memory (RSS) of a reference-model objective, of EAP-IG and of the demo; one JSON line.

Every figure is the peak resident set size of a fresh child process (its own
getrusage ru_maxrss at exit), never of this process:

  npo_over_grad_ascent_rss   an NPO LoRA run / the same run with grad_ascent (`run_unlearning`,
                             both forget-only: alpha = 0, so the runs differ only in the objective
                             and NPO's reference model). Target <= 1.15.
  eap_ig_over_fwd_bwd_rss    EAP-IG (inputs mode) over --samples samples x --steps rows / plain
                             forward+backward passes with input-embedding gradients over the same
                             rows (bench/eap_ig.py's baseline). Target <= 1.5.
  demo_peak_rss_gb           `unlearn demo`, cold (fresh caches): --with-demo runs it in a child
                             (~15 min) and reads its peak from wait4, as /usr/bin/time -v does (the
                             largest single process); --demo-rss-from FILE reads "Maximum resident
                             set size" from a saved `/usr/bin/time -v unlearn demo` output. Target
                             <= 3.0. Null without either.

Each child runs --rounds times (the figures are medians, with their spread); "baseline" is a
child that only imports and loads the model, the floor under every other figure.

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/memory.py [--model smollm2-135m] [--rounds 2]
    python bench/memory.py --quick --tofu-dir DIR     # the tiny model (a smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from rounds import load_average, machine, median, ratios, spread

KINDS = ("baseline", "npo", "grad_ascent", "eap_ig", "fwd_bwd")
TIME_V_RSS = re.compile(r"Maximum resident set size \(kbytes\):\s*(\d+)")


# ----------------------------------------------------------------------------- children


def child(kind: str, spec: dict) -> dict:
    """Do one measured thing in this (fresh) process; return what it reports besides the peak."""
    from unlearn_plugins.models import load_model

    if kind in ("npo", "grad_ascent"):
        from unlearn_plugins.training import UnlearnConfig, run_unlearning

        config = UnlearnConfig(
            out=spec["out"],
            model=spec["model"],
            tofu_dir=spec["tofu_dir"],
            forget=spec["forget"],
            retain=None,
            objective=kind,
            objective_options={"alpha": 0.0},
            lora_r=8,
            lora_alpha=16,
            batch_size=4,
            grad_accum=1,
            max_length=spec["max_length"],
            max_steps=spec["train_steps"],
            save_steps=0,
            device=spec["device"],
        )
        record = run_unlearning(config).record
        return {"reference_model": (record.get("reference_model") or {}).get("how"), "steps": record["steps"]}
    model, tok = load_model(spec["model"], device=spec["device"])
    if kind == "baseline":
        return {}
    from eap_ig import plain_passes

    from unlearn_plugins.circuits.eap_ig import EAPIG
    from unlearn_plugins.data.qa import encode_samples, load_split

    for p in model.parameters():
        p.requires_grad_(False)
    examples = encode_samples(tok, load_split(f"tofu:forget01[0:{spec['samples']}]", spec["tofu_dir"]))
    if kind == "eap_ig":
        EAPIG(model, steps=spec["steps"], max_rows=spec["max_rows"], pad_token_id=tok.pad_token_id).score(examples)
    else:
        plain_passes(model, examples, spec["steps"], tok.pad_token_id, spec["max_rows"])
    return {}


def run_child(kind: str, spec: dict) -> dict:
    """Peak RSS (MB) and report of ``kind`` in a fresh Python process."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--spec", json.dumps(spec)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"error: the {kind} child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- the demo


def demo_rss_from(path: str) -> float:
    """GB from `/usr/bin/time -v` output (its "Maximum resident set size (kbytes)")."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise SystemExit(f"error: --demo-rss-from {path}: {exc.strerror or exc}") from None
    found = TIME_V_RSS.findall(text)
    if not found:
        raise SystemExit(
            f"error: --demo-rss-from {path}: no 'Maximum resident set size (kbytes): N' line "
            f"(save the output of /usr/bin/time -v unlearn demo)"
        )
    return int(found[-1]) / 1024**2


def demo_rss_measured(model: str) -> float:
    """GB: peak RSS of a cold `unlearn demo` (fresh cache folders) run as a child (wait4's ru_maxrss)."""
    with tempfile.TemporaryDirectory(prefix="unlearn-bench-demo-") as tmp:
        env = dict(os.environ, UNLEARN_CACHE_DIR=str(Path(tmp) / "cache"))
        proc = subprocess.Popen(
            [sys.executable, "-m", "unlearn_plugins.cli", "demo", "--model", model, "--out", str(Path(tmp) / "report")],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"error: unlearn demo failed (exit {proc.returncode})")
        return usage.ru_maxrss / 1024**2


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tofu-dir", default=os.environ.get("UNLEARN_TOFU_DIR"))
    parser.add_argument(
        "--device",
        default=None,
        help="cpu or cuda (default: cuda if available); on CUDA the line also has each child's peak GPU memory",
    )
    parser.add_argument("--rounds", type=int, default=2, help="children of each kind (figures are medians)")
    parser.add_argument("--train-steps", type=int, default=10, help="optimizer steps of the NPO / grad_ascent runs")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--samples", type=int, default=16, help="EAP-IG samples (TOFU forget01)")
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG steps (rows per sample)")
    parser.add_argument("--max-rows", type=int, default=20)
    parser.add_argument("--with-demo", action="store_true", help="also run a cold `unlearn demo` (~15 min)")
    parser.add_argument(
        "--demo-rss-from",
        default=None,
        metavar="FILE",
        help="read the demo's peak from saved `/usr/bin/time -v unlearn demo` output",
    )
    parser.add_argument("--quick", action="store_true", help="the tiny model, 1 round, 2 steps (a smoke test)")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        report = child(args.child, json.loads(args.spec))
        report["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        import torch

        if torch.cuda.is_available() and torch.cuda.max_memory_allocated():
            report["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 1024**2
        print(json.dumps(report))
        return 0
    if args.with_demo and args.demo_rss_from:
        raise SystemExit("error: give --with-demo or --demo-rss-from, not both")
    demo_gb = demo_rss_from(args.demo_rss_from) if args.demo_rss_from else None
    load_start = load_average()
    if args.quick:
        args.rounds, args.train_steps, args.samples, args.steps = 1, 2, 2, 2

    with tempfile.TemporaryDirectory(prefix="unlearn-bench-memory-") as tmp:
        model = args.model
        if args.quick:
            from unlearn_plugins.testing import save_tiny_model

            model = str(save_tiny_model(Path(tmp) / "tiny-model"))
        spec = {
            "model": model,
            "tofu_dir": args.tofu_dir,
            "device": args.device,
            "forget": "tofu:forget01",
            "max_length": args.max_length,
            "train_steps": args.train_steps,
            "samples": args.samples,
            "steps": args.steps,
            "max_rows": args.max_rows,
        }
        peaks: dict[str, list[float]] = {kind: [] for kind in KINDS}
        gpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
        reference = None
        for round_ in range(args.rounds):
            for kind in KINDS:  # interleaved: a round measures every kind once
                report = run_child(kind, {**spec, "out": str(Path(tmp) / f"{kind}-{round_}")})
                peaks[kind].append(report["peak_rss_mb"])
                if "peak_gpu_mb" in report:
                    gpu[kind].append(report["peak_gpu_mb"])
                reference = report.get("reference_model") or reference
    if args.with_demo:
        demo_gb = demo_rss_measured(args.model)

    npo = ratios(peaks["npo"], peaks["grad_ascent"])
    eap = ratios(peaks["eap_ig"], peaks["fwd_bwd"])
    print(
        json.dumps(
            {
                "bench": "memory",
                "npo_over_grad_ascent_rss": median(npo, 3),
                "eap_ig_over_fwd_bwd_rss": median(eap, 3),
                "demo_peak_rss_gb": None if demo_gb is None else round(demo_gb, 2),
                "spread": {"npo_over_grad_ascent_rss": spread(npo, 3), "eap_ig_over_fwd_bwd_rss": spread(eap, 3)},
                "peak_rss_mb": {kind: spread(values, 1) for kind, values in peaks.items()},
                "peak_gpu_mb": {kind: spread(values, 1) for kind, values in gpu.items() if values} or None,
                "npo_reference_model": reference,
                "model": "tiny-llama" if args.quick else args.model,
                "device": args.device,
                "train_steps": args.train_steps,
                "max_length": args.max_length,
                "eap_ig": {"samples": args.samples, "steps": args.steps, "max_rows": args.max_rows},
                "machine": machine(load_start),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
