"""FILA's initialisation alone, with and without its decoder blocks recomputed in the backward:
peak resident memory (VmHWM of a fresh child process) and the importance's largest difference.

Each child loads the model in fp32 on CPU, wraps it in the demo's LoRA (r 16, alpha 32, the
default targets), and runs ``FILAInit().importance`` (batches of 4, the demo's options) on a
forget and a retain split (by default a demo benchmark folder's forget.json and retain.json);
one JSON line per mode, then one comparing their importances.

    python bench/fila_checkpointing.py --bench UNLEARN_CACHE_DIR/demo/bench-auto-XXXX
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(mode: str, model: str, forget: str, retain: str, max_length: int, save: str) -> dict:
    import time

    import torch

    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.initializers.fila import FILAInit
    from unlearn_plugins.models import load_model
    from unlearn_plugins.training.lora import build_lora_model

    torch.set_num_threads(1)
    base, tok = load_model(model, device="cpu", dtype="float32")
    peft_model = build_lora_model(base, r=16, alpha=32.0, dropout=0.0, target_modules=None)
    f = encode_samples(tok, load_split(forget), max_length=max_length)
    r = encode_samples(tok, load_split(retain), max_length=max_length)
    init = FILAInit()
    init.checkpointing = mode == "recomputed"
    started = time.perf_counter()
    importance = init.importance(peft_model, f, r, tok.pad_token_id)
    seconds = time.perf_counter() - started
    torch.save({k: v.clone() for k, v in importance.items()}, save)
    with open("/proc/self/status") as handle:
        hwm = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:"))
    return {"mode": mode, "peak_rss_mib": round(hwm / 1024, 1), "seconds": round(seconds, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, help="a demo benchmark folder (forget.json, retain.json)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-length", type=int, default=192)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    forget, retain = str(Path(args.bench) / "forget.json"), str(Path(args.bench) / "retain.json")
    if args.child:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(child(args.child, args.model, forget, retain, args.max_length, args.save)))
        return 0
    import torch

    work = Path(tempfile.mkdtemp(prefix="fila-ckpt-"))
    saved = {}
    for mode in ("plain", "recomputed"):
        saved[mode] = work / f"{mode}.pt"
        cmd = [sys.executable, __file__, "--bench", args.bench, "--model", args.model]
        cmd += ["--max-length", str(args.max_length), "--child", mode, "--save", str(saved[mode])]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        print(out, flush=True)
    a, b = (torch.load(saved[m]) for m in ("plain", "recomputed"))
    diff = max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-30)) for k in a)
    print(json.dumps({"importance_equal": all(torch.equal(a[k], b[k]) for k in a), "max_rel_diff": diff}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
