"""`unlearn plan`: the peak memory of each stage of a run on its device (weights, gradients,
optimizer state, reference model, activations, EAP-IG buffers, MRD's copy, FILA's Fisher), from
the model's config.json alone: no weights are read. A stage that does not fit the device
(--device-memory, else the card's total or this machine's available RAM) is an error.
`unlearn run / finetune / score / eval --dry-run` print the same plan for their own options."""

from __future__ import annotations

import argparse

from ..errors import UnlearnError
from .common import add_command

EXAMPLE = """examples:
  unlearn plan --model tests/data/llama-3-8b/config.json --device cuda --device-memory 80GB --objective npo
  unlearn plan --model meta-llama/Meta-Llama-3-8B-Instruct --device cuda --full-finetune --dtype bf16 \\
      --optim adamw_bnb_8bit --gradient-checkpointing --stages run
  unlearn plan --model smollm2-135m --stages eap_ig,mrd --length 160 --json
"""

STAGES = ("run", "fila", "eap_ig", "mrd", "eval")


def add_parser(sub) -> None:
    p = add_command(
        sub,
        "plan",
        "the peak memory of each stage of a run, from the model's config (nothing loaded)",
        __doc__,
        EXAMPLE,
    )
    p.add_argument("--model", default="smollm2-135m", help="a model folder, hub id, alias, or a config.json file")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--device-memory", default=None, metavar="SIZE", help="e.g. 80GB (default: the device's own)")
    p.add_argument(
        "--stages",
        default="run,eap_ig,mrd,eval",
        help=f"comma-separated, of {', '.join(STAGES)} (default: run,eap_ig,mrd,eval; fila with --initializer fila)",
    )
    p.add_argument("--length", type=int, default=None, help="tokens per row (default: --max-length)")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--answer-fraction", type=float, default=0.5, help="answer tokens per token (default: 0.5)")
    p.add_argument("--json", action="store_true", help="one JSON line per stage instead of the table")
    g = p.add_argument_group("run (unlearn run / finetune)")
    g.add_argument("--objective", default="grad_diff", help="decides the reference model (default: grad_diff)")
    g.add_argument("--retain-loss", choices=["nll", "kl"], default=None)
    g.add_argument("--no-retain", action="store_true", help="forget rows only")
    g.add_argument("--initializer", default="kaiming")
    g.add_argument("--full-finetune", action="store_true")
    g.add_argument("--dtype", default=None, help="weights: float32, bfloat16 (default: as `unlearn run`)")
    g.add_argument("--mixed-precision", default="auto", choices=["auto", "no", "bf16", "fp16"])
    g.add_argument("--batch-size", type=int, default=4)
    g.add_argument("--lora-r", type=int, default=32)
    g.add_argument("--target-modules", default=None, metavar="A,B,...")
    g.add_argument("--optim", default="adamw_torch")
    g.add_argument("--gradient-checkpointing", action="store_true")
    g.add_argument("--reference-dtype", default=None)
    g = p.add_argument_group("scoring and evaluation")
    g.add_argument("--samples", type=int, default=20, help="QA scored (default: 20)")
    g.add_argument("--eap-steps", type=int, default=5)
    g.add_argument("--eap-max-rows", type=int, default=20)
    g.add_argument("--mrd-precision", default="fp64", choices=["fp64", "fp32"])
    g.add_argument("--mrd-chunk", default="layer", choices=["layer", "model"])
    g.add_argument("--mrd-batch-size", type=int, default=8)
    g.add_argument("--eval-batch-size", type=int, default=8)
    p.set_defaults(func=run)


def _objective_needs_reference(args) -> bool:
    from ..training.config import UnlearnConfig
    from ..training.run import build_objective

    config = UnlearnConfig(out="-", objective=args.objective, retain_loss=args.retain_loss)
    return bool(getattr(build_objective(config), "needs_reference_model", False))


def build_stages(args) -> tuple[object, list]:
    """(shape, stages) for the parsed options."""
    from .. import memory_plan as mp
    from ..models import pick_device

    device = pick_device(args.device)
    shape = mp.model_shape(args.model, trust_remote_code=args.trust_remote_code)
    length = args.length or args.max_length
    chosen = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in chosen if s not in STAGES]
    if bad:
        raise UnlearnError(f"--stages {args.stages}: unknown {', '.join(bad)}; choose from {', '.join(STAGES)}")
    if args.initializer in ("fila", "vila") and "fila" not in chosen and "run" in chosen:
        chosen.insert(chosen.index("run") + 1, "fila")
    weight_dtype = mp.DTYPE_NAMES.get(args.dtype) if args.dtype else None
    if args.dtype and weight_dtype is None:
        raise UnlearnError(f"--dtype {args.dtype}: use float32, bfloat16 or float16")
    infer_dtype = weight_dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    targets = [t.strip() for t in args.target_modules.split(",")] if args.target_modules else None
    try:
        mp.check_optimizer_available(args.optim)
        missing = None
    except UnlearnError as exc:  # the plan is still shown; the run itself would refuse
        missing = str(exc)
    inference = {"device": device, "dtype": infer_dtype, "length": length}  # every stage but the run's
    scoring = {**inference, "samples": args.samples}  # EAP-IG's and MRD's
    stages = []
    for name in chosen:
        if name == "run":
            stages.append(
                mp.training_stage(
                    shape,
                    device=device,
                    full_finetune=args.full_finetune,
                    weight_dtype=weight_dtype,
                    mixed_precision=args.mixed_precision,
                    batch_size=args.batch_size,
                    rows_per_example=1 if args.no_retain else 2,
                    length=length,
                    answer_fraction=args.answer_fraction,
                    lora_r=args.lora_r,
                    target_modules=targets,
                    optim=args.optim,
                    gradient_checkpointing=args.gradient_checkpointing,
                    reference=_objective_needs_reference(args),
                    reference_dtype=mp.DTYPE_NAMES.get(args.reference_dtype) if args.reference_dtype else None,
                    name=f"run {args.objective} ({'full' if args.full_finetune else f'LoRA r={args.lora_r}'})",
                )
            )
            if missing:
                stages[-1].notes.append(f"here: {missing}")
        elif name == "fila":
            stages.append(mp.fila_stage(shape, lora_r=args.lora_r, target_modules=targets, **inference))
        elif name == "eap_ig":
            steps, rows = args.eap_steps, args.eap_max_rows
            stage = mp.eap_ig_stage(shape, steps=steps, max_rows=rows, answer_fraction=args.answer_fraction, **scoring)
            stages.append(stage)
        elif name == "mrd":
            chunking = {"precision": args.mrd_precision, "chunk": args.mrd_chunk, "batch_size": args.mrd_batch_size}
            stages.append(mp.mrd_stage(shape, **chunking, **scoring))
        else:
            stages.append(mp.inference_stage(shape, batch_size=args.eval_batch_size, **inference))
    return shape, stages


