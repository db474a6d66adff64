"""The options `unlearn run` and `unlearn finetune` share: their training flags, and the merge
of defaults < --preset < the run resumed < --config TOML < the flags given."""

from __future__ import annotations

import argparse
import dataclasses

from ..options import add_config_arguments, config_flag, parse_options
from .common import add_show_config_option, print_config

#: a flag's default: not given (only flags actually given override the config file)
S = argparse.SUPPRESS


def add_training_options(p: argparse.ArgumentParser, config_cls, groups: dict) -> None:
    """The flags of ``config_cls``'s fields (`unlearn run` and `unlearn finetune`), generated
    from their metadata into ``groups`` (the command's own first, then "model", "LoRA", ...):
    a flag not given sets nothing, the config's default applies."""
    p.add_argument("--config", default=None, metavar="FILE.toml", help="options from a TOML file; flags override it")
    fields = dataclasses.fields(config_cls)
    for title in dict.fromkeys([None, *groups, *(f.metadata.get("group") for f in fields)]):  # usage: group by group
        names = tuple(f.name for f in fields if f.metadata.get("group") == title)
        add_config_arguments(p, config_cls, groups=groups, names=names, unset=True)
    add_show_config_option(p, "the merged options (defaults < --preset < the run resumed < --config < flags)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the run's memory plan (each stage's peak on its device) and stop; loads no weights",
    )


#: parsed options that are not config fields
NOT_CONFIG = ("func", "command", "debug", "verbosity", "show_config", "config", "preset", "dry_run")


def key_value_fields(config_cls) -> dict[str, str]:
    """{field: its flag} of the fields given as repeatable KEY=VALUE flags (dicts of options)."""
    return {f.name: config_flag(f) for f in dataclasses.fields(config_cls) if f.metadata.get("parse") == "options"}


def cli_values(args: argparse.Namespace, config_cls) -> dict:
    """The options given on the command line, as ``config_cls``'s field names."""
    values = {k: v for k, v in vars(args).items() if k not in NOT_CONFIG}
    for key, flag in key_value_fields(config_cls).items():
        if key in values:
            values[key] = parse_options(values[key], flag)
    if values.pop("no_retain", False):
        values["retain"] = None
    return values


def resolve_config(config_cls, args: argparse.Namespace):
    """defaults < saved run config (--resume) < --config TOML < flags; dict options merge key by key."""
    from ..training.config import build_config, load_toml
    from ..training.run import saved_config

    cli = cli_values(args, config_cls)
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
    for key in key_value_fields(config_cls):
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
    "add_training_options",
    "resolve_config",
    "cli_values",
    "report_run",
    "run_training",
    "dry_run",
]
