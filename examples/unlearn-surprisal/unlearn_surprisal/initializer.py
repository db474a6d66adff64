"""An adapter initializer: start LoRA in the directions the forget answers use most."""

from __future__ import annotations

from dataclasses import dataclass, field

from unlearn_plugins import InitResult
from unlearn_plugins.data.qa import pad_batch


@dataclass
class ForgetSubspaceInit:
    """lora_A = the top-r principal directions of each LoRA layer's inputs on forget answer
    tokens, lora_B = 0: the model is unchanged at step 0, and training starts by moving the
    outputs of exactly those inputs."""

    max_examples: int = field(default=64, metadata={"help": "forget examples measured (the first ones)"})
    batch_size: int = field(default=8, metadata={"help": "examples per forward pass"})

    def __post_init__(self):
        if self.max_examples < 1 or self.batch_size < 1:
            raise ValueError("max_examples and batch_size must be >= 1")

    def initialize(self, peft_model, *, forget, retain, tokenizer):
        import torch
        from peft.tuners.lora import LoraLayer

        adapter = peft_model.active_adapter
        layers = {name: m for name, m in peft_model.named_modules() if isinstance(m, LoraLayer) and adapter in m.lora_A}
        grams, answer = {}, {}

        def hook(name):
            def collect(_module, args):
                x = args[0][answer["mask"]].float()  # (answer tokens, d_in)
                grams[name] = grams.get(name, 0) + x.T @ x

            return collect

        handles = [m.get_base_layer().register_forward_pre_hook(hook(n)) for n, m in layers.items()]
        device = next(peft_model.parameters()).device
        examples = list(forget)[: self.max_examples]
        try:
            with torch.no_grad(), peft_model.disable_adapter():
                for start in range(0, len(examples), self.batch_size):
                    batch = pad_batch(examples[start : start + self.batch_size], tokenizer.pad_token_id)
                    batch = {k: v.to(device) for k, v in batch.items()}
                    answer["mask"] = batch["labels"] != -100
                    peft_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        finally:
            for handle in handles:
                handle.remove()
        with torch.no_grad():
            for name, module in layers.items():
                r = module.r[adapter]
                _, vectors = torch.linalg.eigh(grams[name].double())  # ascending eigenvalues
                top = vectors[:, -r:].flip(1).T  # (r, d_in), orthonormal rows
                module.lora_A[adapter].weight.copy_(top)
                module.lora_B[adapter].weight.zero_()
        return InitResult(info={"init": "forget_subspace", "examples": len(examples), "lora_layers": len(layers)})
