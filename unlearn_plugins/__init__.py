"""unlearn-plugins: a plugin host for machine unlearning in LLMs.

Public API::

    from unlearn_plugins import hookimpl, get_component, list_components, create
"""

from .hookspecs import hookimpl
from .host import create, get_component, list_components, list_plugins, reset_host
from .interfaces import (
    ADAPTER_INITIALIZER,
    DIFFICULTY_SCORER,
    KINDS,
    LM_EVAL_TASK_DIR,
    UNLEARNING_OBJECTIVE,
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
    "KINDS",
    "DIFFICULTY_SCORER",
    "ADAPTER_INITIALIZER",
    "UNLEARNING_OBJECTIVE",
    "LM_EVAL_TASK_DIR",
]
