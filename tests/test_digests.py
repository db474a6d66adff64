"""Content keys of the caches (stage folders, CUD anchor runs and score matrices) are on users'
disks: a refactoring that changed one value would silently recompute every cached stage. These
pin known values computed before the digest helpers were unified."""

from pathlib import Path

from unlearn_plugins.files import json_digest
from unlearn_plugins.interfaces import QASample
from unlearn_plugins.scorers.cud import samples_fingerprint
from unlearn_plugins.stages import digest


def test_stage_keys_are_unchanged():
    assert digest(1, "finetune", {"lr": 1e-5, "b": [1, 2]}, None, Path("/x/y")) == "3c8943d3b550"
    assert digest() == "4f53cda18c2b"


def test_cud_cache_keys_are_unchanged():
    from unlearn_plugins.scorers.cud import cache

    anchor = cache.anchor_run_key("abc", "def", "npo", 0, {"runner": "run_unlearning", "stop_prob": 0.1})
    assert anchor == "e21e392ce078f553e2179e14aedce510"
    matrix = cache.matrix_key(
        "fp", QASample("Q?", "A.", 0, "s", 0, {}), {"mode": "inputs", "steps": 5, "context": None}
    )
    assert matrix == "99e3ffc967ba99eb8f7f6c7f4b595a20"
    samples = [QASample("Q?", "A.", 0, "s", 0, {}), QASample("Who?", "Her.", 1, "s", 0, {})]
    assert samples_fingerprint(samples) == "335c9b004028e13a17b89db0"


def test_json_digest_is_one_key_for_equal_content():
    """Key order does not matter, a tuple is a list, non-JSON values go in as str(); the length
    cuts the hex digest (None: all 64 digits)."""
    full = json_digest(({"a": 1, "b": Path("/p")}, (1, 2)))
    assert full == json_digest([{"b": "/p", "a": 1}, [1, 2]])
    assert len(full) == 64 and json_digest({"x": 1}, length=12) == json_digest({"x": 1})[:12]
    assert json_digest({"x": 1}) != json_digest({"x": 2})
