"""Lemma B.5 and Thm B.6 on the noise-driven charge flow of one neuron (used by ``appendix_b3``).

Setting (the lemma's own: the charge follows the noise term of the Noether flow while its
equilibrium C* moves as a drifted Brownian motion). The neuron ``u·wᵀx`` sits on its function
minimum ``uw = p`` (``‖p‖`` = ``p``); ``x₁`` has variance ``s_x`` and the label noise
``σ_ε``. With ``b² = ‖w‖²`` and ``C = b² − p²/b²`` the flow (library factor, eq. 7 corrected)
is ``dC/dt = (η/S)Tr[ΣA] = (η/S)4σ_ε²(p²(s_x + d − 1)/b² − s_x b²) = k(a⁴/b² − b²)`` with
``k = (η/S)·4σ_ε²s_x`` and ``a²`` the equilibrium ``b²`` (``a⁴ = p²(s_x + d − 1)/s_x``); SGF has
no diffusion in C on the minimum (θᵀAΣ^{1/2} = 0 there). Driving ``s_x`` moves ``C* = a² − p²/a²``
anywhere; ``σ_ε² ∝ 1/s_x`` keeps ``k`` fixed, so only ``k`` and the path of C* matter.

Lemma B.5's rate: the block ratios at θ* are ``Tr[Σ*A₊²]/θ*ᵀA₊²θ* = 4σ_ε²s_x`` and
``Tr[Σ*A₋²]/θ*ᵀA₋²θ* = 4σ_ε²s_x a⁴/p²``, so ``r₀ = (η/S)c₀ = k·min(1, a⁴/p²)`` (= k while
C* ≥ 0); the linear rate is ``r = 2k/(1 + p²/a⁴) ∈ [r₀, 2r₀]``. The corrected bound (ours,
docs/concepts/appendix-b.md) is ``E(C − C*)² ≤ μ²/r₀² + s²/(2r₀)`` (large t), the printed one
``(2μ² + s²)/(2σ⁴c₀²)``; they differ in how the noise term scales with the rate: ``1/r₀``
against ``1/r₀²``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["b_squared", "linear_rate", "simulate_charge"]


def b_squared(c: np.ndarray | float, p: float) -> np.ndarray:
    """``b²`` with ``b² − p²/b² = c`` (the positive root). Same shape as ``c``."""
    c = np.asarray(c, dtype=float)
    return np.asarray(0.5 * (c + np.sqrt(c * c + 4.0 * p * p)))


def simulate_charge(
    *,
    k: float,
    mu: float,
    s: float,
    c_star0: float,
    c0: float,
    t_end: float,
    n_paths: int,
    dt_rate: float,
    n_logs: int,
    seed: int,
    p: float = 1.0,
) -> dict[str, np.ndarray]:
    """Euler(–Maruyama) paths of ``(C, C*)``: ``dC* = μdt + s dW``, ``dC = k(a⁴/b² − b²)dt``.

    Args:
        k: the rate scale (η/S)·4σ_ε²s_x (> 0).
        mu, s: drift and volatility of C* (per unit time).
        c_star0, c0: C*(0) and C(0).
        t_end: horizon; the step is ``dt = dt_rate/(2k)`` (2k bounds the linear rate).
        n_paths: independent paths; n_logs: logged times (evenly spaced, including 0).

    Returns:
        ``t`` [L], ``C`` and ``C_star`` [L, n_paths], ``r0_path`` [n_paths] (k·min over the path
        of min(1, a⁴/p²)).
    """
    if not (k > 0 and t_end > 0 and n_paths >= 1 and 0 < dt_rate <= 0.1):
        raise ValueError(
            f"k={k!r}, t_end={t_end!r}, n_paths={n_paths!r}, dt_rate={dt_rate!r}; expected "
            "k > 0, t_end > 0, n_paths ≥ 1 and 0 < dt_rate ≤ 0.1 (Euler stability)."
        )
    dt = dt_rate / (2.0 * k)
    n_steps = math.ceil(t_end / dt)
    dt = t_end / n_steps
    log_at = np.unique(np.linspace(0, n_steps, n_logs).round().astype(np.int64))
    rng = np.random.default_rng(seed)
    c = np.full(n_paths, float(c0))
    cs = np.full(n_paths, float(c_star0))
    ratio_min = np.full(n_paths, np.inf)
    out_c, out_cs = [], []
    li = 0
    sq = s * math.sqrt(dt)
    block = 4096
    for start in range(0, n_steps + 1, block):
        m = min(block, n_steps + 1 - start)
        xi = rng.standard_normal((m, n_paths)) if s > 0 else None
        for j in range(m):
            step = start + j
            if li < len(log_at) and step == log_at[li]:
                out_c.append(c.copy())
                out_cs.append(cs.copy())
                li += 1
            if step == n_steps:
                break
            a2 = b_squared(cs, p)
            ratio_min = np.minimum(ratio_min, np.minimum(1.0, a2 * a2 / (p * p)))
            b2 = b_squared(c, p)
            c = c + dt * k * (a2 * a2 / b2 - b2)
            cs = cs + mu * dt + (sq * xi[j] if xi is not None else 0.0)
    return {
        "t": dt * log_at[: len(out_c)],
        "C": np.array(out_c),
        "C_star": np.array(out_cs),
        "r0_path": k * ratio_min,
    }


def linear_rate(k: float, c_star: np.ndarray | float, p: float = 1.0) -> np.ndarray:
    """``r = 2k/(1 + p²/a⁴)`` at the equilibrium charge ``c_star``. Same shape."""
    a2 = b_squared(c_star, p)
    return np.asarray(2.0 * k / (1.0 + p * p / (a2 * a2)))
