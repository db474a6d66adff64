"""The plugin host: built-ins from registry.toml, third-party plugins from entry points.

Rules (each one tested):

* built-in plugins are declared in ``registry.toml`` and validated when loaded;
* third-party plugins come from the entry point group ``unlearn_plugins`` and are loaded one
  by one, built-ins first, then entry points in name order;
* a plugin loads whole or not at all: one that fails to import, implements an unknown hook
  (pluggy's ``check_pending``: a misspelt ``register_difficulty_scorer``) or no hook, whose hook
  raises, or that registers a component name its kind already has, or whose plugin name is
  taken, is refused - none of its components are registered - with one warning line naming it
  (and an ``ERROR:`` line in ``unlearn plugins``) while the rest keep working;
  ``UNLEARN_PLUGINS_STRICT=1`` turns such a refusal into an error;
* ``UNLEARN_DISABLE_PLUGINS=a,b`` blocks plugins by name (built-ins too);
  ``UNLEARN_LOAD_PLUGINS=a,b`` loads only these third-party plugins (empty: none), as
  simonw/llm's ``LLM_LOAD_PLUGINS``; built-ins always load unless disabled;
* a component's options are declared (:mod:`unlearn_plugins.options`) and every bad option
  fails the same way: one line naming the component and its plugin.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pluggy

from . import hookspecs
from .errors import (
    DuplicateComponentError,
    PluginLoadError,
    RegistryError,
    UnknownComponentError,
    UnlearnError,
    one_line,
)
from .interfaces import BENCHMARK, HOOK_OF_KIND, KINDS, LM_EVAL_TASK_DIR, PROTOCOL_OF_KIND, Benchmark
from .options import (
    Declared,
    attributes,
    declared_options,
    finite_problems,
    name_problems,
    type_problems,
    values_in_use,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENTRY_POINT_GROUP = "unlearn_plugins"
REGISTRY_SCHEMA_VERSION = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_OBJECT_RE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")
_ENTRY_FIELDS = {"name": str, "kind": str, "object": str, "summary": str, "components": list}
#: how messages name a component of each kind
KIND_WORD = {
    "difficulty_scorer": "scorer",
    "adapter_initializer": "initializer",
    "unlearning_objective": "objective",
    "lm_eval_task_dir": "task folder",
    "attack": "attack",
    "benchmark": "benchmark",
}


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class RegistryEntry:
    """One built-in plugin as declared in registry.toml."""

    name: str
    kind: str
    object: str
    summary: str
    components: tuple[str, ...]


def package_file(name: str) -> Path:
    """A data file shipped with the package (wheel) or at the repository root (editable)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / name, here.parent / name):
        if candidate.exists():
            return candidate
    return here / name


def registry_path() -> Path:
    return package_file("registry.toml")


def load_registry(path: str | os.PathLike | None = None) -> list[RegistryEntry]:
    """Parse and validate registry.toml; errors name the file, the entry and the field."""
    path = Path(path) if path is not None else registry_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RegistryError(f"{path}: registry file not found") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RegistryError(f"{path}: not valid TOML: {exc}") from None

    version = data.get("schema_version")
    if version is None:
        raise RegistryError(f"{path}: field 'schema_version' is missing (expected {REGISTRY_SCHEMA_VERSION})")
    if version != REGISTRY_SCHEMA_VERSION or isinstance(version, bool):
        raise RegistryError(
            f"{path}: field 'schema_version': unsupported value {version!r} (expected {REGISTRY_SCHEMA_VERSION})"
        )
    unknown_top = set(data) - {"schema_version", "plugin"}
    if unknown_top:
        raise RegistryError(
            f"{path}: unknown top-level field(s) {sorted(unknown_top)} (expected 'schema_version', 'plugin')"
        )
    items = data.get("plugin")
    if not isinstance(items, list) or not items:
        raise RegistryError(f"{path}: field 'plugin': expected a non-empty array of tables ([[plugin]])")

    entries: list[RegistryEntry] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items, start=1):
        label = f"{path}: [[plugin]] entry {i}"
        if not isinstance(item, dict):
            raise RegistryError(f"{label}: expected a table")
        if isinstance(item.get("name"), str):
            label += f" ({item['name']!r})"
        for key, typ in _ENTRY_FIELDS.items():
            if key not in item:
                raise RegistryError(f"{label}: field '{key}' is missing")
            if not isinstance(item[key], typ):
                raise RegistryError(f"{label}: field '{key}': expected {typ.__name__}, got {type(item[key]).__name__}")
        extra = set(item) - set(_ENTRY_FIELDS)
        if extra:
            raise RegistryError(f"{label}: unknown field(s) {sorted(extra)}")
        if not _NAME_RE.match(item["name"]):
            raise RegistryError(f"{label}: field 'name': {item['name']!r} is not a valid plugin name")
        if item["kind"] not in KINDS:
            raise RegistryError(f"{label}: field 'kind': {item['kind']!r} is not one of {', '.join(KINDS)}")
        if not _OBJECT_RE.match(item["object"]):
            raise RegistryError(
                f"{label}: field 'object': {item['object']!r} is not of the form 'module' or 'module:attr'"
            )
        if not item["summary"].strip():
            raise RegistryError(f"{label}: field 'summary' is empty")
        comps = item["components"]
        if not comps or not all(isinstance(c, str) and _NAME_RE.match(c) for c in comps):
            raise RegistryError(f"{label}: field 'components': expected a non-empty list of component names")
        if item["name"] in seen:
            raise RegistryError(f"{label}: field 'name': {item['name']!r} already used by entry {seen[item['name']]}")
        seen[item["name"]] = i
        entries.append(RegistryEntry(item["name"], item["kind"], item["object"], item["summary"], tuple(comps)))
    return entries


