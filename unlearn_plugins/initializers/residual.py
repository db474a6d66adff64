"""Shared pieces of the data-driven initializers: writing a residual LoRA init
(base W0 - s B A, so the model is unchanged at step 0), running batches, and keeping
all processes identical."""

from __future__ import annotations

from typing import Iterator, Sequence

from ..data.qa import pad_batch
from ..interfaces import InitResult
from ..training.lora import lora_layers


def batches(examples: Sequence[dict], pad_token_id: int, batch_size: int, device) -> Iterator[dict]:
    """Length-bucketed padded batches on ``device``."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    for start in range(0, len(order), batch_size):
        batch = pad_batch([examples[i] for i in order[start : start + batch_size]], pad_token_id)
        yield {k: v.to(device) for k, v in batch.items()}


def write_residual(module, adapter: str, A, B) -> None:
    """lora_A = A (r x d_in), lora_B = B (d_out x r), base W <- W - s B A (computed in fp32)."""
    import torch

    with torch.no_grad():
        base = module.get_base_layer().weight
        s = module.scaling[adapter]
        A32, B32 = A.float().to(base.device), B.float().to(base.device)
        base.copy_((base.float() - s * (B32 @ A32)).to(base.dtype))
        module.lora_A[adapter].weight.copy_(A32.to(module.lora_A[adapter].weight.dtype))
        module.lora_B[adapter].weight.copy_(B32.to(module.lora_B[adapter].weight.dtype))


def sync_from_rank0(peft_model) -> None:
    """Under torch.distributed, make every process hold rank 0's base weights and adapters
    (the ReGLU reference code mutated the base weight on rank 0 only)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    adapter = peft_model.active_adapter
    for _, module in lora_layers(peft_model):
        for tensor in (module.get_base_layer().weight, module.lora_A[adapter].weight, module.lora_B[adapter].weight):
            dist.broadcast(tensor.data, src=0)


def residual_result(peft_model, bases: dict, **info) -> InitResult:
    """The result of an initializer that wrote a residual into the base weights and keeps a
    retain basis per module: every process made to hold rank 0's weights, then ``info``."""
    sync_from_rank0(peft_model)
    return InitResult(retain_basis=bases, residual=True, info=info)


def model_device(model):
    return next(model.parameters()).device
