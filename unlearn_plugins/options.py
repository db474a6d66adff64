"""A component's options: what it declares, how given values are checked, what run.json records.

A component declares its options the way the ecosystem does (transformers' HfArgumentParser,
PEFT's LoraConfig): as a dataclass whose fields carry ``metadata={"help": ...}`` (the component
itself, or its ``config_class``), or as keyword parameters of its constructor, with help as
``Annotated[type, "help"]``. The host reads them
to list them (`unlearn plugins --json`), to refuse an unknown option or a value of the wrong
type with one line naming the component, and to record the values in use in run.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import types
import typing
from collections import abc
from dataclasses import dataclass
from typing import Any

_MISSING = object()


class _Unavailable:
    """The default of a dataclass field whose ``default_factory`` raised: the option is listed
    (with why) and the component itself reports the error when it is created."""

    def __init__(self, text: str):
        self.text = " ".join(text.split())[:200]

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Option:
    """One declared option: its name, type (as text), default, and help."""

    name: str
    type: str = ""
    default: Any = _MISSING
    help: str = ""
    hint: Any = None  # the resolved annotation (None: not resolvable, values are not type-checked)

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "type": self.type, "help": self.help}
        entry["required" if self.required else "default"] = True if self.required else json_safe(self.default)
        return entry


@dataclass(frozen=True)
class Declared:
    """A component's options; ``open_ended``: it also takes ``**kwargs`` that lead nowhere
    declared, so unknown names are left to the component to refuse."""

    options: tuple[Option, ...]
    open_ended: bool = False

    def names(self) -> list[str]:
        return [o.name for o in self.options]

    def get(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    def to_json(self) -> list[dict[str, Any]]:
        return [o.to_json() for o in self.options]


def json_safe(value: Any) -> Any:
    """``value`` if JSON can hold it, else its repr (run.json and `unlearn plugins --json`)."""
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _help_of(hint: Any) -> tuple[Any, str]:
    """(the type inside ``Annotated[type, "help", ...]``, the help text) of an annotation."""
    if typing.get_origin(hint) is typing.Annotated:
        inner, *extras = typing.get_args(hint)
        return inner, next((e for e in extras if isinstance(e, str)), "")
    return hint, ""


def _type_text(hint: Any, raw: Any) -> str:
    if hint is None:
        return "" if raw is inspect.Parameter.empty else str(raw)
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except Exception:  # noqa: BLE001 - a name only importable under TYPE_CHECKING, ...: not type-checked
        return {}


def _from_dataclass(cls: type) -> Declared:
    hints = _hints(cls)
    options = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint, annotated_help = _help_of(hints.get(f.name))
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            try:
                default = f.default_factory()
            except Exception as exc:  # noqa: BLE001 - a plugin's factory: listed, not fatal to the listing
                default = _Unavailable(f"<default_factory raised {type(exc).__name__}: {exc}>")
        else:
            default = _MISSING
        options.append(
            Option(f.name, _type_text(hint, f.type), default, str(f.metadata.get("help", annotated_help)), hint)
        )
    return Declared(tuple(options))


def _constructors(obj: Any) -> list[Any]:
    """The functions whose keyword parameters are ``obj``'s options: a class's ``__init__``,
    followed up the MRO while one passes ``**kwargs`` on; a factory function itself."""
    if not isinstance(obj, type):
        return [obj]
    found = []
    for klass in obj.__mro__:
        if klass is object:
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        found.append(init)
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            break
    return found


def declared_options(obj: Any) -> Declared | None:
    """The options of a component class or factory; None when it has no inspectable signature.
    A class whose options are a typed config names it as ``config_class`` (as PEFT's tuners do)."""
    config_class = getattr(obj, "config_class", None) if isinstance(obj, type) else None
    if isinstance(config_class, type) and dataclasses.is_dataclass(config_class):
        return _from_dataclass(config_class)
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        return _from_dataclass(obj)
    options: dict[str, Option] = {}
    try:
        functions = _constructors(obj)
        if not functions:  # no __init__ of its own below object: no options
            return Declared(())
        signatures = [inspect.signature(function) for function in functions]
    except (TypeError, ValueError):  # a builtin or C callable
        return None
    for function, signature in zip(functions, signatures):
        params = list(signature.parameters.values())[1 if isinstance(obj, type) else 0 :]  # not self
        hints = _hints(function)
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY) or p.name in options:
                continue
            hint, help_text = _help_of(hints.get(p.name))
            default = _MISSING if p.default is p.empty else p.default
            options[p.name] = Option(p.name, _type_text(hint, p.annotation), default, help_text, hint)
    # the last constructor in the chain still takes **kwargs: names beyond these cannot be judged
    open_ended = any(p.kind is p.VAR_KEYWORD for p in signatures[-1].parameters.values())
    return Declared(tuple(options.values()), open_ended)


