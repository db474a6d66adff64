"""`unlearn plugins`: every plugin, its source, its components (where each is defined, its
options, a task folder's path) and why a plugin was refused."""

from __future__ import annotations

import json
import os
import sys

from .common import add_command

EXAMPLE = """examples:
  unlearn plugins                           # one block per plugin
  unlearn plugins --json | jq '.[].name'    # machine-readable
  UNLEARN_LOAD_PLUGINS=surprisal unlearn plugins   # load only this third-party plugin
"""


def add_parser(sub) -> None:
    p = add_command(sub, "plugins", "list installed plugins and their components", __doc__, EXAMPLE)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _options_text(options) -> str:
    if options is None:
        return "options: (cannot be listed)"
    if not options:
        return "no options"
    shown = [o["name"] + ("" if o.get("required") else f"={o['default']!r}") for o in options]
    return "options: " + ", ".join(shown)


def render_text(plugins) -> str:
    lines = []
    for p in plugins:
        version = f" {p['version']}" if p["version"] else ""
        dist = f" [{p['distribution']}{version}]" if p["distribution"] else ""
        state = f" (disabled by {p['disabled_by']})" if p["disabled"] else ""
        lines.append(f"{p['name']}{dist} - {p['source']}{state}")
        if p["summary"]:
            lines.append(f"  {p['summary']}")
        for kind, components in p["components"].items():
            lines.append(f"  {kind}:")
            for c in components:
                if "path" in c:
                    where = c["path"]
                elif "summary" in c:  # a benchmark
                    where = f"{c['module']}; {c['summary']}"
                else:
                    where = f"{c['module']}; {_options_text(c['options'])}"
                lines.append(f"    {c['name']}  {where}")
        for err in p["errors"]:
            lines.append(f"  ERROR: {err}")
    return "\n".join(lines)


def run(args) -> int:
    from ..host import list_plugins

    plugins = [p.to_json() for p in list_plugins()]
    text = json.dumps(plugins, indent=2) if args.json else render_text(plugins)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left early (`unlearn plugins --json | head`): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
    return 0
