"""The example third-party plugin, installed with pip (no network), seen and run by the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "unlearn-surprisal"


def pip(*args):
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory):
    """Install the example into this environment, from a copy (keeps the checkout clean)."""
    src = tmp_path_factory.mktemp("example") / "unlearn-surprisal"
    shutil.copytree(EXAMPLE, src)
    out = pip("install", "--no-deps", "--no-build-isolation", "--no-index", "-q", str(src))
    assert out.returncode == 0, out.stderr
    yield
    pip("uninstall", "-y", "-q", "unlearn-surprisal")


def unlearn(*args, env=None):
    cmd = [str(Path(sys.executable).parent / "unlearn"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def test_plugins_json_lists_builtins_and_example(installed_example):
    out = unlearn("plugins", "--json")
    assert out.returncode == 0, out.stderr
    plugins = {p["name"]: p for p in json.loads(out.stdout)}
    example = plugins["surprisal"]
    assert example["source"] == "entry point"
    assert example["distribution"] == "unlearn-surprisal" and example["version"] == "0.1.0"
    assert example["components"] == {"difficulty_scorer": ["max_surprisal"]}
    assert example["errors"] == []
    assert plugins["builtin-scorers"]["source"] == "built-in"
    disabled = unlearn("plugins", "--json", env={"UNLEARN_DISABLE_PLUGINS": "surprisal"})
    assert {p["name"]: p for p in json.loads(disabled.stdout)}["surprisal"]["disabled"] is True


@pytest.mark.slow
def test_example_scorer_runs_from_cli_on_forget01(installed_example, embedded_model_dir, tofu_dir, tmp_path):
    out_file = tmp_path / "scores.jsonl"
    env = {"UNLEARN_CACHE_DIR": str(embedded_model_dir.parent.parent), "UNLEARN_TOFU_DIR": str(tofu_dir)}
    out = unlearn("score", "--scorer", "max_surprisal", "--model", "smollm2-135m", "--data", "tofu:forget01",
                  "--out", str(out_file), env=env)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(40))
    assert rows[0]["question"].startswith("What is the full name of the author born in Kuwait City")
    scores = [r["score"] for r in rows]
    assert all(s < 0 for s in scores) and len(set(scores)) > 30  # negated NLLs, sample-specific
    # the built-in loss scorer on the same data: every sample's worst token is at least its mean
    loss_file = tmp_path / "loss.jsonl"
    out = unlearn("score", "--scorer", "loss", "--data", "tofu:forget01", "--out", str(loss_file), env=env)
    assert out.returncode == 0, out.stderr
    loss = [json.loads(line)["score"] for line in loss_file.read_text().splitlines()]
    assert all(w <= m + 1e-5 for w, m in zip(scores, loss))


def test_unknown_scorer_lists_available(installed_example, tmp_path):
    out = unlearn("score", "--scorer", "nope", "--data", "tofu:forget01", "--out", str(tmp_path / "x.jsonl"))
    assert out.returncode == 1
    assert "unknown difficulty scorer 'nope'; available:" in out.stderr and "max_surprisal" in out.stderr
    assert "Traceback" not in out.stderr
