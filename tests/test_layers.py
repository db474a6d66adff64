"""The package's layers (pyproject.toml's [tool.importlinter], checked by `lint-imports` in CI)
hold only if no module reaches into another package's private names either: a name with a
leading underscore is its package's own, free to change. import-linter sees modules, not
names, so this test reads every module's imports and the attributes it takes of imported
modules."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import unlearn_plugins

ROOT = Path(unlearn_plugins.__file__).resolve().parent


def _module(path: Path) -> list[str]:
    parts = ["unlearn_plugins", *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _package(parts: list[str]) -> str:
    """The part of the package a module belongs to: its top-level subpackage or module."""
    return parts[1] if len(parts) > 1 else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        me = _module(path)
        here = me if path.name == "__init__.py" else me[:-1]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: dict[str, list[str]] = {}  # local name -> the module of another package it is
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                target = here[: len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
            else:
                target = node.module.split(".") if node.module else []
            if target[:1] != ["unlearn_plugins"]:
                continue
            for alias in node.names:
                whole = [*target, alias.name]
                if _package(whole) == _package(me) and len(whole) > 2:
                    continue  # its own package
                if _private(alias.name) and _package(target) != _package(me):
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {'.'.join(target)}.{alias.name}")
                elif _package(whole) != _package(me):
                    modules[alias.asname or alias.name] = whole
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and _private(node.attr)
            ):
                found.append(
                    f"{path.relative_to(ROOT.parent)}:{node.lineno}: {'.'.join(modules[node.value.id])}.{node.attr}"
                )
    return found


def test_no_module_imports_a_private_name_of_another_package():
    assert private_imports() == []


def test_the_check_finds_a_private_import(tmp_path, monkeypatch):
    """The scan above is not vacuous: a module taking another package's private name is found."""
    fake = tmp_path / "unlearn_plugins"
    (fake / "evaluation").mkdir(parents=True)
    (fake / "evaluation" / "x.py").write_text(
        "from ..demo.report import _pyplot\nfrom ..data import qa\nqa._has_chat_template(None)\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    assert private_imports() == [
        "unlearn_plugins/evaluation/x.py:1: unlearn_plugins.demo.report._pyplot",
        "unlearn_plugins/evaluation/x.py:3: unlearn_plugins.data.qa._has_chat_template",
    ]
