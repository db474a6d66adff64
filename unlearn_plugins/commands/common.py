"""Options shared by several commands (model, data, device)."""

from __future__ import annotations

import argparse
import json

from ..errors import UnlearnError


def add_model_options(parser: argparse.ArgumentParser, *, default: str | None = "smollm2-135m") -> None:
    parser.add_argument("--model", default=default, required=default is None,
                        help="local Hugging Face folder, hub id, or alias 'smollm2-135m' (default: %(default)s)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: fp32 on CPU, bf16 on CUDA)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow custom model code from the hub")


def add_data_options(parser: argparse.ArgumentParser, *, default: str | None = "tofu:forget01") -> None:
    parser.add_argument("--data", default=default, required=default is None,
                        help="tofu:SPLIT, tofu:SPLIT[a:b], or a JSON-lines file in TOFU's format (default: %(default)s)")
    parser.add_argument("--tofu-dir", default=None, help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)")


def parse_options(pairs: list[str] | None) -> dict:
    """--option key=value pairs; values parsed as JSON when possible (numbers, booleans, lists)."""
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UnlearnError(f"--option {pair!r}: expected key=value")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    return options
