"""Thm 5.4's chain solved by the library: the equilibrium that noetherflow's solver finds for a
deep linear chain, against the chain's closed form (eq. 16), on an exact design.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from noetherflow.experiments._base import derive_seed
from noetherflow.theory.ziyin2024 import (
    deep_linear_sgd_solution,
)

if TYPE_CHECKING:
    from noetherflow.experiments.thm54 import Config

_DTYPE = torch.float64


def exact_design(n: int, cov: Tensor, gen: torch.Generator) -> Tensor:
    """``n`` zero-mean points whose empirical second moment is exactly ``cov``; ``[n, d]``."""
    d = cov.shape[0]
    if n <= d:
        raise ValueError(f"n_design={n} must exceed the dimension {d} (zero mean, full rank).")
    a = torch.randn(n, d + 1, generator=gen, dtype=_DTYPE)
    a[:, 0] = 1.0
    q, _ = torch.linalg.qr(a)
    z = q[:, 1:] * math.sqrt(n)  # orthogonal to the ones vector, (1/n) zᵀz = I
    return z @ torch.linalg.cholesky(cov).T


def _sq_loss(out: Tensor, target: Tensor) -> Tensor:
    return ((out - target) ** 2).sum(dim=-1).mean()


def _partial_grams(ws: list[Tensor]) -> list[Tensor]:
    out, p = [], ws[0]
    out.append(p.T @ p)
    for w in ws[1:-1]:
        p = w @ p
        out.append(p.T @ p)
    return out


def chain_solver_check(
    cfg: Config, V: Tensor, sx: Tensor, se: Tensor, depth: int, seed: int
) -> dict[str, Any]:
    """Random orbit point of the minimum → ``solve_equilibrium`` → compare with Thm 5.4."""
    import noetherflow as nf

    gen = torch.Generator().manual_seed(derive_seed(seed, "thm54", "chain", depth))
    k = cfg.rank
    xs = exact_design(cfg.n_design, sx, gen)
    es = exact_design(cfg.n_design, se, gen)
    x = xs.repeat_interleave(cfg.n_design, dim=0)
    y = x @ V.T + es.repeat(cfg.n_design, 1)
    emp_sx, emp_se = x.T @ x / x.shape[0], (y - x @ V.T).T @ (y - x @ V.T) / x.shape[0]
    theory = deep_linear_sgd_solution(V, sx, se, hidden_dims=[k] * (depth - 1))
    ws = [w.clone() for w in theory.weights]
    conds = []
    for i in range(depth - 1):
        G = torch.randn(k, k, generator=gen, dtype=_DTYPE)
        conds.append(float(torch.linalg.cond(G)))
        ws[i], ws[i + 1] = G @ ws[i], ws[i + 1] @ torch.linalg.inv(G)
    dims = [cfg.d_x] + [k] * (depth - 1) + [cfg.d_y]
    layers = [nn.Linear(dims[i], dims[i + 1], bias=False, dtype=_DTYPE) for i in range(depth)]
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for layer, w in zip(layers, ws, strict=True):
            layer.weight.copy_(w)
    syms = nf.SymmetrySet([nf.DoubleRotation(layers[i], layers[i + 1]) for i in range(depth - 1)])

    def weights() -> list[Tensor]:
        return [layer.weight.detach().clone() for layer in layers]

    def product(wl: list[Tensor]) -> Tensor:
        p = wl[0]
        for w in wl[1:]:
            p = w @ p
        return p

    def gram_err(wl: list[Tensor]) -> float:
        errs = [
            float(torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b))
            for a, b in zip(_partial_grams(wl), _partial_grams(theory.weights), strict=True)
        ]
        return max(errs)

    before = weights()
    err_before = gram_err(before)
    t0 = time.perf_counter()
    stats = nf.collect_stats(model, syms, _sq_loss, x, y, estimator="reference")
    sol = nf.solve_equilibrium(
        syms,
        stats,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        weight_decay=0.0,
        time="continuous",
        options=nf.SolveOptions(tol=cfg.solver_tol),
    )
    nf.teleport(model, sol)
    solve_s = time.perf_counter() - t0
    after = weights()
    norms_after = [float((w * w).sum()) for w in after]
    norm_err = max(abs(a / b - 1.0) for a, b in zip(norms_after, theory.norms_sq, strict=True))
    return {
        "depth": depth,
        "n_samples": int(x.shape[0]),
        "design_moment_err": max(
            float((emp_sx - sx).abs().max() / sx.abs().max()),
            float((emp_se - se).abs().max() / se.abs().max()),
        ),
        "orbit_condition_numbers": conds,
        "gram_rel_err_before": err_before,
        "gram_rel_err_after": gram_err(after),
        "norm_rel_err_after": norm_err,
        "product_change": float(
            torch.linalg.matrix_norm(product(after) - product(before))
            / torch.linalg.matrix_norm(product(before))
        ),
        "norms_sq_after": norms_after,
        "norms_sq_theory": list(theory.norms_sq),
        "converged": bool(sol.converged),
        "sweeps": int(sol.iterations),
        "at_infinity": [r.name for r in sol.at_infinity],
        "max_residual": max(sol.residual.values(), default=float("nan")),
        "solve_s": solve_s,
    }
