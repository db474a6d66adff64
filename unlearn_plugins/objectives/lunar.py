"""LUNAR, unlearning by neural activation redirection (Shen et al. 2025; open-unlearning
``src/trainer/unlearn/lunar.py``): no gradient step on the language-model loss; instead, for each
chosen layer, the MLP's down-projection is refitted so that on the forget set it writes its old
output plus ``coeff * direction`` (a direction from the forget prompts towards prompts the model
refuses), and on the retain set its old output.

The procedure, per layer ``l`` of ``layer_idx_list``:

1. direction: the mean residual stream after block ``l`` at the last token of the refusal
   prompts (``direction_prompts``), minus the same over the forget questions (raw text, no
   prompt format);
2. over every token of every forget and retain example (prompt and answer, one example per
   forward pass): the down-projection's input ``x``, and the target ``h_block - h_mid``
   (the block's output minus its input to ``post_attention_layernorm``, i.e. the MLP's output),
   plus ``coeff * direction`` on forget tokens;
3. a copy of the down-projection weight (``net_dtype``, bf16 as the reference's) trained on
   the mixed forget and retain rows: MSE (summed over layers), AdamW(lr), ExponentialLR(0.9) per
   epoch, ``num_epochs`` epochs of shuffled batches of ``batch_size``;
4. the trained weight replaces the model's.

It runs once, in the objective's ``finish`` step; its ``training_step`` leaves no gradient, so
the run's own optimizer steps change nothing (as the reference's ``train`` skips the Trainer's
loop). Llama-style decoder layers only (``post_attention_layernorm``, ``mlp.down_proj``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from ..errors import UnlearnError
from ..options import attributes
from .base import RetainDataObjective, check_option, mean_nll

NET_DTYPES = ("bfloat16", "float32")
#: the refusal prompts used when ``direction_prompts`` is not given: 24 requests of the kind the
#: reference's ``harmful.json`` (AdvBench-style) holds, written for this package
SHIPPED_PROMPTS = Path(__file__).with_name("lunar_refusal_prompts.txt")


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of ``path``: a JSON list (of strings, or of objects with ``instruction``,
    ``question``, ``prompt`` or ``text``, as the reference's ``harmful.json``), JSON lines of
    such objects, or plain text with one prompt per line."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UnlearnError(f"objective 'lunar': cannot read direction_prompts {path} ({exc.strerror or exc})") from None

    def prompt(item: Any, where: str) -> str:
        if isinstance(item, str):
            return item
        if isinstance(item, dict):
            for key in ("instruction", "question", "prompt", "text"):
                if isinstance(item.get(key), str):
                    return item[key]
        raise UnlearnError(
            f"objective 'lunar': direction_prompts {where}: expected a string or an object with "
            f"'instruction', 'question', 'prompt' or 'text'"
        )

    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UnlearnError(
                f"objective 'lunar': direction_prompts {path}:{exc.lineno}: not JSON ({exc.msg})"
            ) from None
        prompts = [prompt(item, f"{path} item {i}") for i, item in enumerate(items)]
    elif stripped.startswith("{"):
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    prompts.append(prompt(json.loads(line), f"{path}:{n}"))
                except json.JSONDecodeError as exc:
                    raise UnlearnError(
                        f"objective 'lunar': direction_prompts {path}:{n}: not JSON ({exc.msg})"
                    ) from None
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise UnlearnError(f"objective 'lunar': direction_prompts {path} holds no prompt")
    return prompts


def decoder_layers(model):
    """The decoder layers (the ModuleList named ``layers``) of a model, through wrappers."""
    import torch

    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "layers" and isinstance(module, torch.nn.ModuleList):
            return module
    raise UnlearnError("objective 'lunar': cannot find the model's decoder layers (a module list named 'layers')")


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def last_token_means(model, tokenizer, prompts, block: int, max_length: int = 512):
    """Mean over ``prompts`` of the input of decoder block ``block`` at the last token (each
    prompt tokenized as raw text, alone, as by the reference's tokenizer call)."""
    import torch

    layers = decoder_layers(model)
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    total = torch.zeros(int(model.config.hidden_size), dtype=dtype, device=device)
    seen = {}

    def keep(_module, args):
        seen["h"] = _first(args)[0, -1, :].to(dtype)

    handle = layers[block].register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            for text in prompts:
                enc = tokenizer([text], truncation=True, max_length=max_length, return_tensors="pt")
                model(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device))
                total += seen["h"]
    finally:
        handle.remove()
    return (1.0 / len(prompts)) * total


