"""Built-in recommendation-unlearning objectives (registered through the same hook as any
plugin): ``e2urec`` and ``bad_teacher``. NegGrad is the built-in ``grad_ascent``."""

from unlearn_plugins import hookimpl

from .bad_teacher import BadTeacher
from .e2urec import E2URec


@hookimpl
def register_unlearning_objectives(register):
    register("e2urec", E2URec)
    register("bad_teacher", BadTeacher)
