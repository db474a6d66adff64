"""A stage's resources.json reports that stage's own peak memory, not the worker's peak from
an earlier stage (studies and the parallel demo build many stages in one worker process: the
stage's resident set is sampled from /proc while it runs, since getrusage also remembers the
size of the process that spawned the worker), and measuring it leaves the process's own peak,
the one /usr/bin/time -v reports, intact."""

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
        import time
        from pathlib import Path
        from unlearn_plugins.study.cells import measured

        def big(tmp):  # an earlier stage: ~600 MB touched, held a while, then freed
            block = bytearray(600 * 2**20)
            block[:: 4096] = b"x" * len(block[:: 4096])
            time.sleep(0.3)  # the sampler reads every 5 ms, when its thread gets the GIL and a core
            del block

        def small(tmp):  # the next stage: a few MB
            block = bytearray(8 * 2**20)
            del block

        for name, build in (("big", big), ("small", small)):
            out = Path({str(tmp_path)!r}) / name
            out.mkdir()
            measured(build, {{}})(out)
        for line in open("/proc/self/status"):  # the process's own peak, what wait4 reports
            if line.startswith("VmHWM:"):
                print(int(line.split()[1]) / 1024)
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
    # measuring a stage's peak leaves the process's own peak alone: /usr/bin/time -v and a
    # parent's wait4 still see the big stage after the small one
    assert float(done.stdout.split()[-1]) >= big["peak_rss_mb"] - 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc")
def test_a_built_stage_gives_its_freed_memory_back(tmp_path):
    """glibc keeps freed heap memory below a live allocation; a worker that built one large stage
    would carry that into every later stage. run_stage hands it back once the stage is built."""
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from unlearn_plugins.stages import Stages
        from unlearn_plugins.study.cells import run_stage

        kept = []

        def rss_mb():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

        def stage(tmp):  # 400 MB in 64 KB heap blocks (under malloc's mmap threshold), freed,
            blocks = []  # each with a small live block after it: free() cannot shrink the heap
            for _ in range(6400):
                blocks.append(bytearray(64 * 2**10))
                kept.append(bytearray(600))
            (tmp / "out.txt").write_text("built")
            del blocks

        root = Path(sys.argv[2])
        before = rss_mb()
        if sys.argv[1] == "run_stage":
            run_stage(Stages(root, total=1), "stage", root / "stage", stage)
        else:  # the same work outside run_stage
            stage(root)
        print(round(rss_mb() - before))
        """
    )

    def kept_mb(how: str) -> float:
        folder = tmp_path / how
        folder.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", script, how, str(folder)], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return float(done.stdout.split()[-1])

    assert kept_mb("plain") > 300  # the premise: glibc kept what the stage freed
    assert kept_mb("run_stage") < 100
