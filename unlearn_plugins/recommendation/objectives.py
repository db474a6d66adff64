"""Built-in recommendation-unlearning objectives (registered through the same hook as any
plugin): ``e2urec`` and ``bad_teacher``. NegGrad is the built-in ``grad_ascent``."""

from .. import hookimpl
from ..objectives.bad_teacher import BadTeacher
from ..objectives.e2urec import E2URec


@hookimpl
def register_unlearning_objectives(register):
    register("e2urec", E2URec)
    register("bad_teacher", BadTeacher)
