"""RILA (ReGLU): representation-guided LoRA initialisation.

For each LoRA target module, the uncentered second moments of its OUTPUT on forget
and retain data give Delta = (1 - beta) Cf - beta (Cr + ridge I); the adapter starts in
the top-r eigenvectors of Delta (directions the forget data uses more than the retain
data): B = Q, A = Q^T W0, base W0 - s B A (model unchanged at step 0). The retain basis
P_B (top-k eigenvectors of Cr) is handed to the ``rol`` regulariser.

Statistics (defaults = the reference code, see docs/methods.md): ``mode=faithful`` gives one
row per sequence, the sum of the module's outputs over all its tokens (question and answer;
padding excluded unless ``pad_to`` pads every sequence to that length as TOFU-format data
does); ``mode=token`` one row per answer token. ``n_samples=256``: the first 256 forget
examples and, for each of them, one retain example drawn uniformly at random (seeded), as
the reference pairs them; ``n_samples="all"`` uses every forget and every retain example.

Exact paths, chosen per module:
- rows: fewer rows n than d_out: orthonormalise the stacked rows (d_out x n) and
  eigendecompose an n x n matrix; d_out x d_out is never formed;
- factored: a bias-free module with d_in < d_out (gate/up projections) has outputs
  in the column space of W0, so Cout = W0 Cin W0^T: accumulate the d_in x d_in input
  Gram and eigendecompose in that d_in-dim subspace;
- dense: otherwise, the d_out x d_out output Gram.
The orthogonal complement of a subspace path holds the eigenvalue -beta*ridge of Delta
(and ridge of Cr): exactly what the dense path would find there. The rows-path subspace is
spanned by the forget AND retain rows whatever beta is, so Delta and Cr are both exact on it.

Cost: one forward pass without the LM head over each split, the statistics pooled inside the
forward hooks (one batched matmul or index per module and batch, the pooling worked out once per
batch), then the decompositions batched: modules of one shape are stacked and every QR and
eigendecomposition of a stack is one call (chunked to bound memory).
"""

from __future__ import annotations

import warnings
from typing import Annotated

from ..data.qa import IGNORE_INDEX
from ..interfaces import InitResult
from ..training.config import ConfigError
from ..training.lora import lora_layers
from .residual import batches, model_device, residual_result, write_residual

RIDGE = 1e-4


class _Stats:
    """Per module and split: stacked rows (rows path) or a Gram matrix (dense/factored), the
    Gram summed in float64: a float32 sum's rounding floor (about 1e-7 x the top eigenvalue)
    lies inside real retain spectra, which span 1e6 and more, so no threshold on it could tell
    a small real direction from rounding."""

    def __init__(self, path: str):
        self.path = path
        self.rows: list = []
        self.gram = None
        self.count = 0

    def add(self, h) -> None:
        self.count += h.shape[0]
        if self.path == "rows":
            self.rows.append(h)
            return
        h = h.double()
        if self.gram is None:
            self.gram = h.T @ h
        else:
            self.gram.addmm_(h.T, h)

    def matrix(self):
        import torch

        return torch.cat(self.rows)


class _Pooling:
    """How one batch's module activations (B, T, d) become representation rows, worked out once
    per batch for every hooked module: answer-token positions (``token``: their flat indices), or
    per-sequence sums (``faithful``: a (B, 1, T) weight applied by one batched matmul; 1 on every
    position when ``padded``, as the reference pools pad positions, else the attention mask)."""

    def __init__(self, batch, mode: str, padded: bool = False):
        import torch

        self.index = self.weight = None
        if mode == "token":
            self.index = (batch["labels"] != IGNORE_INDEX).flatten().nonzero().squeeze(1)
        elif not padded:
            self.weight = batch["attention_mask"].unsqueeze(1).to(torch.float32)

    def __call__(self, x):
        import torch

        x = x.float()
        if self.index is not None:
            return x.reshape(-1, x.shape[-1]).index_select(0, self.index)
        if self.weight is None:
            return x.sum(1)
        return torch.bmm(self.weight, x).squeeze(1)


