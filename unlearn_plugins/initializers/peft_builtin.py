"""PEFT's own LoRA initialisations behind the adapter-initializer interface."""

from __future__ import annotations

from typing import Annotated

from ..interfaces import InitResult
from ..training.lora import DefaultInit, ResetInit, lora_layers


class KaimingInit(DefaultInit):
    """PEFT's default, ``init_lora_weights=True`` (the LoRA paper's init, and the one the TOFU,
    FILA and VILA LoRA baselines train with): A ~ kaiming-uniform(a=sqrt(5)), i.e.
    U(-1/sqrt(d_in), 1/sqrt(d_in)) like a fresh nn.Linear, B = 0. Our default init (and
    `unlearn finetune`'s, :class:`unlearn_plugins.training.lora.DefaultInit`)."""

    name = "kaiming"
    peft_init = True


class GaussianInit(ResetInit):
    """PEFT's ``init_lora_weights="gaussian"``: A ~ N(0, std 1/r), B = 0."""

    name = "gaussian"
    peft_init = "gaussian"


class _LayerMethodInit:
    """PEFT's weight-SVD/QR inits applied to an existing PeftModel through each LoRA
    layer's own method (PEFT has no registry for init names)."""

    residual = True
    method = ""

    def _apply(self, module, adapter):
        raise NotImplementedError

    def initialize(self, peft_model, *, forget=None, retain=None, tokenizer=None) -> InitResult:
        import torch

        from .residual import sync_from_rank0

        adapter = peft_model.active_adapter
        with torch.no_grad():
            for _name, module in lora_layers(peft_model):
                self._apply(module, adapter)
        sync_from_rank0(peft_model)
        return InitResult(residual=True, info={"init": self.method})


class PiSSAInit(_LayerMethodInit):
    """PEFT's PiSSA: the adapter holds the top-r singular directions of W (niter > 0: fast
    randomized SVD, PEFT's ``pissa_niter_N``)."""

    method = "pissa"

    def __init__(
        self, niter: Annotated[int | None, "power iterations of a fast randomized SVD (None: exact SVD)"] = None
    ):
        if niter is not None and (not isinstance(niter, int) or isinstance(niter, bool) or niter < 0):
            raise ValueError(f"pissa option niter must be an integer >= 0, got {niter!r}")
        self.niter = niter

    def _apply(self, module, adapter):
        module.pissa_init(adapter, "pissa" if not self.niter else f"pissa_niter_{int(self.niter)}")


class OLoRAInit(_LayerMethodInit):
    """PEFT's OLoRA: QR decomposition of W."""

    method = "olora"

    def _apply(self, module, adapter):
        module.olora_init(adapter)


def _run_batches(peft_model, examples, tokenizer, batch_size):
    import torch

    from .residual import batches, model_device

    with torch.no_grad():
        for batch in batches(examples, tokenizer.pad_token_id, batch_size, model_device(peft_model)):
            peft_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])


class CorDAInit:
    """PEFT's CorDA (knowledge-preserved mode by default) with covariance from data:
    the retain examples ('kpm': keep what the retain data uses) or the forget examples
    ('ipm'). PEFT's covariance hook takes one sequence per forward, so no batching."""

    residual = True

    def __init__(
        self,
        mode: Annotated[
            str, "'kpm': covariance of the retain data (keep what it uses); 'ipm': of the forget data"
        ] = "kpm",
    ):
        if mode not in ("kpm", "ipm"):
            raise ValueError(f"corda mode must be 'kpm' or 'ipm', got {mode!r}")
        self.mode = mode

    def initialize(self, peft_model, *, forget, retain, tokenizer) -> InitResult:
        import re

        import torch
        from peft import LoraConfig
        from peft.tuners.lora.config import CordaConfig
        from peft.tuners.lora.corda import preprocess_corda

        from .residual import sync_from_rank0

        adapter = peft_model.active_adapter
        data = retain if self.mode == "kpm" else forget
        if not data:
            raise ValueError(f"corda ({self.mode}) needs {'retain' if self.mode == 'kpm' else 'forget'} examples")
        modules = lora_layers(peft_model)
        # Hook the base layers (plain nn.Linear) that hold the weights.
        pattern = "^(" + "|".join(re.escape(f"{name}.base_layer") for name, _ in modules) + ")$"
        ranks = {module.r[adapter] for _, module in modules}
        if len(ranks) != 1:
            raise ValueError(f"corda needs one LoRA rank for every module, got {sorted(ranks)}")
        config = LoraConfig(
            r=ranks.pop(),
            target_modules=pattern,
            init_lora_weights="corda",
            corda_config=CordaConfig(corda_method=self.mode, verbose=False),
        )

        def run_model():
            with peft_model.disable_adapter():
                _run_batches(peft_model, data, tokenizer, 1)

        preprocess_corda(peft_model, config, run_model=run_model)
        with torch.no_grad():
            for _name, module in modules:
                module.corda_init(adapter, "corda")
        sync_from_rank0(peft_model)
        return InitResult(residual=True, info={"init": "corda", "mode": self.mode})


class EVAInit:
    """PEFT's EVA: lora_A from the right singular vectors of each layer's inputs on the
    given data (B = 0, so not residual); rho = 1 keeps the configured rank everywhere."""

    residual = False

    def __init__(
        self,
        data: Annotated[str, "examples whose inputs are decomposed: forget, retain or both"] = "forget",
        batch_size: Annotated[int, "examples per forward pass"] = 8,
        rho: Annotated[float, "EVA's rank redistribution (1: the configured rank everywhere)"] = 1.0,
    ):
        if data not in ("forget", "retain", "both"):
            raise ValueError(f"eva data must be forget, retain or both, got {data!r}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"eva option batch_size must be an integer >= 1, got {batch_size!r}")
        self.data, self.batch_size, self.rho = data, batch_size, rho

    def initialize(self, peft_model, *, forget, retain, tokenizer) -> InitResult:
        from peft import initialize_lora_eva_weights
        from peft.tuners.lora.config import EvaConfig

        from ..data.qa import pad_batch
        from .residual import model_device, sync_from_rank0

        adapter = peft_model.active_adapter
        examples = {"forget": forget, "retain": retain, "both": list(forget) + list(retain)}[self.data]
        device = model_device(peft_model)
        loader = [
            {k: v.to(device) for k, v in pad_batch(examples[i : i + self.batch_size], tokenizer.pad_token_id).items()}
            for i in range(0, len(examples), self.batch_size)
        ]
        config = peft_model.peft_config[adapter]
        saved = (config.init_lora_weights, config.eva_config)
        config.init_lora_weights, config.eva_config = "eva", EvaConfig(rho=self.rho)
        try:
            initialize_lora_eva_weights(peft_model, dataloader=loader, adapter_name=adapter, show_progress_bar=False)
        finally:
            config.init_lora_weights, config.eva_config = saved
        sync_from_rank0(peft_model)
        return InitResult(residual=False, info={"init": "eva", "data": self.data})
