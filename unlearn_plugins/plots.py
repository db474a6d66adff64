"""Every plot's set-up and file: matplotlib's pyplot on the non-interactive Agg backend, and a
figure written as a PNG atomically (a reader never sees half a file). Used by the demo's and
the robustness reports and the circuit plots."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

#: dots per inch of every PNG the package writes
DPI = 110


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | os.PathLike) -> None:
    """``fig`` as a PNG at ``path``, written atomically."""
    from .files import atomic_open

    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI)


def finish_png(fig, path: str | os.PathLike) -> None:
    """``fig`` laid out tight, written as a PNG at ``path`` (atomically) and closed."""
    fig.tight_layout()
    save_png(fig, path)
    pyplot().close(fig)


def plot_log_scatter(
    rows: Sequence[dict],
    path: Path,
    *,
    x: str,
    y: str,
    floor: float,
    markers: dict[str, str],
    labels: tuple[str, str, str],
    height: float,
) -> None:
    """One point per model row, at ``max(row[x], floor)`` on a log scale and ``row[y]`` (a row
    missing either is left out), marked by ``markers`` (model name -> marker, else a circle; a
    star drawn larger); ``labels``: the x label, y label and title."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, height))
    for r in rows:
        if r[x] is None or r[y] is None:
            continue
        marker = markers.get(r["name"], "o")
        ax.scatter(max(r[x], floor), r[y], s=120 if marker == "*" else 70, marker=marker, label=r["label"])
    ax.set_xscale("log")
    xlabel, ylabel, title = labels
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    finish_png(fig, path)


__all__ = ["pyplot", "save_png", "finish_png", "plot_log_scatter", "DPI"]
