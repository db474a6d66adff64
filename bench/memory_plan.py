"""The memory plan's estimates (unlearn_plugins/memory_plan.py) against measured peaks.

For each model size and stage, a fresh child process loads the model from its folder and runs
the stage as the package runs it (`run_unlearning`, `answer_nll`, the EAP-IG engine,
`mrd_scores`, FILA's initializer); its peak is /proc/self/status's VmHWM at exit minus the
VmHWM of a baseline child that imports the same libraries, tokenises the same data and loads
no model. The plan's estimate for the same options, without its runtime part, is printed beside
it: one JSON line per (size, stage) with estimate, measured and their ratio (target 0.8-1.2).
With --gpu the children run on CUDA and the measured figure is torch.cuda.max_memory_allocated.

Sizes: the tiny model at two widths and depths, SmolLM2-135M (the embedded model, real weights),
and random-weight Llama-style models built from a config (0.4B: every stage, full fine-tuning
included; 1B: inference and scoring stages), written once to --work as safetensors.

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/memory_plan.py --out bench/results/memory_plan.jsonl
    python bench/memory_plan.py --sizes tiny-256 --stages score_loss     # one quick line
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name: (LlamaConfig fields, stages); None: the embedded model
#: the default sizes (tiny-256x4, ~17M parameters, also runs: its figures are mostly allocator noise)
DEFAULT_SIZES = ("tiny-512x8", "smollm2-135m", "llama-0.4b", "llama-1b")
SIZES = {
    "tiny-256x4": (
        dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
        32000,
    ),
    "tiny-512x8": (
        dict(
            hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4
        ),
        32000,
    ),
    "smollm2-135m": (None, None),
    "llama-0.4b": (
        dict(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=8,
        ),
        32000,
    ),
    "llama-1b": (
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=20,
            num_attention_heads=32,
            num_key_value_heads=8,
        ),
        32000,
    ),
}
STAGES = ("score_loss", "lora_npo", "full_graddiff", "eap_ig", "mrd", "mrd_model_copy", "fila")
#: stages too large for this machine's 24 GB (shared) at a size: full fine-tuning above 0.5B,
#: MRD's whole fp64 copy and FILA's two fp32 Fisher sets above 0.5B
SKIP = {"llama-1b": {"full_graddiff", "mrd_model_copy", "fila"}}
#: the measured options, small so each child takes about a minute on a 2-core CPU
OPTIONS = dict(batch_size=2, length=48, samples=4, lora_r=8, steps=5, max_rows=5)


def build_model(name: str, work: Path) -> str:
    """The model folder of a size (random weights, fp32 safetensors, the tiny tokenizer), built once."""
    fields, vocab = SIZES[name]
    if fields is None:
        return name
    folder = work / name
    if (folder / "config.json").is_file():
        return str(folder)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from unlearn_plugins.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **fields,
    )
    model = LlamaForCausalLM(config)
    tmp = Path(tempfile.mkdtemp(dir=work))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, folder)
    return str(folder)


# ----------------------------------------------------------------------------- the child


def vm_hwm() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def child(stage: str, spec: dict) -> dict:
    """Run one stage in this fresh process; return its peak and the lengths it saw."""
    import torch
    from transformers import Trainer  # noqa: F401

    # every child imports what any stage imports, so the baseline child's peak is the floor of all
    import unlearn_plugins.circuits.eap_ig  # noqa: F401
    import unlearn_plugins.initializers.fila  # noqa: F401
    import unlearn_plugins.likelihood  # noqa: F401
    import unlearn_plugins.scorers.mrd  # noqa: F401
    import unlearn_plugins.training.run  # noqa: F401
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_model, load_tokenizer, resolve_model

    torch.set_num_threads(1)
    device = spec["device"]
    gpu = device.startswith("cuda")
    where = resolve_model(spec["model"])
    tok = load_tokenizer(where)
    forget = load_split(spec["forget"], spec["tofu_dir"])[: spec["samples"]]
    retain = load_split(spec["retain"], spec["tofu_dir"])[: spec["samples"]]
    examples = encode_samples(tok, forget, max_length=spec["length"])
    lengths = [len(e["input_ids"]) for e in examples]
    answers = sum(sum(1 for x in e["labels"][1:] if x != -100) for e in examples)
    info = {"max_length_seen": max(lengths), "answer_fraction": round(answers / sum(lengths), 3)}
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    if stage == "baseline":
        pass
    elif stage in ("lora_npo", "full_graddiff"):
        import warnings

        from unlearn_plugins.training import UnlearnConfig, run_unlearning

        warnings.simplefilter("ignore")
        full = stage == "full_graddiff"
        with tempfile.TemporaryDirectory() as out:
            data = Path(out) / "data"
            data.mkdir()
            for name, items in (("forget", forget), ("retain", retain)):
                with open(data / f"{name}.json", "w") as handle:
                    for s in items:
                        handle.write(json.dumps({"question": s.question, "answer": s.answer}) + "\n")
            config = UnlearnConfig(
                out=str(Path(out) / "run"),
                model=where,
                device=device,
                forget=str(data / "forget.json"),
                retain=str(data / "retain.json"),
                objective="grad_diff" if full else "npo",
                full_finetune=full,
                lora_r=spec["lora_r"],
                lora_alpha=2.0 * spec["lora_r"],
                batch_size=spec["batch_size"],
                grad_accum=1,
                max_steps=2,
                max_length=spec["length"],
                save_steps=0,
                logging_steps=1,
                optim=spec.get("optim", "adamw_torch"),
                gradient_checkpointing=spec.get("gradient_checkpointing", False),
            )
            run_unlearning(config)
    else:
        model, _ = load_model(where, device=device)
        if stage == "score_loss":
            from unlearn_plugins.likelihood import answer_nll

            answer_nll(model, examples, tok.pad_token_id, batch_size=spec["batch_size"])
        elif stage == "eap_ig":
            from unlearn_plugins.circuits.eap_ig import EAPIG

            EAPIG(model, steps=spec["steps"], max_rows=spec["max_rows"], pad_token_id=tok.pad_token_id).score(examples)
        elif stage in ("mrd", "mrd_model_copy"):
            from unlearn_plugins.scorers.mrd import mrd_scores

            chunk = "model" if stage == "mrd_model_copy" else "layer"
            mrd_scores(model, examples, tok.pad_token_id, perturbations=1, batch_size=spec["batch_size"], chunk=chunk)
        elif stage == "fila":
            from unlearn_plugins.initializers.fila import FILAInit
            from unlearn_plugins.training.lora import build_lora_model

            peft_model = build_lora_model(
                model, r=spec["lora_r"], alpha=2.0 * spec["lora_r"], dropout=0.0, target_modules=None
            )
            retained = encode_samples(tok, retain, max_length=spec["length"])
            FILAInit(batch_size=spec["batch_size"]).initialize(
                peft_model, forget=examples, retain=retained, tokenizer=tok
            )
        else:
            raise SystemExit(f"unknown stage {stage}")
    info["peak_bytes"] = torch.cuda.max_memory_allocated() if gpu else vm_hwm()
    return info


def run_child(stage: str, spec: dict, cache: Path | None = None) -> dict:
    """The child's report; with ``cache``, a measurement made before with the same stage and
    options is read back instead of made again (--reuse: the estimate is recomputed)."""
    import hashlib

    key = hashlib.sha256(json.dumps([stage, spec], sort_keys=True).encode()).hexdigest()[:16]
    path = cache / f"{stage}-{key}.json" if cache else None
    if path is not None and path.is_file():
        return json.loads(path.read_text())
    started = time.time()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", stage, "--spec", json.dumps(spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{stage} on {spec['model']} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["seconds"] = round(time.time() - started, 1)
    if path is not None:
        path.write_text(json.dumps(result))
    return result


# ----------------------------------------------------------------------------- estimates


def estimate(stage: str, shape, spec: dict, seen: dict):
    """The plan's stage for the measured options (lengths as the child saw them)."""
    from unlearn_plugins import memory_plan as mp

    device = spec["device"]
    length, fraction = seen["max_length_seen"], seen["answer_fraction"]
    common = dict(device=device, length=length)
    if stage == "score_loss":
        return mp.inference_stage(shape, batch_size=spec["batch_size"], kind="score", **common)
    if stage in ("lora_npo", "full_graddiff"):
        full = stage == "full_graddiff"
        return mp.training_stage(
            shape,
            full_finetune=full,
            batch_size=spec["batch_size"],
            rows_per_example=2,
            answer_fraction=fraction,
            lora_r=spec["lora_r"],
            reference=not full,
            optim=spec.get("optim", "adamw_torch"),
            gradient_checkpointing=spec.get("gradient_checkpointing", False),
            **common,
        )
    if stage == "eap_ig":
        return mp.eap_ig_stage(
            shape,
            steps=spec["steps"],
            max_rows=spec["max_rows"],
            samples=spec["samples"],
            answer_fraction=fraction,
            **common,
        )
    if stage in ("mrd", "mrd_model_copy"):
        chunk = "model" if stage == "mrd_model_copy" else "layer"
        return mp.mrd_stage(shape, batch_size=spec["batch_size"], samples=spec["samples"], chunk=chunk, **common)
    if stage == "fila":
        return mp.fila_stage(shape, lora_r=spec["lora_r"], batch_size=spec["batch_size"], **common)
    raise ValueError(stage)