def layer_activations(model, examples, layer: int):
    """Per example (one forward pass each, no padding): the down-projection's input (T, d_ff),
    the block's output (T, d) and its ``post_attention_layernorm`` input (T, d), of layer ``layer``."""
    import torch

    block = decoder_layers(model)[layer]
    device = next(model.parameters()).device
    seen: dict[str, Any] = {}
    hooks = [
        block.register_forward_hook(lambda _m, _a, out: seen.__setitem__("post", _first(out)[0].detach().clone())),
        block.post_attention_layernorm.register_forward_pre_hook(
            lambda _m, args: seen.__setitem__("mid", _first(args)[0].detach().clone())
        ),
        block.mlp.down_proj.register_forward_pre_hook(
            lambda _m, args: seen.__setitem__("x", _first(args)[0].detach().clone())
        ),
    ]
    rows = []
    try:
        with torch.no_grad():
            for example in examples:
                ids = torch.tensor([list(example["input_ids"])], device=device)
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
                rows.append((seen["x"], seen["post"], seen["mid"]))
    finally:
        for h in hooks:
            h.remove()
    return rows


class _Rows:
    """Rows of one split, one tensor per layer (the reference's ActivationDataset_multiple_layers)."""

    def __init__(self, inputs, targets):
        self.inputs, self.targets = inputs, targets

    def __len__(self):
        return self.inputs[0].shape[0]

    def __getitem__(self, i):
        return [x[i] for x in self.inputs], [t[i] for t in self.targets]


