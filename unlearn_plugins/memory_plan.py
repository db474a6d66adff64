"""The memory plan: each stage's peak memory on its device, from the model's config alone, so a
run that cannot fit is refused before anything is loaded (`unlearn plan`, `--dry-run`).

The model is never loaded: its ``config.json`` is read (transformers' AutoConfig) and the
architecture built on the meta device (accelerate's ``init_empty_weights``) to count parameters,
the decoder blocks' linear layers (LoRA's default targets) and the untied LM head. Each stage's
peak is the sum of what the code keeps at once (the parts are named in the plan):

- weights: every parameter in the weight dtype (fp32 on CPU; on CUDA bf16 for a LoRA base and
  fp32 master weights for full fine-tuning, as :mod:`unlearn_plugins.training.run` loads them);
- LoRA adapter, gradients and optimizer state of the trainable parameters (adapters are fp32;
  AdamW keeps two states of the parameter's dtype, the 8-bit optimizers two bytes, adafactor
  factored row and column statistics); on CUDA AdamW's multi-tensor step adds one temporary set;
- reference model: LoRA computes it on the trained model's own weights (no copy); full
  fine-tuning keeps a frozen copy, in bf16 under bf16 mixed precision;
- activations: what autograd keeps per token of every row of a step (forget and retain rows)
  in each decoder block (two RMSNorms, q, k, v as attention gets them, its output, the MLP's four
  intermediate-size tensors) and at the head, or one block's input per block plus one block with
  gradient checkpointing; the logits of a forward (batch x length x vocab) and the fp32 copy of
  the answer rows the loss keeps;
- EAP-IG (CUD's score matrices): the fp32 buffers of :mod:`unlearn_plugins.circuits.eap_ig`
  (activation differences batch x sources x length x width, per-head weight copies, scores)
  and a forward+backward over max_rows rows with frozen weights;
- MRD: one decoder block (plus the embedding and head) in the scoring precision at a time
  (``chunk="layer"``, the default), or a whole copy of the model (``chunk="model"``);
- FILA: the forget and retain Fisher sums, fp32, of every targeted weight, and the activations
  of its gradient pass with the decoder blocks recomputed in the backward (as the initializer
  takes them: one block's input per block plus one block);
- runtime: what the process holds before any of this (CPU: Python, torch, transformers and the
  libraries a stage imports, measured on this project's machine; CUDA: the context).

Estimates are checked against measured peaks by ``bench/memory_plan.py`` (docs/memory.md).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UnlearnError

GiB = 2**30
MiB = 2**20
BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_NAMES = {
    "fp64": "float64",
    "float64": "float64",
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}
#: resident memory of a stage's process before it loads a model (CPU, MiB): Python, torch,
#: transformers, peft (training, scoring) and lm-eval, datasets (evaluation); measured on this
#: project's 2-core machine (bench/memory_plan.py's baseline child and the demo's stages)
CPU_RUNTIME_MB = {"train": 620, "score": 620, "eval": 620}
#: working memory of torch's CPU kernels and autograd engine (MiB) once a model has run: not
#: derived from the code but the residual of bench/memory_plan.py's measurements at 40M-135M
#: parameters, where it is a visible share (forward only; forward and backward)
CPU_WORKSPACE_MB = {"forward": 20, "backward": 64}
#: what a CUDA process holds beyond torch's allocator (the context and kernels), MiB; an
#: assumption (never measured here: no GPU)
CUDA_CONTEXT_MB = 600
#: optimizers whose transformers implementation needs bitsandbytes
BNB_OPTIMIZERS = re.compile(r"(bnb|8bit|paged|ademamix|lion_32bit|rmsprop_bnb)")


def optimizer_needs_bitsandbytes(name: str) -> bool:
    """Whether transformers' optimizer ``name`` is one of bitsandbytes' (8-bit, paged, ...)."""
    return bool(BNB_OPTIMIZERS.search(name)) and not name.startswith(("adamw_torch", "adafactor"))


def check_optimizer_available(name: str) -> None:
    """Refuse a bitsandbytes optimizer where the package is missing (transformers would fail at
    the first optimizer step, after the model load)."""
    import importlib.util

    if optimizer_needs_bitsandbytes(name) and importlib.util.find_spec("bitsandbytes") is None:
        raise UnlearnError(
            f"option 'optim' {name!r} needs the package bitsandbytes (pip install bitsandbytes, CUDA only); "
            f"'adafactor' needs nothing and keeps almost no optimizer state"
        )


def optimizer_state_bytes(name: str, trainable: int, param_bytes: int, factored: int) -> int:
    """Optimizer state for ``trainable`` parameters of ``param_bytes`` each. ``factored``: the
    sum of rows + columns of the trainable matrices (adafactor's statistics)."""
    if name.startswith("sgd"):
        return 0
    if name.startswith("adafactor"):
        return 4 * factored
    if "8bit" in name:
        return 2 * trainable
    if name.startswith("lion"):
        return trainable * param_bytes
    return 2 * trainable * param_bytes  # AdamW and the other two-moment optimizers


# ----------------------------------------------------------------------------- the model's shape


@dataclass(frozen=True)
class Shape:
    """What the plan needs of an architecture (counted on the meta device)."""

    name: str
    params: int  # every parameter once (tied embeddings counted once)
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    config_dtype: str | None
    #: (leaf name, in_features, out_features) of each linear layer of one decoder block
    block_linears: tuple[tuple[str, int, int], ...]
    #: parameters outside the decoder blocks (embeddings, final norm, an untied LM head)
    outside_params: int
    tied: bool

    @property
    def block_params(self) -> int:
        return (self.params - self.outside_params) // max(self.layers, 1)

    def linear_params(self, targets: list[str] | None = None) -> int:
        """Weights of the decoder blocks' linear layers (``targets``: those leaf names only)."""
        return self.layers * sum(i * o for n, i, o in self.block_linears if targets is None or n in targets)

    def lora_params(self, r: int, targets: list[str] | None = None) -> int:
        """Parameters of a rank-r LoRA adapter on those linear layers (A: r x in, B: out x r)."""
        return self.layers * sum(r * (i + o) for n, i, o in self.block_linears if targets is None or n in targets)

    def factored(self) -> int:
        """Sum over every weight matrix of rows + columns (adafactor's state, in floats)."""
        block = sum(i + o for _, i, o in self.block_linears)
        return self.layers * block + self.vocab + self.hidden


def _config_of(spec: str, trust_remote_code: bool):
    """(AutoConfig, name) for a model folder, hub id, alias, or a ``config.json`` file."""
    from transformers import AutoConfig

    path = Path(spec).expanduser()
    if path.is_file():
        where = str(path)
    else:
        from .models import check_hub_model, resolve_model

        where = resolve_model(spec)
        if not Path(where).exists():
            check_hub_model(spec, where)
    try:
        return AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code), where
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnlearnError(f"--model {spec}: cannot read its config.json: {first}") from None


