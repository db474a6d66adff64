"""What every timing bench reports with a figure: the median over rounds and its spread.

A figure is the median of per-round values (each round measures both sides of a ratio, one
after the other, so a slow spell of the machine hits both); ``spread`` gives min / median /
max and the relative range (max - min) / median, so two runs can be compared: with enough
rounds (each bench's ``--rounds``) two runs on an idle machine agree within 10%, and a wide
range says the machine was busy. ``machine`` records the load average at start and end.
"""

from __future__ import annotations

import os
import statistics
from typing import Sequence


def spread(values: Sequence[float], digits: int = 4) -> dict:
    """min / median / max of the values (rounds, or steps), the relative range and their count."""
    values = sorted(float(v) for v in values)
    if not values:
        raise ValueError("no rounds to summarise")
    median = statistics.median(values)
    return {
        "min": round(values[0], digits),
        "median": round(median, digits),
        "max": round(values[-1], digits),
        "rel_range": round((values[-1] - values[0]) / abs(median), 3) if median else None,
        "n": len(values),
    }


def median(values: Sequence[float], digits: int = 4) -> float:
    return round(statistics.median(float(v) for v in values), digits)


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-round ratios (round i's numerator over round i's denominator)."""
    if len(numerators) != len(denominators):
        raise ValueError("ratios need one numerator and one denominator per round")
    return [n / d for n, d in zip(numerators, denominators)]


def load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine(load_at_start: float | None) -> dict:
    """CPU count and the 1-minute load average at the start and the end of the bench."""
    return {"cpus": os.cpu_count(), "load_average": [load_at_start, load_average()]}


def add_rounds_argument(parser, default: int, help: str) -> None:
    """``--rounds``, also accepted as ``--repeats`` (its earlier name)."""
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=default, help=help)


def parse_run_arguments(parser, argv, quick: str):
    """The parsed ``argv``, after adding ``--device`` and ``--tofu-dir`` (None: the defaults of
    unlearn_plugins) and ``--quick`` (``quick``: what the smoke test runs)."""
    parser.add_argument("--device", default=None)
    parser.add_argument("--tofu-dir", default=None)
    parser.add_argument("--quick", action="store_true", help=quick)
    return parser.parse_args(argv)
