"""Built-in adapter initializers (registered through the same hook as any plugin)."""

from .. import hookimpl
from .fila import FILAInit
from .peft_builtin import CorDAInit, EVAInit, GaussianInit, KaimingInit, OLoRAInit, PiSSAInit
from .random_residual import RandomResidualInit
from .rila import RILAInit
from .vila import VILAInit


@hookimpl
def register_adapter_initializers(register):
    register("kaiming", KaimingInit)  # PEFT's default (init_lora_weights=True), named after A's distribution
    register("gaussian", GaussianInit)
    register("pissa", PiSSAInit)
    register("olora", OLoRAInit)
    register("eva", EVAInit)
    register("corda", CorDAInit)
    register("rila", RILAInit)
    register("fila", FILAInit)
    register("vila", VILAInit)
    register("random_residual", RandomResidualInit)  # a control: RILA's norm, random directions
