"""Options shared by several commands (model, data, device), and the checks every command
makes on its options before any work."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path

from ..errors import UnlearnError


def add_command(sub, name: str, help: str, doc: str | None, example: str) -> argparse.ArgumentParser:
    """The parser of sub-command ``name``: ``help`` in `unlearn --help`, its module's docstring
    ``doc`` as the description and its ``example`` lines as the epilog, both laid out as written."""
    return sub.add_parser(
        name, help=help, description=doc, epilog=example, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def device_option(value: str) -> str:
    """argparse type of --device: a device this machine has (checked before any loading)."""
    from ..training.config import device_problem

    problem = device_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{value!r}: {problem}")
    return value


def dtype_option(value: str) -> str:
    """argparse type of --dtype."""
    from ..training.config import DTYPES

    if value not in DTYPES:
        raise argparse.ArgumentTypeError(f"{value!r}: use one of {', '.join(DTYPES)}")
    return value


def add_model_options(parser: argparse.ArgumentParser, *, default: str | None = "smollm2-135m") -> None:
    parser.add_argument(
        "--model",
        default=default,
        required=default is None,
        help="local Hugging Face folder, hub id, or alias 'smollm2-135m' (the embedded model) or 'tiny-llama' "
        "(a tiny random model for trying commands; default: %(default)s)",
    )
    parser.add_argument(
        "--device", default=None, type=device_option, help="cpu, cuda, cuda:1 ... (default: cuda if available)"
    )
    parser.add_argument(
        "--dtype",
        default=None,
        type=dtype_option,
        help="float32, bfloat16 or float16 (default: fp32 on CPU, bf16 on CUDA)",
    )
    parser.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the hub")
    add_prompt_options(parser)


def add_prompt_options(parser: argparse.ArgumentParser) -> None:
    """--prompt-format and --date-string, as the training config defines them (applied to the
    whole command by the CLI: :func:`prompt_format`)."""
    from ..options import add_config_arguments
    from ..training.config import MODEL, TrainingConfig

    add_config_arguments(parser, TrainingConfig, groups={MODEL: parser}, names=("prompt_format", "date_string"))


def prompt_format(args):
    """The prompt format a command's --prompt-format / --date-string / --system-prompt ask for
    (None: neither flag given, the one in force stays)."""
    from ..data import prompts

    name, date = getattr(args, "prompt_format", None), getattr(args, "date_string", None)
    if name is None and date is None:
        return None
    return prompts.resolve(name, date_string=date)


def add_data_options(parser: argparse.ArgumentParser, *, default: str | None = "tofu:forget01") -> None:
    parser.add_argument(
        "--data",
        default=default,
        required=default is None,
        help="tofu:SPLIT, tofu:SPLIT[a:b], or a JSON-lines file in TOFU's format (default: %(default)s)",
    )
    add_tofu_dir_option(parser)


def add_tofu_dir_option(parser) -> None:
    """--tofu-dir, as the training config defines it (``parser``: a parser or an argument group)."""
    from ..options import add_config_arguments
    from ..training.config import DATA, TrainingConfig

    add_config_arguments(parser, TrainingConfig, groups={DATA: parser}, names=("tofu_dir",))


def check_int(flag: str, value, minimum: int) -> None:
    """A whole-number option (not a bool) of at least ``minimum``; the error names the option."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UnlearnError(f"{flag} must be an integer >= {minimum}, got {value!r}")


def check_out_folder(flag: str, path: str | None) -> None:
    """An output folder: it may exist as a folder, but must not be a file."""
    if path and Path(path).exists() and not Path(path).is_dir():
        raise UnlearnError(f"{flag} {path}: is an existing file, not a folder")


def check_out_file(flag: str, path: str | None) -> None:
    """An output file: it may exist as a file, but must not be a folder."""
    if path and Path(path).is_dir():
        raise UnlearnError(f"{flag} {path}: is a folder, not a file")


# ----------------------------------------------------------------------------- --show-config


def add_show_config_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--show-config", action="store_true", help=f"print {what} as TOML and exit without running anything"
    )


def print_config(values: Mapping, title: str) -> int:
    """--show-config: ``values`` as TOML under a comment line naming what they are."""
    print(f"# {title}")
    print(to_toml(values), end="")
    return 0


def _plain(value, path: tuple, unset: list[str]):
    """``value`` in TOML's types (tuples and paths as lists and strings); None-valued keys are
    dropped and listed in ``unset`` (TOML has no null)."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if item is None:
                unset.append(".".join(map(str, (*path, key))))
            else:
                out[str(key)] = _plain(item, (*path, key), unset)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, path, unset) for item in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (bool, int, float, str)):
        return value
    raise UnlearnError(f"--show-config: option {'.'.join(map(str, path))}: {value!r} has no TOML form")


def to_toml(values: Mapping) -> str:
    """``values`` as a TOML document (tomli-w) that ``tomllib.loads`` reads back as ``values``,
    tuples and paths as lists and strings. TOML has no null: options not set are named in a
    comment line ``# not set: "a", "b.c"`` at the top."""
    import tomli_w

    unset: list[str] = []
    document = tomli_w.dumps(_plain(values, (), unset))
    names = ", ".join(
        json.dumps(name).replace("\x7f", "\\u007f") for name in unset
    )  # a comment holds no control character
    return (f"# not set: {names}\n" if unset else "") + document