# ----------------------------------------------------------------------------- checking values


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits the annotation ``hint``; None when the annotation says too little."""
    hint, _ = _help_of(hint)
    if hint is None or hint is Any or hint is inspect.Parameter.empty:
        return None
    if hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        verdicts = [_matches(value, arm) for arm in args]
        return True if any(v is True for v in verdicts) else (None if any(v is None for v in verdicts) else False)
    if origin is typing.Literal:
        return value in args
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    container = origin or hint
    if container in (list, tuple, typing.Sequence, abc.Sequence):
        if not isinstance(value, (list, tuple)):
            return False
        inner = [a for a in args if a is not Ellipsis]
        if len(inner) == 1:
            verdicts = [_matches(item, inner[0]) for item in value]
            return not any(v is False for v in verdicts)
        return True
    if container in (dict, typing.Mapping, abc.Mapping):
        return isinstance(value, dict)
    if isinstance(hint, type):
        try:
            return isinstance(value, hint)
        except TypeError:
            return None
    return None


def type_problems(declared: Declared | None, given: dict[str, Any]) -> list[str]:
    """One sentence per given option whose value does not fit its declared type."""
    if declared is None:
        return []
    problems = []
    for name, value in given.items():
        option = declared.get(name)
        if option is not None and _matches(value, option.hint) is False:
            problems.append(f"option {name!r} must be {option.type}, got {value!r}")
    return problems


def finite_problems(given: dict[str, Any]) -> list[str]:
    """Given values that are NaN or infinite (a study's ``alpha = inf``; JSON's ``Infinity``):
    accepted, they made the loss non-finite and the error said "lower --lr"."""
    import math

    def bad(value: Any) -> bool:
        if isinstance(value, float):
            return not math.isfinite(value)
        if isinstance(value, (list, tuple)):
            return any(bad(v) for v in value)
        if isinstance(value, dict):
            return any(bad(v) for v in value.values())
        return False

    return [f"option {name!r} must be a finite number, got {value!r}" for name, value in given.items() if bad(value)]


def name_problems(declared: Declared | None, given: dict[str, Any]) -> list[str]:
    """Unknown option names (unless the component takes any) and missing required ones."""
    if declared is None:
        return []
    known = declared.names()
    problems = []
    if not declared.open_ended:
        unknown = [name for name in given if name not in known]
        if unknown:
            listed = ", ".join(known) if known else "none"
            problems.append(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(repr(u) for u in unknown)} "
                f"(its options: {listed})"
            )
    missing = [o.name for o in declared.options if o.required and o.name not in given]
    if missing:
        problems.append(f"missing required option{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    return problems


def values_in_use(declared: Declared | None, instance: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The option values a created component runs with (for run.json): each declared option's
    attribute on the instance when it has one, else the value given, else the default."""
    if declared is None:
        return {k: json_safe(v) for k, v in given.items()}
    values = {}
    for option in declared.options:
        if hasattr(instance, option.name) and not callable(getattr(instance, option.name)):
            value = getattr(instance, option.name)
        elif option.name in given:
            value = given[option.name]
        elif not option.required:
            value = option.default
        else:
            continue
        values[option.name] = json_safe(value)
    for name, value in given.items():  # open-ended components: what was given beyond the declared
        values.setdefault(name, json_safe(value))
    return values


def attributes(instance: Any, names: str) -> dict[str, Any]:
    """``instance``'s attributes ``names`` (space-separated, in this order) as a dict: e.g. a
    component's ``options()``, what run.json records."""
    return {name: getattr(instance, name) for name in names.split()}


def options_repr(instance: Any, hidden: tuple[str, ...] = ()) -> str:
    """``NAME(key=value, ...)`` of a component's ``options()`` but the ``hidden`` ones."""
    shown = ", ".join(f"{k}={v!r}" for k, v in instance.options().items() if k not in hidden)
    return f"{instance.name}({shown})"


def parse_options(pairs: list[str] | None, flag: str = "--option") -> dict:
    """--option key=value pairs; values parsed as JSON when possible (numbers, booleans, lists)."""
    from .errors import UnlearnError

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


# ----------------------------------------------------------------------------- typed configs

#: what :func:`config_field` keeps in a field's metadata (read by :func:`add_config_arguments`
#: and by a study file's table reader)
CONFIG_KEYS = ("help", "cli", "flag", "flags", "metavar", "choices", "group", "mutex", "parse", "minimum", "maximum")


