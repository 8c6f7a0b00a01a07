"""The noise equilibrium of AdamW and Adam: what is exact and what is a random-walk model.

Let η, λ, β₁ denote ``lr``, the decoupled ``weight_decay`` of ``torch.optim.AdamW`` and the
first ``betas`` entry. One AdamW step is θ' = kθ + u with k = 1 − ηλ and the Adam update
u = −η·m̂/(√v̂ + ε). The update is not a gradient, so θᵀA u ≠ 0 in general.

**Exact (any family, any update).** C(θ') = k²C + 2k·θᵀAu + uᵀAu step by step
(:mod:`noetherflow.optim.decompose`). Averaging over a stationary window,

    ⟨C⟩ = (2k⟨θᵀAu⟩ + ⟨uᵀAu⟩) / (1 − k²)                                     (A1)

exactly (up to the window's boundary term (C_end − C_start)/(T(1 − k²))), with the two
update moments measured during training. Adam without decoupled decay has k = 1: (A1) then
says ⟨2θᵀAu + uᵀAu⟩ = 0, a condition and not a level.

**Random-walk model (scale-invariant weights; Kosson, Messmer & Jaggi, ICML 2024).**
Assume (i) noise-dominated gradients: E[g | past] = 0 along A; (ii) a preconditioner that has
settled, v̂ ≈ E[g²] per coordinate, β₂ → 1, ε negligible, bias correction done; then
n = g/√v̂ has mean 0 and E[nᵀAn] = Tr[A·diag(E[g²]/v̂)] ≈ Tr[A] over the coordinates that
get a gradient (for scale invariance, A = I, their number D). A coordinate whose gradient is
always 0 (an input that is constant 0) has m = v = 0, so n = 0 there: it only decays and
does not count (tested). E[g²/v̂] = 1 also needs g² to vary little on the 1/(1 − β₂)
steps that v̂ averages: sparse inputs give less than 1, heavy tails more, and v̂ remembers a
transient (large early gradients) for a few 1/(1 − β₂). With m̂ the EMA of n,
u_t = β₁u_{t−1} − η(1 − β₁)n_t, so
(θ, u) follows the linear step of :mod:`~noetherflow.optim.momentum` eq. (1) with
(p, q, r, s, t, u) = (k, β₁, −η(1 − β₁), 0, β₁, −η(1 − β₁)), and its stationary point is

    C* = η(1 − β₁)(1 + β₁ − β₁ηλ) / (λ(1 + β₁)(2 − ηλ)(1 − β₁ + β₁ηλ)) · E[nᵀAn]   (A2)
    ⟨uᵀAu⟩/C* = ηλ(2 − ηλ)(1 − β₁ + β₁ηλ) / (1 + β₁ − β₁ηλ)                       (A3)

For small ηλ: C* → ηD/(2λ), i.e. the equilibrium norm ‖θ‖ = √(ηD/(2λ)) of Kosson et al.
(independent of β₁), and the per-step angular update √(⟨‖u‖²⟩/C*) → √(2ηλ(1 − β₁)/(1 + β₁)).
Every assumption is measurable in a run: (i) by ⟨θᵀAu⟩ against (A1), (ii) by E[nᵀAn]
against D. The experiment ``optim-adamw`` reports each approximation's error.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "adamw_angular_update",
    "adamw_equilibrium_charge",
    "decoupled_stationary_charge",
    "rotational_equilibrium_norm",
]


def _check(lr: float, decay: float, beta1: float = 0.0) -> None:
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr={lr!r} must be a positive finite learning rate η.")
    if not (decay > 0 and lr * decay < 2):
        raise ValueError(
            f"weight_decay={decay!r} must be > 0 with lr·weight_decay < 2 (AdamW's decoupled λ; "
            "without decay there is no finite equilibrium norm)."
        )
    if not 0 <= beta1 < 1:
        raise ValueError(f"beta1={beta1!r} must lie in [0, 1).")


def decoupled_stationary_charge(
    update_sq: Tensor | float, cross: Tensor | float, *, lr: float, weight_decay: float
) -> Tensor:
    """Eq. (A1): ⟨C⟩ from the measured ⟨uᵀAu⟩ (``update_sq``) and ⟨θᵀAu⟩ (``cross``).

    Exact for time averages over a stationary window; any family (charge-shaped inputs).
    """
    _check(lr, weight_decay)
    k = 1 - lr * weight_decay
    u = torch.as_tensor(update_sq, dtype=torch.float64)
    c = torch.as_tensor(cross, dtype=torch.float64)
    return (2 * k * c + u) / (1 - k * k)


def adamw_equilibrium_charge(
    noise: Tensor | float, *, lr: float, weight_decay: float, beta1: float
) -> Tensor:
    """Eq. (A2): the random-walk C* from E[nᵀAn] (``noise``; ≈ D for scale invariance)."""
    _check(lr, weight_decay, beta1)
    eta, lam, b = lr, weight_decay, beta1
    w = eta * (1 - b) * (1 + b - b * eta * lam)
    w /= lam * (1 + b) * (2 - eta * lam) * (1 - b + b * eta * lam)
    return w * torch.as_tensor(noise, dtype=torch.float64)


def adamw_angular_update(*, lr: float, weight_decay: float, beta1: float) -> float:
    """Eq. (A3): the RMS per-step angular update √(⟨uᵀAu⟩/C*) (radians) in the random walk."""
    _check(lr, weight_decay, beta1)
    eta, lam, b = lr, weight_decay, beta1
    return math.sqrt(
        eta * lam * (2 - eta * lam) * (1 - b + b * eta * lam) / (1 + b - b * eta * lam)
    )


def rotational_equilibrium_norm(n_coords: int, *, lr: float, weight_decay: float) -> float:
    """Kosson et al.'s small-ηλ limit of (A2): ‖θ‖ = √(ηD/(2λ)).

    D = ``n_coords``, the scale-invariant coordinates that get a gradient (module docstring).
    """
    _check(lr, weight_decay)
    return math.sqrt(lr * n_coords / (2 * weight_decay))
