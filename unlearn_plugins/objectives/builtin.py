"""Built-in unlearning objectives and the ``rol`` regulariser (registered through the same
hook as any plugin)."""

from .. import hookimpl
from .altpo import AltPO
from .ceu import CEU
from .gradient import WGA, GradAscent, GradDiff, SatImp
from .gru import GRU
from .ihl import IHL
from .lmcleaner import LMCleaner
from .lunar import LUNAR
from .pdu import PDU
from .preference import NPO, IdkDPO, SimNPO
from .rmu import RMU
from .rol import ROL
from .sibl import SIBL
from .t3 import T3
from .task_vector import TaskVector
from .undial import UNDIAL


@hookimpl
def register_unlearning_objectives(register):
    register("grad_ascent", GradAscent)
    register("grad_diff", GradDiff)
    register("npo", NPO)
    register("simnpo", SimNPO)
    register("idk_dpo", IdkDPO)
    register("undial", UNDIAL)
    register("wga", WGA)
    register("satimp", SatImp)
    register("rmu", RMU)
    register("ihl", IHL)
    register("ceu", CEU)
    register("task_vector", TaskVector)
    register("gru", GRU)
    register("pdu", PDU)
    register("sibl", SIBL)
    register("altpo", AltPO)
    register("lunar", LUNAR)
    register("t3", T3)
    register("lmcleaner", LMCleaner)
    register("rol", ROL)
