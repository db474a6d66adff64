"""Is it really forgotten? Membership inference, privleak, exact memorization and the forget
set's probability / ROUGE-L after relearning, int4 quantization and the paraphrase probe, for
the full, retain and each unlearned model of an `unlearn demo` run (docs/results.md, "Is it really forgotten?").

Each model is measured by one `unlearn eval --mia --robustness` (the retain model first: its MIA
reference gives the others' privleak and reference attack), in a fresh process; results are
read back from lm-eval's layout. A model already measured in --out is not measured again.

    unlearn demo --out unlearn-demo
    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/really_forgotten.py --demo unlearn-demo \
        --out docs/study/really_forgotten

Forget split: the demo's forgotten author (TOFU author 199, the last 20 QA of
forget10_perturbed); holdout: TOFU author 196, whom no demo model was trained on. Prints the
tables (Markdown) and writes them, with every number, to --out (table.md, really_forgotten.json),
with a plot of forget probability before and after each attack (forget_prob_under_attack.png).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FORGET = "tofu:forget10_perturbed[380:400]"  # author 199: the demo's forget author
HOLDOUT = "tofu:forget10_perturbed[320:340]"  # author 196: in no demo model's training data
ATTACKS = ("relearn", "quantize")


def measure(name: str, model: str, adapter: str | None, out: Path, args, reference: Path) -> dict:
    """One `unlearn eval --mia --robustness` of a model; its summary (cached in ``out/name``)."""
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    folder = out / name
    try:
        return read_outputs(folder).summary
    except Exception:  # noqa: BLE001 - not measured yet
        pass
    cmd = [
        sys.executable,
        "-m",
        "unlearn_plugins.cli",
        "eval",
        "--model",
        model,
        "--mia",
        "--robustness",
        "--forget-split",
        args.forget_split,
        "--holdout-split",
        args.holdout_split,
        "--robustness-attacks",
        ",".join(ATTACKS),
        "--attack-option",
        "quantize.bits=4",
        "--batch-size",
        str(args.batch_size),
        *(["--dtype", args.dtype] if args.dtype else []),
        "--out",
        str(folder),
    ]
    if adapter:
        cmd += ["--adapter", adapter]
    cmd += ["--save-mia-reference", str(reference)] if name == "retain" else ["--mia-reference", str(reference)]
    print(f"== {name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, env={**os.environ})
    return read_outputs(folder).summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", required=True, help="an `unlearn demo` report folder (its results.json names the models)")
    p.add_argument("--out", required=True, help="folder for the evaluations and the table")
    p.add_argument("--forget-split", default=FORGET)
    p.add_argument("--holdout-split", default=HOLDOUT)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--dtype",
        default=None,
        help="weights while measuring (default: the dtype the demo evaluated in, from its results.json)",
    )
    args = p.parse_args(argv)
    from unlearn_plugins.evaluation.really_forgotten import plot_under_attack, row, table
    from unlearn_plugins.files import write_json

    results = json.loads((Path(args.demo) / "results.json").read_text())
    if args.dtype is None:  # measure as the demo measured ("library default": fp32 on CPU)
        demo_dtype = results.get("evaluation", {}).get("dtype")
        args.dtype = demo_dtype if demo_dtype in ("bf16", "fp32") else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # `unlearn eval` takes a split name or a file: the slices are written as JSON-lines files
    from unlearn_plugins.data.qa import load_split
    from unlearn_plugins.stratify import write_split

    specs = {flag: getattr(args, flag) for flag in ("forget_split", "holdout_split")}
    for flag in ("forget_split", "holdout_split"):
        spec = getattr(args, flag)
        if spec.startswith("tofu:") and "[" in spec:
            path = out / f"{flag.split('_')[0]}.json"
            write_split(path, load_split(spec))
            setattr(args, flag, str(path))
    targets, runs = results["targets"], results["unlearning_runs"]
    models = [("retain", targets["retain"]["model"], None), ("full", targets["full"]["model"], None)]
    models += [(name, targets["full"]["model"], run["adapter"]) for name, run in runs.items()]
    reference = out / "retain_mia_reference.json"
    rows = []
    for name, model, adapter in models:
        summary = measure(name, model, adapter, out, args, reference)
        rows.append(row(name if name in ("full", "retain") else runs[name]["label"], summary))
    text = table(rows)
    print(text)
    (out / "table.md").write_text(text + "\n")
    plot_under_attack(rows, out / "forget_prob_under_attack.png")
    write_json(
        out / "really_forgotten.json",
        {
            "forget_split": specs["forget_split"],
            "holdout_split": specs["holdout_split"],
            "attacks": list(ATTACKS),
            "quantize_bits": 4,
            "dtype": args.dtype or "library default",
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
