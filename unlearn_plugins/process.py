"""The state of the process a stage runs in: its memory (the resident set now, a stage's
sampled peak, handing freed memory back to the system) and which libraries' log lines reach
its output, and the GPU it is given. Shared by the study's cells and workers and the CUD scorer's
anchor runs; torch is imported only where a GPU is asked about."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import threading


def resident_mb() -> float | None:
    """This process's resident set now, in MB (MiB); None where /proc is missing."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakSampler:
    """A stage's own peak resident memory, sampled: a thread reads this process's resident set
    (/proc/self/statm) every ``every`` seconds while the stage runs. It does not reset the
    kernel's high-water mark (clear_refs would), so the process's own peak, the one
    ``/usr/bin/time -v`` and a parent's wait4 report, still counts every stage: with the reset,
    a worker's reported peak was only its last stage's (the demo read 3.16 GB where a stage had
    reached 3.54). A peak shorter than ``every`` can be missed. ``scope``: "stage" on Linux;
    elsewhere "process" (getrusage's peak so far)."""

    def __init__(self, every: float = 0.005):
        self.every = every
        self.peak = 0
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.scope = "stage" if self._rss() is not None else "process"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _rss(self) -> int | None:
        try:
            with open("/proc/self/statm") as handle:
                return int(handle.read().split()[1]) * self.page
        except (OSError, ValueError, IndexError):
            return None

    def _sample(self) -> None:
        rss = self._rss()
        if rss is not None and rss > self.peak:
            self.peak = rss

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> PeakSampler:
        if self.scope == "stage":
            self._sample()
            self._thread = threading.Thread(target=self._run, name="peak-rss-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()

    def peak_mb(self) -> float:
        """The stage's peak in MB (MiB), or the process's peak so far where /proc is missing."""
        if self.scope == "stage":
            return round(self.peak / 2**20, 1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)  # bytes on macOS, KiB on Linux


def freeze_libraries() -> None:
    """Import what every cell uses (the Trainer, PEFT, lm-eval) and move it out of the garbage
    collector's view: a fresh worker's first full collections (the Trainer makes one at each
    training start) would otherwise scan the ~0.5M objects of these imports, ~0.4 s each."""
    import gc

    import lm_eval.evaluator  # noqa: F401
    import peft  # noqa: F401
    import transformers.trainer  # noqa: F401

    gc.collect()
    gc.freeze()


def release_memory(*, between_stages: bool = False) -> None:
    """Hand the memory a finished stage freed back to the system. glibc keeps freed heap pages
    (torch's CPU tensors come from malloc), so a worker that had built a 3.4 GB stage stayed at
    2.7 GB through every later one, and each stage's peak started there (measured on the demo's
    fine-tune: 2.70 GB resident after it, 0.73 GB after malloc_trim). A no-op without glibc.
    On CUDA, torch's cached free blocks go back to the card too (for the next stage, or
    another process on the same GPU).

    ``between_stages``: no stage's objects are alive, so what survives the collection is what
    the process keeps for good (imported libraries and their caches); it is moved out of the
    collector's view (``gc.freeze``). Every later full collection, this one's and the Trainer's
    at each training start, then scans only what was made since: with torch, transformers and
    lm-eval imported, one scanned ~475k objects in 0.4-1.5 s."""
    import ctypes
    import gc

    gc.collect()
    if between_stages:
        gc.freeze()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc (macOS, musl, Windows)
        pass
    torch = sys.modules.get("torch")  # never imported here: a torch-free process stays so
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # the caching allocator's free blocks back to the card


@contextlib.contextmanager
def quiet_libraries():
    """Keep a pipeline's output to its stage lines and progress bars: lm-eval's per-task
    warnings and deprecation notices are for people calling those libraries directly. With
    ``--verbosity`` (UNLEARN_VERBOSITY, which the CLI sets, and workers inherit) that flag decides."""
    import warnings

    if os.environ.get("UNLEARN_VERBOSITY"):
        yield
        return
    # (and our TOFU tasks' "no retain reference" warning: the retain model's evaluation makes it)
    names = (
        "lm_eval",
        "transformers",
        "peft",
        "accelerate",
        "unlearn_plugins.benchmarks.tofu.tasks.tofu.utils",
        "unlearn_plugins.evaluation.lm_eval_requests",
    )
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# ----------------------------------------------------------------------------- GPUs


def visible_gpus(count: int, environ: dict | None = None) -> list[str]:
    """The GPUs this process may hand to its workers, as ``CUDA_VISIBLE_DEVICES`` entries name
    them (indices or UUIDs): the inherited mask's entries, in its order, or ``0..count-1``
    when no mask is set. ``count``: the CUDA devices this process sees (torch's count, which
    already honours the mask). A child given ``CUDA_VISIBLE_DEVICES=str(k)`` under the mask
    ``2,3`` would run on physical GPU k, not on the k-th of ours."""
    environ = os.environ if environ is None else environ
    mask = environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return [str(i) for i in range(count)]
    entries = [x.strip() for x in mask.split(",") if x.strip()]
    return entries[:count] if count else entries


def gpu_for(index: int, count: int, environ: dict | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that gives a child this process's CUDA device
    ``index`` mod ``count`` (a worker's slot, or the device a process runs on): the one rule
    for the study's workers and the CUD scorer's anchor-run children."""
    gpus = visible_gpus(count, environ)
    if not gpus:
        raise ValueError(f"no visible GPU to place process {index} on (CUDA_VISIBLE_DEVICES hides them all)")
    return gpus[index % len(gpus)]


def check_gpu_share(workers: int, gpus: int, per_gpu: int, where: str = "--workers") -> None:
    """More workers than GPUs is refused unless each GPU is to be shared by ``per_gpu`` workers
    (a study's ``[study] workers_per_gpu``): two training runs on one card silently halve each
    other's memory and speed."""
    from .errors import UnlearnError

    if gpus and workers > gpus * per_gpu:
        share = -(-workers // gpus)
        raise UnlearnError(
            f"{where} {workers}: this machine shows {gpus} GPU(s) with {per_gpu} worker(s) each; "
            f"give at most {gpus * per_gpu} workers, or set [study] workers_per_gpu = {share} "
            f"in the study file to let {share} workers share a GPU"
        )


def gpu_identity(device=None) -> str | None:
    """The physical GPU a CUDA device is (its UUID, the same on every process whatever the
    mask), or None on CPU and where no CUDA device is used. ``device``: a torch device or
    index (default: the current CUDA device)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        if device is None or isinstance(device, int):
            index = torch.cuda.current_device() if device is None else device
        else:
            dev = torch.device(device)
            if dev.type != "cuda":
                return None
            index = torch.cuda.current_device() if dev.index is None else dev.index
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        count = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPU to name
        return None
    if uuid is None:  # an older torch: the mask's entry, or NVML's name of that physical GPU
        uuid = _nvml_uuid(gpu_for(index, count))
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _nvml_uuid(entry: str) -> str | None:
    """A ``CUDA_VISIBLE_DEVICES`` entry's UUID: itself if it is one, else NVML's (nvidia-ml-py,
    where installed) for that physical index; None otherwise."""
    if entry.startswith("GPU-"):
        return entry
    try:
        import pynvml

        pynvml.nvmlInit()
        value = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
    except Exception:  # noqa: BLE001 - no NVML, or an entry it does not know
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = [
    "resident_mb",
    "PeakSampler",
    "freeze_libraries",
    "release_memory",
    "quiet_libraries",
    "visible_gpus",
    "gpu_for",
    "check_gpu_share",
    "gpu_identity",
]
