"""registry.toml: validation errors name file, entry and field; it matches the built-in hooks."""

from __future__ import annotations

import pytest

from unlearn_plugins.errors import RegistryError
from unlearn_plugins.host import PluginHost, import_object, load_registry, registry_path
from unlearn_plugins.interfaces import BENCHMARK, LM_EVAL_TASK_DIR

GOOD_ENTRY = """
[[plugin]]
name = "builtin-scorers"
kind = "difficulty_scorer"
object = "unlearn_plugins.scorers.builtin"
summary = "s"
components = ["length", "loss"]
"""


def write(tmp_path, text):
    path = tmp_path / "registry.toml"
    path.write_text(text)
    return path


def test_shipped_registry_lists_exactly_what_builtin_hooks_register():
    entries = load_registry()
    host = PluginHost(load_entry_points=False)
    for entry in entries:
        info = host.plugins[entry.name]
        assert info.errors == [], f"built-in plugin {entry.name} failed: {info.errors}"
        registered = {kind: sorted(names) for kind, names in info.components.items()}
        expected = {entry.kind: sorted(entry.components)}
        if entry.kind == BENCHMARK:  # a benchmark's task folder is registered with it, named after it
            expected[LM_EVAL_TASK_DIR] = sorted(entry.components)
        assert registered == expected, (
            f"registry.toml entry {entry.name!r} says {entry.kind}: {sorted(entry.components)}, "
            f"its hooks register {registered}"
        )
        assert import_object(entry.object) is not None
    assert {e.name for e in entries} == {p.name for p in host.plugins.values() if p.source == "built-in"}


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "schema_version = 1\n" + GOOD_ENTRY.replace('kind = "difficulty_scorer"', 'kind = "scorer"'),
            "entry 1 ('builtin-scorers'): field 'kind': 'scorer' is not one of",
        ),
        ("schema_version = 1\n" + GOOD_ENTRY.replace('summary = "s"\n', ""), "field 'summary' is missing"),
        (
            "schema_version = 1\n" + GOOD_ENTRY.replace('"unlearn_plugins.scorers.builtin"', '"a b:c"'),
            "field 'object': 'a b:c' is not of the form",
        ),
        (
            "schema_version = 1\n" + GOOD_ENTRY.replace('components = ["length", "loss"]', "components = []"),
            "field 'components'",
        ),
        (
            "schema_version = 1\n" + GOOD_ENTRY.replace('name = "builtin-scorers"', "name = 3"),
            "field 'name': expected str, got int",
        ),
        (
            "schema_version = 1\n" + GOOD_ENTRY + GOOD_ENTRY,
            "entry 2 ('builtin-scorers'): field 'name': 'builtin-scorers' already used by entry 1",
        ),
        ("schema_version = 2\n" + GOOD_ENTRY, "field 'schema_version': unsupported value 2"),
        (GOOD_ENTRY, "field 'schema_version' is missing"),
        ("schema_version = 1\n", "field 'plugin': expected a non-empty array"),
        ("schema_version = 1\n" + GOOD_ENTRY + "colour = 'red'\n", "unknown field(s) ['colour']"),
        ("schema_version = 1\n[[plugin]\n", "not valid TOML"),
    ],
)
def test_registry_errors_name_file_entry_and_field(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    message = str(info.value)
    assert str(path) in message
    assert expected in message


def test_missing_registry_file(tmp_path):
    with pytest.raises(RegistryError, match="registry file not found"):
        load_registry(tmp_path / "nope.toml")


def test_registry_is_found_next_to_the_package():
    assert registry_path().is_file()
