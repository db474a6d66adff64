"""`unlearn study` stopped from outside and run twice at once, each test from an empty cache
of its own: SIGTERM and SIGKILL leave no worker behind, a Ctrl-C that reaches only the workers
stops the study, two concurrent runs build each cell once. (A module of its own, beside
test_study_run.py's tests on one shared cache, so pytest-xdist runs the two side by side.)"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from test_study_run import _wait_for, report, run_cli, study_file

pytestmark = pytest.mark.usefixtures("single_thread")


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_stopped_study_leaves_no_worker_behind(how, tmp_path):
    """`kill` (SIGTERM) stops the study as Ctrl-C does: its workers interrupt their cells, whose
    temporary folders go, and it exits 143. Killed outright (SIGKILL), its workers notice within
    seconds and stop too: no orphan goes on computing a cell no one will collect."""
    cache = tmp_path / "cache"
    path = study_file(tmp_path, [0], methods=["grad_diff"])
    proc = run_cli(path, "--workers", "1", "--out", tmp_path / "report", "--cache-dir", cache)
    building = _wait_for(lambda: next(iter(cache.glob("target-*.tmp-*")), None), 600, proc)  # in a worker
    worker = int(building.name.rsplit("-", 1)[1])  # <folder>.tmp-<host>-<pid>
    assert worker != proc.pid
    os.kill(proc.pid, getattr(signal, how))
    _, err = proc.communicate(timeout=120)
    if how == "SIGTERM":
        assert proc.returncode == 143 and err.splitlines()[-1] == "terminated", err[-3000:]
    else:
        assert proc.returncode == -signal.SIGKILL
    assert _gone(worker, 30), f"worker {worker} still running after the study stopped ({how})"
    assert not list(cache.glob("*.tmp-*"))


def test_a_ctrl_c_that_reaches_only_the_workers_stops_the_study(tmp_path):
    """A script's background study ignores SIGINT (no job control), its
    workers do not; a Ctrl-C of the script stopped the workers, and the study went on reporting
    their cells as "died: exit code 0". The study now stops as on its own Ctrl-C: exit 130,
    one line naming the interrupted worker, no temporary stage folder left."""
    cache = tmp_path / "cache"
    path = study_file(tmp_path, [0], methods=["grad_diff"])
    proc = run_cli(
        path,
        "--workers",
        "2",
        "--out",
        tmp_path / "report",
        "--cache-dir",
        cache,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    _wait_for(lambda: next(iter(cache.glob("target-*.tmp-*")), None), 600, proc)
    time.sleep(1)  # the worker is inside the stage, its SIGINT handler set
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "died: exit code" not in err, err[-3000:]
    assert re.fullmatch(r"interrupted \(in worker \d \(pid \d+\)\)", err.strip().splitlines()[-1]), err[-1000:]
    assert not list(cache.glob("*.tmp-*"))


def test_two_concurrent_runs_build_each_cell_once(tmp_path):
    cache = tmp_path / "cache"
    path = study_file(tmp_path, [0], methods=["grad_diff"])
    procs = [run_cli(path, "--workers", "1", "--out", tmp_path / f"report{i}", "--cache-dir", cache) for i in (0, 1)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs[0][-2000:] + errs[1][-2000:]
    runs = [report(tmp_path / f"report{i}") for i in (0, 1)]
    cells = list(runs[0]["cells"])
    assert cells == ["target", "retain/forget1", "eval-retain/forget1", "eval-full/forget1", "grad_diff/forget1/seed0"]
    waited = 0
    for cell in cells:
        # each stage is built by exactly one run; the other finds it cached or waits for it (a
        # cell of two stages may have its first built by one run and its second by the other)
        per_stage = zip(*(r["cells"][cell]["sources"] for r in runs))
        for i, stage_sources in enumerate(per_stage):
            sources = sorted(stage_sources)
            assert sources in (["built", "cached"], ["built", "waited"]), (cell, i, sources)
            waited += sources.count("waited")
        assert "built" in [r["cells"][cell]["source"] for r in runs], cell
    assert waited >= 1  # one run waited for a stage the other was building, then used it
    assert any(" wait " in line and "is in use by pid" in line for err in errs for line in err.splitlines())
    assert runs[0]["groups"] == runs[1]["groups"]
