"""A built-in component's ``revision`` is part of the keys of the study cells that use it, so
a change of its numbers must come with a bump. This test keeps a record of
each built-in's source file and revision: a source change without a bump fails here, and the
author says which it is: numbers changed (bump ``revision``) or not (re-record the digest with
``UPDATE_COMPONENT_SOURCES=1 pytest tests/test_component_revisions.py``)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from unlearn_plugins.host import get_host
from unlearn_plugins.interfaces import ADAPTER_INITIALIZER, ATTACK, DIFFICULTY_SCORER, UNLEARNING_OBJECTIVE

RECORD = Path(__file__).parent / "fixtures" / "component_sources.json"
KINDS = (UNLEARNING_OBJECTIVE, ADAPTER_INITIALIZER, DIFFICULTY_SCORER, ATTACK)


def current() -> dict:
    host = get_host()
    out = {}
    for kind in KINDS:
        for component in host.list(kind):
            if host.plugins[component.plugin].source != "built-in":
                continue
            module = sys.modules[component.obj.__module__]
            source = Path(module.__file__).read_bytes().replace(b"\r\n", b"\n")
            out[f"{kind}/{component.name}"] = {
                "module": module.__name__,
                "revision": getattr(component.obj, "revision", 1),
                "sha256": hashlib.sha256(source).hexdigest()[:16],
            }
    return out


def test_a_built_in_components_source_does_not_change_without_its_revision():
    now = current()
    if os.environ.get("UPDATE_COMPONENT_SOURCES"):
        RECORD.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(RECORD.read_text())
    problems = []
    for name, entry in now.items():
        old = recorded.get(name)
        if old is None:
            problems.append(f"{name}: not recorded")
        elif old["sha256"] != entry["sha256"] and old["revision"] == entry["revision"]:
            problems.append(
                f"{name}: {entry['module']} changed but its revision is still {entry['revision']}: bump "
                f"`revision` if its numbers change, else re-record (UPDATE_COMPONENT_SOURCES=1)"
            )
        elif entry["revision"] < old["revision"]:
            problems.append(f"{name}: revision went down ({old['revision']} -> {entry['revision']})")
    assert not problems, "\n".join(problems)
