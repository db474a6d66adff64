"""The random-residual control of ``reglu_tofu_v2``: a residual LoRA init of RILA's size, without its
information.

RILA starts every module at B = Q (d_out x r, orthonormal: directions the forget data uses more
than the retain data), A = Q^T W0, and corrects the base to W0 - s B A. Its adapter therefore
starts far from PEFT's B = 0, and at the same learning rate a residual init moves further than
the default one: comparing IHL + RILA with IHL alone mixes the size of that starting point with
RILA's guidance. This control keeps the size and drops the guidance: per module, RILA's
solution is computed (same options, same data) only to read ||s B A||_F = s ||Q^T W0||_F, and
the adapter is written with random directions of exactly that norm:

    B = orthonormal columns of a Gaussian d_out x r matrix (as RILA's B = Q),
    A = c V^T, V the orthonormal columns of a Gaussian d_in x r matrix,
    c = ||Q^T W0||_F / sqrt(r), so ||A||_F = ||RILA's A||_F and ||s B A||_F = RILA's,

and the base is corrected as RILA's (:func:`residual.write_residual`: W0 - s B A in fp32), so
the model is unchanged at step 0. B and A have RILA's Frobenius norms factor by factor; their
directions are drawn from a generator seeded by ``seed`` (default: drawn from the run's seeded
RNG, so ``--seed`` decides them), independent of the forget and retain data.
"""

from __future__ import annotations

from typing import Annotated

from ..interfaces import InitResult
from ..training.config import ConfigError
from .residual import residual_result, write_residual
from .rila import RILAInit

NORM_SOURCES = ("rila",)


def random_factors(d_out: int, d_in: int, r: int, norm: float, generator):
    """(A (r x d_in), B (d_out x r)), float64 on the CPU: B with orthonormal columns, A = c V^T
    with V orthonormal, c such that ||B A||_F = ``norm`` (B A's r singular values all equal)."""
    import torch

    if r > min(d_out, d_in):
        raise ConfigError(
            f"random_residual needs the LoRA rank ({r}) at most the module's smaller side ({min(d_out, d_in)})"
        )
    b, _ = torch.linalg.qr(torch.randn(d_out, r, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d_in, r, generator=generator, dtype=torch.float64))
    return (norm / r**0.5) * v.T, b


class RandomResidualInit:
    """Random residual init with RILA's per-module norm ||s B A||_F. Options: norm_from ("rila":
    the only source), seed (None: drawn from the run's seeded RNG; an integer fixes the
    directions), and RILA's options for the norm: beta, mode, n_samples, pad_to, batch_size,
    path, rila_seed (RILA's ``seed``: its retain-partner draw) and rol_rank (the retain basis
    handed to ``rol``, RILA's: a regulariser's data, not part of the init)."""

    residual = True

    def __init__(
        self,
        norm_from: Annotated[str, "whose per-module norm ||s B A||_F to copy: rila"] = "rila",
        seed: Annotated[int | None, "seed of the random directions (None: from the run's --seed)"] = None,
        beta: Annotated[float, "RILA's beta, for the norm"] = 0.7,
        mode: Annotated[str, "RILA's mode, for the norm: 'faithful' or 'token'"] = "faithful",
        n_samples: Annotated[int | str | None, 'RILA\'s n_samples, for the norm ("all": every example)'] = 256,
        rila_seed: Annotated[int, "RILA's seed (its retain-partner draw), for the norm"] = 0,
        pad_to: Annotated[int | None, "RILA's pad_to, for the norm"] = None,
        rol_rank: Annotated[int, "k of RILA's retain basis handed to the rol regulariser"] = 128,
        batch_size: Annotated[int, "examples per forward pass while measuring"] = 8,
        path: Annotated[str | None, "RILA's exact path: dense, rows or factored (None: cheapest)"] = None,
    ):
        if norm_from not in NORM_SOURCES:
            raise ConfigError(
                f"random_residual option norm_from must be one of {', '.join(NORM_SOURCES)}, got {norm_from!r}"
            )
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ConfigError(f"random_residual option seed must be an integer >= 0 or None, got {seed!r}")
        try:
            self.rila = RILAInit(
                beta=beta,
                mode=mode,
                n_samples=n_samples,
                seed=rila_seed,
                pad_to=pad_to,
                rol_rank=rol_rank,
                batch_size=batch_size,
                path=path,
            )
        except ConfigError as exc:  # "rila option seed ..." reads as this initializer's option
            message = str(exc).replace("rila option seed", "random_residual option rila_seed")
            raise ConfigError(message.replace("rila option", "random_residual option")) from exc
        self.norm_from, self.seed = norm_from, seed

    def initialize(self, peft_model, *, forget, retain, tokenizer) -> InitResult:
        import torch

        adapter = peft_model.active_adapter
        modules, solved, paths, samples = self.rila.solve_modules(
            peft_model, forget=forget, retain=retain, tokenizer=tokenizer, who="random_residual (norm_from=rila)"
        )
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        generator = torch.Generator().manual_seed(seed)
        bases, norms = {}, []
        for name, module in modules.items():  # model order: the draws do not depend on the data
            solution = solved.pop(name)
            w0 = module.get_base_layer().weight
            d_out, d_in = w0.shape
            q = solution.q.to(w0.device)
            norm = float(torch.linalg.matrix_norm(q.T @ w0.double()))  # ||RILA's A||_F = ||B A||_F
            a, b = random_factors(d_out, d_in, module.r[adapter], norm, generator)
            write_residual(module, adapter, a, b)
            bases[name] = solution.retain_basis.float().to(w0.device)
            norms.append(module.scaling[adapter] * norm)
        span = {"min": min(norms), "max": max(norms)} if norms else {}
        rila = {"beta": self.rila.beta, "mode": self.rila.mode, "paths": paths, "samples": samples}
        info = {"init": "random_residual", "norm_from": self.norm_from, "seed": seed, **rila, "residual_norm": span}
        return residual_result(peft_model, bases, **info)
