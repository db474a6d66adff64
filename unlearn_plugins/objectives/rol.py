"""ROL, the ReGLU regulariser: keep every LoRA update out of the retain representation subspace.

L_ROL = sum over LoRA modules of ||B^T P_B||_F^2 (fp32), where P_B (d_out x k) spans the top-k
directions of the module's outputs on retain data. The basis comes from the adapter
initializer (``InitResult.retain_basis``, e.g. RILA). For modules it does not cover, the
reference draws a random orthonormal basis (``basis="random"``, the default: QR of a Gaussian
d_out x k matrix, seeded by ``seed``); ``basis="data"`` computes it here from retain data instead:
top-k eigenvectors of the uncentered second moment C_r = H_r^T H_r / n_r of the module's (base
layer) outputs over attended tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import UnlearnError
from ..training.lora import active_adapter, canonical_name, lora_layers
from .base import ObjectiveContext, check_option

#: above this many bytes of d_out x d_out moment matrices, use per-sequence features instead
MOMENT_BUDGET_BYTES = 2 * 1024**3


def top_eigenvectors(moment, k: int):
    """The k eigenvectors of a symmetric matrix with the largest eigenvalues, as columns (fp32)."""
    import torch

    values, vectors = torch.linalg.eigh(moment.double())
    order = torch.argsort(values, descending=True)[:k]
    return vectors[:, order].float().contiguous()


def random_basis(d_out: int, k: int, seed: int):
    """The reference's ``_random_rol_basis``: the Q of a QR of a Gaussian d_out x k matrix (fp32)."""
    import torch

    g = torch.Generator().manual_seed(int(seed))
    q, _ = torch.linalg.qr(torch.randn(d_out, k, generator=g))
    return q.contiguous()


def retain_basis_from_data(
    model,
    modules: Sequence[tuple[str, Any]],
    examples: Sequence[dict],
    *,
    rank: int,
    pad_token_id: int,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Top-``rank`` retain directions of each module's base-layer outputs (name -> d_out x k)."""
    import torch

    from ..data.qa import pad_batch

    device = next(model.parameters()).device
    dims = {name: int(module.get_base_layer().weight.shape[0]) for name, module in modules}
    token_level = sum(d * d * 4 for d in dims.values()) <= MOMENT_BUDGET_BYTES
    stats: dict[str, Any] = {}
    counts = {name: 0 for name in dims}
    current_mask: dict[str, Any] = {}
    handles = []

    def hook_for(name):
        def hook(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            mask = current_mask["mask"].to(out.device)
            h = out.detach().float()
            if token_level:
                h = h[mask.bool()]  # (n_tokens, d_out)
                part = h.T @ h
                counts[name] += h.shape[0]
            else:  # one mean feature per sequence
                m = mask.to(h.dtype)[..., None]
                h = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
                part = h
                counts[name] += h.shape[0]
            if token_level:
                stats[name] = part if name not in stats else stats[name] + part
            else:
                stats.setdefault(name, []).append(part.cpu())

        return hook

    for name, module in modules:
        handles.append(module.get_base_layer().register_forward_hook(hook_for(name)))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(examples), batch_size):
                batch = pad_batch(list(examples[start : start + batch_size]), pad_token_id)
                current_mask["mask"] = batch["attention_mask"]
                model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)

    basis = {}
    for name, d_out in dims.items():
        k = min(rank, d_out)
        if token_level:
            moment = stats[name] / max(counts[name], 1)
        else:
            feats = torch.cat(stats[name])
            moment = feats.T @ feats / max(counts[name], 1)
        basis[name] = top_eigenvectors(moment, k)
    return basis


