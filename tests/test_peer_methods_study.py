"""The `peer_methods` study: every built-in unlearning objective of the TOFU benchmark at its
reference defaults, and its tiny variant (the methods that are not one loss per batch) run end
to end on the tiny model."""

from __future__ import annotations

import json

import pytest
import tomllib

from unlearn_plugins.cli import main
from unlearn_plugins.host import get_host
from unlearn_plugins.interfaces import UNLEARNING_OBJECTIVE
from unlearn_plugins.study import builtin_studies

pytestmark = pytest.mark.usefixtures("single_thread")

#: built-in objectives that are not TOFU methods of their own: ReGLU's retain term (a
#: regularizer) and the MovieLens benchmark's objectives
NOT_TOFU_METHODS = {"rol", "e2urec", "bad_teacher"}


def study() -> dict:
    return tomllib.loads(builtin_studies()["peer_methods"].read_text())


def test_the_study_holds_every_built_in_objective_at_its_defaults():
    host = get_host()
    built_in = {
        c.name
        for c in host.list(UNLEARNING_OBJECTIVE)
        if (info := host.plugins.get(c.plugin)) is not None and info.source == "built-in"
    }
    methods = study()["methods"]
    used = {m["objective"] for m in methods}
    assert built_in - NOT_TOFU_METHODS <= used, sorted(built_in - NOT_TOFU_METHODS - used)
    # reference defaults: no method changes its objective's options, but for the MUSE
    # baselines' KL-on-retain variants, which are options of GradAscent and NPO
    options = {m["name"]: m.get("objective_options", {}) for m in methods}
    assert {name: o for name, o in options.items() if o} == {
        "ga_klr": {"alpha": 1.0, "retain_loss": "kl"},
        "npo_klr": {"retain_loss": "kl"},
    }
    assert len({m["name"] for m in methods}) == len(methods)


def test_the_tiny_variant_runs_every_method_that_is_not_a_per_batch_loss(tmp_path, capsys):
    out = tmp_path / "report"
    code = main(
        ["study", "peer_methods", "--variant", "tiny", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
        + ["--threads", "1"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    data = json.loads((out / "study.json").read_text())
    assert data["failed"] == []
    groups = {g["method"]: g["metrics"] for g in data["groups"]}
    assert set(groups) == {m["name"] for m in study()["variants"]["tiny"]["methods"]}
    for name, m in groups.items():
        for key in ("forget_quality", "model_utility", "forget_prob"):
            assert 0 <= m[key]["mean"] <= 1, (name, key)
    summary = (out / "summary.md").read_text()
    assert "| T3 | 1/1 |" in summary and "| LUNAR | 1/1 |" in summary
