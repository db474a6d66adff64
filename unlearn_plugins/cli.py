"""The `unlearn` command: parse, call the library, print. Errors print once, on one line,
without a traceback (``--debug`` shows it); the package's own warnings print as one
``warning:`` line each."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from pathlib import Path

from .commands import COMMANDS
from .errors import UnlearnError

_PACKAGE_DIR = str(Path(__file__).resolve().parent)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error: `error: unlearn probs: argument --batch-size: ...`."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(
        prog="unlearn",
        description="Machine unlearning for LLMs: score difficulty, unlearn, evaluate.",
    )
    parser.add_argument("--version", action="version", version=f"unlearn-plugins {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f".commands.{name}", __package__).add_parser(sub)
    return parser


@contextlib.contextmanager
def _one_line_warnings():
    """Warnings raised by this package print as `warning: MESSAGE`; others keep Python's format."""
    original = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None):
        if str(filename).startswith(_PACKAGE_DIR):
            return f"warning: {message}\n"
        return original(message, category, filename, lineno, line)

    warnings.formatwarning = format_warning
    try:
        yield
    finally:
        warnings.formatwarning = original


def _one_line(exc: BaseException) -> str:
    """The message on one line (a wrapped library error may carry several)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with _one_line_warnings():
            return int(args.func(args) or 0)
    except (UnlearnError, OSError) as exc:  # OSError: a file that cannot be read or written (disk full, ...)
        if args.debug:
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