class ROL:
    """ReGLU's representation-orthogonality regulariser (component kind: unlearning objective,
    ``regularizer = True``). Options: ``weight`` (lambda, 0.5), ``rank`` (k = 128), ``basis``
    ("random", the reference's, or "data": for modules the initializer gives no basis),
    ``seed`` (of the random basis, 0), ``max_samples`` (retain examples for ``basis="data"``, 256)."""

    name = "rol"
    #: 2: RILA's retain basis has k columns completed away from the forget rows; a
    #: study re-keys (rebuilds) the cells that use ROL
    revision = 2
    regularizer = True
    needs_reference_model = False
    needs_retain_data = False  # only when the initializer gives no basis; checked in prepare()

    def __init__(
        self,
        *,
        weight: float = 0.5,
        rank: int = 128,
        basis: str = "random",
        seed: int = 0,
        max_samples: int = 256,
        batch_size: int = 8,
    ):
        check_option(self.name, "weight", weight, isinstance(weight, (int, float)) and weight >= 0, "a number >= 0")
        check_option(self.name, "rank", rank, isinstance(rank, int) and rank > 0, "an integer > 0")
        check_option(
            self.name, "max_samples", max_samples, isinstance(max_samples, int) and max_samples > 0, "an integer > 0"
        )
        check_option(self.name, "basis", basis, basis in ("random", "data"), "'random' or 'data'")
        check_option(
            self.name,
            "seed",
            seed,
            isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0,
            "an integer >= 0",
        )
        self.weight = float(weight)
        self.rank = rank
        self.basis, self.seed = basis, seed
        self.max_samples = max_samples
        self.batch_size = batch_size
        self.pairs: list[tuple[Any, Any]] = []  # (lora_B weight, P_B)
        self.last_terms = {}

    def __repr__(self) -> str:
        return f"rol(weight={self.weight}, rank={self.rank}, basis={self.basis!r}, max_samples={self.max_samples})"

    def set_basis(self, model, basis: dict[str, Any]) -> None:
        """Bind each LoRA module's B to its retain basis (names as in ``named_modules``)."""
        import torch

        by_name = {canonical_name(k): v for k, v in basis.items()}
        adapter = active_adapter(model)
        pairs = []
        for name, module in lora_layers(model, canonical_names=True):
            weight = module.lora_B[adapter].weight
            if name not in by_name:
                raise UnlearnError(f"rol: no retain basis for LoRA module {name!r}")
            p = torch.as_tensor(by_name[name]).to(device=weight.device, dtype=torch.float32)
            if p.shape[0] != weight.shape[0]:
                raise UnlearnError(
                    f"rol: retain basis for {name!r} has {p.shape[0]} rows, the module has {weight.shape[0]} outputs"
                )
            pairs.append((weight, p))
        self.pairs = pairs

    def prepare(self, context: ObjectiveContext) -> None:
        modules = lora_layers(context.model, canonical_names=True)
        if not modules:
            raise UnlearnError("regularizer 'rol' needs LoRA modules (it cannot be used with --full-finetune)")
        given = getattr(context.init_result, "retain_basis", None) or {}
        basis = {canonical_name(k): v for k, v in given.items()}
        missing = [(name, module) for name, module in modules if name not in basis]
        if missing and self.basis == "random":
            for i, (name, module) in enumerate(missing):
                d_out = int(module.get_base_layer().weight.shape[0])
                basis[name] = random_basis(d_out, min(self.rank, d_out), self.seed * 100003 + i)
        elif missing:
            if not context.retain:
                raise UnlearnError(
                    "regularizer 'rol': the initializer gives no retain basis and there is no retain "
                    "data to compute one (--retain)"
                )
            pad = context.tokenizer.pad_token_id
            basis.update(
                retain_basis_from_data(
                    context.model,
                    missing,
                    list(context.retain)[: self.max_samples],
                    rank=self.rank,
                    pad_token_id=pad,
                    batch_size=self.batch_size,
                )
            )
        self.set_basis(context.model, basis)
        context.info["rol_basis"] = {
            "from_initializer": len(modules) - len(missing),
            ("random" if self.basis == "random" else "from_retain_data"): len(missing),
        }
        return None

    def loss(self, model=None, batch=None, reference_model=None):
        import torch

        if not self.pairs:
            raise UnlearnError(
                "regularizer 'rol' has no retain basis: call prepare() (the trainer does) or set_basis()"
            )
        total = torch.zeros((), device=self.pairs[0][0].device, dtype=torch.float32)
        for weight, p in self.pairs:
            total = total + (weight.float().T @ p.to(weight.device)).pow(2).sum()
        return total
