"""EAP-IG edge scores on Hugging Face decoder-only models (Llama, Mistral, Qwen2 families:
pre-norm RMSNorm blocks, grouped-query attention), batched and without TransformerLens.

score(u -> d) = (a_u(corrupt) - a_u(clean)) . sum over IG steps of grad_d(metric),
summed over positions and divided by the number of steps, one matrix per sample
(layout: :mod:`unlearn_plugins.circuits.graph`).

Modes (docs/methods.md, "EAP-IG baselines"):

- ``inputs`` (default): the input embedding is interpolated from the baseline to the
  clean input, alpha = k/m for k = 0..m-1 (k = 1..m with the zero baseline, see
  :attr:`EAPIG.alphas`); m rows per sample, all in one batch.
- ``activations`` (the CUD paper code's variant, kept as the reference): for each of
  the 2L+1 layer nodes (input, each attention layer, each MLP) and k = 1..m, that
  node's output is replaced by alpha clean + (1 - alpha) corrupt (alpha = k/m) in a
  clean run; gradients of every run count for every edge; (2L+1) m rows per sample.

Baselines: ``zero`` (every source's corrupt activation is 0: zero ablation, as in the
paper code), ``mean``, ``other`` (the nearest-length other sample, cut or padded with the
pad token to the same length). ``mean`` in ``inputs`` mode: the corrupt input is the mean
input embedding over a data set's tokens at every position, and the corrupt activations
are that input's own forward pass, as for any corrupt input (docs/methods.md); in
``activations`` mode each node is mean-ablated: its corrupt output is its mean over the
data set's tokens.

Why it is fast: clean and corrupt source activations come from one no-grad forward
per batch; the model runs once per batch of (step x sample) rows with frozen weights;
per-head q/k/v gradients at the pre-norm residual are never materialised per IG step:
the RMSNorm backward is split into a part linear in the gradient (summed over steps
first, then projected by W^T once) and a rank-one part that only needs the q/k/v
outputs; one batched matmul per layer then contracts with the activation differences.
The LM head runs only at answer positions. Accumulation is in fp32.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..data.qa import IGNORE_INDEX
from ..errors import ModelError
from .graph import Graph

MODES = ("inputs", "activations")
BASELINES = ("zero", "mean", "other")
METRICS = ("prob", "logprob")


# ----------------------------------------------------------------------------- model access


@dataclass
class Architecture:
    """The modules of a Llama-style causal LM that the engine hooks."""

    base: Any  # the decoder (LlamaModel): embed_tokens, layers, norm
    lm_head: Any
    layers: list
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int

    @property
    def groups(self) -> int:
        return self.n_heads // self.n_kv_heads


def _unwrap(model):
    """The transformers model under a PEFT wrapper."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _norm_eps(norm, where: str) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:
        eps = getattr(norm, "eps", None)
    if eps is None or getattr(norm, "weight", None) is None:
        raise ModelError(f"{where}: {type(norm).__name__} is not an RMSNorm with a weight and an epsilon")
    return float(eps)


def resolve_architecture(model) -> Architecture:
    """Find the decoder, layers and heads; fail with the missing attribute named."""
    inner = _unwrap(model)
    name = type(inner).__name__
    base = getattr(inner, "model", None)
    lm_head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if base is None or lm_head is None:
        raise ModelError(f"EAP-IG: {name} is not a decoder-only causal LM with .model and an LM head")
    for attr in ("embed_tokens", "layers", "norm"):
        if not hasattr(base, attr):
            raise ModelError(f"EAP-IG: {name}.model has no '{attr}' (supported: Llama, Mistral, Qwen2 families)")
    layers = list(base.layers)
    for i, layer in enumerate(layers):
        for attr in ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp"):
            if not hasattr(layer, attr):
                raise ModelError(f"EAP-IG: {name} layer {i} has no '{attr}' (a pre-norm block is required)")
        for attr in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not hasattr(layer.self_attn, attr):
                raise ModelError(
                    f"EAP-IG: {name} layer {i} attention has no '{attr}' (separate q/k/v/o projections are required)"
                )
    config = inner.config
    n_heads = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    d_model = int(config.hidden_size)
    head_dim = int(
        getattr(layers[0].self_attn, "head_dim", None) or getattr(config, "head_dim", None) or d_model // n_heads
    )
    if n_heads % n_kv:
        raise ModelError(f"EAP-IG: {name}: {n_heads} query heads are not a multiple of {n_kv} key/value heads")
    return Architecture(base, lm_head, layers, n_heads, n_kv, head_dim, d_model)


