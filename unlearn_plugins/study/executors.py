"""Where a study's cells run: ``local`` worker processes on this machine, or a ``dask``
cluster (a LocalCluster, or an existing scheduler's address).

Both run one cell per task through :func:`.cells.execute_cell`, which writes into the shared
stage cache, and report events to the runner: ``("start", cell, where)``, ``("stage", cell, i,
n, label)``, ``("wait", cell, message)`` and ``("done", cell, result)``.

Local workers are single processes started with ``spawn`` (no inherited torch or OpenMP
state), each pinned to its share of the cores (``torch.set_num_threads`` and the OpenMP/MKL
thread variables): on 2 cores two single-threaded workers do more cells per hour than one
two-threaded one (bench/study_throughput.py). With GPUs, worker k sees only the (k mod N)-th of
the GPUs this process sees (:func:`..process.gpu_for`: the inherited ``CUDA_VISIBLE_DEVICES``
entries, or all GPUs without one), and more workers than GPUs is refused unless the study lets
``workers_per_gpu`` workers share one. A
worker that dies (killed, out of memory) fails the cell it was running, and a new worker
takes its place; the others go on. A worker whose resident memory, once a cell is done and
its freed memory handed back, has grown more than ``UNLEARN_WORKER_GROWTH_MB`` (default 256)
above what it held after its first cell retires, and a fresh one takes the next cell: what
a process keeps from cell to cell (imported libraries' caches, heap it cannot return) adds to
every later cell's peak (the demo's unlearning stages peaked 0.7 GB higher in a worker that had
built other stages than alone).
"""

from __future__ import annotations

import os
import queue
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import UnlearnError
from ..process import check_gpu_share, freeze_libraries, resident_mb, visible_gpus
from ..stages import remove_own_temporaries
from .cells import CellTask, execute_cell

EXECUTORS = ("local", "dask")
#: a local worker's exit status after an interrupt (SIGINT), as a shell's 128 + 2
INTERRUPTED_EXIT = 130


def threads_per_worker(workers: int) -> int:
    """The cores of this machine shared evenly by the workers (at least one thread each), at
    most ``OMP_NUM_THREADS`` when that is set (the usual cap on a shared machine)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cores // max(workers, 1))
    cap = os.environ.get("OMP_NUM_THREADS", "")
    return min(share, int(cap)) if cap.isdigit() and int(cap) >= 1 else share


def growth_limit_mb() -> float | None:
    """``UNLEARN_WORKER_GROWTH_MB``: how far a worker's memory after a cell may grow above its
    memory after its first cell before it retires (default 256; 0 or less: never retires)."""
    value = os.environ.get("UNLEARN_WORKER_GROWTH_MB", "").strip()
    try:
        limit = float(value) if value else 256.0
    except ValueError:
        raise UnlearnError(f"UNLEARN_WORKER_GROWTH_MB={value!r}: not a number of MB") from None
    return limit if limit > 0 else None


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable CUDA: CPU workers
        return 0


def _pin(threads: int, gpu: str | None) -> None:
    """This process's thread count (before torch starts its pools) and visible GPU."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    import torch

    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- local


def _local_worker(slot: int, inbox, outbox, threads: int, gpu: str | None, growth_mb: float | None = None) -> None:
    """A local worker: cells from ``inbox`` until None, events to ``outbox``; it retires (its
    last "done" says so) once its memory has grown ``growth_mb`` above its first cell's."""
    # Ctrl-C (or the runner's SIGINT) interrupts the cell, whose stage removes its temporary
    # folder, even when the study was started with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _pin(threads, gpu)
    where = f"worker {slot} (pid {os.getpid()})"
    parent = os.getppid()
    _watch_parent(parent)
    first_mb = None
    cell = cache = None
    try:
        while True:
            try:
                task = inbox.get(timeout=5)
            except queue.Empty:
                if os.getppid() != parent:  # the study was killed: no one is left to hand out cells
                    return
                continue
            if task is None:
                return
            cell, cache = task.plan.cell.id, task.cache
            outbox.put(("start", cell, where))
            if first_mb is None:  # the first cell imports these anyway: after "start", as before
                freeze_libraries()
            result = execute_cell(task, lambda *event: outbox.put(event))
            now_mb = resident_mb()
            first_mb = now_mb if first_mb is None else first_mb
            retire = growth_mb is not None and now_mb is not None and now_mb > first_mb + growth_mb
            outbox.put(("done", cell, {**result, "worker": where, "retired": retire}))
            cell = None
            if retire:
                return
    except KeyboardInterrupt:  # the stage being built has removed its temporary folder
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the study's own SIGINT may follow: leave quietly
        if cache is not None:  # a second SIGINT may have cut the stage's own clean-up short
            remove_own_temporaries(Path(cache))
        # said to the study, which stops too: a Ctrl-C that reached the workers but not the
        # study itself (started with SIGINT ignored, as a script's background job) went on
        # to report the cells as died with exit code 0
        try:
            outbox.put(("interrupted", cell, where))
            if os.getppid() != parent:  # no one reads it: exit without waiting to send it
                outbox.cancel_join_thread()
        except (OSError, ValueError):
            pass
        raise SystemExit(INTERRUPTED_EXIT) from None


