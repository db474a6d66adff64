"""A normal (non-editable) wheel install finds registry.toml and tasks/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from support_checks import build_wheel

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_registry_and_tasks(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "unlearn_plugins/registry.toml" in names
    assert any(n.startswith("unlearn_plugins/tasks/") for n in names)
    # each benchmark's home with its task YAMLs beside their code
    for name in (
        "movielens/tasks/movielens_rec.yaml",
        "movielens/tasks/utils.py",
        "muse/tasks/_muse_news.yaml",
        "tofu/tasks/tofu/_tofu_template_yaml",
        "tofu/tasks/tofu/tofu_forget01_truth_ratio.yaml",
        "tofu/tasks/tofu/utils.py",
        "tofu/tasks/tofu_mia/tofu_mia.yaml",
        "tofu/tasks/tofu_mia/utils.py",
        "tofu/tasks/tofu_probes/_tofu_probe_template_yaml",
        "tofu/tasks/tofu_probes/utils.py",
        "tofu/tofu_subset/authors_197-199_perturbed.json",
        "tofu/tofu_subset/LICENSE",
        "wmdp/tasks/wmdp_local/_default_template_yaml",
        "wmdp/tasks/wmdp_local/_wmdp_local.yaml",
        "wmdp/tasks/wmdp_local/wmdp_local_bio.yaml",
    ):
        assert f"unlearn_plugins/benchmarks/{name}" in names
    assert not any(n.startswith("unlearn_plugins/tasks/wmdp_local/") for n in names)  # one home per task
    assert any(n.endswith("entry_points.txt") for n in names)

    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)  # a wheel install is an unzip
    code = (
        "import json, unlearn_plugins.host as h;"
        "host = h.PluginHost(load_entry_points=False);"
        "print(json.dumps({'registry': str(h.registry_path()), 'tasks': str(h.package_file('tasks')),"
        " 'plugins': sorted(host.plugins), 'errors': [e for p in host.plugins.values() for e in p.errors]}))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["registry"] == str(target / "unlearn_plugins" / "registry.toml")
    assert info["tasks"] == str(target / "unlearn_plugins" / "tasks")
    assert info["errors"] == [] and {"builtin-scorers", "builtin-movielens", "builtin-muse", "builtin-tofu"} <= set(
        info["plugins"]
    )
