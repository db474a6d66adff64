"""Options shared by several commands (model, data, device), and the checks every command
makes on its options before any work."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UnlearnError


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
    parser.add_argument("--model", default=default, required=default is None,
                        help="local Hugging Face folder, hub id, or alias 'smollm2-135m' (default: %(default)s)")
    parser.add_argument("--device", default=None, type=device_option,
                        help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--dtype", default=None, type=dtype_option,
                        help="float32, bfloat16 or float16 (default: fp32 on CPU, bf16 on CUDA)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the hub")


def add_data_options(parser: argparse.ArgumentParser, *, default: str | None = "tofu:forget01") -> None:
    parser.add_argument("--data", default=default, required=default is None,
                        help="tofu:SPLIT, tofu:SPLIT[a:b], or a JSON-lines file in TOFU's format (default: %(default)s)")
    parser.add_argument("--tofu-dir", default=None, help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)")


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


def parse_options(pairs: list[str] | None, flag: str = "--option") -> dict:
    """--option key=value pairs; values parsed as JSON when possible (numbers, booleans, lists)."""
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UnlearnError(f"{flag} {pair!r}: expected key=value")
        try:
            options[key.strip().replace("-", "_")] = json.loads(value)
        except (ValueError, RecursionError):  # not JSON (or too long/deep for Python's parser): the text
            options[key.strip().replace("-", "_")] = value
    return options