def _data_lengths(model: str, spec: str, max_length: int) -> tuple[int, float]:
    """(longest encoded example, answer tokens per token) of a data file or split."""
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_tokenizer

    rows = encode_samples(load_tokenizer(model), load_split(spec, None), max_length=max_length)
    tokens = sum(len(r["input_ids"]) for r in rows) or 1
    answers = sum(sum(1 for x in r["labels"][1:] if x != -100) for r in rows)
    return max(len(r["input_ids"]) for r in rows), answers / tokens


def demo_stages(cache: Path, study: str = "demo") -> list[dict]:
    """Each finished stage of an `unlearn demo` cache (UNLEARN_CACHE_DIR/demo): its recorded peak
    (resources.json, the whole process's resident set, runtime included) beside the plan's
    estimate for the stage's options, read from its run.json and the demo's study file."""
    import warnings

    from unlearn_plugins import memory_plan as mp
    from unlearn_plugins.study.spec import load_study

    warnings.simplefilter("ignore")
    spec = load_study(study)
    max_length = spec.max_length
    rows = []
    for folder in sorted(p for p in cache.iterdir() if (p / "resources.json").is_file()):
        record = json.loads((folder / "resources.json").read_text())
        kind = folder.name.split("-")[0]
        runs = sorted(folder.rglob("run.json"))
        config = json.loads(runs[0].read_text())["config"] if runs else None
        stages = []
        if kind == "target" and config:
            shape = mp.model_shape(config["model"])
            length, fraction = _data_lengths(config["model"], config["data"], config["max_length"])
            stages.append(
                mp.training_stage(
                    shape,
                    batch_size=config["batch_size"],
                    rows_per_example=1,
                    length=length,
                    answer_fraction=fraction,
                    lora_r=config["lora_r"],
                    name="finetune",
                )
            )
        elif kind == "run" and config:
            shape = mp.model_shape(config["model"])
            length, fraction = _data_lengths(config["model"], config["forget"], config["max_length"])
            if config.get("retain"):
                length = max(length, _data_lengths(config["model"], config["retain"], config["max_length"])[0])
            stages.append(
                mp.training_stage(
                    shape,
                    batch_size=config["batch_size"],
                    rows_per_example=2 if config.get("retain") else 1,
                    length=length,
                    answer_fraction=fraction,
                    lora_r=config["lora_r"],
                    reference=config["objective"] in ("npo", "simnpo", "dpo", "undial")
                    or config.get("retain_loss") == "kl",
                )
            )
            if config.get("initializer") in ("fila", "vila"):
                stages.append(mp.fila_stage(shape, lora_r=config["lora_r"], length=length))
            stages.append(mp.inference_stage(shape, batch_size=spec.evaluation.batch_size, length=max_length))
        elif kind == "eval":
            from unlearn_plugins.models import resolve_model

            shape = mp.model_shape(resolve_model(spec.model))
            stages.append(mp.inference_stage(shape, batch_size=spec.evaluation.batch_size, length=max_length))
        elif kind == "cud":
            from unlearn_plugins.models import resolve_model

            shape = mp.model_shape(resolve_model(spec.model))
            options = spec.cud.unlearn
            stages.append(
                mp.training_stage(
                    shape,
                    batch_size=int(options.get("batch_size", 2)),
                    rows_per_example=2,
                    length=max_length,
                    lora_r=int(options.get("lora_r", 16)),
                    reference=True,
                )
            )
            scorer = spec.cud.scorer
            stages.append(
                mp.eap_ig_stage(
                    shape,
                    steps=int(scorer.get("steps", 5)),
                    max_rows=int(scorer.get("max_rows", 20)),
                    length=max_length,
                )
            )
        if not stages:
            continue
        worst = max(stages, key=lambda st: st.total)
        measured = record["peak_rss_mb"]
        rows.append(
            {
                "demo_stage": folder.name,
                "plan_stage": worst.name,
                "estimate_mb": round(worst.total / 2**20, 1),
                "measured_mb": measured,
                "ratio": round(worst.total / 2**20 / measured, 3),
                "within_20pct": 0.8 <= worst.total / 2**20 / measured <= 1.2,
            }
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES))
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--work", default=None, help="folder for the random-weight models (default: a temporary one)")
    p.add_argument("--tofu-dir", default=os.environ.get("UNLEARN_TOFU_DIR"))
    p.add_argument("--gpu", action="store_true", help="run the children on CUDA (torch.cuda.max_memory_allocated)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="read back the measurements kept in --work by an earlier run with the same options (estimates recomputed)",
    )
    p.add_argument(
        "--demo",
        default=None,
        metavar="CACHE",
        help="compare the plan with the stage peaks (resources.json) of a finished `unlearn demo` cache "
        "(UNLEARN_CACHE_DIR/demo) instead of measuring",
    )
    args = p.parse_args(argv)
    if args.demo:
        sys.path.insert(0, str(ROOT))
        rows = demo_stages(Path(args.demo))
        for row in rows:
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as handle:
                    handle.write(json.dumps(row) + "\n")
        return 0 if all(r["within_20pct"] for r in rows) else 1
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.spec))))
        return 0
    sys.path.insert(0, str(ROOT))
    from unlearn_plugins.memory_plan import model_shape

    work = Path(args.work or tempfile.mkdtemp(prefix="memory-plan-"))
    work.mkdir(parents=True, exist_ok=True)
    forget = "tofu:forget01"
    failures = 0
    for size in args.sizes.split(","):
        folder = build_model(size, work)
        shape = model_shape(folder)
        spec = dict(
            OPTIONS,
            model=folder,
            device="cuda" if args.gpu else "cpu",
            tofu_dir=args.tofu_dir,
            forget=forget,
            retain="tofu:retain90",
        )
        cache = work / "measured" if args.reuse else None
        if cache:
            cache.mkdir(exist_ok=True)
        base = None if args.gpu else run_child("baseline", spec, cache)
        for stage in args.stages.split(","):
            if stage in SKIP.get(size, ()):
                continue
            seen = run_child(stage, spec, cache)
            measured = seen["peak_bytes"] - (base["peak_bytes"] if base else 0)
            plan = estimate(stage, shape, spec, seen)
            est = plan.model_bytes()
            ratio = est / measured if measured > 0 else float("inf")
            ok = 0.8 <= ratio <= 1.2
            failures += not ok
            line = {
                "size": size,
                "params": shape.params,
                "stage": stage,
                "device": spec["device"],
                "estimate_mb": round(est / 2**20, 1),
                "measured_mb": round(measured / 2**20, 1),
                "ratio": round(ratio, 3),
                "within_20pct": ok,
                "baseline_mb": round(base["peak_bytes"] / 2**20, 1) if base else None,
                "length": seen["max_length_seen"],
                "batch_size": spec["batch_size"],
                "seconds": seen["seconds"],
                "parts_mb": {k: round(v / 2**20, 1) for k, v in plan.parts.items() if v and k != "runtime"},
            }
            print(json.dumps(line), flush=True)
            if args.out:
                with open(args.out, "a") as handle:
                    handle.write(json.dumps(line) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
