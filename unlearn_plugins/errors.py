"""Errors a user can act on. The CLI prints them without a traceback (``--debug`` shows it)."""

import traceback


def one_line(exc: BaseException) -> str:
    """An exception on one line (a SyntaxError's caret lines folded in)."""
    text = "".join(traceback.format_exception_only(type(exc), exc))
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


class UnlearnError(Exception):
    """Base class: bad input or configuration, with what is wrong and where."""


class RegistryError(UnlearnError):
    """registry.toml is malformed (the message names file, entry and field)."""


class PluginLoadError(UnlearnError):
    """A plugin failed to import or its hook raised (strict mode only)."""


class DuplicateComponentError(UnlearnError):
    """Two plugins register a component of the same kind and name."""


class UnknownComponentError(UnlearnError, KeyError):
    """No component of that kind has that name (the message lists the available ones)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DataError(UnlearnError):
    """Bad data: missing folder or split, malformed line, missing field, empty split."""


class ModelError(UnlearnError):
    """A model could not be resolved or loaded."""


class PluginError(UnlearnError):
    """A plugin's component raised or broke its contract while running (the message names the
    plugin and the component; ``--debug`` shows the original traceback)."""