def model_shape(spec: str, *, trust_remote_code: bool = False) -> Shape:
    """The :class:`Shape` of a model folder, hub id, alias or config.json, loading no weights."""
    import torch.nn as nn
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config, where = _config_of(spec, trust_remote_code)
    with init_empty_weights():
        try:
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        except (ValueError, KeyError) as exc:
            raise UnlearnError(f"--model {spec}: not a causal LM transformers can build: {exc}") from None
    model.tie_weights()  # (inside init_empty_weights the embeddings stay two parameters)
    params = sum(p.numel() for p in model.parameters())
    blocks = None
    for _, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            if blocks is None or len(module) > len(blocks):
                blocks = module
    if blocks is None:
        raise UnlearnError(f"--model {spec}: cannot find the decoder blocks of {type(model).__name__}")
    linears = tuple(
        (name.rsplit(".", 1)[-1], m.in_features, m.out_features)
        for name, m in blocks[0].named_modules()
        if isinstance(m, nn.Linear)
    )
    inside = sum(p.numel() for p in blocks.parameters())
    text = getattr(config, "text_config", None) or config
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    tied = model.get_output_embeddings() is not None and (
        model.get_output_embeddings().weight is model.get_input_embeddings().weight
    )
    return Shape(
        name=spec,
        params=params,
        hidden=hidden,
        intermediate=int(getattr(text, "intermediate_size", 4 * hidden)),
        layers=len(blocks),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        vocab=int(text.vocab_size),
        config_dtype=str(dtype).replace("torch.", "") if dtype is not None else None,
        block_linears=linears,
        outside_params=params - inside,
        tied=bool(tied),
    )