def _watch_parent(parent: int, every: float = 2.0) -> None:
    """Interrupt this worker (SIGINT: the stage being built removes its temporary folder) when
    the study that started it dies without stopping it (SIGKILL, say), even in mid-cell."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def _quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker (a process of its own, started with the first queue)
    warns at exit about the semaphores a killed worker left, after the study's last line; it
    removes them all the same. Its ``-W`` options are this process's (sys.warnoptions)."""
    import sys

    option = "ignore:resource_tracker:UserWarning"
    if option not in sys.warnoptions:
        sys.warnoptions.append(option)


class LocalExecutor:
    """N worker processes on this machine; the runner hands a cell to an idle one."""

    name = "local"

    def __init__(self, workers: int, threads: int | None = None, *, per_gpu: int = 1, use_gpus: bool = True):
        import multiprocessing

        _quiet_resource_tracker()
        self.workers = workers
        self.threads = threads or threads_per_worker(workers)
        #: the GPUs the workers are spread over, as CUDA_VISIBLE_DEVICES entries ([]: CPU workers)
        self.gpu_names = visible_gpus(gpu_count()) if use_gpus else []
        self.gpus = len(self.gpu_names)
        check_gpu_share(workers, self.gpus, per_gpu)
        self.ctx = multiprocessing.get_context("spawn")
        self.growth_mb = growth_limit_mb()
        self.outbox = None
        self.slots: dict[int, dict[str, Any]] = {}

    def describe(self) -> str:
        gpus = f", worker k on GPU {','.join(self.gpu_names)}[k mod {self.gpus}]" if self.gpus else ""
        return f"local: {self.workers} worker process(es), {self.threads} thread(s) each{gpus}"

    def _spawn(self, slot: int) -> None:
        if self.outbox is None:
            self.outbox = self.ctx.Queue()
        inbox = self.ctx.Queue()
        gpu = self.gpu_names[slot % self.gpus] if self.gpus else None
        proc = self.ctx.Process(
            target=_local_worker,
            args=(slot, inbox, self.outbox, self.threads, gpu, self.growth_mb),
            name=f"unlearn-study-worker-{slot}",
            daemon=True,
        )
        proc.start()
        self.slots[slot] = {"proc": proc, "inbox": inbox, "cell": None}

    def free(self) -> int:
        busy = sum(1 for s in self.slots.values() if s["cell"] is not None)
        return self.workers - busy

    def submit(self, task: CellTask) -> None:
        for slot in range(self.workers):
            state = self.slots.get(slot)
            if state is not None and state["cell"] is not None:
                # busy, or dead while holding a cell: events() reports that cell failed and frees
                # the slot; replacing the worker here would lose the cell (the study never ends)
                continue
            if state is not None and state.get("retired"):
                state["proc"].join(30)  # it returns right after its last "done"
                if state["proc"].is_alive():
                    state["proc"].terminate()
                    state["proc"].join(5)
            if state is None or state.get("retired") or not state["proc"].is_alive():
                self._spawn(slot)  # started on first need: a fully cached study starts none
                state = self.slots[slot]
            if state["cell"] is None:
                state["cell"] = task.plan.cell.id
                state["inbox"].put(task)
                return
        raise RuntimeError("no idle worker")  # the runner asks free() first

    def _drain(self, timeout: float) -> list[tuple]:
        events = []
        try:
            events.append(self.outbox.get(timeout=timeout))
            while True:
                events.append(self.outbox.get_nowait())
        except queue.Empty:
            pass
        for event in events:
            if event[0] == "done":
                for state in self.slots.values():
                    if state["cell"] == event[1]:
                        state["cell"] = None
                        state["retired"] = bool(event[2].get("retired"))
        return events

    def events(self, timeout: float) -> list[tuple]:
        if self.outbox is None:
            time.sleep(timeout)
            return []
        events = self._drain(timeout)
        for slot, state in self.slots.items():
            proc = state["proc"]
            if state["cell"] is None or proc.is_alive():
                continue
            events += self._drain(0.2)  # what it sent just before it died
            if state["cell"] is None:
                continue
            code = proc.exitcode
            if code in (INTERRUPTED_EXIT, -signal.SIGINT):  # its own event was lost: the same interrupt
                events.append(("interrupted", state["cell"], f"worker {slot} (pid {proc.pid})"))
                state["cell"] = None
                continue
            how = (
                f"killed by signal {-code} ({signal.Signals(-code).name})" if code and code < 0 else f"exit code {code}"
            )
            error = f"worker {slot} (pid {proc.pid}) died: {how}"
            events.append(("done", state["cell"], {"status": "failed", "error": error, "sources": []}))
            state["cell"] = None
        return events

    def close(self, *, interrupted: bool = False) -> None:
        for state in self.slots.values():
            if interrupted and state["proc"].is_alive() and state["proc"].pid:
                try:
                    os.kill(state["proc"].pid, signal.SIGINT)  # the stage being built cleans up after itself
                except OSError:
                    pass
            else:
                try:
                    state["inbox"].put(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + (30 if interrupted else 10)
        for state in self.slots.values():
            state["proc"].join(max(0.0, deadline - time.monotonic()))
            if state["proc"].is_alive():
                state["proc"].terminate()
                state["proc"].join(5)
        self.slots.clear()


# ----------------------------------------------------------------------------- inline


class InlineExecutor:
    """Every cell in this process, one after the other, with this process's threads: no worker
    to start or import the libraries again (the demo with ``--workers 1``). A cell's output still
    goes to its log; Ctrl-C interrupts the stage being built, which removes its temporary folder."""

    name = "inline"

    def __init__(self):
        self.pending: list[CellTask] = []

    def describe(self) -> str:
        return f"inline: this process (pid {os.getpid()}), one cell after the other"

    def free(self) -> int:
        return 0 if self.pending else 1

    def submit(self, task: CellTask) -> None:
        self.pending.append(task)

    def events(self, timeout: float) -> list[tuple]:
        if not self.pending:
            time.sleep(timeout)
            return []
        task = self.pending.pop(0)
        cell = task.plan.cell.id
        events: list[tuple] = [("start", cell, f"this process (pid {os.getpid()})")]
        result = execute_cell(task, lambda *event: events.append(event))
        events.append(("done", cell, result))
        return events

    def close(self, *, interrupted: bool = False) -> None:
        self.pending.clear()


# ----------------------------------------------------------------------------- dask


def _dask_cell(task: CellTask, events: str, threads: int, gpus: list[str]) -> dict:
    """A cell as a Dask task: pinned like a local worker (a LocalCluster's worker k to the
    (k mod N)-th of the GPUs the study sees), events through a Dask queue."""
    from distributed import Queue, get_worker

    worker = get_worker()
    index = worker.name if isinstance(worker.name, int) else 0
    _pin(threads, gpus[index % len(gpus)] if gpus else None)
    channel = Queue(events)
    where = f"dask worker {worker.address}"

    def emit(*event: Any) -> None:
        try:
            channel.put(event)
        except Exception:  # noqa: BLE001 - progress is best effort
            pass

    emit("start", task.plan.cell.id, where)
    return {**execute_cell(task, emit), "worker": where}


class DaskExecutor:
    """Cells as Dask tasks (one per cell) on a LocalCluster of ``workers`` single-threaded
    processes, or on the cluster at ``address``. Where workers advertise a ``GPU`` resource
    (a LocalCluster does when this machine has GPUs), each cell asks for one."""

    name = "dask"

    def __init__(
        self,
        workers: int,
        address: str | None = None,
        threads: int | None = None,
        *,
        per_gpu: int = 1,
        use_gpus: bool = True,
    ):
        try:
            from distributed import Client, LocalCluster, Queue
        except ImportError:
            raise UnlearnError("--executor dask needs Dask: pip install 'unlearn-plugins[dask]'") from None
        self.threads = threads or (1 if address else threads_per_worker(workers))
        # a scheduler's workers are placed where they were started (one GPU each: dask-cuda's
        # workers, or CUDA_VISIBLE_DEVICES per `dask worker`); a LocalCluster's are pinned here
        self.gpu_names = visible_gpus(gpu_count()) if use_gpus and not address else []
        self.gpus = len(self.gpu_names)
        if not address:
            check_gpu_share(workers, self.gpus, per_gpu)
        self.cluster = None
        if address:
            try:
                self.client = Client(address, timeout="20s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise UnlearnError(f"--scheduler {address}: cannot connect ({exc})") from None
        else:
            env = {name: str(self.threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
            self.cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                env=env,
                resources={"GPU": 1} if self.gpus else None,
            )
            self.client = Client(self.cluster)
        info = self.client.scheduler_info()
        workers_info = info.get("workers", {}).values()
        self.use_gpu = any(w.get("resources", {}).get("GPU") for w in workers_info)
        self.address = self.client.scheduler.address
        self.n_workers = len(info.get("workers", {}))
        self.channel_name = f"unlearn-study-{uuid.uuid4().hex[:8]}"
        self.channel = Queue(self.channel_name, client=self.client)
        self.done: queue.Queue = queue.Queue()
        self.futures: dict[str, Any] = {}

    def describe(self) -> str:
        kind = "LocalCluster" if self.cluster is not None else "scheduler"
        gpu = ", one GPU per cell" if self.use_gpu else ""
        return f"dask: {kind} {self.address}, {self.n_workers} worker(s){gpu}"

    def free(self) -> int:
        return 1 << 30  # the scheduler queues them

    def submit(self, task: CellTask) -> None:
        cell = task.plan.cell.id
        future = self.client.submit(
            _dask_cell,
            task,
            self.channel_name,
            self.threads,
            self.gpu_names,
            key=f"cell-{cell}-{uuid.uuid4().hex[:8]}",
            pure=False,
            resources={"GPU": 1} if self.use_gpu else None,
        )
        self.futures[cell] = future

        def finished(f, cell=cell) -> None:
            try:
                result = f.result()
            except BaseException as exc:  # noqa: BLE001 - a lost worker (KilledWorker), a cancelled task
                text = " ".join(str(exc).split()) or type(exc).__name__
                result = {"status": "failed", "error": f"dask task failed: {type(exc).__name__}: {text}", "sources": []}
            self.done.put(("done", cell, result))

        future.add_done_callback(finished)

    def events(self, timeout: float) -> list[tuple]:
        deadline = time.monotonic() + timeout
        while True:
            events: list[tuple] = []
            try:
                events += [tuple(e) for e in self.channel.get(batch=True) or []]
            except Exception:  # noqa: BLE001 - nothing queued
                pass
            while True:
                try:
                    events.append(self.done.get_nowait())
                except queue.Empty:
                    break
            if events or time.monotonic() >= deadline:
                return events
            time.sleep(0.1)

    def close(self, *, interrupted: bool = False) -> None:
        if interrupted:
            for future in self.futures.values():
                future.cancel()
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def check_scheduler(address: str) -> None:
    """--scheduler's address, before any work (Dask's own error came as a traceback once the
    first cell was ready): Dask installed, and a scheme it knows with a host and a port."""
    try:
        from distributed.comm import get_address_host_port
    except ImportError:
        raise UnlearnError("--executor dask needs Dask: pip install 'unlearn-plugins[dask]'") from None
    try:
        get_address_host_port(address)
    except (ValueError, TypeError) as exc:
        raise UnlearnError(
            f"--scheduler {address}: not a Dask scheduler address ({exc}); give tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786"
        ) from None


def make_executor(
    kind: str,
    workers: int,
    *,
    scheduler: str | None = None,
    threads: int | None = None,
    per_gpu: int = 1,
    use_gpus: bool = True,
):
    """``per_gpu``: workers that may share one GPU (the study's ``workers_per_gpu``);
    ``use_gpus``: False when the cells run on the CPU (``--device cpu``): no GPU is handed out."""
    if kind == "local":
        if scheduler:
            raise UnlearnError("--scheduler is an address of a Dask scheduler: use it with --executor dask")
        return LocalExecutor(workers, threads, per_gpu=per_gpu, use_gpus=use_gpus)
    if kind == "dask":
        return DaskExecutor(workers, scheduler, threads, per_gpu=per_gpu, use_gpus=use_gpus)
    if kind == "inline":  # one cell after the other in this process (workers and threads: its own)
        return InlineExecutor()
    raise UnlearnError(f"--executor {kind!r}: choose {' or '.join(EXECUTORS)}")


__all__ = ["LocalExecutor", "DaskExecutor", "InlineExecutor", "make_executor", "threads_per_worker", "EXECUTORS"]