def config_field(default: Any, help: str, **extra: Any) -> Any:
    """A typed config's field: its default (a callable such as ``list``: a fresh one each time)
    and help (``%(default)s`` in it: the default, written once), with how the command line and
    study files take it: ``flag`` (its spelling, when not the field's name), ``flags`` (more
    spellings), ``metavar``, ``choices``, ``group`` (its argument group), ``mutex`` (flags of one
    group sharing this name exclude each other), ``parse`` ("csv": one comma-separated value;
    "append": repeatable; "options": repeatable KEY=VALUE, made a dict by the command),
    ``minimum`` / ``maximum``, ``cli`` ("common": added by another helper; False: not a flag)."""
    unknown = set(extra) - set(CONFIG_KEYS)
    if unknown:
        raise TypeError(f"config_field: unknown {', '.join(sorted(unknown))}")
    metadata = {"help": help, **extra}
    if callable(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_default(f: dataclasses.Field) -> Any:
    """A field's default (a fresh one of a ``default_factory``)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def config_defaults(cls: type) -> dict[str, Any]:
    """{field: default} of a typed config: what the command line and a study file must agree on."""
    return {f.name: field_default(f) for f in dataclasses.fields(cls) if f.init}


def config_flag(f: dataclasses.Field) -> str:
    """A field's flag: ``--batch-size`` for ``batch_size`` unless its metadata spells it."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def config_help(f: dataclasses.Field) -> str:
    """A field's help with its default in place of ``%(default)s`` (floats as ``%g``): the flag
    shows the config's default even where argparse holds none (``unset``)."""
    text = f.metadata.get("help", "")
    if "%(default)s" in text:
        value = field_default(f)
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        text = text.replace("%(default)s", shown.replace("%", "%%"))
    return text


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _int_csv(text: str) -> list[int]:
    try:
        return [int(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def scalar_type(hint: Any) -> Any:
    """``int`` of ``int | None`` (the type argparse converts a value with)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def add_config_arguments(
    parser: Any,
    cls: type,
    *,
    groups: dict[str, Any] | None = None,
    names: tuple[str, ...] | None = None,
    unset: bool = False,
) -> dict[str, Any]:
    """Add a flag per field of the typed config ``cls`` (or of its fields ``names``), its default,
    help, type and choices the field's: the command line cannot drift from the config. bool
    fields are store-true flags (their default must be False), ``parse`` "append" and "options"
    fields repeatable, "csv" fields one comma-separated value (of integers for ``list[int]``,
    shown as ``I,J,...``);
    ``groups``: argument groups made so far (title -> group), shared between calls. ``unset``: a
    flag not given sets nothing (argparse.SUPPRESS), so only the flags given override a config
    file below them. Returns the groups."""
    groups = {} if groups is None else groups
    exclusive: dict[tuple[str, str], Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if not f.init or meta.get("cli", True) is not True or (names is not None and f.name not in names):
            continue
        target = parser
        if meta.get("group"):
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_argument_group(meta["group"])
            target = groups[meta["group"]]
        if meta.get("mutex"):
            key = (meta.get("group", ""), meta["mutex"])
            if key not in exclusive:
                exclusive[key] = target.add_mutually_exclusive_group()
            target = exclusive[key]
        default = field_default(f)
        kwargs: dict[str, Any] = {"dest": f.name, "help": config_help(f)}
        kwargs["default"] = argparse.SUPPRESS if unset else default
        hint = scalar_type(hints[f.name])
        if hint is bool:
            if default is not False:
                raise TypeError(f"{cls.__name__}.{f.name}: a flag's default must be False")
            kwargs["action"] = "store_true"
        elif meta.get("parse") in ("append", "options"):
            kwargs["action"] = "append"
        elif meta.get("parse") == "csv":
            kwargs["type"] = _int_csv if typing.get_args(hint) == (int,) else _csv
        elif hint in (int, float):
            kwargs["type"] = hint
        if (metavar := config_metavar(f, hint)) is not None:
            kwargs["metavar"] = metavar
        if "choices" in meta:
            kwargs["choices"] = meta["choices"]
        target.add_argument(config_flag(f), *meta.get("flags", ()), **kwargs)
    return groups


def config_metavar(f: dataclasses.Field, hint: Any) -> str | None:
    """A field's metavar on the command line: its own, else ``I,J,...`` for a comma-separated
    list of integers (``hint``: the field's type as :func:`scalar_type` gives it)."""
    if "metavar" in f.metadata:
        return f.metadata["metavar"]
    if f.metadata.get("parse") == "csv" and typing.get_args(hint) == (int,):
        return "I,J,..."
    return None


def config_from_args(cls: type, args: Any, **changes: Any) -> Any:
    """The typed config ``cls`` of parsed arguments (each field from the attribute of its name)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(args, f.name)}
    return cls(**{**values, **changes})


def config_field_of(cls: type, name: str, **changes: Any) -> Any:
    """A field defined as ``cls``'s field ``name`` is (its default and metadata; ``changes``: help
    and the like of this use): a second table that shares an option shares its one definition."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    metadata = {**f.metadata, **changes}
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=metadata)
    return dataclasses.field(default=f.default, metadata=metadata)