def fit_down_projections(weights, forget, retain, *, lr, num_epochs, batch_size, dtype, seed, device):
    """Train one copy of each down-projection weight on the forget and retain rows together
    (MSE summed over layers; AdamW, ExponentialLR(0.9) per epoch); returns the trained weights.
    ``forget`` and ``retain``: (inputs per layer, targets per layer)."""
    import torch
    from torch.utils.data import ConcatDataset, DataLoader

    nets = []
    for w in weights:
        net = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            net.weight.copy_(w)
        nets.append(net.to(device, dtype=dtype))
    data = ConcatDataset([_Rows(*forget), _Rows(*retain)])
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=generator)
    optimizer = torch.optim.AdamW([p for net in nets for p in net.parameters()], lr=lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    mse = torch.nn.MSELoss()
    last = None
    for net in nets:
        net.train()
    for _ in range(num_epochs):
        for inputs, targets in loader:
            optimizer.zero_grad()
            outputs = [net(x.to(device, dtype)) for net, x in zip(nets, inputs)]
            loss = sum(mse(out, t.to(device, dtype)) for out, t in zip(outputs, targets))
            loss.backward()
            optimizer.step()
            last = loss.detach()
        scheduler.step()
    return [net.weight.detach() for net in nets], last


class LUNAR(RetainDataObjective):
    """Refit the down-projection of ``layer_idx_list``'s layers so that forget activations are
    redirected by ``coeff * direction`` and retain activations are kept (module docstring)."""

    name = "lunar"
    revision = 2  # direction_prompts defaults to the shipped prompts (before: required)

    def __init__(
        self,
        *,
        layer_idx_list: Annotated[list[int], "decoder layers whose MLP down-projection is refitted"] = [7],  # noqa: B006 - copied, never changed
        coeff_list: Annotated[
            list[float] | None, "scale of the direction added per layer (None: 2.0 for each layer)"
        ] = None,
        direction_prompts: Annotated[
            str | None,
            "file of prompts the model refuses (the reference's harmful.json): JSON list, JSON lines or one per "
            "line (None: the 24 shipped in objectives/lunar_refusal_prompts.txt)",
        ] = None,
        lr: Annotated[float, "learning rate of the down-projection refit (AdamW)"] = 1e-3,
        num_epochs: Annotated[int, "epochs of the refit over all forget and retain token rows"] = 100,
        batch_size: Annotated[int, "token rows per refit step"] = 64,
        net_dtype: Annotated[str, "dtype of the refitted weight during training ('bfloat16' as the reference)"] = (
            "bfloat16"
        ),
        seed: Annotated[int | None, "shuffling seed of the refit (None: the run's seed)"] = None,
    ):
        layers = [int(i) for i in layer_idx_list]
        check_option(
            self.name,
            "layer_idx_list",
            layer_idx_list,
            bool(layers) and min(layers) >= 0,
            "a non-empty list of layer indices >= 0",
        )
        coeffs = [2.0] * len(layers) if coeff_list is None else [float(c) for c in coeff_list]
        if len(coeffs) < len(layers):  # the reference pads a short list with 2.0
            coeffs += [2.0] * (len(layers) - len(coeffs))
        check_option(self.name, "lr", lr, lr > 0, "a number > 0")
        check_option(self.name, "num_epochs", num_epochs, int(num_epochs) >= 1, "an integer >= 1")
        check_option(self.name, "batch_size", batch_size, int(batch_size) >= 1, "an integer >= 1")
        check_option(self.name, "net_dtype", net_dtype, net_dtype in NET_DTYPES, "'bfloat16' or 'float32'")
        self.layer_idx_list = layers
        self.coeff_list = coeffs[: len(layers)]
        self.direction_prompts = direction_prompts
        self.lr = float(lr)
        self.num_epochs = int(num_epochs)
        self.batch_size = int(batch_size)
        self.net_dtype = net_dtype
        self.seed = seed
        self.last_terms: dict[str, Any] = {}
        self._prompts: list[str] | None = None

    def loss(self, model, batch, reference_model=None):
        """The reference's placeholder loss, ``-NLL(forget)``; never back-propagated (see
        :meth:`training_step`)."""
        return -mean_nll(model, batch["forget"])

    def training_step(self, model, batch, reference_model, step):
        """No gradient: the optimizer steps leave the weights as they are; the work is in
        :meth:`finish`."""
        import torch

        return torch.zeros((), device=batch["forget"]["input_ids"].device)

    def prepare(self, context):
        from peft import PeftModel

        model = getattr(context.model, "module", context.model)
        if isinstance(model, PeftModel):
            raise UnlearnError(
                "objective 'lunar' rewrites MLP down-projection weights of the model itself (the "
                "reference trains no adapter): run it with --full-finetune"
            )
        self._prompts = read_prompts(self.direction_prompts or SHIPPED_PROMPTS)
        layers = decoder_layers(model)
        for i in self.layer_idx_list:
            if i >= len(layers):
                raise UnlearnError(
                    f"objective 'lunar': option 'layer_idx_list' names layer {i}, but the model has {len(layers)} layers"
                )
            block = layers[i]
            if not (hasattr(block, "post_attention_layernorm") and hasattr(getattr(block, "mlp", None), "down_proj")):
                raise UnlearnError(
                    f"objective 'lunar': layer {i} has no post_attention_layernorm and mlp.down_proj "
                    f"(LUNAR needs Llama-style decoder layers)"
                )
        if self.seed is None:
            self.seed = int(context.seed)
        context.info["lunar"] = {"layers": self.layer_idx_list, "direction_prompts": len(self._prompts)}
        return None

    def directions(self, model, tokenizer, forget_questions, max_length: int = 512):
        """Per layer: mean refusal-prompt activation minus mean forget-question activation, at
        the last token of the input of block ``l + 1`` (the output of block ``l``; the last
        block's input when ``l`` is the last layer, as the reference clamps)."""
        n = len(decoder_layers(model))
        out = []
        for layer in self.layer_idx_list:
            block = min(max(layer + 1, 0), n - 1)
            refuse = last_token_means(model, tokenizer, self._prompts, block, max_length)
            forget = last_token_means(model, tokenizer, forget_questions, block, max_length)
            out.append(refuse - forget)
        return out

    def finish(self, model, context):
        """The whole LUNAR update, written into the model's down-projection weights."""
        import torch

        if self._prompts is None:
            raise UnlearnError("objective 'lunar': finish() called without prepare()")
        model = getattr(model, "module", model)
        was_training = model.training
        model.eval()
        questions = [s.question for s in context.forget_samples]
        directions = self.directions(model, context.tokenizer, questions, context.max_length)
        forget_in, forget_out, retain_in, retain_out, weights = [], [], [], [], []
        layers = decoder_layers(model)
        for layer, direction, coeff in zip(self.layer_idx_list, directions, self.coeff_list):
            forget = layer_activations(model, context.forget, layer)
            retain = layer_activations(model, context.retain, layer)
            forget_in.append(torch.cat([x for x, _, _ in forget]))
            forget_out.append(torch.cat([post + coeff * direction - mid for _, post, mid in forget]))
            retain_in.append(torch.cat([x for x, _, _ in retain]))
            retain_out.append(torch.cat([post - mid for _, post, mid in retain]))
            weights.append(layers[layer].mlp.down_proj.weight.detach().clone())
        device = next(model.parameters()).device
        dtype = getattr(torch, self.net_dtype)
        with torch.enable_grad():
            trained, last = fit_down_projections(
                weights,
                (forget_in, forget_out),
                (retain_in, retain_out),
                lr=self.lr,
                num_epochs=self.num_epochs,
                batch_size=self.batch_size,
                dtype=dtype,
                seed=int(self.seed),
                device=device,
            )
        with torch.no_grad():
            for layer, w in zip(self.layer_idx_list, trained):
                layers[layer].mlp.down_proj.weight.copy_(w)
        model.train(was_training)
        context.info["lunar"].update(
            forget_rows=int(forget_in[0].shape[0]),
            retain_rows=int(retain_in[0].shape[0]),
            final_mse=float(last) if last is not None else None,
        )

    def options(self) -> dict[str, Any]:
        return attributes(self, "layer_idx_list coeff_list direction_prompts lr num_epochs batch_size net_dtype seed")

    def __repr__(self) -> str:
        return (
            f"lunar(layer_idx_list={self.layer_idx_list!r}, coeff_list={self.coeff_list!r}, lr={self.lr!r}, "
            f"num_epochs={self.num_epochs!r}, batch_size={self.batch_size!r}, net_dtype={self.net_dtype!r})"
        )