def select_examples(forget, retain, n_samples, seed: int = 0):
    """The reference's choice: the first ``n_samples`` forget examples and one retain partner
    each, drawn uniformly with replacement (a seeded generator); ``None`` / "all": everything."""
    import torch

    if n_samples is None or n_samples == "all":
        return list(forget), list(retain)
    n = min(int(n_samples), len(forget))
    g = torch.Generator().manual_seed(int(seed))
    picks = torch.randint(len(retain), (n,), generator=g).tolist()
    return list(forget[:n]), [retain[i] for i in picks]


def _pad_batches(examples, pad_id: int, batch_size: int, device, pad_to: int):
    """Batches with every sequence right-padded to ``pad_to`` tokens (attention 0 on the pads)."""
    import torch.nn.functional as F

    for batch in batches(examples, pad_id, batch_size, device):
        extra = pad_to - batch["input_ids"].shape[1]
        if extra < 0:
            raise ConfigError(
                f"rila option pad_to={pad_to} is shorter than an example "
                f"({batch['input_ids'].shape[1]} tokens); raise it to at least --max-length"
            )
        yield {
            "input_ids": F.pad(batch["input_ids"], (0, extra), value=pad_id),
            "attention_mask": F.pad(batch["attention_mask"], (0, extra), value=0),
            "labels": F.pad(batch["labels"], (0, extra), value=IGNORE_INDEX),
        }


def _count_rows(examples, mode: str) -> int:
    if mode == "token":
        return sum(sum(1 for t in e["labels"] if t != IGNORE_INDEX) for e in examples)
    return len(examples)


def choose_path(module, n_rows: int) -> str:
    """The cheapest exact path for a module seeing ``n_rows`` representation rows."""
    base = module.get_base_layer()
    d_out, d_in = base.weight.shape
    factored = getattr(base, "bias", None) is None and d_in < d_out
    if n_rows < d_out and not (factored and d_in < n_rows):
        return "rows"
    return "factored" if factored else "dense"


