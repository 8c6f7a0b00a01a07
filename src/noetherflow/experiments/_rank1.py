"""Closed forms of the rank-1 factorisation ``f(x) = UWx`` (hidden width 1) of Fig. 4.

Per-sample loss ``ℓ = ‖UWx − y‖²`` (eq. 12 without weight decay), inputs
``x ~ N(0, input_var·I)``, ``y = Vx + ε``. Shared by :mod:`~noetherflow.experiments.fig4` and
:mod:`~noetherflow.experiments.teleport_fig4`; each closed form is checked against autograd
or a dense eigen-solver in the tests.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from noetherflow._divergence import diverged_mask
from noetherflow.experiments._base import derive_seed

if TYPE_CHECKING:
    from noetherflow.experiments.fig4 import Config

__all__ = [
    "library_checks",
    "orbit_stability",
    "loss_fn",
    "orbit_top_eig",
    "per_sample_hessian_top_eig",
    "per_sample_top_eig",
    "population_top_eig",
    "sample_population",
    "sharpness",
    "torch_model",
]


def sharpness(U: np.ndarray, W: np.ndarray, input_var: float) -> np.ndarray:
    """``Tr ∇²L`` for ``ℓ = ‖UWx − y‖²``, ``Σ_x = input_var·I`` (Prop. 5.3, factor 2).

    Args:
        U: has shape ``[..., d_y, d]``. W: has shape ``[..., d, d_x]``.

    Returns:
        Has shape ``[...]``.
    """
    d_y, d_x = U.shape[-2], W.shape[-1]
    out: np.ndarray = 2.0 * input_var * (d_y * (W * W).sum((-2, -1)) + d_x * (U * U).sum((-2, -1)))
    return out


def per_sample_top_eig(U: np.ndarray, W: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """λ_max of ∇²ℓ_x for ℓ = ‖UWx − y‖², hidden width 1, per sample, closed form.

    With h = Wx, a = hU + r (r = Uh − y) and θ = (U, W): ∇²_UU = 2h²I, ∇²_WW = 2‖U‖²xxᵀ,
    ∇²_UW = 2a xᵀ. The Hessian acts as 2h² on the vectors of U-space orthogonal to a, as 0
    on the W-space orthogonal to x, and on span{(â, 0), (0, x̂)} as the 2×2 matrix
    ``[[2h², 2‖a‖‖x‖], [2‖a‖‖x‖, 2‖U‖²‖x‖²]]``, whose top eigenvalue (≥ 2h²) is

        λ_max = h² + ‖U‖²‖x‖² + sqrt((h² − ‖U‖²‖x‖²)² + 4‖a‖²‖x‖²).

    Checked against :func:`per_sample_hessian_top_eig` (dense eigvalsh) and
    ``nf.top_eigenvalue`` in the tests.

    Args:
        U: has shape ``[R, d_y, 1]``. W: has shape ``[R, 1, d_x]``.
        x: has shape ``[N, d_x]``. y: has shape ``[N, d_y]``.

    Returns:
        Has shape ``[R, N]``.
    """
    u, w = U[..., 0], W[:, 0, :]  # [R, d_y], [R, d_x]
    h = np.einsum("rj,nj->rn", w, x)  # [R, N]
    a = 2.0 * h[..., None] * u[:, None, :] - y[None]  # hU + r = 2hU − y, [R, N, d_y]
    h2 = h * h
    ux = (u * u).sum(1)[:, None] * (x * x).sum(1)[None, :]
    a2x2 = (a * a).sum(-1) * (x * x).sum(1)[None, :]
    out: np.ndarray = h2 + ux + np.sqrt((h2 - ux) ** 2 + 4.0 * a2x2)
    return out


def per_sample_hessian_top_eig(
    U: np.ndarray, W: np.ndarray, x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """Reference for :func:`per_sample_top_eig`: the dense ``[d_y + d_x]²`` Hessian per sample,
    ``np.linalg.eigvalsh``. Same shapes. Slow; for tests and spot checks."""
    u, w = U[..., 0], W[:, 0, :]
    h = np.einsum("rj,nj->rn", w, x)
    r = h[..., None] * u[:, None, :] - y[None]
    dy, dx = u.shape[1], w.shape[1]
    H = np.zeros((*h.shape, dy + dx, dy + dx))
    H[..., :dy, :dy] = 2 * (h**2)[..., None, None] * np.eye(dy)
    H[..., dy:, dy:] = 2 * (u * u).sum(1)[:, None, None, None] * np.einsum("ni,nj->nij", x, x)[None]
    cross = 2 * np.einsum("rni,nj->rnij", h[..., None] * u[:, None, :] + r, x)
    H[..., :dy, dy:] = cross
    H[..., dy:, :dy] = cross.swapaxes(-1, -2)
    out: np.ndarray = np.linalg.eigvalsh(H)[..., -1]
    return out


def population_top_eig(U: np.ndarray, W: np.ndarray, V: np.ndarray, input_var: float) -> np.ndarray:
    """λ_max of ∇²L for L = σ_x²‖UW − V‖² + const (x ~ N(0, σ_x²I)). Has shape ``[R]``."""
    u, w = U[..., 0], W[:, 0, :]
    P = np.einsum("ri,rj->rij", u, w) - V
    dy, dx = u.shape[1], w.shape[1]
    H = np.zeros((u.shape[0], dy + dx, dy + dx))
    H[:, :dy, :dy] = 2 * input_var * (w * w).sum(1)[:, None, None] * np.eye(dy)
    H[:, dy:, dy:] = 2 * input_var * (u * u).sum(1)[:, None, None] * np.eye(dx)
    cross = 2 * input_var * (np.einsum("ri,rj->rij", u, w) + P)
    H[:, :dy, dy:] = cross
    H[:, dy:, :dy] = cross.swapaxes(-1, -2)
    out: np.ndarray = np.linalg.eigvalsh(H)[:, -1]
    return out


def orbit_top_eig(
    U: np.ndarray, W: np.ndarray, x: np.ndarray, y: np.ndarray, lams: np.ndarray
) -> np.ndarray:
    """``E_x λ_max(∇²ℓ_x)`` at ``(e^{−λ}U, e^{λ}W)`` for every λ of ``lams``: ``[R, len(lams)]``.

    The orbit of the rescaling symmetry (same function, Noether charge moved); its minimum
    over λ is the flattest point any teleport of the initialisation can reach.
    """
    return np.stack(
        [per_sample_top_eig(U * math.exp(-lam), W * math.exp(lam), x, y).mean(1) for lam in lams],
        axis=1,
    )


def sample_population(
    rng: np.random.Generator, cfg: Config, V: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` fresh samples ``x ~ N(0, input_var·I)``, ``y = Vx + ε``: ``[n, d]`` each."""
    x = rng.standard_normal((n, cfg.d_io)) * math.sqrt(cfg.input_var)
    y = x @ V.T + rng.standard_normal((n, cfg.d_io)) * math.sqrt(cfg.noise_var)
    return x, y


