"""`unlearn plugins`: every plugin, its source, components and load errors."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("plugins", help="list installed plugins and their components")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..host import list_plugins

    plugins = list_plugins()
    if args.json:
        print(json.dumps([p.to_json() for p in plugins], indent=2))
        return 0
    for p in plugins:
        version = f" {p.version}" if p.version else ""
        dist = f" [{p.distribution}{version}]" if p.distribution else ""
        state = " (disabled)" if p.disabled else ""
        print(f"{p.name}{dist} - {p.source}{state}")
        if p.summary:
            print(f"  {p.summary}")
        for kind, names in sorted(p.components.items()):
            print(f"  {kind}: {', '.join(names)}")
        for err in p.errors:
            print(f"  ERROR: {err}")
    return 0
