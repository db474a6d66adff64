"""SIBL (S-BiAL), sparse bilevel augmented Lagrangian unlearning (open-unlearning
``src/trainer/unlearn/sibl.py``, pull request 159): a magnitude mask picks the weights that may
move; every outer iteration first takes ``K`` masked gradient steps on the retain batch (retain
NLL + an L1 penalty), then one masked outer step on the augmented Lagrangian
``L = F + lambda * NLL(retain) + rho / 2 * r^2`` with ``F`` the mean logit margin
``max_v z - mean_v z`` over every position of the forget batch and ``r = NLL(retain) - epsilon``
(a number, so the penalty adds no gradient), corrected by implicit differentiation:
``g <- g - H_L h`` with ``h`` the conjugate-gradient solution of ``M H_inner M h = M grad_inner``
(``M`` the mask, ``H`` Hessian-vector products); then ``lambda <- max(0, lambda + rho * r)``.

The method updates the weights itself with plain masked steps (``eta_in``, ``eta_theta``), so
its ``training_step`` leaves no gradient for the optimizer: the run's learning rate, optimizer
and schedule do not act. One micro-batch is one outer iteration; after ``T`` of them the
remaining micro-batches change nothing (``--preset sibl`` runs exactly the reference's 20).
"""

from __future__ import annotations

from typing import Annotated, Any

from ..errors import UnlearnError
from ..likelihood import forward, mean_nll
from ..options import attributes, options_repr
from .base import RetainDataObjective, check_option

#: mask methods of the reference's ``SparsityManager`` that are transcribed here
SPARSITY_METHODS = ("layerwise_magnitude", "random")


def layerwise_magnitude_mask(model, sparsity: float) -> dict[str, Any]:
    """Per trainable weight matrix (``weight`` in its name, 2 or more dimensions), 1 where
    ``|w|`` is at least its ``sparsity`` quantile (over a random million entries above ten
    million, as the reference); 1 everywhere on the other trainable parameters (biases, norms).
    Frozen parameters get no mask (the reference's all-ones masks for them never act)."""
    import torch

    masks = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if "weight" in name and param.dim() >= 2:
            flat = param.detach().abs().reshape(-1)
            if flat.numel() > 10_000_000:
                flat = flat[torch.randperm(flat.numel(), device=flat.device)[:1_000_000]]
            threshold = torch.quantile(flat.float(), sparsity).to(param.dtype)
            masks[name] = (param.detach().abs() >= threshold).to(param.dtype)
        else:
            masks[name] = torch.ones_like(param.detach())
    return masks


def random_mask(model, sparsity: float) -> dict[str, Any]:
    """1 with probability ``1 - sparsity`` on each trainable weight matrix (the reference's baseline)."""
    import torch

    masks = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if "weight" in name and param.dim() >= 2:
            masks[name] = (torch.rand_like(param.detach()) > sparsity).to(param.dtype)
        else:
            masks[name] = torch.ones_like(param.detach())
    return masks


def logit_margin(model, part):
    """Mean over every position (prompt and padding too) of ``max_v z - mean_v z``."""
    logits = forward(model, part).logits
    return (logits.max(dim=-1)[0] - logits.mean(dim=-1)).mean()


