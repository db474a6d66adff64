"""`unlearn run`: unlearn a forget split from a model with an objective (LoRA or full
fine-tuning); writes a PEFT adapter and run.json. Options come from defaults, then
``--preset``, then ``--config FILE.toml``, then the flags given (only flags actually given
override); ``--show-config`` prints the result and runs nothing."""

from __future__ import annotations

import argparse

from .common import add_show_config_option, parse_options, print_config

S = argparse.SUPPRESS

EXAMPLE = """examples:
  unlearn run --forget tofu:forget01 --retain tofu:retain99 --objective npo --out npo
  unlearn run --preset reglu --forget tofu:forget05 --retain tofu:retain95 --lr 5e-5 --out reglu
  unlearn run --config run.toml --seed 1 --out run-s1      # the flags given override the file
  unlearn run --preset reglu --config run.toml --out x --show-config   # the merged options; runs nothing
  unlearn run --config run.toml --seed 1 --out run-s1 --resume         # continue an interrupted run
"""


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_training_options(p: argparse.ArgumentParser) -> None:
    """Flags shared by `unlearn run` and `unlearn finetune` (every default lives in the config class)."""
    p.add_argument("--config", default=None, metavar="FILE.toml", help="options from a TOML file; flags override it")
    p.add_argument("--out", default=S, help="output folder (adapter or model, run.json)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=S, help="local folder, hub id or alias 'smollm2-135m' (default: smollm2-135m)")
    g.add_argument("--device", default=S, help="cpu or cuda (default: cuda if available); under accelerate launch, one per process")
    g.add_argument("--dtype", default=S, help="base weight dtype: float32, bfloat16, float16 (default: fp32 on CPU, bf16 LoRA base on CUDA)")
    g.add_argument("--mixed-precision", default=S, choices=["auto", "no", "bf16", "fp16"], help="autocast (default: auto = bf16 on CUDA)")
    g.add_argument("--trust-remote-code", action="store_true", default=S)
    g.add_argument("--max-length", type=int, default=S, help="max tokens per example (default: 512)")
    g.add_argument("--system-prompt", default=S, help="system prompt for the chat template")
    g = p.add_argument_group("LoRA")
    g.add_argument("--full-finetune", action="store_true", default=S, help="train all weights instead of a LoRA adapter")
    g.add_argument("--lora-r", type=int, default=S, help="LoRA rank (default: 32)")
    g.add_argument("--lora-alpha", type=float, default=S, help="LoRA alpha (default: 64)")
    g.add_argument("--lora-dropout", type=float, default=S, help="LoRA dropout (default: 0)")
    g.add_argument("--target-modules", type=_csv, default=S, metavar="A,B,...",
                   help="LoRA target module names (default: every linear layer of the decoder blocks)")
    g.add_argument("--merge", action="store_true", default=S, help="also write the model with the adapter merged into OUT/merged")
    g = p.add_argument_group("optimiser")
    g.add_argument("--lr", type=float, default=S, help="learning rate (default: 1e-4)")
    g.add_argument("--epochs", type=float, default=S, help="epochs (default: 5)")
    g.add_argument("--max-steps", type=int, default=S, help="optimizer steps; overrides --epochs")
    g.add_argument("--batch-size", type=int, default=S, help="per-device batch size (default: 4)")
    g.add_argument("--grad-accum", type=int, default=S, help="gradient accumulation steps (default: 4)")
    g.add_argument("--weight-decay", type=float, default=S, help="default: 0.01")
    g.add_argument("--lr-scheduler", default=S, metavar="NAME",
                   help="transformers scheduler: linear, cosine, constant, constant_with_warmup, ... (default: constant)")
    w = g.add_mutually_exclusive_group()
    w.add_argument("--warmup-steps", type=int, default=S, metavar="N", help="linear warmup over N optimizer steps (default: none)")
    w.add_argument("--warmup-ratio", type=float, default=S, metavar="F", help="warmup over this fraction of all steps, in [0, 1)")
    w.add_argument("--warmup-epochs", type=float, default=S, metavar="E",
                   help="warmup over E epochs' optimizer steps, counted as the Trainer counts them")
    g.add_argument("--max-grad-norm", type=float, default=S, help="gradient clipping (default: 1.0; 0 = off)")
    g.add_argument("--optim", default=S, help="transformers optimizer name (default: adamw_torch)")
    g.add_argument("--seed", type=int, default=S, help="default: 0")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--save-steps", type=int, default=S, help="checkpoint every N steps (default: every epoch; 0 = never)")
    g.add_argument("--save-total-limit", type=int, default=S, help="checkpoints kept (default: 2)")
    g.add_argument("--keep-checkpoints", action="store_true", default=S, help="keep OUT/checkpoints after success")
    g.add_argument("--logging-steps", type=int, default=S, help="log the loss every N steps (default: 1)")
    g.add_argument("--resume", action="store_true", default=S, help="continue the interrupted run in --out from its last checkpoint")
    g.add_argument("--overwrite", action="store_true", default=S, help="replace a run already in --out")
    add_show_config_option(p, "the merged options (defaults < --preset < the run resumed < --config < flags)")


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="unlearn a forget set (writes a PEFT adapter and run.json)",
                       description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--forget", default=S, help="forget split: tofu:SPLIT, tofu:SPLIT[a:b] or a .json file (default: tofu:forget01)")
    g.add_argument("--retain", default=S, help="retain split (default: tofu:retain99)")
    g.add_argument("--no-retain", action="store_true", default=S, help="train without retain data")
    g.add_argument("--allow-overlap", action="store_true", default=S,
                   help="accept samples that are in both --forget and --retain (default: refused)")
    g.add_argument("--tofu-dir", default=S, help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)")
    g = p.add_argument_group("method")
    g.add_argument("--preset", default=S, help="a named recipe applied below --config and flags: reglu "
                   "(= --initializer rila --regularizer rol --objective ihl with ReGLU's TOFU defaults and schedule)")
    g.add_argument("--objective", default=S, help="unlearning objective (default: grad_diff; see `unlearn plugins`)")
    g.add_argument("--objective-option", action="append", default=S, metavar="KEY=VALUE", help="objective option (repeatable)")
    g.add_argument("--retain-loss", choices=["nll", "kl"], default=S, help="retain term: NLL or KL to the reference model")
    g.add_argument("--initializer", default=S, help="LoRA adapter initializer (default: kaiming, PEFT's default)")
    g.add_argument("--initializer-option", action="append", default=S, metavar="KEY=VALUE")
    g.add_argument("--regularizer", default=S, help="regulariser added to the objective, e.g. rol")
    g.add_argument("--regularizer-option", action="append", default=S, metavar="KEY=VALUE",
                   help="e.g. weight=0.5 (lambda), rank=128")
    add_training_options(p)
    p.set_defaults(func=run)


#: parsed options that are not config fields
NOT_CONFIG = ("func", "command", "debug", "verbosity", "show_config", "config", "preset")
_DICT_FLAGS = {"objective_option": "objective_options", "initializer_option": "initializer_options",
               "regularizer_option": "regularizer_options"}


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


def _report(result, what: str) -> None:
    record = result.record
    final = record.get("final_loss")
    loss = f", final loss {final:.4g}" if isinstance(final, (int, float)) else ""
    outputs = ", ".join(f"{k}: {v}" for k, v in record.get("outputs", {}).items())
    print(f"{what}: {record['steps']} steps in {record['wall_time_s']:.1f} s{loss} -> {outputs}; "
          f"{result.out / 'run.json'}")


def check_overlap(config) -> None:
    """Refuse forget samples that are also retain samples (unless allow_overlap), before any model work."""
    from ..data.tofu import check_disjoint, load_split

    if config.retain:
        check_disjoint(load_split(config.forget, config.tofu_dir), load_split(config.retain, config.tofu_dir),
                       forget_spec=config.forget, retain_spec=config.retain, allow_overlap=config.allow_overlap)


def run(args) -> int:
    from ..training import UnlearnConfig, run_unlearning

    config = resolve_config(UnlearnConfig, args)
    if args.show_config:
        return print_config(config.to_dict(), "unlearn run: the options this run would use")
    check_overlap(config)
    result = run_unlearning(config)
    if result.record.get("outputs"):  # the main process
        _report(result, f"unlearned {result.record['samples']['forget']} forget samples with {config.objective}")
    return 0
