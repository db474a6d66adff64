"""Where easy and hard circuits put their edges: mean edge counts per destination layer x
component (q, k, v, MLP, logits), from the ``circuit_by_layer`` field the ``cud`` scorer
writes per sample."""

from __future__ import annotations

import os
from typing import Sequence

from ..errors import UnlearnError
from .graph import DST_TYPES


def mean_placement(rows: Sequence[dict]):
    """Mean (L+1, 5) edge-count matrix over rows with ``circuit_by_layer``."""
    import numpy as np

    mats = [np.asarray(r["circuit_by_layer"], dtype=float) for r in rows if r.get("circuit_by_layer") is not None]
    if not mats:
        raise UnlearnError("no 'circuit_by_layer' in the score rows: score with the cud scorer to plot circuits")
    if len({m.shape for m in mats}) != 1:
        raise UnlearnError("score rows have circuit_by_layer of different shapes (different models?)")
    return np.mean(mats, axis=0)


def plot_easy_hard(
    easy_rows: Sequence[dict], hard_rows: Sequence[dict], path: str | os.PathLike, title: str = "CUD circuits"
) -> None:
    """A PNG with three heatmaps: easy, hard, hard - easy (layer x component)."""
    from ..plots import finish_png, pyplot

    plt = pyplot()
    easy, hard = mean_placement(easy_rows), mean_placement(hard_rows)
    layers = easy.shape[0]
    fig, axes = plt.subplots(1, 3, figsize=(12, max(4, layers * 0.22)), sharey=True)
    vmax = max(easy.max(), hard.max(), 1e-9)
    diff = hard - easy
    dmax = max(abs(diff).max(), 1e-9)
    panels = (
        (easy, f"easy (n={len(easy_rows)})", "viridis", 0, vmax),
        (hard, f"hard (n={len(hard_rows)})", "viridis", 0, vmax),
        (diff, "hard - easy", "coolwarm", -dmax, dmax),
    )
    for ax, (mat, name, cmap, lo, hi) in zip(axes, panels):
        im = ax.imshow(mat, aspect="auto", origin="lower", cmap=cmap, vmin=lo, vmax=hi)
        ax.set_title(name)
        ax.set_xticks(range(len(DST_TYPES)), DST_TYPES)
        fig.colorbar(im, ax=ax, fraction=0.046)
    axes[0].set_ylabel(f"destination layer ({layers - 1} = logits)")
    fig.suptitle(f"{title}: mean circuit edges per sample by destination")
    finish_png(fig, path)
