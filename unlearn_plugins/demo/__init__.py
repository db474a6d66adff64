"""`unlearn demo`: the whole product on the embedded model and a small TOFU-style
benchmark, with every stage cached so a rerun continues where the last one stopped.

- :mod:`.benchmark`: the N-author benchmark folder (TOFU's format) from TOFU or the
  generated fictitious authors;
- :mod:`.pipeline`: the stages (targets, CUD, unlearning, evaluation) and their cache;
- :mod:`.report`: the terminal table, results.json, summary.md and the plots.
"""

from .pipeline import DemoConfig, run_demo

__all__ = ["DemoConfig", "run_demo"]
