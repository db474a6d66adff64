"""The static edge graph of a decoder-only transformer (the layout of EAP-IG).

Sources write into the residual stream: the input embedding, every attention head
(its share of o_proj) and every MLP. Destinations read from it, before their RMSNorm:
each head's q, k and v input, each MLP input, and the logits (final residual).
An edge u -> d exists when u writes before d reads (an MLP reads its own layer's
heads; a head does not). Score matrices are (n_src, n_dst) with this index layout:

- source 0 = input; layer l: heads at 1 + l (H + 1) + h, the MLP at 1 + l (H + 1) + H
- destination layer l: q at l (3H + 1) + h, k at + H + h, v at + 2H + h, the MLP at
  l (3H + 1) + 3H; the logits last.

SmolLM2-135M (30 layers, 9 heads): 301 x 841 with 123,211 real edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

#: component types, as stored per source / destination (for analysis and plots)
SRC_TYPES = ("input", "head", "mlp")
DST_TYPES = ("q", "k", "v", "mlp", "logits")


@dataclass(frozen=True)
class Graph:
    """Index arithmetic of the edge graph for ``n_layers`` layers of ``n_heads`` query heads."""

    n_layers: int
    n_heads: int

    def __post_init__(self):
        if self.n_layers < 1 or self.n_heads < 1:
            raise ValueError(f"Graph needs at least one layer and one head, got {self.n_layers} x {self.n_heads}")

    # ------------------------------------------------------------------ sizes
    @property
    def n_src(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_dst(self) -> int:
        return self.n_layers * (3 * self.n_heads + 1) + 1

    @property
    def dst_per_layer(self) -> int:
        return 3 * self.n_heads + 1

    @property
    def n_edges(self) -> int:
        return int(self.edge_mask.sum())

    # ------------------------------------------------------------------ indices
    def src_head(self, layer: int, head: int) -> int:
        return 1 + layer * (self.n_heads + 1) + head

    def src_mlp(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def dst_qkv(self, layer: int, which: str, head: int) -> int:
        return layer * self.dst_per_layer + "qkv".index(which) * self.n_heads + head

    def dst_mlp(self, layer: int) -> int:
        return layer * self.dst_per_layer + 3 * self.n_heads

    @property
    def dst_logits(self) -> int:
        return self.n_dst - 1

    def n_src_before_attn(self, layer: int) -> int:
        """Sources an attention head of ``layer`` reads: everything before the layer."""
        return 1 + layer * (self.n_heads + 1)

    def n_src_before_mlp(self, layer: int) -> int:
        """Sources the MLP of ``layer`` reads: everything before it, incl. its layer's heads."""
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    # ------------------------------------------------------------------ per-index facts
    @cached_property
    def src_layer(self):
        """Layer of each source (input = -1)."""
        import torch

        out = torch.full((self.n_src,), -1, dtype=torch.long)
        for layer in range(self.n_layers):
            out[self.src_head(layer, 0) : self.src_mlp(layer) + 1] = layer
        return out

    @cached_property
    def src_type(self):
        """Index into SRC_TYPES of each source."""
        import torch

        out = torch.full((self.n_src,), SRC_TYPES.index("head"), dtype=torch.long)
        out[0] = SRC_TYPES.index("input")
        for layer in range(self.n_layers):
            out[self.src_mlp(layer)] = SRC_TYPES.index("mlp")
        return out

    @cached_property
    def dst_layer(self):
        """Layer of each destination (logits = n_layers)."""
        import torch

        out = torch.arange(self.n_dst) // self.dst_per_layer
        out[-1] = self.n_layers
        return out

    @cached_property
    def dst_type(self):
        """Index into DST_TYPES of each destination."""
        import torch

        within = torch.arange(self.n_dst) % self.dst_per_layer
        out = torch.div(within, self.n_heads, rounding_mode="floor").clamp(max=3)
        out[-1] = DST_TYPES.index("logits")
        return out

    @cached_property
    def dst_node(self):
        """Node id of each destination (a source's node id is its index): the q/k/v of a head map to
        the head's node, an MLP input to the MLP's; logits = n_src."""
        import torch

        out = torch.empty(self.n_dst, dtype=torch.long)
        for layer in range(self.n_layers):
            for h in range(self.n_heads):
                for which in "qkv":
                    out[self.dst_qkv(layer, which, h)] = self.src_head(layer, h)
            out[self.dst_mlp(layer)] = self.src_mlp(layer)
        out[-1] = self.n_src
        return out

    @property
    def n_nodes(self) -> int:
        """Nodes: input, heads, MLPs (the sources) and the logits."""
        return self.n_src + 1

    @cached_property
    def edge_mask(self):
        """Bool (n_src, n_dst): True where the edge exists."""
        import torch

        mask = torch.zeros((self.n_src, self.n_dst), dtype=torch.bool)
        for layer in range(self.n_layers):
            base = layer * self.dst_per_layer
            mask[: self.n_src_before_attn(layer), base : base + 3 * self.n_heads] = True
            mask[: self.n_src_before_mlp(layer), self.dst_mlp(layer)] = True
        mask[:, -1] = True
        return mask

    # ------------------------------------------------------------------ names
    def src_name(self, i: int) -> str:
        if i == 0:
            return "input"
        layer, within = divmod(i - 1, self.n_heads + 1)
        return f"m{layer}" if within == self.n_heads else f"a{layer}.h{within}"

    def dst_name(self, j: int) -> str:
        if j == self.n_dst - 1:
            return "logits"
        layer, within = divmod(j, self.dst_per_layer)
        if within == 3 * self.n_heads:
            return f"m{layer}"
        which, head = divmod(within, self.n_heads)
        return f"a{layer}.h{head}<{'qkv'[which]}>"

    def edge_name(self, i: int, j: int) -> str:
        return f"{self.src_name(i)}->{self.dst_name(j)}"

    def to_dict(self) -> dict:
        return {"n_layers": self.n_layers, "n_heads": self.n_heads}
