"""Built-in difficulty scorers (registered through the same hook as any plugin)."""

from .. import hookimpl
from .baselines import LengthScorer, LossScorer
from .cud import CUDScorer
from .mrd import MRDScorer


@hookimpl
def register_difficulty_scorers(register):
    register("length", LengthScorer)
    register("loss", LossScorer)
    register("mrd", MRDScorer)
    register("cud", CUDScorer)