# ----------------------------------------------------------------------------- stages


@dataclass
class Stage:
    """One stage's peak on one device: named parts in bytes."""

    name: str
    device: str
    parts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def model_bytes(self) -> int:
        """The peak without the process's runtime (what bench/memory_plan.py compares)."""
        return self.total - self.parts.get("runtime", 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.name,
            "device": self.device,
            "total_gib": round(self.total / GiB, 3),
            "parts_mib": {k: round(v / MiB, 1) for k, v in self.parts.items() if v},
            "notes": self.notes,
        }


def nbytes(dtype: str) -> int:
    name = DTYPE_NAMES.get(str(dtype).replace("torch.", ""))
    if name is None:
        raise UnlearnError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    return BYTES[name]


def _runtime(device: str, kind: str) -> int:
    if device.startswith("cuda"):
        return CUDA_CONTEXT_MB * MiB
    return CPU_RUNTIME_MB[kind] * MiB


def _workspace(stage: "Stage", device: str, kind: str) -> None:
    if not device.startswith("cuda"):
        stage.parts["CPU kernels' working memory"] = CPU_WORKSPACE_MB[kind] * MiB


def largest_tensor(shape: "Shape") -> int:
    """Elements of the largest single weight (the embedding, or a block's largest matrix)."""
    return max([shape.vocab * shape.hidden] + [i * o for _, i, o in shape.block_linears])


def block_activation_elems(shape: Shape, *, lora_r: int = 0, lora_targets: int = 0, gqa_in_sdpa: bool = False) -> int:
    """Elements autograd keeps per token in one decoder block during training: the input
    RMSNorm's input, normalised and scaled tensors (3h), q after RoPE (h), k and v as attention
    receives them (repeated to every query head unless SDPA does grouped-query attention),
    attention's output and o_proj's input (2h), the post-attention RMSNorm (3h), the MLP's gate,
    up, activation and product (4i), and each LoRA layer's rank-r intermediate."""
    h, i = shape.hidden, shape.intermediate
    kv = shape.kv_heads * shape.head_dim if gqa_in_sdpa else shape.heads * shape.head_dim
    return 3 * h + h + 2 * kv + 2 * h + 3 * h + 4 * i + lora_r * lora_targets


