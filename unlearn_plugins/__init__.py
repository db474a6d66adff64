"""unlearn-plugins: a plugin host for machine unlearning in LLMs.

Public API::

    from unlearn_plugins import hookimpl, get_component, list_components, create
"""

import logging as _logging


class _ImportNoise(_logging.Filter):
    """torchao (the quantize attack's library) is imported by PEFT once installed; on a machine
    without its optional GPU kernels it logs a warning per kernel, and torch one per enum it
    registers. Those lines would reach every command's stderr: they are dropped, nothing else."""

    def filter(self, record):
        text = record.getMessage()
        return not (
            text.startswith(("Failed to load", "Skipping import of cpp extensions"))
            or "is an Enum subclass and is now natively supported" in text
        )


for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).addFilter(_ImportNoise())

from .hookspecs import hookimpl  # noqa: E402
from .host import create, get_component, list_components, list_plugins, reset_host  # noqa: E402
from .interfaces import (  # noqa: E402
    ADAPTER_INITIALIZER,
    ATTACK,
    BENCHMARK,
    DIFFICULTY_SCORER,
    KINDS,
    LM_EVAL_TASK_DIR,
    UNLEARNING_OBJECTIVE,
    AttackResult,
    Benchmark,
    InitResult,
    QASample,
)

__version__ = "0.1.0"

__all__ = [
    "hookimpl",
    "create",
    "get_component",
    "list_components",
    "list_plugins",
    "reset_host",
    "QASample",
    "InitResult",
    "AttackResult",
    "Benchmark",
    "KINDS",
    "DIFFICULTY_SCORER",
    "ADAPTER_INITIALIZER",
    "UNLEARNING_OBJECTIVE",
    "LM_EVAL_TASK_DIR",
    "ATTACK",
    "BENCHMARK",
]