def math_attention():
    """PyTorch's math attention kernel: the fused ones have no second derivative, which the
    Hessian-vector products need (same values up to rounding)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def conjugate_gradient(matvec, b, *, iterations: int, tol: float):
    """Solve ``A x = b`` from ``x = 0`` with SciPy's CG (``maxiter``, ``atol``, ``rtol=0``) on
    the CPU, as the reference does; each product runs on ``b``'s device and dtype. NumPy has no
    bf16/fp16 arithmetic worth the name, so half-precision vectors are solved in fp32."""
    import torch
    from scipy.sparse.linalg import LinearOperator, cg

    device, dtype, n = b.device, b.dtype, b.numel()
    host = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    b_np = b.detach().to(host).cpu().numpy()

    def product(v):
        return matvec(torch.from_numpy(v).to(device=device, dtype=dtype)).detach().to(host).cpu().numpy()

    x, _ = cg(LinearOperator((n, n), matvec=product, dtype=b_np.dtype), b_np, maxiter=iterations, atol=tol, rtol=0)
    return torch.from_numpy(x).to(device=device, dtype=dtype)


class SIBL(RetainDataObjective):
    """Sparse bilevel augmented Lagrangian: masked inner retain steps, a masked outer forget step
    with an implicit-differentiation correction, a dual variable on the retain-loss budget."""

    name = "sibl"

    def __init__(
        self,
        *,
        use_sparsity: Annotated[bool, "update only the weights the mask keeps"] = True,
        sparsity: Annotated[float, "fraction of each weight matrix that stays fixed"] = 0.9,
        sparsity_method: Annotated[str, "mask: 'layerwise_magnitude' (the reference's default) or 'random'"] = (
            "layerwise_magnitude"
        ),
        epsilon: Annotated[float, "retain-loss budget of the constraint"] = 0.1,
        T: Annotated[int, "outer iterations (one per micro-batch; later ones change nothing)"] = 20,
        K: Annotated[int, "inner retain steps per outer iteration"] = 10,
        eta_theta: Annotated[float, "outer step size"] = 1e-4,
        eta_in: Annotated[float, "inner step size"] = 1e-4,
        rho: Annotated[float, "augmented Lagrangian penalty and dual step"] = 1.0,
        gamma: Annotated[float, "L1 coefficient of the inner problem"] = 1e-4,
        use_implicit: Annotated[bool, "correct the outer gradient by implicit differentiation"] = True,
        cg_iters: Annotated[int, "conjugate-gradient iterations"] = 10,
        cg_tol: Annotated[float, "conjugate-gradient absolute tolerance"] = 1e-3,
    ):
        check_option(self.name, "sparsity", sparsity, 0 <= sparsity < 1, "a number in [0, 1)")
        check_option(
            self.name,
            "sparsity_method",
            sparsity_method,
            sparsity_method in SPARSITY_METHODS,
            " or ".join(repr(m) for m in SPARSITY_METHODS),
        )
        for option, value in (("T", T), ("K", K), ("cg_iters", cg_iters)):
            check_option(self.name, option, value, isinstance(value, int) and value >= 0, "an integer >= 0")
        for option, value in (("eta_theta", eta_theta), ("eta_in", eta_in), ("rho", rho), ("gamma", gamma)):
            check_option(self.name, option, value, value >= 0, "a number >= 0")
        check_option(self.name, "cg_tol", cg_tol, cg_tol > 0, "a number > 0")
        self.use_sparsity, self.sparsity, self.sparsity_method = bool(use_sparsity), float(sparsity), sparsity_method
        self.epsilon, self.T, self.K = float(epsilon), int(T), int(K)
        self.eta_theta, self.eta_in, self.rho, self.gamma = float(eta_theta), float(eta_in), float(rho), float(gamma)
        self.use_implicit, self.cg_iters, self.cg_tol = bool(use_implicit), int(cg_iters), float(cg_tol)
        self.lambda_dual = 0.0
        self.iterations = 0
        self.mask: dict[str, Any] | None = None
        self.last_terms: dict[str, Any] = {}

    # ------------------------------------------------------------------ pieces of the reference

    def initialize_mask(self, model) -> None:
        import torch

        if not self.use_sparsity:
            self.mask = {n: torch.ones_like(p.detach()) for n, p in model.named_parameters() if p.requires_grad}
        elif self.sparsity_method == "random":
            self.mask = random_mask(model, self.sparsity)
        else:
            self.mask = layerwise_magnitude_mask(model, self.sparsity)

    def _trainable(self, model):
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def _l1(self, params):
        return sum((p.abs() * self.mask[n]).sum() for n, p in params)

    @staticmethod
    def _grads(loss, params, **kwargs):
        import torch

        grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True, **kwargs)
        return [torch.zeros_like(p) if g is None else g for (_, p), g in zip(params, grads)]

    def inner_step(self, model, retain) -> float:
        """One masked step on ``NLL(retain) + gamma * |theta * mask|_1``."""
        import torch

        params = self._trainable(model)
        loss = mean_nll(model, retain)
        grads = self._grads(loss + self.gamma * self._l1(params), params)
        with torch.no_grad():
            for (name, param), grad in zip(params, grads):
                param.sub_(self.eta_in * grad * self.mask[name])
        return float(loss.detach())

    def outer_step(self, model, forget, retain):
        """The masked outer step and the dual update; returns (F, NLL(retain), r)."""
        import torch

        params = self._trainable(model)
        forget_loss = logit_margin(model, forget)
        retain_loss = mean_nll(model, retain)
        r = float(retain_loss.detach()) - self.epsilon
        lagrangian = forget_loss + self.lambda_dual * retain_loss + 0.5 * self.rho * r**2
        grads = self._grads(lagrangian, params, create_graph=self.use_implicit)
        update = [g.detach() for g in grads]
        if self.use_implicit:
            mask = torch.cat([self.mask[n].reshape(-1) for n, _ in params])
            inner = mean_nll(model, retain) + self.gamma * self._l1(params)
            inner_grad = torch.cat([g.reshape(-1) for g in self._grads(inner, params, create_graph=True)])

            def hvp(flat_grad, vec):
                return torch.cat(
                    [h.reshape(-1) for h in self._grads((flat_grad * vec).sum(), params, retain_graph=True)]
                )

            h = conjugate_gradient(
                lambda vec: hvp(inner_grad, vec * mask) * mask,
                inner_grad.detach() * mask,
                iterations=self.cg_iters,
                tol=self.cg_tol,
            )
            correction = hvp(torch.cat([g.reshape(-1) for g in grads]), h)
            offset = 0
            for i, (_, param) in enumerate(params):
                update[i] = update[i] - correction[offset : offset + param.numel()].reshape(param.shape)
                offset += param.numel()
        with torch.no_grad():
            for (name, param), grad in zip(params, update):
                param.sub_(self.eta_theta * grad * self.mask[name])
        self.lambda_dual = max(0.0, self.lambda_dual + self.rho * r)
        return forget_loss.detach(), retain_loss.detach(), r

    # ------------------------------------------------------------------ the objective contract

    def loss(self, model, batch, reference_model=None):
        """The outer objective ``F + lambda * NLL(retain)`` with the current lambda (the logged
        value; training goes through :meth:`training_step`)."""
        if batch.get("retain") is None:
            raise UnlearnError("objective 'sibl' needs retain data (its inner problem and constraint are on it)")
        return logit_margin(model, batch["forget"]) + self.lambda_dual * mean_nll(model, batch["retain"])

    def training_step(self, model, batch, reference_model, step):
        import torch

        if batch.get("retain") is None:
            raise UnlearnError("objective 'sibl' needs retain data (its inner problem and constraint are on it)")
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_world_size() > 1:
                raise UnlearnError("objective 'sibl' updates the weights itself: run it in one process")
        model = getattr(model, "module", model)
        if self.iterations >= self.T:  # the reference stops after T outer iterations
            with torch.no_grad():
                return logit_margin(model, batch["forget"])
        if self.mask is None:
            self.initialize_mask(model)
        for _ in range(self.K):
            self.inner_step(model, batch["retain"])
        with math_attention():
            forget, retain, r = self.outer_step(model, batch["forget"], batch["retain"])
        for param in model.parameters():
            param.grad = None  # the optimizer applies nothing: SIBL has stepped already
        self.iterations += 1
        self.last_terms = {
            "forget": forget,
            "retain": retain,
            "residual": torch.tensor(r),
            "lambda": torch.tensor(self.lambda_dual),
        }
        return forget

    def finish(self, model, context) -> None:
        kept = sum(int(m.sum()) for m in (self.mask or {}).values())
        total = sum(m.numel() for m in (self.mask or {}).values())
        context.info["sibl"] = {
            "outer_iterations": self.iterations,
            "lambda": self.lambda_dual,
            "mask_kept_fraction": kept / total if total else None,
        }

    def options(self) -> dict[str, Any]:
        return attributes(
            self,
            "use_sparsity sparsity sparsity_method epsilon T K eta_theta eta_in rho gamma use_implicit cg_iters cg_tol",
        )

    def __repr__(self) -> str:
        return options_repr(self)