def collect_stats(peft_model, forget, retain, pad_token_id, *, mode="faithful", batch_size=8, path=None, pad_to=None):
    """{module name: (forget _Stats, retain _Stats)} from one no-grad pass over each split,
    with the adapter disabled and the LM head skipped."""
    import torch

    if mode not in ("token", "faithful"):
        raise ConfigError(f"rila option mode must be 'token' or 'faithful', got {mode!r}")
    padded = pad_to is not None
    modules = lora_layers(peft_model)
    n_rows = _count_rows(forget, mode) + _count_rows(retain, mode)
    stats = {}
    for name, m in modules:
        p = path or choose_path(m, n_rows)
        stats[name] = (_Stats(p), _Stats(p))
    state = {"pool": None, "split": 0}
    handles = []
    for name, m in modules:
        base = m.get_base_layer()
        if stats[name][0].path == "factored":

            def pre(_mod, args, _name=name):
                stats[_name][state["split"]].add(state["pool"](args[0]))

            handles.append(base.register_forward_pre_hook(pre))
        else:

            def post(_mod, _args, output, _name=name):
                stats[_name][state["split"]].add(state["pool"](output))

            handles.append(base.register_forward_hook(post))
    backbone = getattr(peft_model.get_base_model(), "model", None)  # decoder without LM head
    run = backbone if backbone is not None and hasattr(backbone, "layers") else peft_model
    device = model_device(peft_model)
    try:
        with torch.no_grad(), peft_model.disable_adapter():
            for split, examples in enumerate((forget, retain)):
                state["split"] = split
                split_batches = (
                    _pad_batches(examples, pad_token_id, batch_size, device, pad_to)
                    if padded
                    else batches(examples, pad_token_id, batch_size, device)
                )
                for batch in split_batches:
                    state["pool"] = _Pooling(batch, mode, padded)
                    run(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    finally:
        for h in handles:
            h.remove()
    return stats


SOLVE_CHUNK_BYTES = 256 * 2**20  # float64 working set of one stacked solve (bounds the peak memory)


class Solution:
    """One module's result: Q (d x r) and the eigenvalues of Delta (largest algebraic first), the
    retain basis P_B (top-k eigenvectors of Cr, completed by :func:`retain_basis`) and how many
    of its columns are eigenvectors of Cr (``retain_kept``; the rest complete it)."""

    def __init__(self, q, values, retain_basis, retain_kept: int | None = None):
        self.q, self.values, self.retain_basis = q, values, retain_basis
        self.retain_kept = retain_basis.shape[1] if retain_kept is None else retain_kept


def _group_key(fs: _Stats, rs: _Stats, weight) -> tuple:
    """Modules with equal keys have equally shaped problems and are solved in one stack."""
    if fs.path == "rows":
        return ("rows", weight.shape[0], sum(len(h) for h in fs.rows), sum(len(h) for h in rs.rows))
    return (fs.path, *weight.shape)


def _projected(path: str, fs: list, rs: list, weights: list):
    """(Cf, Cr, basis) of a stack of M modules, float64: Cf, Cr (M x m x m) dense (basis None) or
    on the orthonormal subspace ``basis`` (M x d x m) of each module."""
    import torch

    nf = torch.tensor([s.count for s in fs], dtype=torch.float64).view(-1, 1, 1)
    nr = torch.tensor([s.count for s in rs], dtype=torch.float64).view(-1, 1, 1)
    if path == "dense":
        cf = torch.stack([s.gram for s in fs]).double()
        cr = torch.stack([s.gram for s in rs]).double()
        return cf / nf.to(cf.device), cr / nr.to(cr.device), None
    if path == "rows":
        hf = torch.stack([s.matrix() for s in fs]).double()  # M x n_f x d
        hr = torch.stack([s.matrix() for s in rs]).double()
        nf, nr = nf.to(hf.device), nr.to(hf.device)
        # the span of BOTH row sets, independent of beta (a beta-weighted stack loses the retain
        # rows at beta = 0 and with them P_B)
        x = torch.cat([hf / nf.sqrt(), hr / nr.sqrt()], 1)
        u, _ = torch.linalg.qr(x.mT)  # M x d x n
        pf, pr = hf @ u, hr @ u
        return pf.mT @ pf / nf, pr.mT @ pr / nr, u
    # factored: Cout = W Cin W^T, W = U R
    w = torch.stack(list(weights)).double()
    u, rmat = torch.linalg.qr(w)  # M x d_out x d_in
    gf = torch.stack([s.gram for s in fs]).double() / nf.to(w.device)
    gr = torch.stack([s.gram for s in rs]).double() / nr.to(w.device)
    return rmat @ gf @ rmat.mT, rmat @ gr @ rmat.mT, u


def _top(evals, evecs, basis, d: int, k: int, complement_value: float):
    """Top-k eigenpairs (largest first) from one module's ascending eigh output; on a subspace,
    lifted by ``basis`` and topped up from its complement, whose eigenvalue is ``complement_value``."""
    import torch

    evals, evecs = evals.flip(0), evecs.flip(1)
    if basis is None:
        return evecs[:, :k], evals[:k]
    keep = evals > complement_value  # eigenpairs that outrank the complement
    vecs, vals = basis @ evecs[:, keep][:, :k], evals[keep][:k]
    if vecs.shape[1] < k:
        extra = _complement(basis, d, k - vecs.shape[1])
        vecs = torch.cat([vecs, extra], 1)
        vals = torch.cat([vals, torch.full((extra.shape[1],), complement_value).to(vals)])
    return vecs, vals


def solve(problems: list, beta: float, r: list, k: list) -> list[Solution]:
    """Solve M modules' problems, stacked: ``problems`` holds (forget _Stats, retain _Stats,
    base weight) of modules whose :func:`_group_key` is the same; ``r`` and ``k`` per module.

    Delta = (1 - beta) Cf - beta (Cr + ridge I) and Cr go through one batched eigendecomposition
    (float64, as the reference); on a subspace path Delta's eigenvalues move by -beta * ridge."""
    import torch

    fs, rs, weights = zip(*problems)
    path = fs[0].path
    cf, cr, basis = _projected(path, fs, rs, weights)
    m = cf.shape[-1]
    if basis is None:
        eye = torch.eye(m, dtype=cf.dtype, device=cf.device)
        delta = (1 - beta) * cf - beta * (cr + RIDGE * eye)
    else:
        delta = (1 - beta) * cf - beta * cr
    mats = torch.cat([delta, cr])
    evals, evecs = torch.linalg.eigh((mats + mats.mT) / 2)
    shift = 0.0 if basis is None else beta * RIDGE
    # rows are projected, and Gram matrices summed, in float64
    rounding = torch.finfo(torch.float64).eps
    out = []
    for i, weight in enumerate(weights):
        d = weight.shape[0]
        own = None if basis is None else basis[i]
        q, vals = _top(evals[i], evecs[i], own, d, r[i], 0.0)
        j = len(weights) + i
        retain, kept = retain_basis(evals[j], evecs[j], cf[i], own, d, min(k[i], d), rounding)
        out.append(Solution(q, vals - shift, retain, kept))
    return out


def retain_basis(evals, evecs, cf, basis, d: int, k: int, rounding: float):
    """(P_B, how many of its columns are eigenvectors of Cr). P_B has k orthonormal columns: the
    eigenvectors of Cr whose eigenvalues stand above rounding (largest first), completed where Cr
    has fewer than k such directions as the reference's degenerate ridge eigenspace completes
    them, but never with forget directions: first the
    directions no data reaches (the orthogonal complement of the forget and retain rows), and
    only if those run out the remaining forget directions, the least used first.

    ``evals``/``evecs``: Cr's ascending eigendecomposition in the coordinates ``basis`` (d x m;
    None: the dense path, m = d); ``cf``: Cf in the same coordinates; ``rounding``: the relative
    precision of the statistics (an eigenvalue under ``max * m * rounding`` is numerically 0)."""
    import torch

    evals, evecs = evals.flip(0), evecs.flip(1)
    m = evecs.shape[0]
    top = float(evals.abs().max()) if evals.numel() else 0.0
    keep = evals > top * m * rounding
    chosen = evecs[:, keep][:, :k]
    if chosen.shape[1] < k:
        # Cr's numerical null space in these coordinates, ordered by how much forget data uses it
        null = evecs[:, ~keep]
        fvals, fvecs = torch.linalg.eigh(null.mT @ cf @ null)
        ftop = float(cf.diagonal().abs().max())
        quiet = fvals <= ftop * m * rounding
        null = null @ fvecs  # ascending forget energy
        unused, used = null[:, quiet], null[:, ~quiet]
        lift = (lambda x: x) if basis is None else (lambda x: basis @ x)
        parts = [lift(chosen), lift(unused)]
        outside = 0 if basis is None else d - m  # directions outside the subspace: no data there
        have = chosen.shape[1] + unused.shape[1]
        if have < k and outside > 0:
            parts.append(_complement(basis, d, min(k - have, outside)))
            have += parts[-1].shape[1]
        if have < k:
            parts.append(lift(used[:, : k - have]))
        return torch.cat(parts, 1)[:, :k], chosen.shape[1]
    return (chosen if basis is None else basis @ chosen), k


def _solve_bytes(fs: _Stats, rs: _Stats, weight) -> int:
    """float64 bytes a module adds to a stacked solve (inputs, the subspace and its eigenproblems)."""
    d_out, d_in = weight.shape
    if fs.path == "rows":
        n = sum(len(h) for h in fs.rows) + sum(len(h) for h in rs.rows)
        return 8 * (3 * n * d_out + 6 * n * n)
    m = d_out if fs.path == "dense" else d_in
    return 8 * (d_out * d_in + 8 * m * m)


def solve_in_stacks(items: dict, beta: float, r: dict, k: dict, *, chunk_bytes: int = SOLVE_CHUNK_BYTES):
    """Yield (name, Solution) for every module of ``items`` (name -> (forget _Stats, retain _Stats,
    base weight)), solving same-shaped modules together in stacks of at most ``chunk_bytes``.
    Each module's statistics are dropped from ``items`` once its stack is solved."""
    groups: dict[tuple, list[str]] = {}
    for name, (fs, rs, weight) in items.items():
        groups.setdefault(_group_key(fs, rs, weight), []).append(name)
    for names in groups.values():
        per = max(1, chunk_bytes // max(1, _solve_bytes(*items[names[0]])))
        for start in range(0, len(names), per):
            chunk = names[start : start + per]
            solutions = solve([items[n] for n in chunk], beta, [r[n] for n in chunk], [k[n] for n in chunk])
            for name, solution in zip(chunk, solutions):
                del items[name]
                yield name, solution


def _complement(basis, d: int, k: int, seed: int = 0):
    """k orthonormal vectors orthogonal to ``basis`` (d x m); deterministic."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rand = torch.randn(d, k, generator=g, dtype=basis.dtype).to(basis.device)
    for _ in range(2):  # re-orthogonalise for accuracy
        rand = rand - basis @ (basis.T @ rand)
    q, _ = torch.linalg.qr(rand)
    return q


class RILAInit:
    """ReGLU's representation-guided init. Options: beta (0.7, the TOFU default), mode
    ('faithful' | 'token'), n_samples (256 | "all"), seed (0: the retain draw), pad_to (None;
    N pads every sequence to N tokens for faithful pooling), rol_rank (128), batch_size (8),
    path (None = automatic; 'dense' | 'rows' | 'factored' to force one)."""

    residual = True

    def __init__(
        self,
        beta: Annotated[float, "retain weight in Delta = (1 - beta) Cf - beta Cr, in [0, 1]"] = 0.7,
        mode: Annotated[
            str, "'faithful': one row per sequence (sum over its tokens); 'token': one per answer token"
        ] = "faithful",
        n_samples: Annotated[
            int | str | None,
            'forget examples measured, each with one drawn retain partner; "all": every example of both splits',
        ] = 256,
        seed: Annotated[int, "seed of the retain partners' draw"] = 0,
        pad_to: Annotated[
            int | None, "pad every sequence to this many tokens (faithful pooling of TOFU-format data)"
        ] = None,
        rol_rank: Annotated[int, "k of the retain basis handed to the rol regulariser"] = 128,
        batch_size: Annotated[int, "examples per forward pass while measuring"] = 8,
        path: Annotated[str | None, "force one exact path: dense, rows or factored (None: cheapest)"] = None,
    ):
        def bad(option, value, expected):
            raise ConfigError(f"rila option {option} must be {expected}, got {value!r}")

        def whole(value, minimum):
            return isinstance(value, int) and not isinstance(value, bool) and value >= minimum

        if not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
            bad("beta", beta, "in [0, 1]")
        if mode not in ("faithful", "token"):
            bad("mode", mode, "'faithful' or 'token'")
        if not (
            n_samples is None
            or n_samples == "all"
            or (isinstance(n_samples, int) and not isinstance(n_samples, bool) and n_samples >= 1)
        ):
            bad("n_samples", n_samples, 'an integer >= 1 or "all"')
        if pad_to is not None and (mode != "faithful" or not isinstance(pad_to, int) or pad_to < 1):
            bad("pad_to", pad_to, "a positive token count, with mode=faithful")
        if path not in (None, "dense", "rows", "factored"):
            bad("path", path, "dense, rows or factored")
        for option, value, minimum in (("seed", seed, 0), ("rol_rank", rol_rank, 1), ("batch_size", batch_size, 1)):
            if not whole(value, minimum):
                bad(option, value, f"an integer >= {minimum}")
        self.beta, self.mode, self.rol_rank, self.batch_size, self.path = beta, mode, rol_rank, batch_size, path
        self.n_samples, self.seed, self.pad_to = n_samples, seed, pad_to

    def solve_modules(self, peft_model, *, forget, retain, tokenizer, who: str = "rila"):
        """Measure and solve without writing anything: (LoRA modules {name: module}, {name:
        :class:`Solution`}, {path: module count}, {"forget": n, "retain": n} examples measured).
        The ``random_residual`` control reads RILA's per-module norms from here."""
        if not forget or not retain:
            raise ConfigError(f"{who} needs both forget and retain examples (give --retain)")
        adapter = peft_model.active_adapter
        forget, retain = select_examples(forget, retain, self.n_samples, self.seed)
        # TOFU-format data pads with the end token
        pad_id = (
            tokenizer.eos_token_id if self.pad_to and tokenizer.eos_token_id is not None else tokenizer.pad_token_id
        )
        stats = collect_stats(
            peft_model,
            forget,
            retain,
            pad_id,
            mode=self.mode,
            batch_size=self.batch_size,
            path=self.path,
            pad_to=self.pad_to,
        )
        modules = dict(lora_layers(peft_model))
        items = {name: (*stats.pop(name), module.get_base_layer().weight) for name, module in modules.items()}
        ranks = {name: module.r[adapter] for name, module in modules.items()}
        keep = {name: min(self.rol_rank, module.get_base_layer().weight.shape[0]) for name, module in modules.items()}
        paths = {}
        for fs, _rs, _w in items.values():
            paths[fs.path] = paths.get(fs.path, 0) + 1
        solved = dict(solve_in_stacks(items, self.beta, ranks, keep))
        return modules, solved, paths, {"forget": len(forget), "retain": len(retain)}

    def initialize(self, peft_model, *, forget, retain, tokenizer) -> InitResult:
        adapter = peft_model.active_adapter
        modules, solved, paths, samples = self.solve_modules(
            peft_model, forget=forget, retain=retain, tokenizer=tokenizer
        )
        ranks = {name: module.r[adapter] for name, module in modules.items()}
        bases, short, kept = {}, [], {}
        for name, module in modules.items():  # model order, as before
            solution, r = solved.pop(name), ranks[name]
            kind = kept.setdefault(name.rsplit(".", 1)[-1], [solution.retain_kept, solution.retain_kept, 0])
            kind[0], kind[1] = min(kind[0], solution.retain_kept), max(kind[1], solution.retain_kept)
            kind[2] = max(kind[2], solution.retain_basis.shape[1])
            w0 = module.get_base_layer().weight
            n_pos = int((solution.values > 0).sum())
            if n_pos < r:
                short.append(f"{name} ({n_pos}/{r})")
            q = solution.q.to(w0.device)
            write_residual(module, adapter, q.T @ w0.double(), q)
            bases[name] = solution.retain_basis.float().to(w0.device)
        if short:
            warnings.warn(
                f"rila: fewer than r positive eigenvalues of Delta in {len(short)} module(s), e.g. "
                f"{', '.join(short[:3])}; there the adapter also spans directions the forget data does not "
                f"favour (more forget data or a smaller r helps)",
                RuntimeWarning,
                stacklevel=2,
            )
        return residual_result(
            peft_model,
            bases,
            init="rila",
            beta=self.beta,
            mode=self.mode,
            paths=paths,
            samples=samples,
            modules_short_of_rank=len(short),
            # per module kind: [fewest, most] eigenvectors of Cr in P_B, and k (the rest complete it)
            retain_basis_kept=kept,
        )