def training_stage(
    shape: Shape,
    *,
    device: str = "cpu",
    full_finetune: bool = False,
    weight_dtype: str | None = None,
    mixed_precision: str = "auto",
    batch_size: int = 4,
    rows_per_example: int = 2,
    length: int = 512,
    answer_fraction: float = 0.5,
    lora_r: int = 32,
    target_modules: list[str] | None = None,
    optim: str = "adamw_torch",
    gradient_checkpointing: bool = False,
    reference: bool = False,
    reference_dtype: str | None = None,
    name: str = "run",
) -> Stage:
    """An unlearning or fine-tuning run (`unlearn run` / `finetune`), from its second step on
    (optimizer state allocated). ``rows_per_example``: forward passes per example of a
    micro-batch (a forget and a retain row: 2; forget-only: 1)."""
    cuda = device.startswith("cuda")
    bf16_autocast = cuda and mixed_precision in ("auto", "bf16")
    wdtype = weight_dtype or ("float32" if full_finetune or not cuda else "bfloat16")
    wb = nbytes(wdtype)
    act_b = 2 if bf16_autocast or wb == 2 else 4
    stage = Stage(name, "cuda" if cuda else "cpu")
    stage.parts["weights"] = shape.params * wb
    if full_finetune:
        trainable, param_b = shape.params, wb
        factored = shape.factored()
    else:
        trainable, param_b = shape.lora_params(lora_r, target_modules), 4
        stage.parts["lora adapter"] = trainable * 4
        factored = shape.layers * sum(lora_r + i + lora_r + o for n, i, o in shape.block_linears)
        stage.notes.append(f"LoRA r={lora_r}: {trainable / 1e6:.1f}M trainable parameters (fp32)")
    stage.parts["gradients"] = trainable * param_b
    stage.parts["optimizer"] = optimizer_state_bytes(optim, trainable, param_b, factored)
    if full_finetune and optim.startswith("adamw_torch"):
        # CUDA's multi-tensor AdamW: one temporary set (the square roots of every second moment);
        # the CPU's single-tensor loop: two temporaries of the tensor being stepped
        stage.parts["optimizer step temporaries"] = trainable * param_b if cuda else 2 * largest_tensor(shape) * param_b
    if reference:
        if full_finetune:
            rdtype = reference_dtype or ("bfloat16" if bf16_autocast else wdtype)
            stage.parts["reference model"] = shape.params * nbytes(rdtype)
            stage.notes.append(f"reference: a frozen {rdtype} copy")
        else:
            stage.notes.append("reference: the trained model with its adapter off (no copy)")
    rows = batch_size * rows_per_example
    tokens = rows * length
    targets = [n for n, _, _ in shape.block_linears if target_modules is None or n in target_modules]
    per_block = block_activation_elems(
        shape, lora_r=0 if full_finetune else lora_r, lora_targets=0 if full_finetune else len(targets)
    )
    head = 4 * shape.hidden  # the embedding output and the final RMSNorm
    if gradient_checkpointing:
        kept = tokens * (shape.layers * shape.hidden + head) + batch_size * length * per_block
        stage.notes.append("gradient checkpointing: one block's input kept per block, one block recomputed")
    else:
        kept = tokens * (shape.layers * per_block + head)
    stage.parts["activations"] = kept * act_b
    answer_rows = int(tokens * answer_fraction)
    part_answers = int(batch_size * length * answer_fraction)
    # the fp32 log-softmax of every part's answer rows autograd keeps, and at the start of a
    # part's backward the gradient of its whole logits (batch x length x vocab, what the answer
    # rows were picked from) and two answer-sized fp32 gradients
    stage.parts["logits"] = (
        batch_size * length * shape.vocab * act_b + (answer_rows + 2 * part_answers) * shape.vocab * 4
    )
    _workspace(stage, device, "backward")
    stage.parts["runtime"] = _runtime(device, "train")
    return stage


def _weight_bytes(device: str, dtype: str | None) -> int:
    """Bytes per element of frozen weights in ``dtype``, by default bf16 on CUDA and fp32 on CPU."""
    return nbytes(dtype or ("bfloat16" if device.startswith("cuda") else "float32"))


def _frozen_weights(shape: Shape, name: str, device: str, dtype: str | None) -> tuple[Stage, int]:
    """A stage on ``device`` holding the model's frozen weights (:func:`_weight_bytes`), and the
    weights' bytes per element."""
    wb = _weight_bytes(device, dtype)
    stage = Stage(name, "cuda" if device.startswith("cuda") else "cpu")
    stage.parts["weights"] = shape.params * wb
    return stage, wb


def inference_stage(
    shape: Shape,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    batch_size: int = 8,
    length: int = 512,
    name: str = "eval",
    kind: str = "eval",
) -> Stage:
    """A forward without gradient (evaluation, the loss scorer): weights, one block's largest
    temporaries, the key/value cache of the batch and the logits with their fp32 log-softmax."""
    stage, wb = _frozen_weights(shape, name, device, dtype)
    tokens = batch_size * length
    stage.parts["activations"] = tokens * (4 * shape.hidden + 3 * shape.intermediate) * wb
    stage.parts["key/value cache"] = 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * wb
    stage.parts["logits"] = tokens * shape.vocab * (wb + 4)
    _workspace(stage, device, "forward")
    stage.parts["runtime"] = _runtime(device, kind)
    return stage


