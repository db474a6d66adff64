"""A stage's resources.json reports that stage's own peak memory, not the worker's peak from
an earlier stage (studies and the parallel demo build many stages in one worker process; the
reset is Linux's clear_refs; the reading /proc's VmHWM, since getrusage also remembers the
size of the process that spawned the worker)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the per-stage peak needs /proc (Linux)")
def test_a_stages_peak_is_its_own(tmp_path):
    script = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from unlearn_plugins.study.cells import measured

        def big(tmp):  # an earlier stage: ~600 MB touched, then freed
            block = bytearray(600 * 2**20)
            block[:: 4096] = b"x" * len(block[:: 4096])
            del block

        def small(tmp):  # the next stage: a few MB
            block = bytearray(8 * 2**20)
            del block

        for name, build in (("big", big), ("small", small)):
            out = Path({str(tmp_path)!r}) / name
            out.mkdir()
            measured(build, {{}})(out)
        """
    )
    ballast = bytearray(1500 * 2**20)  # a large parent, as pytest or a study's main process is
    ballast[::4096] = b"x" * len(ballast[::4096])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    del ballast
    assert done.returncode == 0, done.stderr[-2000:]
    big = json.loads((tmp_path / "big" / "resources.json").read_text())
    small = json.loads((tmp_path / "small" / "resources.json").read_text())
    assert big["peak_scope"] == small["peak_scope"] == "stage"
    assert 600 < big["peak_rss_mb"] < 1500  # the stage's own: not the parent's 1.5 GB
    assert small["peak_rss_mb"] < big["peak_rss_mb"] - 400  # not the earlier stage's peak