def import_object(ref: str) -> Any:
    """Import ``module`` or ``module:attr`` (attr may be dotted)."""
    module_name, _, attr = ref.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


# ----------------------------------------------------------------------------- host


def _where_defined(obj: Any) -> str | None:
    """``module:qualname`` of a class or function (None for other objects, e.g. a path)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else None


@dataclass
class Component:
    """A registered component: its kind, name, the object, the plugin that gave it and the
    module that registered it (``module``: where the object is defined, else that hook's module)."""

    kind: str
    name: str
    obj: Any
    plugin: str
    module: str = ""

    @property
    def label(self) -> str:
        """How messages name it: ``objective 'npo' (plugin 'builtin-objectives')``."""
        return f"{KIND_WORD[self.kind]} {self.name!r} (plugin {self.plugin!r})"

    def options(self) -> Declared | None:
        return None if self.kind in (LM_EVAL_TASK_DIR, BENCHMARK) else declared_options(self.obj)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "module": self.module}
        if self.kind == LM_EVAL_TASK_DIR:
            entry["path"] = str(Path(self.obj).resolve())
        elif self.kind == BENCHMARK:
            entry["summary"] = self.obj.summary
            entry["task_dirs"] = [str(Path(p).resolve()) for p in self.obj.task_dirs]
            entry["studies"] = sorted(self.obj.studies)
            entry["commands"] = list(self.obj.commands)
        else:
            declared = self.options()
            entry["options"] = declared.to_json() if declared is not None else None
            if declared is not None and declared.open_ended:
                entry["takes_other_options"] = True
        return entry


@dataclass
class PluginInfo:
    """What `unlearn plugins` shows for one plugin."""

    name: str
    source: str  # "built-in" or "entry point"
    distribution: str | None = None
    version: str | None = None
    summary: str = ""
    components: dict[str, list[str]] = field(default_factory=dict)  # kind -> names
    errors: list[str] = field(default_factory=list)
    disabled: bool = False
    disabled_by: str | None = None  # the variable that kept it from loading
    registered: list[Component] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **attributes(self, "name source distribution version summary"),
            "components": {
                kind: [c.to_json() for c in self.registered if c.kind == kind]
                for kind in KINDS
                if any(c.kind == kind for c in self.registered)
            },
            **attributes(self, "errors disabled disabled_by"),
        }


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _names_from_env(name: str) -> set[str] | None:
    """The comma-separated names in ``name`` (None when it is not set)."""
    if name not in os.environ:
        return None
    return {p.strip() for p in os.environ[name].split(",") if p.strip()}


class _Refused(Exception):
    """A plugin broke a loading rule (unknown hook, no hook, a taken name)."""