def effective_weight(linear):
    """The weight a linear layer applies, PEFT LoRA deltas included (unmerged adapters)."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight
    weight = base.weight
    if getattr(linear, "merged", False) or getattr(linear, "disable_adapters", False):
        return weight
    for adapter in getattr(linear, "active_adapters", []):
        if adapter in getattr(linear, "lora_A", {}):
            weight = weight + linear.get_delta_weight(adapter)
    return weight


def effective_bias(linear):
    base = getattr(linear, "base_layer", linear)
    return getattr(base, "bias", None)


def _check_rmsnorm(norm, d_model: int, where: str) -> float:
    """Verify numerically that ``norm`` is w * x / sqrt(mean(x^2) + eps) (what the
    hand-written RMSNorm backward assumes); return eps."""
    import torch

    eps = _norm_eps(norm, where)
    weight = norm.weight
    x = torch.randn(2, d_model, generator=torch.Generator().manual_seed(0)).to(weight.device, weight.dtype)
    with torch.no_grad():
        got = norm(x).float()
        xf = x.float()
        want = weight.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    tol = 1e-4 if weight.dtype == torch.float32 else 5e-2
    if not torch.allclose(got, want, rtol=tol, atol=tol):
        raise ModelError(
            f"EAP-IG: {where} ({type(norm).__name__}) does not compute w * x / rms(x); "
            f"only RMSNorm pre-norm models are supported"
        )
    return eps


# ----------------------------------------------------------------------------- engine


class EAPIG:
    """Per-sample EAP-IG score matrices for a model.

    ``examples`` are encoded QA dicts (input_ids, attention_mask, labels with -100
    outside answer tokens) as built by :func:`unlearn_plugins.data.qa.encode_samples`.
    The metric is the mean answer-token probability exp(-mean NLL) (``prob``) or the
    mean answer-token log-probability (``logprob``), answer tokens only.
    ``max_rows`` bounds the rows of one forward/backward (memory): samples per batch =
    max_rows // rows per sample (or ``batch_size``); activations mode splits a sample's
    rows over several passes. ``mean_examples``: the data set of the ``mean`` baseline
    (default: the scored examples).
    """

    def __init__(
        self,
        model,
        *,
        mode: str = "inputs",
        steps: int = 5,
        baseline: str = "zero",
        metric: str = "prob",
        max_rows: int = 20,
        batch_size: int | None = None,
        mean_examples: Sequence[dict] | None = None,
        pad_token_id: int | None = None,
        progress: bool = False,
    ):
        if mode not in MODES:
            raise ValueError(f"EAP-IG mode {mode!r}: choose one of {', '.join(MODES)}")
        if baseline not in BASELINES:
            raise ValueError(f"EAP-IG baseline {baseline!r}: choose one of {', '.join(BASELINES)}")
        if metric not in METRICS:
            raise ValueError(f"EAP-IG metric {metric!r}: choose one of {', '.join(METRICS)}")
        if int(steps) < 1:
            raise ValueError(f"EAP-IG steps must be >= 1, got {steps}")
        self.model = model
        self.arch = resolve_architecture(model)
        self.graph = Graph(len(self.arch.layers), self.arch.n_heads)
        self.mode, self.steps, self.baseline, self.metric = mode, int(steps), baseline, metric
        self.max_rows = max(1, int(max_rows))
        self.batch_size = batch_size
        self.mean_examples = mean_examples
        self.progress = progress
        config = _unwrap(model).config
        if pad_token_id is None:
            pad_token_id = getattr(config, "pad_token_id", None)
            if pad_token_id is None:
                eos = getattr(config, "eos_token_id", None)
                pad_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
        self.pad_token_id = int(pad_token_id or 0)
        a = self.arch
        self.eps_in, self.eps_post = [], []
        for i, layer in enumerate(a.layers):
            self.eps_in.append(_check_rmsnorm(layer.input_layernorm, a.d_model, f"layer {i} input_layernorm"))
            self.eps_post.append(
                _check_rmsnorm(layer.post_attention_layernorm, a.d_model, f"layer {i} post_attention_layernorm")
            )
        self.eps_final = _check_rmsnorm(a.base.norm, a.d_model, "final norm")
        self._means = None
        self._w = None  # per-head weights while scoring
        #: seconds spent so far: clean/corrupt source forwards, IG forwards, IG backwards
        #: (gradient hooks included) and the hooks' own reduction + contraction work
        self.timings = {"sources": 0.0, "forward": 0.0, "backward": 0.0, "hooks": 0.0}

    # ------------------------------------------------------------------ public API
    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def alphas(self) -> list[float]:
        """IG points of ``inputs`` mode: k/m for k = 0..m-1 (hannamw/EAP-IG), except with the
        zero baseline, where k = 1..m: an all-zero input is a singular point of every RMSNorm
        (its Jacobian there is 1/sqrt(eps)), so the gradient at alpha = 0 grows like
        eps^(-L/2) and overflows in deep models (NaN in SmolLM2-135M)."""
        shift = 1 if self.baseline == "zero" else 0
        return [(k + shift) / self.steps for k in range(self.steps)]

    @property
    def variants(self) -> int:
        """Rows per sample: m in ``inputs`` mode, (2L + 1) m in ``activations`` mode."""
        if self.mode == "inputs":
            return self.steps
        return (2 * len(self.arch.layers) + 1) * self.steps

    def score(self, examples: Sequence[dict]):
        """(n, n_src, n_dst) fp32 CPU tensor of per-sample edge scores (0 off the edge mask)."""
        import torch

        out = torch.zeros((len(examples), self.graph.n_src, self.graph.n_dst), dtype=torch.float32)
        for idx, scores in self.iter_scores(examples):
            out[idx] = scores
        return out

    def iter_scores(
        self, examples: Sequence[dict], indices: Sequence[int] | None = None
    ) -> Iterator[tuple[list[int], Any]]:
        """Yield (indices, (b, n_src, n_dst) CPU scores) batch by batch, shortest first.
        ``indices``: score only these examples; the ``mean`` and ``other`` baselines still use
        all of ``examples`` (so a shard of a set gets the same corrupt inputs as the whole set)."""

        targets = range(len(examples)) if indices is None else list(indices)
        if not examples or not targets:
            return
        for i in targets:
            if not any(x != IGNORE_INDEX for x in examples[i]["labels"][1:]):
                raise ValueError(f"EAP-IG: example {i} has no answer tokens (labels are all {IGNORE_INDEX})")
        if self.baseline == "mean" and self._means is None:
            self._means = self._mean_sources(self.mean_examples or examples)
        corrupt_ids = self._other_samples(examples) if self.baseline == "other" else None
        batch = self.batch_size or max(1, self.max_rows // self.variants)
        order = sorted(targets, key=lambda i: len(examples[i]["input_ids"]))
        batches = [order[i : i + batch] for i in range(0, len(order), batch)]
        if self.progress:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc=f"EAP-IG ({self.mode}, m={self.steps})", unit="batch")
        mask = self.graph.edge_mask
        with self._frozen():
            for idx in batches:
                scores = self._score_batch(
                    [examples[i] for i in idx], [corrupt_ids[i] for i in idx] if corrupt_ids else None
                )
                yield idx, scores.cpu() * mask

    def source_activations(self, input_ids, attention_mask=None):
        """Clean source outputs (B, n_src, T, D) fp32: input, per-head shares of o_proj, MLPs."""
        import torch

        with self._frozen(), torch.no_grad():
            buf, _ = self._sources(
                input_ids.to(self.device), None if attention_mask is None else attention_mask.to(self.device), sign=1.0
            )
        return buf

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def _frozen(self):
        """Weights frozen and eval mode for the duration; k/v expanded per query head."""
        was_training = self.model.training
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        groups = [
            (layer.self_attn, getattr(layer.self_attn, "num_key_value_groups", None)) for layer in self.arch.layers
        ]
        self.model.eval()
        for p, _ in flags:
            p.requires_grad_(False)
        outer = self._w is None
        if outer:
            self._w = self._load_weights()
        try:
            yield
        finally:
            if outer:
                self._w = None
            for p, flag in flags:
                p.requires_grad_(flag)
            for attn, g in groups:
                if g is not None:
                    attn.num_key_value_groups = g
            self.model.train(was_training)

    def _pad(self, examples: Sequence[dict], ids_override=None):
        import torch

        from ..data.qa import pad_batch

        batch = pad_batch(examples, self.pad_token_id)
        dev = self.device
        ids, mask, labels = batch["input_ids"].to(dev), batch["attention_mask"].to(dev), batch["labels"].to(dev)
        corrupt = None
        if ids_override is not None:
            corrupt = torch.full_like(ids, self.pad_token_id)
            for i, row in enumerate(ids_override):
                corrupt[i, : len(row)] = torch.tensor(row, device=dev)
        return ids, mask, labels, corrupt

    def _other_samples(self, examples: Sequence[dict]) -> list[list[int]]:
        """For each example, the nearest-length other example's tokens, cut or padded to its length."""
        if len(examples) < 2:
            raise ValueError("EAP-IG baseline 'other' needs at least two samples")
        lengths = [len(e["input_ids"]) for e in examples]
        out = []
        for i, n in enumerate(lengths):
            j = min((k for k in range(len(examples)) if k != i), key=lambda k: (abs(lengths[k] - n), k))
            ids = list(examples[j]["input_ids"][:n])
            out.append(ids + [self.pad_token_id] * (n - len(ids)))
        return out

    def _load_weights(self):
        """Effective per-head weights of every layer (fp32), computed once per scoring call:
        W_q, W_k, W_v per query head stacked (3H, dh, D) and W_O split by head (D, H, dh)."""
        import torch

        a = self.arch
        kv_of_head = torch.arange(a.n_heads, device=self.device) // a.groups
        out = []
        with torch.no_grad():
            for layer in a.layers:
                attn = layer.self_attn
                wq = effective_weight(attn.q_proj).float().view(a.n_heads, a.head_dim, a.d_model)
                wk = effective_weight(attn.k_proj).float().view(a.n_kv_heads, a.head_dim, a.d_model)[kv_of_head]
                wv = effective_weight(attn.v_proj).float().view(a.n_kv_heads, a.head_dim, a.d_model)[kv_of_head]
                wo = effective_weight(attn.o_proj).float().view(a.d_model, a.n_heads, a.head_dim)
                out.append({"qkv": torch.cat([wq, wk, wv]), "o": wo})
        return out

    def _sources(self, ids, mask, sign: float, buf=None, inputs_embeds=None, keep_nodes: bool = False):
        """One no-grad forward; adds ``sign`` x each source output into buf (B, n_src, T, D) fp32.
        With keep_nodes, also returns the node outputs (embedding, attention, MLP per layer)."""
        import torch

        a, g = self.arch, self.graph
        emb = a.base.embed_tokens(ids) if inputs_embeds is None else inputs_embeds
        B, T = emb.shape[:2]
        if buf is None:
            buf = torch.zeros((B, g.n_src, T, a.d_model), dtype=torch.float32, device=emb.device)
        buf[:, 0].add_(emb.float(), alpha=sign)
        nodes = {"input": emb, "attn": [None] * len(a.layers), "mlp": [None] * len(a.layers)}
        handles = []

        def attn_hook(l, wo):
            def pre(module, args):
                z = args[0].float().view(B, T, a.n_heads, a.head_dim)
                start = g.src_head(l, 0)
                buf[:, start : start + a.n_heads].add_(torch.einsum("bthe,dhe->bhtd", z, wo), alpha=sign)

            def post(module, args, out):
                if keep_nodes:
                    nodes["attn"][l] = out.detach()

            return pre, post

        def mlp_hook(l):
            def post(module, args, out):
                buf[:, g.src_mlp(l)].add_(out.float(), alpha=sign)
                if keep_nodes:
                    nodes["mlp"][l] = out.detach()

            return post

        try:
            for l, layer in enumerate(a.layers):
                pre, post = attn_hook(l, self._w[l]["o"])
                handles.append(layer.self_attn.o_proj.register_forward_pre_hook(pre))
                handles.append(layer.self_attn.o_proj.register_forward_hook(post))
                handles.append(layer.mlp.register_forward_hook(mlp_hook(l)))
            a.base(inputs_embeds=emb, attention_mask=mask, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        return buf, nodes

    def _mean_sources(self, examples: Sequence[dict]):
        """Each source's mean output over the tokens of ``examples`` (n_src, D) fp32."""
        import torch

        total, count = None, 0
        with self._frozen(), torch.no_grad():
            for i in range(0, len(examples), 8):
                ids, mask, _, _ = self._pad(examples[i : i + 8])
                buf, _ = self._sources(ids, mask, sign=1.0)
                m = mask.to(buf.dtype)[:, None, :, None]
                part = (buf * m).sum(dim=(0, 2))
                total = part if total is None else total + part
                count += int(mask.sum())
        return total / max(count, 1)

    # ------------------------------------------------------------------ one batch
    def _score_batch(self, examples: Sequence[dict], corrupt_rows):
        import torch

        a, g = self.arch, self.graph
        ids, mask, labels, corrupt_ids = self._pad(examples, corrupt_rows)
        B, T = ids.shape
        V = self.variants
        chunk = max(1, self.max_rows // B)
        keep = self.mode == "activations"
        # In inputs mode with one pass, sources are captured from the IG rows themselves:
        # the alpha = 1 row is the clean input (zero baseline), alpha = 0 the corrupt one.
        one_pass = self.mode == "inputs" and chunk >= V
        capture: dict[int, float] = {}
        t0 = time.perf_counter()
        with torch.no_grad():
            clean_emb = a.base.embed_tokens(ids)
            corrupt_nodes = None
            if one_pass and self.baseline == "zero":
                diff = torch.zeros((B, g.n_src, T, a.d_model), dtype=torch.float32, device=clean_emb.device)
                clean_nodes = None
                capture[V - 1] = -1.0
            else:
                diff, clean_nodes = self._sources(ids, mask, sign=-1.0, inputs_embeds=clean_emb, keep_nodes=keep)
            if self.baseline == "zero":
                base_emb = torch.zeros_like(clean_emb)
            elif self.baseline == "mean":
                means = self._means.to(diff.device)
                base_emb = means[0].to(clean_emb.dtype).expand_as(clean_emb)
                if keep:  # activations mode: every node is mean-ablated, its corrupt output is its mean
                    diff += means[None, :, None, :]
                elif one_pass:  # inputs mode: the alpha = 0 row is the mean-embedding input itself
                    capture[0] = 1.0
                else:  # inputs mode: corrupt sources from a forward of the mean-embedding input
                    self._sources(ids, mask, sign=1.0, buf=diff, inputs_embeds=base_emb)
            else:
                base_emb = a.base.embed_tokens(corrupt_ids)
                if one_pass:
                    capture[0] = 1.0
                else:
                    _, corrupt_nodes = self._sources(
                        corrupt_ids, mask, sign=1.0, buf=diff, inputs_embeds=base_emb, keep_nodes=keep
                    )
        if keep and corrupt_nodes is None:
            corrupt_nodes = self._baseline_nodes(clean_nodes, base_emb)
        self.timings["sources"] += time.perf_counter() - t0

        scores = torch.zeros((B, g.n_src, g.n_dst), dtype=torch.float32, device=diff.device)
        for v0 in range(0, V, chunk):
            variants = list(range(v0, min(V, v0 + chunk)))
            self._pass(
                variants,
                ids,
                mask,
                labels,
                clean_emb,
                base_emb,
                clean_nodes,
                corrupt_nodes,
                diff,
                scores,
                capture if v0 == 0 else {},
            )
        scores /= V
        return scores

    def _baseline_nodes(self, clean_nodes, base_emb):
        """Corrupt node outputs for the zero and mean baselines (activations mode)."""
        import torch

        nodes = {"input": base_emb, "attn": [], "mlp": []}
        for l, layer in enumerate(self.arch.layers):
            ref_a, ref_m = clean_nodes["attn"][l], clean_nodes["mlp"][l]
            if self.baseline == "zero":
                nodes["attn"].append(torch.zeros_like(ref_a))
                nodes["mlp"].append(torch.zeros_like(ref_m))
            else:
                g = self.graph
                means = self._means.to(ref_a.device)
                attn_mean = means[g.src_head(l, 0) : g.src_head(l, 0) + self.arch.n_heads].sum(0)
                bias = effective_bias(layer.self_attn.o_proj)
                if bias is not None:
                    attn_mean = attn_mean + bias.float()
                nodes["attn"].append(attn_mean.to(ref_a.dtype).expand_as(ref_a))
                nodes["mlp"].append(means[g.src_mlp(l)].to(ref_m.dtype).expand_as(ref_m))
        return nodes

    def _pass(
        self, variants, ids, mask, labels, clean_emb, base_emb, clean_nodes, corrupt_nodes, diff, scores, capture
    ):
        """One forward + backward over rows (variant, sample); gradients are reduced over the
        variants and contracted with ``diff`` into ``scores`` layer by layer during backward.
        ``capture`` {variant: sign}: add sign x that variant's source outputs to ``diff`` during
        the forward (before any contraction needs them)."""
        import torch

        a, g = self.arch, self.graph
        B, T = ids.shape
        Vc = len(variants)
        D, H, dh = a.d_model, a.n_heads, a.head_dim
        m = self.steps
        dev = clean_emb.device

        # --- inputs of the rows and the node patches (activations mode)
        patches: dict[tuple[str, int], tuple[Any, Any]] = {}
        if self.mode == "inputs":
            alphas = torch.tensor([self.alphas[v] for v in variants], device=dev, dtype=torch.float32)
            emb = base_emb.float()[None] + alphas[:, None, None, None] * (clean_emb.float() - base_emb.float())[None]
        else:
            emb = clean_emb.float()[None].repeat(Vc, 1, 1, 1)
            by_node: dict[int, list[tuple[int, float]]] = {}
            for i, v in enumerate(variants):
                by_node.setdefault(v // m, []).append((i, (v % m + 1) / m))
            for node, items in by_node.items():
                rows = torch.tensor([i for i, _ in items], device=dev)
                al = torch.tensor([x for _, x in items], device=dev, dtype=torch.float32)[:, None, None, None]
                if node == 0:
                    clean, corrupt = clean_nodes["input"], corrupt_nodes["input"]
                else:
                    kind = "attn" if node % 2 == 1 else "mlp"
                    layer = (node - 1) // 2
                    clean, corrupt = clean_nodes[kind][layer], corrupt_nodes[kind][layer]
                value = al * clean.float()[None] + (1 - al) * corrupt.float()[None]  # (n, B, T, D)
                if node == 0:
                    emb[rows] = value
                else:
                    row_idx = (rows[:, None] * B + torch.arange(B, device=dev)[None]).reshape(-1)
                    patches[(kind, layer)] = (row_idx, value.reshape(-1, T, D))
        emb = emb.reshape(Vc * B, T, D).to(clean_emb.dtype).requires_grad_(True)
        captured = [
            (slice(variants.index(v) * B, (variants.index(v) + 1) * B), sign)
            for v, sign in capture.items()
            if v in variants
        ]
        with torch.no_grad():
            for rows, sign in captured:
                diff[:, 0].add_(emb[rows].float(), alpha=sign)
        rows_mask = mask.repeat(Vc, 1)
        rows_labels = labels.repeat(Vc, 1)

        # --- hooks: stash forward values, catch gradients, reduce and contract per layer
        store: dict[int, dict[str, Any]] = {l: {} for l in range(len(a.layers))}
        done = set()

        def vbt(x):
            return x.float().reshape(Vc, B, T, *x.shape[2:])

        def contract(cols_start, n_src_used, G):
            """scores[:, :n_src_used, cols] += diff . G, G: (B, n_cols, T, D)."""
            n_cols = G.shape[1]
            lhs = diff[:, :n_src_used].reshape(B, n_src_used, T * D)
            rhs = G.reshape(B, n_cols, T * D).transpose(1, 2)
            scores[:, :n_src_used, cols_start : cols_start + n_cols] += torch.bmm(lhs, rhs)

        def inv_rms(x, eps):
            return torch.rsqrt(torch.linalg.vector_norm(x, dim=-1).square_().div_(D).add_(eps))  # (V, B, T)

        def norm_grad_identity(x, grad, w, eps):
            """Sum over variants of d metric / d x through y = w x r (W = identity): (B, T, D)."""
            r = inv_rms(x, eps)
            first = torch.einsum("vbt,vbtd->btd", r, grad).mul_(w)
            coef = torch.einsum("vbtd,vbtd->vbt", grad * w, x).mul_(r.pow(3)).div_(D)
            return first.sub_(torch.einsum("vbt,vbtd->btd", coef, x))

        def finish_layer(l):
            """Destinations of layer l: per-head q/k/v inputs and the MLP input, (B, 3H+1, T, D).

            Per row, d metric / d x_h = r w (W_h^T g_h) - r^3 (g_h . W_h (w x)) x / D for the
            RMSNorm y = w x r feeding head h's projection W_h; W_h (w x) = (proj_h - bias) / r.
            The first part is summed over rows (IG steps) before W^T, the second needs only
            the scalar g_h . proj_h per row: nothing of size (rows x 3H x D) is built."""
            if l in done:
                return
            t_start = time.perf_counter()
            s = store[l]
            done.add(l)
            layer = a.layers[l]
            x = vbt(s.pop("x_in"))  # (V, B, T, D)
            r = inv_rms(x, self.eps_in[l])  # (V, B, T)
            coefs, gbars = [], []
            for which in "qkv":
                out = s.pop(which)
                bias = s.pop(f"b_{which}", None)
                if bias is not None:
                    out = out - bias
                gr = s.pop(f"g_{which}", None)
                if gr is None:
                    coefs.append(torch.zeros((Vc, B, T, H), device=dev))
                    gbars.append(torch.zeros((B, T, H, dh), device=dev))
                    continue
                gr = vbt(gr)
                proj = vbt(out)
                if which != "q" and a.groups > 1:  # k/v heads shared by `groups` query heads: no copy
                    gr = gr.view(Vc, B, T, a.n_kv_heads, a.groups, dh)
                    c = torch.einsum("vbtkge,vbtke->vbtkg", gr, proj.view(Vc, B, T, a.n_kv_heads, dh))
                else:
                    gr = gr.view(Vc, B, T, H, dh)
                    c = torch.einsum("vbthe,vbthe->vbth", gr, proj.view(Vc, B, T, H, dh))
                coefs.append(c.reshape(Vc, B, T, H))
                gbars.append(torch.einsum("vbt,vbt...->bt...", r, gr).reshape(B, T, H, dh))
            coef = torch.cat(coefs, -1).mul_((r.pow(2) / D)[..., None])  # (V, B, T, 3H)
            gbar = torch.cat(gbars, 2)  # (B, T, 3H, dh)
            G = torch.empty((B, g.dst_per_layer, T, D), dtype=torch.float32, device=dev)
            first = torch.einsum("bthe,hed->bhtd", gbar, self._w[l]["qkv"]).mul_(layer.input_layernorm.weight.float())
            G[:, : 3 * H] = first.sub_(torch.einsum("vbth,vbtd->bhtd", coef, x))
            gm = s.pop("g_mid", None)
            xm = s.pop("x_mid")
            if gm is None:
                G[:, 3 * H] = 0
            else:
                G[:, 3 * H] = norm_grad_identity(
                    vbt(xm), vbt(gm), layer.post_attention_layernorm.weight.float(), self.eps_post[l]
                )
            contract(l * g.dst_per_layer, g.n_src_before_mlp(l), G)
            self.timings["hooks"] += time.perf_counter() - t_start

        def proj_hook(l, which):
            def hook(module, args, out):
                s = store[l]
                bias = effective_bias(module)
                if bias is not None:
                    s[f"b_{which}"] = bias.detach()
                s[which] = out.detach()
                if which != "q" and a.groups > 1:
                    Bt = out.shape[:-1]
                    out = (
                        out.view(*Bt, a.n_kv_heads, 1, dh).expand(*Bt, a.n_kv_heads, a.groups, dh).reshape(*Bt, H * dh)
                    )

                def grad_hook(grad, l=l, which=which):
                    store[l][f"g_{which}"] = grad.detach()
                    if all(f"g_{w}" in store[l] for w in "qkv"):
                        finish_layer(l)

                out.register_hook(grad_hook)
                return out

            return hook

        def norm_in_hook(l):
            def hook(module, args):
                store[l]["x_in"] = args[0].detach()

            return hook

        def mid_hook(l):
            def hook(module, args, out):
                store[l]["x_mid"] = args[0].detach()

                def grad_hook(grad, l=l):
                    store[l]["g_mid"] = grad.detach()

                out.register_hook(grad_hook)

            return hook

        final = {}

        def final_hook(module, args, out):
            final["x"] = args[0].detach()

            def grad_hook(grad):
                t_start = time.perf_counter()
                G = norm_grad_identity(vbt(final.pop("x")), vbt(grad), a.base.norm.weight.float(), self.eps_final)
                contract(g.dst_logits, g.n_src, G[:, None])
                self.timings["hooks"] += time.perf_counter() - t_start

            out.register_hook(grad_hook)

        def capture_attn(l):
            def pre(module, args):
                z = args[0].detach()
                start = g.src_head(l, 0)
                for rows, sign in captured:
                    zr = z[rows].float().view(B, T, H, dh)
                    diff[:, start : start + H].add_(torch.einsum("bthe,dhe->bhtd", zr, self._w[l]["o"]), alpha=sign)

            return pre

        def capture_mlp(l):
            def hook(module, args, out):
                for rows, sign in captured:
                    diff[:, g.src_mlp(l)].add_(out[rows].detach().float(), alpha=sign)

            return hook

        def patch_hook(kind, l):
            def hook(module, args, out):
                if (kind, l) not in patches:
                    return out
                rows, value = patches[(kind, l)]
                out = out.clone()
                out[rows] = value.to(out.dtype)
                return out

            return hook

        handles = []
        try:
            for l, layer in enumerate(a.layers):
                attn = layer.self_attn
                handles.append(layer.input_layernorm.register_forward_pre_hook(norm_in_hook(l)))
                for which in "qkv":
                    handles.append(getattr(attn, f"{which}_proj").register_forward_hook(proj_hook(l, which)))
                handles.append(layer.post_attention_layernorm.register_forward_hook(mid_hook(l)))
                if captured:
                    handles.append(attn.o_proj.register_forward_pre_hook(capture_attn(l)))
                    handles.append(layer.mlp.register_forward_hook(capture_mlp(l)))
                if patches:
                    handles.append(attn.o_proj.register_forward_hook(patch_hook("attn", l)))
                    handles.append(layer.mlp.register_forward_hook(patch_hook("mlp", l)))
                if a.groups > 1:
                    attn.num_key_value_groups = 1
            handles.append(a.base.norm.register_forward_hook(final_hook))
            t0 = time.perf_counter()
            hidden = a.base(inputs_embeds=emb, attention_mask=rows_mask, use_cache=False).last_hidden_state
            metric = self._metric(hidden, rows_labels)
            t1 = time.perf_counter()
            metric.backward()
            for l in range(len(a.layers) - 1, -1, -1):  # layers whose q/k/v got no gradient at all
                if l not in done and "x_in" in store[l]:
                    finish_layer(l)
            self.timings["forward"] += t1 - t0
            self.timings["backward"] += time.perf_counter() - t1
        finally:
            for h in handles:
                h.remove()
            for layer in a.layers:
                if a.groups > 1:
                    layer.self_attn.num_key_value_groups = a.groups

    def _metric(self, hidden, labels):
        """Sum over rows of the per-row answer metric; the LM head runs on answer positions only."""
        import torch

        target = labels[:, 1:]
        rows, pos = torch.nonzero(target != IGNORE_INDEX, as_tuple=True)
        logits = self.arch.lm_head(hidden[rows, pos]).float()
        logp = torch.log_softmax(logits, dim=-1).gather(1, target[rows, pos][:, None])[:, 0]
        n_rows = labels.shape[0]
        sums = torch.zeros(n_rows, device=logp.device, dtype=logp.dtype).index_add(0, rows, logp)
        counts = torch.zeros(n_rows, device=logp.device, dtype=logp.dtype).index_add(0, rows, torch.ones_like(logp))
        mean_logp = sums / counts.clamp_min(1)
        per_row = mean_logp.exp() if self.metric == "prob" else mean_logp
        return per_row.sum()


__all__ = ["EAPIG", "Architecture", "resolve_architecture", "effective_weight", "MODES", "BASELINES", "METRICS"]
