"""Closed forms behind the approx experiment: the mean-field charge and the second-order
deviation of the charge from it (see :mod:`noetherflow.experiments.approx`).
"""

from __future__ import annotations

import math

import numpy as np


def mean_field_charge(
    zeta: float, rate: float, product: float, w2: float, u2: float, *, lam_max: float = 10.0
) -> float:
    """Mean-field stationary charge of ``ℓ = (uwx − y)² + ζ½‖θ − θ₂‖²`` on the minimum manifold.

    Derivation (ours, eq. 20 with both sides exact for this model). On the manifold
    ``w = √p e^λ, u = √p e^{−λ}`` (``p = product > 0``) every per-sample gradient of ℓ₁ is
    ``2rx·(u, w)``, so ``Σ = 4Var[rx]·vvᵀ`` with ``v = (u, w)`` and
    ``Tr[ΣA] = 4Var[rx](u² − w²) = −4Var[rx]·C``. With the drift of eq. (20),
    ``dC/dt = −2ζθᵀA(θ − θ₂) + (η/S)Tr[ΣA]``, the stationary point is

        ``(r + 2ζ)·C = 2ζ·θᵀAθ₂``,  ``r = 4(η/S)Var[rx]`` (= ``charge_relaxation_rate``),

    a scalar equation in λ (``C = 2p sinh 2λ``, ``θᵀAθ₂ = √p(e^λ w₂ − e^{−λ}u₂)``) solved by
    bisection. Small ζ: ``C ≈ 2ζθ₀ᵀAθ₂/r`` (eq. 20's first order, ``θ₀`` balanced); ζ → ∞:
    ``C → C(θ₂)``. It ignores the fluctuations of θ around the manifold, which at large ζ
    contribute ``−Tr[A·Cov θ]``, of the same order σ² as eq. (23)'s deviation; so it
    interpolates the two regimes but is not a substitute for eq. (23).
    """
    if product <= 0:
        raise ValueError(f"product={product!r}; expected p = w·u > 0.")
    if rate <= 0 or zeta < 0:
        raise ValueError(f"rate={rate!r}, zeta={zeta!r}; expected rate > 0 and zeta ≥ 0.")
    sp = math.sqrt(product)

    def f(lam: float) -> float:
        c = 2.0 * product * math.sinh(2.0 * lam)
        return (rate + 2.0 * zeta) * c - 2.0 * zeta * sp * (
            math.exp(lam) * w2 - math.exp(-lam) * u2
        )

    from scipy.optimize import brentq

    lam = float(brentq(f, -lam_max, lam_max, xtol=1e-14))  # f is increasing in λ
    return 2.0 * product * math.sinh(2.0 * lam)


def charge_deviation_second_order(
    hessian: np.ndarray,
    sigma: np.ndarray,
    generator: np.ndarray,
    zeta: float,
    lr: float,
    batch_size: int,
) -> float:
    """Stationary ``E[C] − C*`` of discrete SGD for ``ℓ = ℓ₁ + ζ·½‖θ − θ*‖²``, leading order in σ².

    Derivation (ours; completes eq. 23). Let θ* minimise both ``L₁`` and ``ℓ₂`` and write
    ``θ = θ* + δ``. The exact step identity (docs/concepts/flow.md, the cross term ``θᵀA∇ℓ₁ = 0``)
    gives ``E[ΔC] = −2ηζ E[θᵀA(θ − θ*)] + η² E[gᵀAg]`` and, since
    ``θᵀA(θ − θ*) = ½(C − C*) + ½δᵀAδ``, stationarity gives exactly

        ``E[C − C*] = (η/ζ) E[gᵀAg] − E[δᵀAδ]``,
        ``E[gᵀAg] = E[∇LᵀA∇L] + E[Tr Σ(θ)A]/S``.

    To leading order ``∇L = Hδ`` and ``Cov δ = P`` solves the discrete Lyapunov equation
    ``P = (I − ηH)P(I − ηH) + η²Σ/S`` (``H`` the Hessian of the total loss at θ*), so

        ``E[C − C*] = (η/ζ)(Tr[ΣA]/S + Tr[HAHP]) − Tr[AP] + O(σ⁴)``.

    The first term is eq. (23) when ``h_min = ζ`` (here ``∇²ℓ₂ = I``). The last one, the
    fluctuation of θ across the flat-for-ℓ₁ directions, is of the same order σ² and is dropped
    by eq. (21)'s expansion, which treats θ − θ* as deterministic. When Σ lies along an
    eigenvector of H with eigenvalue ``h_v`` the sum is eq. (23) times
    ``(1 − ζ/(2h_v)) / (1 − ηh_v/2)``.

    Args:
        hessian: ``H``, shape ``[P, P]``. sigma: per-sample gradient covariance of ℓ₁ at θ*,
            shape ``[P, P]``. generator: ``A``, shape ``[P, P]``.
        zeta, lr, batch_size: ``ζ``, ``η``, ``S``.
    """
    from scipy.linalg import solve_discrete_lyapunov

    h, sig, a = (np.asarray(m, dtype=np.float64) for m in (hessian, sigma, generator))
    if zeta <= 0:
        raise ValueError(f"zeta={zeta!r}; expected ζ > 0.")
    step = np.eye(h.shape[0]) - lr * h
    cov = solve_discrete_lyapunov(step, lr**2 * sig / batch_size)
    noise = np.trace(sig @ a) / batch_size + np.trace(h @ a @ h @ cov)
    return float(lr / zeta * noise - np.trace(a @ cov))