class PluginHost:
    """Loads plugins and indexes their components by kind and name."""

    def __init__(
        self,
        *,
        registry: str | os.PathLike | None = None,
        load_entry_points: bool = True,
        strict: bool | None = None,
        disabled: Iterable[str] | None = None,
        entry_points: Iterable[md.EntryPoint] | None = None,
        load_only: Iterable[str] | None = None,
    ) -> None:
        self.strict = _env_flag("UNLEARN_PLUGINS_STRICT") if strict is None else strict
        self.disabled = (_names_from_env("UNLEARN_DISABLE_PLUGINS") or set()) if disabled is None else set(disabled)
        #: third-party plugins to load (None: all)
        self.load_only = _names_from_env("UNLEARN_LOAD_PLUGINS") if load_only is None else set(load_only)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.refused: list[PluginInfo] = []  # plugins refused because their name was taken
        self.components: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}

        self.registry = load_registry(registry)
        for entry in self.registry:
            info = PluginInfo(entry.name, "built-in", "unlearn-plugins", _own_version(), entry.summary)
            self._load(info, lambda entry=entry: import_object(entry.object))
        if load_entry_points:
            eps = list(entry_points if entry_points is not None else md.entry_points(group=ENTRY_POINT_GROUP))
            for ep in sorted(eps, key=lambda e: e.name):
                dist = getattr(ep, "dist", None)
                info = PluginInfo(
                    ep.name,
                    "entry point",
                    dist.metadata["Name"] if dist is not None else None,
                    dist.version if dist is not None else None,
                    (dist.metadata.get("Summary") or "") if dist is not None else "",
                )
                if self.load_only is not None and ep.name not in self.load_only:
                    info.disabled, info.disabled_by = True, "UNLEARN_LOAD_PLUGINS"
                self._load(info, ep.load)
            unknown = sorted((self.load_only or set()) - {ep.name for ep in eps})
            if unknown:
                warnings.warn(
                    f"UNLEARN_LOAD_PLUGINS names {', '.join(map(repr, unknown))}: no such plugin is "
                    f"installed (installed: {', '.join(sorted(ep.name for ep in eps)) or 'none'})",
                    RuntimeWarning,
                    stacklevel=2,
                )
            unknown = sorted(self.disabled - {e.name for e in self.registry} - {ep.name for ep in eps})
            if unknown:  # a misspelt name disables nothing: said, as UNLEARN_LOAD_PLUGINS's
                known = [e.name for e in self.registry] + sorted(ep.name for ep in eps)
                warnings.warn(
                    f"UNLEARN_DISABLE_PLUGINS names {', '.join(map(repr, unknown))}: no such plugin "
                    f"(plugins: {', '.join(known)})",
                    RuntimeWarning,
                    stacklevel=2,
                )

    # -- loading
    def _fail(self, info: PluginInfo, what: str, detail: str, exc: BaseException | None = None) -> None:
        """Record a refused plugin: one warning line, or an error under strict mode."""
        info.errors.append(f"{what}: {detail}")
        message = f"plugin {info.name!r} ({info.source}) refused: {what}: {detail}"
        if self.strict:
            raise PluginLoadError(message + " (UNLEARN_PLUGINS_STRICT is set)") from exc
        warnings.warn(message + "; the other plugins are loaded", RuntimeWarning, stacklevel=3)

    def _load(self, info: PluginInfo, load: Callable[[], Any]) -> None:
        if info.name in self.disabled:
            info.disabled, info.disabled_by = True, "UNLEARN_DISABLE_PLUGINS"
        holder = self.plugins.get(info.name)
        if holder is not None:
            self.refused.append(info)
            if not info.disabled:
                self._fail(
                    info,
                    "name already taken",
                    f"{holder.source} plugin {holder.name!r} ({holder.distribution}) has this name",
                )
            return
        self.plugins[info.name] = info
        if info.disabled:
            return
        try:
            obj = load()
        except Exception as exc:  # an import error must not take the host down
            self._fail(info, "failed to import", one_line(exc), exc)
            return
        except SystemExit as exc:  # sys.exit() at import would end every command, silently
            self._fail(info, "failed to import", f"it called sys.exit({exc.code!r}) while being imported", exc)
            return
        except KeyboardInterrupt as exc:
            if type(exc) is not KeyboardInterrupt or exc.args:
                raise
            raise KeyboardInterrupt(f"while importing plugin {info.name!r} ({info.source})") from exc
        other = self.pm.get_name(obj)
        if other is not None:  # two entry points naming one module
            module = getattr(obj, "__name__", obj)
            self._fail(info, "invalid plugin", f"{module!s} is already loaded as plugin {other!r}")
            return
        try:
            self.pm.register(obj, name=info.name)
        except Exception as exc:
            self._fail(info, "invalid plugin", one_line(exc), exc)
            return
        try:
            staged = self._call_hooks(info, obj)
        except _Refused as exc:
            self.pm.unregister(obj)
            what, detail = exc.args
            self._fail(info, what, detail, exc.__cause__)
            return
        for component in staged:  # all or nothing
            self.components[component.kind][component.name] = component
            info.components.setdefault(component.kind, []).append(component.name)
            info.registered.append(component)

    def _check_hooks(self, obj: Any) -> list[Any]:
        """This plugin's hook implementations; a misspelt or missing hook is a refusal."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = next(
                (
                    n
                    for n in vars(self.pm.hook)
                    if not n.startswith("_")
                    and not getattr(self.pm.hook, n).has_spec()
                    and getattr(self.pm.hook, n).get_hookimpls()
                ),
                "?",
            )
            close = difflib.get_close_matches(name, HOOK_OF_KIND.values(), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _Refused(
                "unknown hook",
                f"{name!r} is not an unlearn_plugins hook ({hint}hooks: {', '.join(HOOK_OF_KIND.values())})",
            ) from exc
        callers = self.pm.get_hookcallers(obj) or []
        if not callers:
            raise _Refused(
                "no hook",
                f"it implements none of {', '.join(HOOK_OF_KIND.values())} (are its "
                f"functions marked with @unlearn_plugins.hookimpl?)",
            )
        return callers

    def _call_hooks(self, info: PluginInfo, obj: Any) -> list[Component]:
        """Call each of the plugin's hooks with a ``register`` that stages components, so a
        hook that registers some components then fails leaves none registered."""
        self._check_hooks(obj)
        staged: list[Component] = []
        for kind in KINDS:
            hook_name = HOOK_OF_KIND[kind]
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not obj:
                    continue

                def register(name: str, component: Any, _kind=kind, _impl=impl) -> None:
                    staged.append(self._component(_kind, name, component, info.name, _impl, staged))
                    if _kind == BENCHMARK:  # its task folders, named after it
                        dirs = component.task_dirs
                        for path in dirs:
                            folder = name if len(dirs) == 1 else f"{name}.{Path(path).name}"
                            staged.append(self._component(LM_EVAL_TASK_DIR, folder, path, info.name, _impl, staged))

                try:
                    impl.function(**({"register": register} if "register" in impl.argnames else {}))
                except DuplicateComponentError as exc:
                    raise _Refused("name already taken", str(exc)) from exc
                except Exception as exc:
                    raise _Refused(f"hook {hook_name} raised", one_line(exc)) from exc
        return staged

    def _component(
        self, kind: str, name: Any, component: Any, plugin: str, impl: Any, staged: list[Component]
    ) -> Component:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise TypeError(
                f"component name must be a non-empty string of letters, digits, '_', '-' or '.', got {name!r}"
            )
        if component is None:
            raise TypeError(f"component {name!r} is None")
        existing = self.components[kind].get(name) or next(
            (c for c in staged if c.kind == kind and c.name == name), None
        )
        if existing is not None:
            raise DuplicateComponentError(
                f"{kind} {name!r} is already registered by plugin {existing.plugin!r}; disable one of them "
                f"with UNLEARN_DISABLE_PLUGINS={plugin}"
            )
        if kind == LM_EVAL_TASK_DIR:
            component = Path(component)
            if not component.is_dir():
                raise TypeError(f"task folder {name!r}: {component} is not a folder")
            if not any(component.rglob("*.yaml")):
                raise TypeError(
                    f"task folder {name!r}: {component} holds no .yaml task file (a setuptools "
                    f"package must declare its YAML files as package data)"
                )
        if kind == BENCHMARK:
            if not isinstance(component, Benchmark):
                raise TypeError(f"benchmark {name!r}: not an unlearn_plugins.interfaces.Benchmark")
            if problems := component.problems():
                raise TypeError(f"benchmark {name!r}: {'; '.join(problems)}")
            others = [*self.components[kind].values(), *(c for c in staged if c.kind == kind)]
            for source in (name, *component.sources):  # each [benchmark] source reaches one study part
                if owner := next((c for c in others if source in (c.name, *c.obj.sources)), None):
                    raise TypeError(f"benchmark {name!r}: [benchmark] source {source!r} is benchmark {owner.name!r}'s")
        module = _where_defined(component) or getattr(impl.function, "__module__", "") or ""
        return Component(kind, name, component, plugin, module)

    # -- queries
    def list(self, kind: str) -> list[Component]:
        _check_kind(kind)
        return sorted(self.components[kind].values(), key=lambda c: c.name)

    def get(self, kind: str, name: str) -> Component:
        _check_kind(kind)
        try:
            return self.components[kind][name]
        except KeyError:
            available = ", ".join(sorted(self.components[kind])) or "(none installed)"
            raise UnknownComponentError(
                f"unknown {kind.replace('_', ' ')} {name!r}; available: {available}{self._why_missing(kind, name)}"
            ) from None

    def _why_missing(self, kind: str, name: str) -> str:
        """Plugins that might have given ``name`` but were not loaded: a built-in that lists it in
        registry.toml, and every disabled or refused third-party plugin (its names are unknown)."""
        builtin = {e.name: e for e in self.registry}
        notes = []
        for info in [*self.plugins.values(), *self.refused]:
            if not (info.disabled or info.errors):
                continue
            entry = builtin.get(info.name) if info.source == "built-in" else None
            if info.source == "built-in" and (entry is None or entry.kind != kind or name not in entry.components):
                continue
            state = f"disabled by {info.disabled_by}" if info.disabled else f"refused ({info.errors[0]})"
            notes.append(f"plugin {info.name!r} ({info.source}) is {state}")
        return f"; not loaded: {'; '.join(notes)}" if notes else ""

    def not_loaded(self, kind: str) -> str:
        """The plugins of ``kind`` that were not loaded (disabled or refused: built-ins of that
        kind, every third-party one), as :meth:`get` appends them to an unknown name; "" when none.
        A benchmark brings task folders too: it counts for ``lm_eval_task_dir``."""
        builtin = {e.name: e for e in self.registry}
        kinds = {kind, BENCHMARK} if kind == LM_EVAL_TASK_DIR else {kind}
        notes = []
        for info in [*self.plugins.values(), *self.refused]:
            if not (info.disabled or info.errors):
                continue
            if info.source == "built-in" and (info.name not in builtin or builtin[info.name].kind not in kinds):
                continue
            state = f"disabled by {info.disabled_by}" if info.disabled else f"refused ({info.errors[0]})"
            notes.append(f"plugin {info.name!r} ({info.source}) is {state}")
        return f"; not loaded: {'; '.join(notes)}" if notes else ""

    def label(self, kind: str, name: str) -> str:
        """How messages name ``kind``/``name``: with its plugin when registered."""
        component = self.components.get(kind, {}).get(name)
        return component.label if component is not None else f"{KIND_WORD.get(kind, kind)} {name!r}"


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UnknownComponentError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")


def _own_version() -> str | None:
    try:
        return md.version("unlearn-plugins")
    except md.PackageNotFoundError:
        return None


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide host, built on first use."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost()
    return _HOST


def reset_host() -> None:
    """Forget the cached host (tests; after installing a plugin at run time)."""
    global _HOST
    _HOST = None


def list_components(kind: str) -> list[Component]:
    """Components of one kind, sorted by name."""
    return get_host().list(kind)


def get_component(kind: str, name: str) -> Any:
    """The registered object for ``kind``/``name``; unknown names list the available ones."""
    return get_host().get(kind, name).obj


def create(kind: str, name: str, /, **options: Any) -> Any:
    """Instantiate a component with options, checking it implements its kind's protocol.

    Every bad option fails the same way, as a :class:`PluginLoadError` whose one line names the
    component and its plugin: an unknown or missing option (from its declared options), an
    error its constructor raises, or a value that does not fit the option's declared type."""
    return create_with_record(kind, name, **options)[0]


