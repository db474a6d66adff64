"""Built-in attacks (registered through the same hook as any plugin)."""

from .. import hookimpl
from .quantize import Quantize
from .relearn import Relearn


@hookimpl
def register_attacks(register):
    register("relearn", Relearn)
    register("quantize", Quantize)
