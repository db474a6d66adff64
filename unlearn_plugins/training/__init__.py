"""Training: the Trainer subclass, LoRA wiring, run configs and the `run_unlearning` /
`run_finetune` library calls behind `unlearn run` and `unlearn finetune`."""

from .config import ConfigError, FinetuneConfig, TrainingConfig, UnlearnConfig
from .run import RunResult, TrainingError, run_finetune, run_unlearning

__all__ = [
    "run_unlearning",
    "run_finetune",
    "UnlearnConfig",
    "FinetuneConfig",
    "TrainingConfig",
    "RunResult",
    "TrainingError",
    "ConfigError",
]