def device_limit(device_memory: str | None, device: str | None) -> tuple[int, str]:
    """(bytes, how it was found): --device-memory, else the device's own."""
    from .. import memory_plan as mp
    from ..models import pick_device

    if device_memory:
        return mp.parse_size(device_memory), "--device-memory"
    return mp.available_bytes(pick_device(device))


def report(shape, stages, limit: int, how: str, *, as_json: bool = False, what: str = "the run") -> int:
    """Print the plan; an error (exit 1) when a stage does not fit."""
    from .. import memory_plan as mp

    print(mp.to_json(stages) if as_json else mp.table(stages, shape, limit, how), flush=True)
    mp.check_fits(stages, limit, how, what)
    return 0


def run(args) -> int:
    shape, stages = build_stages(args)
    limit, how = device_limit(args.device_memory, args.device)
    return report(shape, stages, limit, how, as_json=args.json, what="the plan")


def add_dry_run_options(p: argparse.ArgumentParser) -> None:
    """`--dry-run` and `--device-memory` of the commands that load a model."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the memory plan (each stage's peak on its device) and stop; loads no weights",
    )
    p.add_argument(
        "--device-memory",
        default=None,
        metavar="SIZE",
        help="memory the plan must fit, e.g. 80GB (default: the device's)",
    )


def _lengths(args, max_length: int) -> tuple[int, float]:
    """(longest encoded example, answer tokens per token) of --data with --model's tokenizer."""
    from ..data.qa import encode_samples, load_split
    from ..models import load_tokenizer

    tok = load_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
    rows = encode_samples(tok, load_split(args.data, args.tofu_dir), max_length=max_length)
    tokens = sum(len(r["input_ids"]) for r in rows) or 1
    answers = sum(sum(1 for x in r["labels"][1:] if x != -100) for r in rows)
    return max((len(r["input_ids"]) for r in rows), default=max_length), answers / tokens


def score_dry_run(args, options: dict) -> int:
    """`unlearn score --dry-run`: the scorer's stages at --data's lengths."""
    from .. import memory_plan as mp
    from ..data.qa import load_split
    from ..models import pick_device

    device = pick_device(args.device)
    dtype = mp.DTYPE_NAMES.get(args.dtype) if args.dtype else None
    shape = mp.model_shape(args.model, trust_remote_code=args.trust_remote_code)
    length, fraction = _lengths(args, int(options.get("max_length", 512)))
    samples = len(load_split(args.data, args.tofu_dir))
    if args.scorer == "mrd":
        stages = [
            mp.mrd_stage(
                shape,
                device=device,
                dtype=dtype,
                precision=options.get("precision", "fp64"),
                chunk=options.get("chunk", "layer"),
                batch_size=int(options.get("batch_size", 8)),
                length=length,
                samples=samples,
            )
        ]
    elif args.scorer == "cud":
        stages = [
            mp.training_stage(
                shape, device=device, batch_size=2, rows_per_example=1, length=length, name="cud anchor runs"
            ),
            mp.eap_ig_stage(
                shape,
                device=device,
                dtype=dtype,
                steps=int(options.get("steps", 5)),
                max_rows=int(options.get("max_rows", 20)),
                length=length,
                samples=samples,
                answer_fraction=fraction,
            ),
        ]
    else:
        stages = [
            mp.inference_stage(
                shape,
                device=device,
                dtype=dtype,
                batch_size=8,
                length=length,
                name=f"score {args.scorer}",
                kind="score",
            )
        ]
    limit, how = device_limit(args.device_memory, args.device)
    return report(shape, stages, limit, how, what="`unlearn score`")


def eval_dry_run(args) -> int:
    """`unlearn eval --dry-run`: an evaluation's forward at the batch size and 512 tokens."""
    from .. import memory_plan as mp
    from ..models import pick_device

    device = pick_device(args.device)
    dtype = mp.DTYPE_NAMES.get(args.dtype) if args.dtype else None
    shape = mp.model_shape(args.model, trust_remote_code=args.trust_remote_code)
    stage = mp.inference_stage(shape, device=device, dtype=dtype, batch_size=args.batch_size, length=512)
    stage.notes.append("at 512 tokens per row (TOFU prompts and generations are shorter)")
    limit, how = device_limit(args.device_memory, args.device)
    return report(shape, [stage], limit, how, what="`unlearn eval`")