def create_with_record(kind: str, name: str, /, **options: Any) -> tuple[Any, dict[str, Any]]:
    """:func:`create`, plus what run.json records of it: name, plugin, object and the option values in use."""
    component = get_host().get(kind, name)
    declared = component.options()

    def refuse(problem: str, exc: BaseException | None = None):
        raise PluginLoadError(f"{component.label} rejected its options {options}: {problem}") from exc

    problems = name_problems(declared, options)
    if problems:
        refuse("; ".join(problems))
    try:
        instance = component.obj(**options)
    except UnlearnError as exc:
        refuse(_describe_error(exc), exc)
    except Exception as exc:  # a plugin's own check (ValueError, assert ...) or a value of the wrong type
        refuse("; ".join(type_problems(declared, options)) or one_line(exc), exc)
    # after the constructor: its own message comes first; a NaN or infinity it let through
    # (alpha = inf) would make the loss non-finite and the error advise a lower --lr
    problems = type_problems(declared, options) + finite_problems(options)
    if problems:
        refuse("; ".join(problems))
    protocol = PROTOCOL_OF_KIND.get(kind)
    if protocol is not None and not isinstance(instance, protocol):
        raise PluginLoadError(f"{component.label} does not implement {protocol.__name__} (see docs/plugins.md)")
    record = {
        "name": name,
        "plugin": component.plugin,
        "object": component.module,
        "options": values_in_use(declared, instance, options),
    }
    return instance, record


