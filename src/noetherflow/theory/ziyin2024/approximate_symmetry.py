"""Approximate symmetry ``ℓ = ℓ₁ + ζℓ₂`` in continuous time (§5.4, eqs. 20–23)."""

from __future__ import annotations

from noetherflow.theory.ziyin2024._common import _check_positive
from noetherflow.theory.ziyin2024.charge_dynamics import charge_relaxation_rate


def approximate_symmetry_flow(
    zeta: float, grad_l2_A_theta: float, trace_sigma_A: float, lr: float, batch_size: int
) -> float:
    """``dC/dt = −2ζ ∇ℓ₂ᵀAθ + (η/S) Tr[ΣA]`` for ``ℓ = ℓ₁ + ζℓ₂`` (paper eq. 20).

    The drift of ``C = θᵀAθ`` is ``−∇Cᵀ∇L = −2θᵀA(∇L₁ + ζ∇ℓ₂)`` and ``θᵀA∇L₁ = 0``. The
    paper's ``−ζ∇ℓ₂ᵀAθ + σ²Tr[ΣA]`` has both factors of 2 missing; they cancel in its
    fixed-point condition (20), ``ζ∇ℓ₂ᵀAθ = σ²Tr[ΣA]``, which is therefore right.
    (Weight decay is the case ``ζℓ₂ = γ‖θ‖²``: eq. 9.)
    """
    _check_positive("lr", lr)
    _check_positive("batch_size", batch_size)
    return -2.0 * zeta * grad_l2_A_theta + lr / batch_size * trace_sigma_A


def approximate_symmetry_charge_shift_small_zeta(
    zeta: float,
    grad_l2_A_theta: float,
    trace_sigma_A2: float,
    theta_A2_theta: float,
    lr: float,
    batch_size: int,
    *,
    weight_decay: float = 0.0,
) -> float:
    """First-order shift ``C − C₀`` of the stationary charge for small ``ζ`` (§5.4, eq. 20).

    Derivation (ours; the paper only says "a first-order correction in ζ"). Linearise the
    flow of eq. (20) along the orbit ``e^{λA}θ₀`` of the exact-symmetry equilibrium ``θ₀``:
    ``Ċ ≈ −r (C − C₀) − 2ζ∇ℓ₂(θ₀)ᵀAθ₀`` with ``r`` from :func:`charge_relaxation_rate`, so

        ``C − C₀ = −2ζ ∇ℓ₂(θ₀)ᵀAθ₀ / r + O(ζ²)``,
        ``r = 4γ + (η/S) Tr[Σ(θ₀)A²] / θ₀ᵀA²θ₀``.

    Assumes the motion stays on the orbit (the ``ζ`` term may also move ``θ`` off it).
    """
    rate = charge_relaxation_rate(
        trace_sigma_A2, theta_A2_theta, lr, batch_size, weight_decay, time="continuous"
    )
    return -2.0 * zeta * grad_l2_A_theta / rate


def approximate_symmetry_displacement(
    zeta: float,
    hessian_eigenvalue: float,
    n_A_theta: float,
    trace_sigma_A: float,
    lr: float,
    batch_size: int,
) -> float:
    """Eq. (22): ``s = (θ − θ*)·n = σ²Tr[ΣA] / (ζ h n ᵀAθ*)`` with ``σ² = η/(2S)``.

    For the solution family where ``θ − θ*`` is an eigenvector ``n`` of ``H = ∇²ℓ₂(θ*)``
    with eigenvalue ``h > 0``, ``θ*`` a minimum of ``ℓ₂``; leading order in ``σ²``.
    """
    _check_positive("hessian_eigenvalue", hessian_eigenvalue)
    if zeta == 0.0 or n_A_theta == 0.0:
        raise ValueError("zeta and n_A_theta must be nonzero; expected the large-ζ regime.")
    sigma2 = lr / (2.0 * batch_size)
    return sigma2 * trace_sigma_A / (zeta * hessian_eigenvalue * n_A_theta)


def approximate_symmetry_charge_shift_large_zeta(
    zeta: float, hessian_eigenvalue: float, trace_sigma_A: float, lr: float, batch_size: int
) -> float:
    """Eq. (23): ``C − C* = 2σ²Tr[ΣA]/(ζh) = (η/S)Tr[ΣA]/(ζh)`` to leading order in ``σ²``.

    The paper's constant is right in our convention (the factors of eq. 20 cancel). Use
    ``h = h_min`` for the paper's approximation ``C ≈ C* + 2σ²Tr[ΣA]/h_min``.
    """
    _check_positive("hessian_eigenvalue", hessian_eigenvalue)
    _check_positive("lr", lr)
    _check_positive("batch_size", batch_size)
    if zeta == 0.0:
        raise ValueError("zeta=0; expected the large-ζ regime (ζ > 0).")
    return lr / batch_size * trace_sigma_A / (zeta * hessian_eigenvalue)
