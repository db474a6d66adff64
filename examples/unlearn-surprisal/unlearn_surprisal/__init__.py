"""unlearn-surprisal: one component of every kind unlearn-plugins has (docs/plugins.md)."""

from pathlib import Path

from unlearn_plugins import hookimpl

from .attack import WeightNoise
from .initializer import ForgetSubspaceInit
from .objective import CappedAscent
from .scorer import MaxSurprisalScorer


@hookimpl
def register_difficulty_scorers(register):
    register("max_surprisal", MaxSurprisalScorer)


@hookimpl
def register_adapter_initializers(register):
    register("forget_subspace", ForgetSubspaceInit)


@hookimpl
def register_unlearning_objectives(register):
    register("capped_ascent", CappedAscent)


@hookimpl
def register_lm_eval_task_dirs(register):
    register("surprisal", Path(__file__).parent / "tasks")


@hookimpl
def register_attacks(register):
    register("weight_noise", WeightNoise)