def mrd_stage(
    shape: Shape,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    precision: str = "fp64",
    chunk: str = "layer",
    batch_size: int = 8,
    length: int = 512,
    samples: int = 20,
) -> Stage:
    """MRD (:mod:`unlearn_plugins.scorers.mrd`): the scored model, its weights in the scoring
    precision (one block at a time, or a whole copy), a batch's forward in that precision."""
    stage = inference_stage(
        shape, device=device, dtype=dtype, batch_size=0, length=length, name=f"score mrd ({precision})", kind="score"
    )
    pb = nbytes(precision)
    wb = _weight_bytes(device, dtype)
    del stage.parts["key/value cache"]
    if chunk == "model":
        # deepcopy (weights' dtype) then .to(precision) tensor by tensor: at the end the copy in
        # the precision, plus the noise of one tensor
        stage.parts[f"{precision} copy of the model"] = shape.params * pb + (shape.params * wb if pb < wb else 0)
        stage.notes.append(f"MRD chunk=model: a whole {precision} copy")
    else:
        outside = shape.outside_params
        stage.parts[f"{precision} embedding, head and one block"] = (outside + shape.block_params) * pb
        stage.notes.append(f"MRD chunk=layer: one decoder block in {precision} at a time")
    # one weight's fp32 noise and its upcast to the precision while it is added
    stage.parts["noise (largest weight)"] = largest_tensor(shape) * (4 + pb)
    tokens = batch_size * length
    # hidden states of the batch and one block's temporaries, in the precision; the logits
    stage.parts["activations"] = tokens * (6 * shape.hidden + 3 * shape.intermediate) * pb
    stage.parts["logits"] = tokens * shape.vocab * (pb + pb)
    stage.parts["log-likelihoods"] = samples * length * 8 * 4
    return stage


def eap_ig_stage(
    shape: Shape,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    steps: int = 5,
    max_rows: int = 20,
    length: int = 512,
    samples: int = 20,
    answer_fraction: float = 0.5,
) -> Stage:
    """CUD's EAP-IG score matrices (inputs mode): the fp32 buffers of the engine (activation
    differences B x sources x length x width, per-head q/k/v/o weight copies, per-layer
    gradient terms, the batch's and every sample's score matrices) and one forward+backward
    over max_rows rows through the frozen model."""
    stage, wb = _frozen_weights(shape, "score cud (EAP-IG)", device, dtype)
    h, L, H = shape.hidden, shape.layers, shape.heads
    b = max(1, max_rows // steps)  # samples per batch
    rows = b * steps
    n_src = 1 + L * H + L
    n_dst = L * (3 * H + 1) + 1
    stage.parts["activation differences (fp32)"] = b * n_src * length * h * 4
    qkv_o = (3 * H * shape.head_dim * h + h * H * shape.head_dim) * L
    stage.parts["per-head weights (fp32)"] = qkv_o * 4
    stage.parts["score matrices (fp32)"] = (b + samples) * n_src * n_dst * 4
    tokens = rows * length
    per_block = block_activation_elems(shape)
    stage.parts["activations"] = tokens * (L * per_block + 4 * h) * wb
    # a block's gradient terms in fp32 while it is reduced: G (b x (3H+1) x T x h) and the
    # rows' q/k/v gradients and stashed inputs
    stage.parts["gradient terms (fp32)"] = (b * (3 * H + 1) * length * h + 6 * tokens * h) * 4
    stage.parts["logits"] = int(tokens * answer_fraction) * shape.vocab * 4 * 2
    _workspace(stage, device, "backward")
    stage.parts["runtime"] = _runtime(device, "score")
    stage.notes.append(
        f"EAP-IG: {b} sample(s) x {steps} steps per pass; buffers fp32 (exactness; not in the model's dtype)"
    )
    return stage


def fila_stage(
    shape: Shape,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    lora_r: int = 32,
    target_modules: list[str] | None = None,
    batch_size: int = 4,
    length: int = 512,
) -> Stage:
    """FILA's (and VILA's) initialisation (:mod:`unlearn_plugins.initializers.fila`): the forget
    and retain Fisher sums (fp32) of every targeted weight, one module's gradient at a time, and a
    training forward+backward of one batch with the decoder blocks recomputed in the backward
    (non-reentrant checkpointing, always on there: one block's input kept per block, one block's
    activations at a time)."""
    stage, wb = _frozen_weights(shape, "init fila", device, dtype)
    stage.parts["lora adapter"] = shape.lora_params(lora_r, target_modules) * 4
    targeted = shape.linear_params(target_modules)
    stage.parts["Fisher sums (fp32, forget and retain)"] = 2 * targeted * 4
    largest = max((i * o for _, i, o in shape.block_linears), default=0)
    stage.parts["gradient (one module)"] = largest * (wb + 4)
    per_block = block_activation_elems(shape)
    tokens = batch_size * length
    stage.parts["activations"] = tokens * (shape.layers * shape.hidden + per_block + 4 * shape.hidden) * wb
    stage.notes.append("FILA: decoder blocks recomputed in the backward (one block's activations at a time)")
    stage.parts["logits"] = tokens * shape.vocab * (wb + 4)
    _workspace(stage, device, "backward")
    stage.parts["runtime"] = _runtime(device, "train")
    return stage


# ----------------------------------------------------------------------------- devices and checks


def parse_size(text: str, where: str = "--device-memory") -> int:
    """Bytes of '80GB', '80GiB', '24G', '512MiB' or a plain number of bytes (GB = GiB here:
    cards are sold in GiB)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise UnlearnError(f"{where} {text!r}: give a size such as 80GB, 24GiB or 512MiB")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()]
    value = float(m.group(1)) * scale
    if not math.isfinite(value) or value <= 0:
        raise UnlearnError(f"{where} {text!r}: must be > 0")
    return int(value)


def available_bytes(device: str) -> tuple[int, str]:
    """(bytes, how it was found) a stage may use on ``device``: a CUDA card's total memory, or
    on CPU the machine's available memory (/proc/meminfo's MemAvailable)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UnlearnError(f"--device {device}: no CUDA device here; state the card's size with --device-memory")
        index = torch.device(device).index or 0
        return torch.cuda.get_device_properties(index).total_memory, f"{torch.cuda.get_device_name(index)}'s total"
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "this machine's available RAM"
    except OSError:
        pass
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, "this machine's RAM"


