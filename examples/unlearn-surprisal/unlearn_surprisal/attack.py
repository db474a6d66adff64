"""An attack: small Gaussian noise on the weights. Forgetting that sits on a knife's edge (the
answer suppressed by a narrow change of the weights) does not survive a nudge in a random
direction; real forgetting does."""

from __future__ import annotations

from dataclasses import dataclass, field

from unlearn_plugins import AttackResult


@dataclass
class WeightNoise:
    """Add N(0, (scale * std(W))^2) noise to every linear weight W of the decoder blocks."""

    scale: float = field(default=0.05, metadata={"help": "noise std as a fraction of each weight matrix's std"})
    seed: int = field(default=0, metadata={"help": "noise seed"})

    def __post_init__(self):
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")

    def attack(self, context):
        import torch

        model, tokenizer = context.load_model()  # the adapter, if any, merged in
        generator = torch.Generator().manual_seed(self.seed)
        layers = 0
        with torch.no_grad():
            for module in model.model.layers.modules():
                if isinstance(module, torch.nn.Linear):
                    weight = module.weight
                    noise = torch.randn(weight.shape, generator=generator) * (self.scale * weight.float().std())
                    weight.add_(noise.to(weight.device, weight.dtype))
                    layers += 1
        context.save_model(model, tokenizer)
        return AttackResult(info={"layers": layers})
