"""Lemmas B.2–B.4 checked on a dense, independent computation (used by ``appendix_b3``).

Model: a two-layer linear net ``f(x) = U W x`` (``W ∈ R^{h×d_x}``, ``U ∈ R^{d_y×h}``), per-sample
loss ``‖f(x) − y‖²``, float64, ``θ = (vec W, vec U)`` row-major. Its one-parameter double
rotation ``W → e^{λB}W, U → U e^{−λB}`` (``B`` symmetric, eigenvalues of both signs) is the
exponential symmetry with the dense generator ``A = diag(B ⊗ I_{d_x}, −I_{d_y} ⊗ B)``.

Everything here is computed from scratch: per-sample gradients by ``torch.func.vmap(grad)``
at every point (no transport identity), ``Σ(θ)`` the per-sample covariance (the paper's Σ),
``e^{λA}`` and ``A± `` from ``numpy.linalg.eigh`` of the dense ``A``, and ``λ*`` by
``scipy.optimize.brentq`` on ``Tr[Σ(e^{λA}θ)A]``. The paper's ``Ċ = σ²Tr[ΣA]`` (eq. 45)
enters Lemma B.2 and Corollary B.4 only through ``Tr[ΣA]``: σ² cancels or scales both sides,
so the checks below are on ``Tr[ΣA]`` (with the corrected ``2σ²`` the left side of eq. 44
doubles and the bound holds a fortiori).

Corrected Lemma B.3 (ours, derivation in docs/concepts/appendix-b.md): with
``h(λ) = θ*ᵀAe^{2λA}θ*`` (so ``C = h(−λ*)``, ``C* = h(0)``), ``−(C − C*)/λ* = h'(ξ)`` for some ξ
between ``−λ*`` and 0, and ``h'(ξ) = 2θ*ᵀA²e^{2ξA}θ*``; hence
``2θ*ᵀA²e^{−2|λ*||A|}θ* ≤ −(C − C*)/λ* ≤ 2θ*ᵀA²e^{2|λ*||A|}θ*``, both sides → ``2θ*ᵀA²θ*`` (both
blocks) as λ* → 0. The printed bound ``2θ*ᵀA±²θ*`` keeps one block only, so it fails near
the equilibrium whenever the other block of θ* is non-zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Problem", "case_record", "make_problem", "trace_sigma_a"]


@dataclass(frozen=True)
class Problem:
    """One random problem: data, generator and a start point (all float64 numpy)."""

    x: np.ndarray  # [n, d_x]
    y: np.ndarray  # [n, d_y]
    a: np.ndarray  # [P, P] dense generator
    theta0: np.ndarray  # [P]
    shapes: tuple[tuple[int, int], tuple[int, int]]


def make_problem(
    seed: int, n: int, d_x: int, h: int, d_y: int, b_eigs: tuple[float, ...]
) -> Problem:
    """Gaussian inputs, ``y = tanh(xV) + 0.5ε``, random ``W, U`` and a random-basis ``B``."""
    if len(b_eigs) != h:
        raise ValueError(f"b_eigs has {len(b_eigs)} values; expected h={h} (one per hidden unit).")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_x))
    y = np.tanh(x @ rng.standard_normal((d_x, d_y))) + 0.5 * rng.standard_normal((n, d_y))
    q, _ = np.linalg.qr(rng.standard_normal((h, h)))
    b = q @ np.diag(b_eigs) @ q.T
    a = np.zeros((h * d_x + d_y * h,) * 2)
    a[: h * d_x, : h * d_x] = np.kron(b, np.eye(d_x))
    a[h * d_x :, h * d_x :] = -np.kron(np.eye(d_y), b)
    w = rng.standard_normal((h, d_x)) / math.sqrt(d_x)
    u = rng.standard_normal((d_y, h)) / math.sqrt(h)
    return Problem(x, y, a, np.concatenate([w.ravel(), u.ravel()]), ((h, d_x), (d_y, h)))


def sigma(prob: Problem, theta: np.ndarray) -> np.ndarray:
    """Per-sample gradient covariance ``Σ(θ)`` [P, P] by ``torch.func.vmap(grad)``."""
    import torch
    from torch.func import grad, vmap

    (h, d_x), (d_y, _) = prob.shapes
    nw = h * d_x

    def loss(th: Any, xi: Any, yi: Any) -> Any:
        w = th[:nw].reshape(h, d_x)
        u = th[nw:].reshape(d_y, h)
        return ((u @ (w @ xi) - yi) ** 2).sum()

    th = torch.as_tensor(theta, dtype=torch.float64)
    xs = torch.as_tensor(prob.x, dtype=torch.float64)
    ys = torch.as_tensor(prob.y, dtype=torch.float64)
    g = vmap(grad(loss), in_dims=(None, 0, 0))(th, xs, ys).numpy()  # [n, P]
    gc = g - g.mean(0)
    return np.asarray(gc.T @ gc / g.shape[0])


def _expm(a: np.ndarray, lam: float) -> np.ndarray:
    vals, vecs = np.linalg.eigh(a)
    return np.asarray((vecs * np.exp(lam * vals)) @ vecs.T)


def trace_sigma_a(prob: Problem, theta: np.ndarray) -> float:
    """``Tr[Σ(θ)A]``."""
    return float(np.sum(sigma(prob, theta) * prob.a))


def solve_lambda_star(prob: Problem, theta: np.ndarray, bracket: float = 6.0) -> float:
    """The zero of ``λ ↦ Tr[Σ(e^{λA}θ)A]`` (decreasing, Thm 4.3) by brentq, xtol 1e-13."""
    from scipy.optimize import brentq

    def f(lam: float) -> float:
        return trace_sigma_a(prob, _expm(prob.a, lam) @ theta)

    return float(brentq(f, -bracket, bracket, xtol=1e-13, rtol=1e-13))


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    vals, vecs = np.linalg.eigh(a)
    plus = (vecs * np.clip(vals, 0.0, None)) @ vecs.T
    minus = (vecs * np.clip(vals, None, 0.0)) @ vecs.T
    return np.asarray(plus), np.asarray(minus)


def case_record(prob: Problem, theta_star: np.ndarray, lam: float) -> dict[str, float]:
    """Every side of eqs. 44, 55, 62 (printed and corrected) at ``θ = e^{−λA}θ*`` (λ* = λ).

    Also ``lambda_root``: λ* of θ re-solved from scratch (must equal ``lam``).
    """
    a = prob.a
    theta = _expm(a, -lam) @ theta_star
    s_theta, s_star = sigma(prob, theta), sigma(prob, theta_star)
    a_plus, a_minus = _split(a)
    a_s = a_plus if lam > 0 else a_minus  # the block the printed bounds keep
    t_sa = float(np.sum(s_theta * a))
    c, c_star = float(theta @ a @ theta), float(theta_star @ a @ theta_star)
    abs_a = a_plus - a_minus
    a2 = a @ a
    grow = _expm(abs_a, 2.0 * abs(lam))
    shrink = _expm(abs_a, -2.0 * abs(lam))
    blk_noise = float(np.sum(s_star * (a_s @ a_s)))
    blk_norm = float(theta_star @ a_s @ a_s @ theta_star)
    b3_hi = 2.0 * float(theta_star @ a2 @ grow @ theta_star)
    b3_lo = 2.0 * float(theta_star @ a2 @ shrink @ theta_star)
    return {
        "lam": lam,
        "lambda_root": solve_lambda_star(prob, theta),
        "b2_lhs": t_sa / lam,
        "b2_rhs": 2.0 * blk_noise,
        "b3_lhs": -(c - c_star) / lam,
        "b3_rhs_printed": 2.0 * float(theta_star @ a_s @ a_s @ theta_star),
        "b3_lo_corrected": b3_lo,
        "b3_hi_corrected": b3_hi,
        "b3_both_blocks": 2.0 * float(theta_star @ a2 @ theta_star),
        "b4_lhs": t_sa / (c - c_star),
        "b4_rhs_printed": -blk_noise / blk_norm,
        "b4_rhs_corrected": -2.0 * blk_noise / b3_hi,
        "b2_limit": 2.0 * float(np.sum(s_star * a2)),
    }
