"""The options `unlearn run` and `unlearn finetune` share: their training flags, and the merge
of defaults < --preset < the run resumed < --config TOML < the flags given."""

from __future__ import annotations

import argparse

from ..options import parse_options
from .common import add_prompt_options, add_show_config_option, print_config

#: a flag's default: not given (only flags actually given override the config file)
S = argparse.SUPPRESS


def csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_split_option(group, flag: str, what: str, default: str) -> None:
    """A training command's data option ``flag``: a TOFU split, a file or a text corpus."""
    group.add_argument(
        flag,
        default=S,
        help=f"{what}tofu:SPLIT, tofu:SPLIT[a:b] or a .json file (default: {default}); or a text corpus cut into "
        "--max-length windows: text:FILE.jsonl, text:FOLDER, text:hf:ID:SPLIT:COLUMN",
    )


def add_training_options(p: argparse.ArgumentParser) -> None:
    """Flags shared by `unlearn run` and `unlearn finetune`: every default lives in the config class
    (a flag not given sets nothing; the help shows :class:`..training.config.TrainingConfig`'s)."""
    from ..options import config_defaults
    from ..training.config import TrainingConfig

    D = config_defaults(TrainingConfig)  # noqa: N806 - read in the help texts below
    p.add_argument("--config", default=None, metavar="FILE.toml", help="options from a TOML file; flags override it")
    p.add_argument("--out", default=S, help="output folder (adapter or model, run.json)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=S, help=f"local folder, hub id or alias 'smollm2-135m' (default: {D['model']})")
    g.add_argument(
        "--device", default=S, help="cpu or cuda (default: cuda if available); under accelerate launch, one per process"
    )
    g.add_argument(
        "--dtype",
        default=S,
        help="base weight dtype: float32, bfloat16, float16 (default: fp32 on CPU, bf16 LoRA base on CUDA)",
    )
    g.add_argument(
        "--mixed-precision",
        default=S,
        choices=["auto", "no", "bf16", "fp16"],
        help=f"autocast (default: {D['mixed_precision']} = bf16 on CUDA)",
    )
    g.add_argument("--trust-remote-code", action="store_true", default=S)
    g.add_argument(
        "--reference-dtype",
        default=S,
        help="full fine-tuning's frozen reference copy (default: bf16 under bf16 mixed precision, else the weights')",
    )
    g.add_argument(
        "--device-memory",
        default=S,
        metavar="SIZE",
        help="memory the run's plan must fit, e.g. 80GB (default: the card's total, or the available RAM on CPU)",
    )
    g.add_argument("--max-length", type=int, default=S, help=f"max tokens per example (default: {D['max_length']})")
    g.add_argument("--system-prompt", default=S, help="system prompt for the chat template")
    add_prompt_options(g, default=S)
    g = p.add_argument_group("LoRA")
    g.add_argument(
        "--full-finetune", action="store_true", default=S, help="train all weights instead of a LoRA adapter"
    )
    g.add_argument("--lora-r", type=int, default=S, help=f"LoRA rank (default: {D['lora_r']})")
    g.add_argument("--lora-alpha", type=float, default=S, help=f"LoRA alpha (default: {D['lora_alpha']:g})")
    g.add_argument("--lora-dropout", type=float, default=S, help=f"LoRA dropout (default: {D['lora_dropout']:g})")
    g.add_argument(
        "--target-modules",
        type=csv_list,
        default=S,
        metavar="A,B,...",
        help="LoRA target module names (default: every linear layer of the decoder blocks)",
    )
    g.add_argument(
        "--merge", action="store_true", default=S, help="also write the model with the adapter merged into OUT/merged"
    )
    g = p.add_argument_group("optimiser")
    g.add_argument("--lr", type=float, default=S, help=f"learning rate (default: {D['lr']:g})")
    g.add_argument("--epochs", type=float, default=S, help=f"epochs (default: {D['epochs']:g})")
    g.add_argument("--max-steps", type=int, default=S, help="optimizer steps; overrides --epochs")
    g.add_argument("--batch-size", type=int, default=S, help=f"per-device batch size (default: {D['batch_size']})")
    g.add_argument(
        "--grad-accum", type=int, default=S, help=f"gradient accumulation steps (default: {D['grad_accum']})"
    )
    g.add_argument("--weight-decay", type=float, default=S, help=f"default: {D['weight_decay']:g}")
    g.add_argument(
        "--lr-scheduler",
        default=S,
        metavar="NAME",
        help="transformers scheduler: linear, cosine, constant, constant_with_warmup, ... "
        f"(default: {D['lr_scheduler']})",
    )
    w = g.add_mutually_exclusive_group()
    w.add_argument(
        "--warmup-steps", type=int, default=S, metavar="N", help="linear warmup over N optimizer steps (default: none)"
    )
    w.add_argument(
        "--warmup-ratio", type=float, default=S, metavar="F", help="warmup over this fraction of all steps, in [0, 1)"
    )
    w.add_argument(
        "--warmup-epochs",
        type=float,
        default=S,
        metavar="E",
        help="warmup over E epochs' optimizer steps, counted as the Trainer counts them",
    )
    g.add_argument(
        "--max-grad-norm", type=float, default=S, help=f"gradient clipping (default: {D['max_grad_norm']}; 0 = off)"
    )
    g.add_argument(
        "--optim",
        default=S,
        help=f"transformers optimizer name (default: {D['optim']}; adamw_bnb_8bit, paged_adamw_8bit need "
        "bitsandbytes; adafactor keeps almost no state)",
    )
    g.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        default=S,
        help="recompute each block's activations in the backward pass (less memory, ~30%% more time)",
    )
    g.add_argument("--seed", type=int, default=S, help=f"default: {D['seed']}")
    g = p.add_argument_group("checkpoints")
    g.add_argument(
        "--save-steps", type=int, default=S, help="checkpoint every N steps (default: every epoch; 0 = never)"
    )
    g.add_argument(
        "--save-total-limit", type=int, default=S, help=f"checkpoints kept (default: {D['save_total_limit']})"
    )
    g.add_argument("--keep-checkpoints", action="store_true", default=S, help="keep OUT/checkpoints after success")
    g.add_argument(
        "--logging-steps", type=int, default=S, help=f"log the loss every N steps (default: {D['logging_steps']})"
    )
    g.add_argument(
        "--resume",
        action="store_true",
        default=S,
        help="continue the interrupted run in --out from its last checkpoint",
    )
    g.add_argument("--overwrite", action="store_true", default=S, help="replace a run already in --out")
    add_show_config_option(p, "the merged options (defaults < --preset < the run resumed < --config < flags)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the run's memory plan (each stage's peak on its device) and stop; loads no weights",
    )


