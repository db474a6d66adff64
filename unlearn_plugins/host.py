"""The plugin host: built-ins from registry.toml, third-party plugins from entry points.

Rules (each one tested):

* built-in plugins are declared in ``registry.toml`` and validated when loaded;
* third-party plugins come from the entry point group ``unlearn_plugins`` and are
  loaded one by one, so one that fails to import or whose hook raises is
  reported (warning, and shown by ``unlearn plugins``) while the rest keep working;
  ``UNLEARN_PLUGINS_STRICT=1`` turns such a failure into an error;
* ``UNLEARN_DISABLE_PLUGINS=a,b`` blocks plugins by name;
* two components of one kind with one name is an error naming both plugins.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import re
import sys
import traceback
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
)
from .interfaces import HOOK_OF_KIND, KINDS, LM_EVAL_TASK_DIR, PROTOCOL_OF_KIND

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENTRY_POINT_GROUP = "unlearn_plugins"
REGISTRY_SCHEMA_VERSION = 1
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_OBJECT_RE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")
_ENTRY_FIELDS = {"name": str, "kind": str, "object": str, "summary": str, "components": list}


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
        raise RegistryError(f"{path}: unknown top-level field(s) {sorted(unknown_top)} (expected 'schema_version', 'plugin')")
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
            raise RegistryError(f"{label}: field 'object': {item['object']!r} is not of the form 'module' or 'module:attr'")
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


@dataclass
class Component:
    """A registered component: its kind, name, the object and the plugin that gave it."""

    kind: str
    name: str
    obj: Any
    plugin: str


@dataclass
class PluginInfo:
    """What `unlearn plugins` shows for one plugin."""

    name: str
    source: str  # "built-in" or "entry point"
    distribution: str | None = None
    version: str | None = None
    summary: str = ""
    components: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    disabled: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "distribution": self.distribution,
            "version": self.version,
            "summary": self.summary,
            "components": self.components,
            "errors": self.errors,
            "disabled": self.disabled,
        }


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _disabled_from_env() -> set[str]:
    return {p.strip() for p in os.environ.get("UNLEARN_DISABLE_PLUGINS", "").split(",") if p.strip()}


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


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
    ) -> None:
        self.strict = _env_flag("UNLEARN_PLUGINS_STRICT") if strict is None else strict
        self.disabled = _disabled_from_env() if disabled is None else set(disabled)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.components: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}

        for entry in load_registry(registry):
            info = PluginInfo(entry.name, "built-in", "unlearn-plugins", _own_version(), entry.summary)
            self._add(info, lambda entry=entry: import_object(entry.object))
        if load_entry_points:
            eps = entry_points if entry_points is not None else md.entry_points(group=ENTRY_POINT_GROUP)
            for ep in sorted(eps, key=lambda e: e.name):
                dist = getattr(ep, "dist", None)
                info = PluginInfo(
                    ep.name,
                    "entry point",
                    dist.metadata["Name"] if dist is not None else None,
                    dist.version if dist is not None else None,
                    (dist.metadata.get("Summary") or "") if dist is not None else "",
                )
                self._add(info, ep.load)
        self._collect()

    # -- loading
    def _fail(self, info: PluginInfo, what: str, exc: BaseException) -> None:
        message = f"plugin {info.name!r} ({info.source}): {what}: {_describe(exc)}"
        info.errors.append(f"{what}: {_describe(exc)}")
        if self.strict:
            raise PluginLoadError(message + " (UNLEARN_PLUGINS_STRICT is set)") from exc
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _add(self, info: PluginInfo, load: Callable[[], Any]) -> None:
        if info.name in self.plugins:
            other = self.plugins[info.name]
            raise DuplicateComponentError(
                f"two plugins are named {info.name!r}: {other.source} ({other.distribution}) and "
                f"{info.source} ({info.distribution})"
            )
        self.plugins[info.name] = info
        if info.name in self.disabled:
            info.disabled = True
            return
        try:
            obj = load()
        except Exception as exc:  # an import error must not take the host down
            self._fail(info, "failed to import", exc)
            return
        try:
            self.pm.register(obj, name=info.name)
        except Exception as exc:
            self._fail(info, "invalid plugin", exc)

    def _collect(self) -> None:
        for kind in KINDS:
            hook = getattr(self.pm.hook, HOOK_OF_KIND[kind])
            # Call implementations one by one so a raising hook only loses its own plugin.
            for impl in hook.get_hookimpls():  # registration order
                info = self.plugins[impl.plugin_name]

                def register(name: str, component: Any, _kind=kind, _plugin=impl.plugin_name) -> None:
                    self._register_component(_kind, name, component, _plugin)

                try:
                    impl.function(register=register)
                except DuplicateComponentError:
                    raise
                except Exception as exc:
                    self._fail(info, f"hook {HOOK_OF_KIND[kind]} raised", exc)

    def _register_component(self, kind: str, name: Any, component: Any, plugin: str) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise TypeError(f"component name must be a non-empty string of letters, digits, '_', '-' or '.', got {name!r}")
        if component is None:
            raise TypeError(f"component {name!r} is None")
        existing = self.components[kind].get(name)
        if existing is not None:
            raise DuplicateComponentError(
                f"{kind} {name!r} is registered by two plugins: {existing.plugin!r} and {plugin!r}; "
                f"disable one with UNLEARN_DISABLE_PLUGINS={plugin}"
            )
        if kind == LM_EVAL_TASK_DIR:
            component = Path(component)
        self.components[kind][name] = Component(kind, name, component, plugin)
        self.plugins[plugin].components.setdefault(kind, []).append(name)

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
                f"unknown {kind.replace('_', ' ')} {name!r}; available: {available}"
            ) from None


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
    """Instantiate a component with options, checking it implements its kind's protocol."""
    component = get_host().get(kind, name)
    try:
        instance = component.obj(**options)
    except TypeError as exc:
        raise PluginLoadError(f"{kind} {name!r} (plugin {component.plugin!r}) rejected its options {options}: {exc}") from exc
    protocol = PROTOCOL_OF_KIND.get(kind)
    if protocol is not None and not isinstance(instance, protocol):
        raise PluginLoadError(
            f"{kind} {name!r} from plugin {component.plugin!r} does not implement {protocol.__name__}"
        )
    return instance


def list_plugins() -> list[PluginInfo]:
    return list(get_host().plugins.values())