def check_fits(stages: list[Stage], device_memory: int, how: str, what: str = "the run") -> None:
    """Refuse (one error line) when any stage's peak exceeds ``device_memory``."""
    over = [s for s in stages if s.total > device_memory]
    if over:
        worst = max(over, key=lambda s: s.total)
        top = sorted(worst.parts.items(), key=lambda kv: -kv[1])[:3]
        parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in top)
        raise UnlearnError(
            f"{what} does not fit: stage '{worst.name}' needs about {worst.total / GiB:.1f} GiB on {worst.device} "
            f"({parts} GiB, ...), {how} is {device_memory / GiB:.1f} GiB; nothing was loaded "
            f"(`unlearn plan` shows every part; --device-memory states another size)"
        )


def table(stages: list[Stage], shape: Shape, device_memory: int | None = None, how: str = "") -> str:
    """The plan as text: one row per stage, its total and its parts."""
    lines = [
        f"memory plan for {shape.name}: {shape.params / 1e9:.2f}B parameters, {shape.layers} layers, hidden "
        f"{shape.hidden}, vocab {shape.vocab}" + (f"; {how}: {device_memory / GiB:.1f} GiB" if device_memory else "")
    ]
    width = max(len(s.name) for s in stages)
    for s in stages:
        fits = "" if device_memory is None else ("  fits" if s.total <= device_memory else "  DOES NOT FIT")
        lines.append(f"  {s.name:<{width}}  {s.device:<4}  {s.total / GiB:8.2f} GiB{fits}")
        for part, value in sorted(s.parts.items(), key=lambda kv: -kv[1]):
            if value:
                lines.append(f"      {part:<44} {value / GiB:8.2f} GiB")
        for note in s.notes:
            lines.append(f"      ({note})")
    return "\n".join(lines)


def to_json(stages: list[Stage]) -> str:
    return "\n".join(json.dumps(s.to_dict()) for s in stages)


__all__ = [
    "Shape",
    "Stage",
    "model_shape",
    "training_stage",
    "inference_stage",
    "mrd_stage",
    "eap_ig_stage",
    "fila_stage",
    "available_bytes",
    "check_fits",
    "parse_size",
    "table",
    "optimizer_needs_bitsandbytes",
    "check_optimizer_available",
]