def torch_model(U: np.ndarray, W: np.ndarray) -> tuple[Any, Any]:
    """``(nn.Sequential(W, U), SymmetrySet[Rescaling])`` of one ``U`` ``[d_y, 1]``, ``W``
    ``[1, d_x]`` in float64: the library's view of the factorisation (charge ``‖W‖² − ‖U‖²``)."""
    import torch
    from torch import nn

    import noetherflow as nf

    first = nn.Linear(W.shape[1], W.shape[0], bias=False).double()
    second = nn.Linear(U.shape[1], U.shape[0], bias=False).double()
    with torch.no_grad():
        first.weight.copy_(torch.as_tensor(W))
        second.weight.copy_(torch.as_tensor(U))
    net = nn.Sequential(first, second)
    return net, nf.SymmetrySet([nf.Rescaling(first, second, label="neuron")])


def loss_fn(out: Any, target: Any) -> Any:
    """Per-sample ``‖f(x) − y‖²`` (sum over outputs), mean over the batch (eq. 12, γ = 0)."""
    return ((out - target) ** 2).sum(1).mean()


def orbit_stability(
    cfg: Config, seed: int, V: np.ndarray, Uk: np.ndarray, Wk: np.ndarray
) -> dict[str, Any]:
    """Per seed: ``E_x λ_max(∇²ℓ_x)`` at the init ``(Uk, Wk)`` and its minimum over the orbit
    (``orbit_grid`` values of λ in ±``orbit_span``), against ``2/η_max``."""
    rng = np.random.default_rng(derive_seed(seed, "fig4", "hessian", cfg.input_var))
    x, y = sample_population(rng, cfg, V, cfg.hessian_samples)
    lams = np.linspace(-cfg.orbit_span, cfg.orbit_span, cfg.orbit_grid)
    orbit = orbit_top_eig(Uk, Wk, x, y, lams)
    at_init = per_sample_top_eig(Uk, Wk, x, y).mean(1)
    orbit_min = orbit.min(1)
    return {
        "threshold_2_over_lr_max": 2.0 / cfg.lr_max,
        "top_eig_kaiming": at_init,
        "orbit_min_top_eig": orbit_min,
        "orbit_argmin_lambda": lams[orbit.argmin(1)],
        "orbit_min_over_threshold_mean": float(np.mean(orbit_min) * cfg.lr_max / 2.0),
        "seeds_with_stable_orbit_point": int(np.sum(orbit_min < 2.0 / cfg.lr_max)),
        "orbit_min_at_grid_edge": bool(np.any(np.abs(lams[orbit.argmin(1)]) >= cfg.orbit_span)),
    }


def library_checks(
    cfg: Config, seed: int, V: np.ndarray, U: np.ndarray, W: np.ndarray
) -> dict[str, Any]:
    """At each final SGD state: nf.charges against ‖W‖² − ‖U‖², and the noise equilibrium
    (nf.collect_stats on fresh samples + nf.solve_equilibrium + nf.teleport) whose sharpness
    is the library's prediction of S_end, for comparison with Thm 5.2 (theory module)."""
    import torch

    import noetherflow as nf

    rng = np.random.default_rng(derive_seed(seed, "fig4", "library", cfg.input_var))
    x, y = (torch.as_tensor(a) for a in sample_population(rng, cfg, V, cfg.stats_batch))
    charge_err, s_eq = [], []
    for U_f, W_f in zip(U, W, strict=True):
        if diverged_mask(U_f).any() or diverged_mask(W_f).any():
            continue
        net, syms = torch_model(U_f, W_f)
        c = float(nf.charges(syms)["neuron"][0])
        ref = float((W_f**2).sum() - (U_f**2).sum())
        charge_err.append(abs(c - ref) / max(abs(ref), 1e-300))
        stats = nf.collect_stats(net, syms, loss_fn, x, y)
        sol = nf.solve_equilibrium(syms, stats, lr=cfg.lr_small, batch_size=cfg.batch_size)
        nf.teleport(net, sol)
        Ut = net[1].weight.detach().numpy()
        Wt = net[0].weight.detach().numpy()
        s_eq.append(float(sharpness(Ut, Wt, cfg.input_var)))
    return {
        "charge_max_rel_err": max(charge_err) if charge_err else math.nan,
        "S_equilibrium": s_eq,
        "S_equilibrium_mean": float(np.mean(s_eq)) if s_eq else math.nan,
    }
