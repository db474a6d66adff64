"""The state of the process a stage runs in: its memory (the resident set now, a stage's
sampled peak, handing freed memory back to the system) and which libraries' log lines reach
its output. Shared by the study's cells and workers and the CUD scorer's anchor runs; torch-free."""

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


def release_memory() -> None:
    """Hand the memory a finished stage freed back to the system. glibc keeps freed heap pages
    (torch's CPU tensors come from malloc), so a worker that had built a 3.4 GB stage stayed at
    2.7 GB through every later one, and each stage's peak started there (measured on the demo's
    fine-tune: 2.70 GB resident after it, 0.73 GB after malloc_trim). A no-op without glibc.
    On CUDA, torch's cached free blocks go back to the card too (for the next stage, or
    another process on the same GPU)."""
    import ctypes
    import gc

    gc.collect()
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
    names = ("lm_eval", "transformers", "peft", "accelerate", "unlearn_plugins.evaluation.tofu_tasks")
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


__all__ = ["resident_mb", "PeakSampler", "release_memory", "quiet_libraries"]
