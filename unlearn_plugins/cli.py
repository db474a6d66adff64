"""The `unlearn` command: parse, call the library, print. Errors print once, without a
traceback (``--debug`` shows it)."""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands import COMMANDS
from .errors import UnlearnError


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="unlearn",
        description="Machine unlearning for LLMs: score difficulty, unlearn, evaluate.",
    )
    parser.add_argument("--version", action="version", version=f"unlearn-plugins {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f".commands.{name}", __package__).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UnlearnError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