#: parsed options that are not config fields
NOT_CONFIG = ("func", "command", "debug", "verbosity", "show_config", "config", "preset", "dry_run")
_DICT_FLAGS = {
    "objective_option": "objective_options",
    "initializer_option": "initializer_options",
    "regularizer_option": "regularizer_options",
}


def cli_values(args: argparse.Namespace) -> dict:
    """The options given on the command line, as config field names."""
    values = {k: v for k, v in vars(args).items() if k not in NOT_CONFIG}
    for flag, key in _DICT_FLAGS.items():
        if flag in values:
            values[key] = parse_options(values.pop(flag), "--" + flag.replace("_", "-"))
    if values.pop("no_retain", False):
        values["retain"] = None
    return values


def resolve_config(config_cls, args: argparse.Namespace):
    """defaults < saved run config (--resume) < --config TOML < flags; dict options merge key by key."""
    from ..training.config import build_config, load_toml
    from ..training.run import saved_config

    cli = cli_values(args)
    toml = load_toml(args.config, config_cls) if args.config else {}
    layers = []
    if getattr(args, "preset", None):
        from ..training.presets import preset

        layers.append((f"preset {args.preset}", preset(args.preset)))
    if cli.get("resume") or toml.get("resume"):
        out = cli.get("out") or toml.get("out")
        saved = saved_config(out) if out else None
        if saved is not None:
            layers.append(("saved config of the run in --out", saved))
    layers.append((args.config or "--config", toml))
    merged_cli = dict(cli)
    for key in _DICT_FLAGS.values():
        if key in cli:
            base = {}
            for _, layer in layers:
                base.update(layer.get(key) or {})
            merged_cli[key] = {**base, **cli[key]}
    layers.append(("command line", merged_cli))
    return build_config(config_cls, *layers)


def dry_run(config, what: str) -> int:
    """`--dry-run`: the memory plan of the run, an error when it does not fit."""
    from ..training.run import plan_run
    from .plan import report

    shape, stages, limit, how = plan_run(config)
    return report(shape, stages, limit, how, what=what)


def run_training(args, config_cls, command: str, train, done, check=None) -> int:
    """`unlearn run` / `finetune` once parsed: the options resolved into a ``config_cls``, then
    --show-config prints them, or ``check(config)`` (before any model work), then --dry-run plans
    the run, or ``train(config)`` runs it and its main process prints ``done(result, config)``."""
    if args.dry_run and not hasattr(args, "out"):  # a dry run writes nothing: no --out needed
        args.out = "(dry run)"
    config = resolve_config(config_cls, args)
    if args.show_config:
        return print_config(config.to_dict(), f"{command}: the options this run would use")
    if check is not None:
        check(config)
    if args.dry_run:
        return dry_run(config, f"`{command}`")
    result = train(config)
    if result.record.get("outputs"):  # the main process
        report_run(result, done(result, config))
    return 0


def report_run(result, what: str) -> None:
    """The one line a finished run prints: steps, time, final loss and where its outputs are."""
    record = result.record
    final = record.get("final_loss")
    loss = f", final loss {final:.4g}" if isinstance(final, (int, float)) else ""
    outputs = ", ".join(f"{k}: {v}" for k, v in record.get("outputs", {}).items())
    print(
        f"{what}: {record['steps']} steps in {record['wall_time_s']:.1f} s{loss} -> {outputs}; "
        f"{result.out / 'run.json'}"
    )


__all__ = [
    "S",
    "csv_list",
    "int_list",
    "add_training_options",
    "resolve_config",
    "cli_values",
    "report_run",
    "run_training",
    "dry_run",
]
