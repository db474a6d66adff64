"""The `unlearn` command: parse, call the library, print. Errors print once, on one line,
without a traceback (``--debug`` shows it); the package's own warnings print as one
``warning:`` line each. ``--debug`` and ``--verbosity`` go before or after the sub-command."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import warnings
from pathlib import Path

from .commands import COMMANDS
from .errors import UnlearnError

_PACKAGE_DIR = str(Path(__file__).resolve().parent)
log = logging.getLogger(f"{__package__}.cli")  # not __name__: that is __main__ under `python -m`

#: --verbosity's levels, in lm-eval's spelling
LEVELS = ("ERROR", "WARNING", "INFO", "DEBUG")
#: the loggers --verbosity sets: this package's and those of the libraries it drives
VERBOSITY_LOGGERS = ("unlearn_plugins", "transformers", "datasets", "lm_eval", "peft", "accelerate")
#: libraries that install their own stderr handler on import and read its level from this
#: variable then (a library imported after the flag is applied, or in a worker process)
LIBRARY_LEVEL_ENV = {"transformers": "TRANSFORMERS_VERBOSITY", "datasets": "DATASETS_VERBOSITY"}
#: the level chosen with --verbosity, for worker processes (unset: no flag, each library's default)
VERBOSITY_ENV = "UNLEARN_VERBOSITY"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error: `error: unlearn probs: argument --batch-size: ...`."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _add_global_options(parser: argparse.ArgumentParser, *, default_debug, default_verbosity) -> None:
    g = parser.add_argument_group("global options (before or after the command)")
    g.add_argument("--debug", action="store_true", default=default_debug, help="show the traceback of an error")
    g.add_argument(
        "--verbosity",
        type=str.upper,
        choices=LEVELS,
        default=default_verbosity,
        metavar="LEVEL",
        help=f"log level of this package and of transformers, datasets, lm-eval, peft and accelerate: "
        f"{', '.join(LEVELS)} (default: each library's own, WARNING; `demo` and `study`: only "
        f"the libraries' errors); ERROR also hides warnings",
    )


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each sub-command's parser, by name."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(
        prog="unlearn",
        description="Machine unlearning for LLMs: score difficulty, unlearn, evaluate.",
        epilog="`unlearn COMMAND --help` describes a command, with examples.",
    )
    parser.add_argument("--version", action="version", version=f"unlearn-plugins {__version__}")
    _add_global_options(parser, default_debug=False, default_verbosity=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f".commands.{name}", __package__).add_parser(sub)
    from .host import benchmarks
    from .interfaces import Benchmark

    for bench in benchmarks().values():  # a benchmark's own verbs (`unlearn movielens`)
        for module in bench.commands:
            Benchmark.load(module).add_parser(sub)
    for command in subcommands(parser).values():
        # SUPPRESS: given before the command, the value is not reset by the command's parser
        _add_global_options(command, default_debug=argparse.SUPPRESS, default_verbosity=argparse.SUPPRESS)
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


@contextlib.contextmanager
def verbosity(level: str | None):
    """``--verbosity LEVEL`` for one command: the level of :data:`VERBOSITY_LOGGERS` (and in the
    environment, for libraries imported later and for worker processes), a stderr handler for
    the loggers that print nothing below WARNING by themselves, and at ERROR no Python warnings
    either. None (no flag) changes nothing. Everything is restored afterwards."""
    if level is None:
        yield
        return
    number = getattr(logging, level)
    loggers = [logging.getLogger(name) for name in VERBOSITY_LOGGERS]
    saved_levels = [lg.level for lg in loggers]
    levels_env = {VERBOSITY_ENV: level, **{var: level.lower() for var in LIBRARY_LEVEL_ENV.values()}}
    saved_env = {var: os.environ.get(var) for var in levels_env}
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s [%(name)s] %(message)s"))
    handled = [lg for lg in loggers if lg.name not in LIBRARY_LEVEL_ENV and not lg.handlers]
    os.environ.update(levels_env)
    for lg in loggers:
        lg.setLevel(number)
    for lg in handled:
        lg.addHandler(handler)
    try:
        with warnings.catch_warnings():
            if number >= logging.ERROR:
                warnings.simplefilter("ignore")
            yield
    finally:
        for lg in handled:
            lg.removeHandler(handler)
        for lg, saved in zip(loggers, saved_levels):
            lg.setLevel(saved)
        for var, value in saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _one_line(exc: BaseException) -> str:
    """The message on one line (a wrapped library error may carry several)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def _cache_hint(exc: BaseException) -> str:
    """Where a file error is in the default cache folder (under $HOME, which may be a file or
    read-only), the hint to put the cache elsewhere; else ""."""
    import os
    import re
    from pathlib import Path

    if os.environ.get("UNLEARN_CACHE_DIR"):
        return ""
    from .models import cache_dir

    root = cache_dir()
    named = [getattr(exc, "filename", None)] + re.findall(r"(/\S+?)(?=[\s:,;)']|$)", str(exc))
    for name in filter(None, named):
        path = Path(str(name))
        if path == root or root in path.parents or path in root.parents:
            return (
                f" (the default cache folder {root} cannot be used: set UNLEARN_CACHE_DIR to a folder that can "
                "be written)"
            )
    return ""


def _close_progress_bars() -> None:
    """Close the progress bars an error left open (the Trainer's), so the error starts its own
    line and stays the last one (a bar closed at exit would print after it)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or ()):
        with contextlib.suppress(Exception):
            bar.close()


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler's stop), raised where the program is, so that the
    cleanup Ctrl-C runs (worker processes stopped, temporary stage folders removed) runs too."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises :class:`Terminated` while a command runs (main thread only; restored after)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _replay(caught) -> None:
    """Warnings caught earlier, shown now (under the warnings format and filters in force)."""
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def main(argv: list[str] | None = None) -> int:
    # the plugins load while the parser is built (a benchmark adds its verbs and demo options):
    # their warnings are shown once the command's --verbosity and one-line format apply
    failed: BaseException | None = None
    with warnings.catch_warnings(record=True) as early:
        warnings.simplefilter("default")
        try:
            parser = build_parser()
        except (UnlearnError, KeyboardInterrupt) as exc:  # UNLEARN_PLUGINS_STRICT=1, a plugin's import
            failed = exc
    if failed is not None:
        with _one_line_warnings():
            _replay(early)
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            raise failed
        if isinstance(failed, KeyboardInterrupt):
            print(f"interrupted {failed.args[0]}" if failed.args else "interrupted", file=sys.stderr)
            return 130
        print(f"error: {_one_line(failed)}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        from .commands.common import prompt_format
        from .data import prompts

        with _sigterm_raises(), _one_line_warnings(), verbosity(args.verbosity), prompts.using(prompt_format(args)):
            log.debug(
                "unlearn %s: %s",
                args.command,
                ", ".join(f"{k}={v!r}" for k, v in vars(args).items() if k not in ("func", "command")),
            )
            _replay(early)
            return int(args.func(args) or 0)
    except (UnlearnError, OSError) as exc:  # OSError: a file that cannot be read or written (disk full, ...)
        if args.debug:
            raise
        _close_progress_bars()
        print(f"error: {_one_line(exc)}{_cache_hint(exc)}", file=sys.stderr)
        return 1
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt as exc:
        print(f"interrupted {exc.args[0]}" if exc.args else "interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