def _describe_error(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def accepts_option(kind: str, name: str, option: str) -> bool:
    """Whether component ``kind``/``name`` declares ``option`` (or takes any option); True for
    an unknown name, which :func:`create` then reports."""
    component = get_host().components.get(kind, {}).get(name)
    if component is None:
        return True
    declared = component.options()
    return declared is None or declared.open_ended or option in declared.names()


def _files_digest(files: Iterable[Path]) -> str:
    import hashlib

    h = hashlib.sha256()
    for path in files:
        h.update(f"{path.name}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _source_files(component: Component) -> list[Path]:
    """The files a component's numbers come from: a task folder's files, else the module that
    defines the object and, when that module is part of a package, the package's other modules."""
    if component.kind == LM_EVAL_TASK_DIR:
        root = Path(component.obj)
        return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    module = sys.modules.get(getattr(component.obj, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path:
        return []
    path = Path(path)
    if getattr(module, "__package__", None) and (path.parent / "__init__.py").is_file():
        return sorted(path.parent.glob("*.py"))
    return [path]


def code_identity(kind: str, name: str) -> dict[str, Any] | None:
    """What identifies a component's code in a cache key (a study's stages): for a built-in
    component its ``revision`` attribute, bumped when its numbers change (None while it is 1, so
    keys made before revisions existed stay valid); for a plugin's, the plugin, its distribution
    and version, and a digest of its source files (an editable or unversioned install changes
    nothing else when its code does)."""
    host = get_host()
    component = host.get(kind, name)
    info = host.plugins.get(component.plugin)
    if info is not None and info.source == "built-in":
        revision = getattr(component.obj, "revision", 1)
        return None if revision == 1 else {"revision": revision}
    return {
        "plugin": component.plugin,
        "distribution": getattr(info, "distribution", None),
        "version": getattr(info, "version", None),
        "source": _files_digest(_source_files(component)),
    }


def benchmarks() -> dict[str, Benchmark]:
    """The registered benchmarks by name."""
    return {c.name: c.obj for c in get_host().list(BENCHMARK)}


def benchmark_part(name: str | None, part: str) -> Any:
    """``part`` (``"study"``, ``"demo"``) of benchmark ``name``, imported; None when no such
    benchmark is registered or it has no such part."""
    bench = benchmarks().get(name) if name else None
    reference = getattr(bench, part, None) if bench is not None else None
    return Benchmark.load(reference) if reference else None


def required_benchmark_part(name: str, part: str) -> Any:
    """:func:`benchmark_part` where the caller cannot go on without it (the author studies and the
    demo need TOFU's ``data``): an error naming the benchmark when it is not registered."""
    found = benchmark_part(name, part)
    if found is None:
        raise UnlearnError(
            f"benchmark {name!r} is not registered or has no {part}, which this needs{get_host().not_loaded(BENCHMARK)}"
        )
    return found


def study_sources(first: str | None = None) -> tuple[str, ...]:
    """Every ``[benchmark] source`` a study file may name: each benchmark with a study part (the
    one named ``first`` first), and the other names its study reads (:attr:`Benchmark.sources`:
    TOFU's ``generated``, ``auto``)."""
    found = sorted(((name != first, name), b) for name, b in benchmarks().items() if b.study)
    return tuple(s for (_, name), b in found for s in (name, *b.sources))


def study_part(source: str) -> Any:
    """The study part of the benchmark whose study reads ``[benchmark] source = source``."""
    for name, bench in benchmarks().items():
        if bench.study and source in (name, *bench.sources):
            return Benchmark.load(bench.study)
    raise UnlearnError(
        f"[benchmark] source {source!r}: no registered benchmark reads such a study{get_host().not_loaded(BENCHMARK)}"
    )


def component_label(kind: str, name: str) -> str:
    """How a run-time error names a component: ``scorer 'x' (plugin 'p')`` (without the plugin
    when ``name`` is not registered, e.g. an object passed in from Python)."""
    return get_host().label(kind, name)


def list_plugins() -> list[PluginInfo]:
    """Every plugin, loaded, disabled or refused (a refused one shows why in ``errors``)."""
    host = get_host()
    return list(host.plugins.values()) + host.refused
