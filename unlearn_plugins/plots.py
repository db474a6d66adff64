"""Every plot's set-up and file: matplotlib's pyplot on the non-interactive Agg backend, and a
figure written as a PNG atomically (a reader never sees half a file). Used by the demo's and
the robustness reports and the circuit plots."""

from __future__ import annotations

import os

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


__all__ = ["pyplot", "save_png", "finish_png", "DPI"]
