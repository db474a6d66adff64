"""A slow, straightforward EAP-IG for one sample on a Llama, written independently of the
engine: a hand-written forward in which every destination (each head's q, k and v input,
each MLP input, the logits) reads its own copy of the pre-norm residual stream, so
autograd gives each destination's gradient directly; one forward+backward per IG step.
Also exact edge patching (one forward per edge). Used by tests and bench/eap_ig_patching.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rot(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def node_list(n_layers):
    """('input',), ('attn', l), ('mlp', l) in residual order: the 2L+1 layer nodes."""
    out = [("input", 0)]
    for layer in range(n_layers):
        out += [("attn", layer), ("mlp", layer)]
    return out


def forward(model, ids, labels, *, emb=None, delta=None, node_value=None, metric="prob"):
    """Hand-written forward of a LlamaForCausalLM on one sequence (ids: (T,)).

    delta: {dst_name: (T, D) tensor} added to that destination's input copy (edge patching).
    node_value: {(kind, layer): (T, D)} replaces a node's output (activations-mode IG).
    Returns (metric, dst_inputs {name: leaf-like copy}, src_outputs {name: (T, D)}), with
    metric = exp(mean answer-token log-prob) ("prob") or the mean log-prob ("logprob").
    """
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    KV = cfg.num_key_value_heads
    D = cfg.hidden_size
    dh = D // H
    eps = cfg.rms_norm_eps
    inner = model.model
    T = ids.shape[0]
    delta = delta or {}
    node_value = node_value or {}
    x = inner.embed_tokens.weight[ids] if emb is None else emb
    if ("input", 0) in node_value:
        x = node_value[("input", 0)]
    srcs = {"input": x}
    dsts = {}
    pos = torch.arange(T)
    inv = (
        1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
        if getattr(cfg, "rope_parameters", None)
        else 1.0 / (cfg.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    )
    freqs = pos[:, None].float() * inv[None]
    angle = torch.cat([freqs, freqs], -1)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def copy(name, resid):
        c = resid.clone()
        if name in delta:
            c = c + delta[name]
        if torch.is_grad_enabled():
            if c.requires_grad:
                c.retain_grad()
            else:  # upstream is a constant (a patched node): the copy is a leaf
                c.requires_grad_(True)
        dsts[name] = c
        return c

    resid = x
    for l in range(L):
        layer = inner.layers[l]
        at = layer.self_attn
        w_in = layer.input_layernorm.weight
        Wq = at.q_proj.weight.view(H, dh, D)
        Wk = at.k_proj.weight.view(KV, dh, D)
        Wv = at.v_proj.weight.view(KV, dh, D)
        Wo = at.o_proj.weight  # (D, H dh)
        zero = torch.zeros(H * dh, dtype=x.dtype)
        bq = (at.q_proj.bias if at.q_proj.bias is not None else zero).view(H, dh)
        bk = (at.k_proj.bias if at.k_proj.bias is not None else zero[: KV * dh]).view(KV, dh)
        bv = (at.v_proj.bias if at.v_proj.bias is not None else zero[: KV * dh]).view(KV, dh)
        head_sum = torch.zeros_like(resid)
        for h in range(H):
            g = h // (H // KV)
            q = _rms(copy(f"a{l}.h{h}<q>", resid), w_in, eps) @ Wq[h].T + bq[h]
            k = _rms(copy(f"a{l}.h{h}<k>", resid), w_in, eps) @ Wk[g].T + bk[g]
            v = _rms(copy(f"a{l}.h{h}<v>", resid), w_in, eps) @ Wv[g].T + bv[g]
            q = q * cos + _rot(q) * sin
            k = k * cos + _rot(k) * sin
            att = (q @ k.T) / dh**0.5
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            out = (att @ v) @ Wo[:, h * dh : (h + 1) * dh].T
            srcs[f"a{l}.h{h}"] = out
            head_sum = head_sum + out
        if ("attn", l) in node_value:
            head_sum = node_value[("attn", l)]
        srcs[f"attn{l}"] = head_sum
        resid = resid + head_sum
        mlp = layer.mlp
        hm = _rms(copy(f"m{l}", resid), layer.post_attention_layernorm.weight, eps)
        mo = (F.silu(hm @ mlp.gate_proj.weight.T) * (hm @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
        if ("mlp", l) in node_value:
            mo = node_value[("mlp", l)]
        srcs[f"m{l}"] = mo
        resid = resid + mo
    final = _rms(copy("logits", resid), inner.norm.weight, eps)
    logits = final @ model.lm_head.weight.T
    target = labels[1:]
    keep = target != -100
    logp = torch.log_softmax(logits[:-1][keep].float(), -1).gather(1, target[keep][:, None])[:, 0]
    value = logp.mean().exp() if metric == "prob" else logp.mean()
    return value, dsts, srcs


def _edges(graph):
    mask = graph.edge_mask
    return [(i, j) for i in range(graph.n_src) for j in range(graph.n_dst) if mask[i, j]]


def reference_scores(
    model, graph, ids, labels, *, steps=5, mode="inputs", corrupt_ids=None, corrupt=None, metric="prob", alphas=None
):
    """EAP-IG by the definition, one sample. Corrupt activations: ``corrupt`` (a dict like
    the clean source outputs), else a forward of corrupt_ids, else zeros. ``alphas``: the
    IG points of inputs mode (default k/m, k = 0..m-1)."""
    with torch.no_grad():
        _, _, clean = forward(model, ids, labels)
        if corrupt is not None:
            corrupt = {k: v.expand_as(clean[k]) for k, v in corrupt.items()}
        elif corrupt_ids is None:
            corrupt = {k: torch.zeros_like(v) for k, v in clean.items()}
        else:
            _, _, corrupt = forward(model, corrupt_ids, labels)
    grads = {}

    def add_grads(dsts):
        for name, t in dsts.items():
            grads[name] = grads.get(name, 0) + (t.grad if t.grad is not None else torch.zeros_like(t))

    if mode == "inputs":
        alphas = alphas if alphas is not None else [k / steps for k in range(steps)]
        n_runs = len(alphas)
        for a in alphas:
            emb = (corrupt["input"] + a * (clean["input"] - corrupt["input"])).detach().requires_grad_(True)
            value, dsts, _ = forward(model, ids, labels, emb=emb, metric=metric)
            value.backward()
            add_grads(dsts)
    else:
        nodes = node_list(graph.n_layers)
        n_runs = len(nodes) * steps
        for kind, layer in nodes:
            key = "input" if kind == "input" else (f"attn{layer}" if kind == "attn" else f"m{layer}")
            for k in range(1, steps + 1):
                a = k / steps
                value = (a * clean[key] + (1 - a) * corrupt[key]).detach()
                emb = clean["input"].detach().clone().requires_grad_(True)
                out, dsts, _ = forward(model, ids, labels, emb=emb, node_value={(kind, layer): value}, metric=metric)
                out.backward()
                add_grads(dsts)
    out = torch.zeros(graph.n_src, graph.n_dst, dtype=torch.float64)
    for i, j in _edges(graph):
        src, dst = graph.src_name(i), graph.dst_name(j)
        d = (corrupt[src] - clean[src]).double()
        out[i, j] = (d * grads[dst].double()).sum() / n_runs
    return out


def exact_patching(model, graph, ids, labels, corrupt_ids=None):
    """metric(edge u->d corrupted) - metric(clean) for every edge: one forward per edge."""
    with torch.no_grad():
        base, _, clean = forward(model, ids, labels)
        if corrupt_ids is None:
            corrupt = {k: torch.zeros_like(v) for k, v in clean.items()}
        else:
            _, _, corrupt = forward(model, corrupt_ids, labels)
        out = torch.zeros(graph.n_src, graph.n_dst, dtype=torch.float64)
        for i, j in _edges(graph):
            src, dst = graph.src_name(i), graph.dst_name(j)
            metric, _, _ = forward(model, ids, labels, delta={dst: corrupt[src] - clean[src]})
            out[i, j] = float(metric - base)
    return out
