"""The local executor's bookkeeping of worker slots."""

from __future__ import annotations

import time
from types import SimpleNamespace

from unlearn_plugins.study.executors import LocalExecutor


def _dead_process(ctx):
    proc = ctx.Process(target=int)  # returns at once, exit code 0
    proc.start()
    proc.join()
    return proc


def test_a_worker_that_died_holding_a_cell_reports_it_failed_before_its_slot_is_reused():
    """Two workers stopped close together: worker 0 died holding cell X after the runner last
    looked, worker 1 was idle. submit() used to restart slot 0 at once, dropping X: the runner
    then waited for X forever (7 of 8 cells done, the study never exited)."""
    executor = LocalExecutor(workers=2, threads=1)
    executor.outbox = executor.ctx.Queue()
    try:
        executor.slots[0] = {"proc": _dead_process(executor.ctx), "inbox": executor.ctx.Queue(), "cell": "X"}
        executor.slots[1] = {"proc": _dead_process(executor.ctx), "inbox": executor.ctx.Queue(), "cell": None}
        assert executor.free() == 1
        task = SimpleNamespace(plan=SimpleNamespace(cell=SimpleNamespace(id="Y")))
        executor.submit(task)  # goes to slot 1 (restarted); slot 0 still holds X
        assert executor.slots[0]["cell"] == "X" and executor.slots[1]["cell"] == "Y"
        reported = {}
        deadline = time.monotonic() + 10
        while "X" not in reported and time.monotonic() < deadline:
            for event in executor.events(0.1):
                if event[0] == "done":
                    reported[event[1]] = event[2]
        assert reported["X"]["status"] == "failed"
        assert "died: exit code 0" in reported["X"]["error"]
        assert executor.slots[0]["cell"] is None  # free again: the next submit restarts it
    finally:
        for state in executor.slots.values():
            if state["proc"].is_alive():
                state["proc"].terminate()
        executor.slots.clear()
