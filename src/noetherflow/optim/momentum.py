"""The noise equilibrium of SGD with momentum (beyond the paper; DESIGN §2.1b, issue #18).

Let η, β, γ, S denote ``lr``, ``momentum``, ``weight_decay`` (γ‖θ‖² in the loss; PyTorch's
coupled ``SGD(weight_decay=λ)`` is γ = λ/2) and ``batch_size``. PyTorch's
``SGD(momentum=β, dampening=0)`` keeps a buffer b; with the displacement v = −η·b it reads

    heavy ball:  v' = βv − η(g + 2γθ),   θ' = θ + v'
    Nesterov:    v' = βv − η(g + 2γθ),   θ' = θ + βv' − η(g + 2γθ)

(g the minibatch gradient of the data loss; PyTorch's first step sets b = g + 2γθ, i.e.
v = 0 before it). Both are one linear step of (θ, v):

    θ' = p θ + q v + r g,    v' = s θ + t v + u g                          (1)

heavy ball (p, q, r, s, t, u) = (1 − 2ηγ, β, −η, −2ηγ, β, −η); Nesterov
(1 − 2ηγ(1 + β), β², −η(1 + β), −2ηγ, β, −η).

**The exact one-step map.** For a symmetry generator A (θᵀA g = 0 for every minibatch
gradient), the charge C = θᵀAθ alone is not Markov; with the cross term B = θᵀAv and the
buffer term E = vᵀAv, (1) gives *exactly* (no expectation)

    C' = p²C + 2pq B + q²E + r² G + 2qr H
    B' = ps C + (pt + qs) B + qt E + ru G + (qu + rt) H                    (2)
    E' = s²C + 2st B + t²E + u² G + 2tu H

with G = gᵀAg and H = vᵀAg. For the heavy ball this is DESIGN §2.1b's map. The relations
hold entrywise for a rotation's matrix charge (every entry is a bilinear form).

**Expectation.** Over the batch (drawn with replacement, independent of the past),
E[G] = Tr[A(∇L∇Lᵀ + Σ/S)] and E[H] = vᵀA∇L. H vanishes only where ∇L = 0 along A (noise
dominated); otherwise it is the correlation of the buffer with the mean gradient.

**Stationary point.** Averaging (2) over a stationary run gives (I − T)x = 𝐠⟨G⟩ + 𝐡⟨H⟩ for
x = (⟨C⟩, ⟨B⟩, ⟨E⟩): exact for time averages, whatever the noise. For the heavy ball,
with a = ηγ,

    C* = (1 + β)(η²⟨G⟩ − 2βη⟨H⟩) / (4a(1 − β)(1 + β − a))                   (3)
    B* = 2a C*/(1 + β),    E* = 4a C*/(1 + β)                               (4)

(4) holds step by step too: C' − B' = (1 − 2ηγ)C + βB exactly, for every family. β = 0
gives C* = η²⟨G⟩/κ with κ = 4ηγ(1 − ηγ): §2's discrete result.

**Effective coefficients.** Where ⟨H⟩ = 0, (3) has today's form κ_eff·C = Tr[A·M] with
M = η_eff²(∇L∇Lᵀ(1 − 1/S) + E[ggᵀ]/S), η_eff = η/(1 − β), and

    heavy ball: κ_eff = 4ηγ(1 + β − ηγ) / ((1 − β)(1 + β))
    Nesterov:   κ_eff = 4ηγ(1 − β + 2βa)(1 + β − a − 2βa) / ((1 − β)²(1 + β + 2βa + 4β²a))

(scaled by 1/(1 − β)² so that κ_eff ≈ the per-step decay of C once the buffer has relaxed;
the scale does not move the equilibrium). β = 0 gives today's discrete (κ, η²(1 − 1/S), η²/S)
exactly. Where ⟨H⟩ ≠ 0 the reduction is not exact: measure ⟨H⟩ (or ⟨vᵀAg⟩ of the realised
batches) and use :func:`stationary_moments`.

**Continuous limit.** η → 0 at fixed β < 1 (the buffer relaxes in ~1/(1 − β) steps, fast
against the 1/(ηγ) steps of the charge): in the time τ = (steps)·η_eff the charge obeys
SGF with learning rate η_eff: dC/dτ = −4γC + (η_eff/S)Tr[ΣA]. Both variants have the same
limit. It is not defined when β → 1 with η(1 − β)⁻¹ fixed (the buffer is then slow too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from noetherflow.flow import NoiseModel

__all__ = [
    "EffectiveNoise",
    "MomentumStep",
    "moment_map",
    "momentum_noise",
    "momentum_step_moments",
    "stationary_moments",
]


def _check(lr: float, momentum: float, weight_decay: float) -> None:
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr={lr!r} must be a positive finite learning rate η.")
    if not 0 <= momentum < 1:
        raise ValueError(
            f"momentum={momentum!r} must lie in [0, 1); β ≥ 1 has no stationary buffer."
        )
    if not (weight_decay >= 0 and math.isfinite(weight_decay)):
        raise ValueError(
            f"weight_decay={weight_decay!r} must be >= 0 (γ of γ‖θ‖²; PyTorch's coupled "
            "SGD(weight_decay=λ) is γ = λ/2)."
        )


@dataclass(frozen=True)
class MomentumStep:
    """The coefficients of eq. (1): θ' = pθ + qv + rg, v' = sθ + tv + ug."""

    p: float
    q: float
    r: float
    s: float
    t: float
    u: float
    lr: float
    momentum: float
    weight_decay: float
    nesterov: bool = False

    @classmethod
    def create(
        cls, *, lr: float, momentum: float, weight_decay: float = 0.0, nesterov: bool = False
    ) -> MomentumStep:
        """PyTorch's ``SGD(lr, momentum, dampening=0, weight_decay=2γ, nesterov)``."""
        _check(lr, momentum, weight_decay)
        eta, b, gam = float(lr), float(momentum), float(weight_decay)
        if nesterov:
            p, q, r = 1 - 2 * eta * gam * (1 + b), b * b, -eta * (1 + b)
        else:
            p, q, r = 1 - 2 * eta * gam, b, -eta
        return cls(p, q, r, -2 * eta * gam, b, -eta, eta, b, gam, bool(nesterov))


def moment_map(step: MomentumStep) -> tuple[Tensor, Tensor, Tensor]:
    """(T, 𝐠, 𝐡) of eq. (2): x' = T x + 𝐠 G + 𝐡 H for x = (C, B, E).

    float64; shapes ``[3, 3]``, ``[3]``, ``[3]``.
    """
    p, q, r, s, t, u = step.p, step.q, step.r, step.s, step.t, step.u
    tmat = torch.tensor(
        [[p * p, 2 * p * q, q * q], [p * s, p * t + q * s, q * t], [s * s, 2 * s * t, t * t]],
        dtype=torch.float64,
    )
    gvec = torch.tensor([r * r, r * u, u * u], dtype=torch.float64)
    hvec = torch.tensor([2 * q * r, q * u + r * t, 2 * t * u], dtype=torch.float64)
    return tmat, gvec, hvec


def momentum_step_moments(
    c: Tensor, b: Tensor, e: Tensor, g: Tensor, h: Tensor, step: MomentumStep
) -> tuple[Tensor, Tensor, Tensor]:
    """(C', B', E') after one step, eq. (2), exact. All arguments share the charge's shape.

    Pass G = gᵀAg, H = vᵀAg of the realised batch for the exact step, or their expectations
    for the expected step.
    """
    p, q, r, s, t, u = step.p, step.q, step.r, step.s, step.t, step.u
    c2 = p * p * c + 2 * p * q * b + q * q * e + r * r * g + 2 * q * r * h
    b2 = p * s * c + (p * t + q * s) * b + q * t * e + r * u * g + (q * u + r * t) * h
    e2 = s * s * c + 2 * s * t * b + t * t * e + u * u * g + 2 * t * u * h
    return c2, b2, e2


def stationary_moments(
    g: Tensor | float, h: Tensor | float, step: MomentumStep
) -> tuple[Tensor, Tensor, Tensor]:
    """The stationary (C*, B*, E*) of eq. (2) for mean noise ⟨G⟩ = ``g`` and cross ⟨H⟩ = ``h``.

    Solves (I − T)x = 𝐠⟨G⟩ + 𝐡⟨H⟩ (eqs. 3–4 for the heavy ball). ``g`` and ``h`` may be
    tensors of any common shape (one charge per generator, or a rotation's ``[d, d]``
    matrix); the results have that shape. Needs γ > 0: without weight decay I − T is singular
    and a finite stationary point needs ⟨G⟩ = ⟨H⟩ = 0 (use :func:`momentum_noise` and the
    orbit solver then).
    """
    if step.weight_decay <= 0:
        raise ValueError(
            f"weight_decay={step.weight_decay!r}: without weight decay the map (2) has no unique "
            "stationary point (I − T is singular). Use momentum_noise(...) with the orbit "
            "solver, which finds where Tr[A·M] = 0 along the orbit."
        )
    tmat, gvec, hvec = moment_map(step)
    lhs = torch.eye(3, dtype=torch.float64) - tmat
    w = torch.linalg.solve(lhs, gvec)
    z = torch.linalg.solve(lhs, hvec)
    gt = torch.as_tensor(g, dtype=torch.float64)
    ht = torch.as_tensor(h, dtype=torch.float64)
    out = [w[i] * gt + z[i] * ht for i in range(3)]
    return out[0], out[1], out[2]


@dataclass(frozen=True)
class EffectiveNoise:
    """flow = −κ C + Tr[A M],  M = c_mean·ḡḡᵀ + c_second·E[ggᵀ]: the form of ``NoiseModel``.

    ``exact_when`` says under which condition the stationary point of this flow is the
    stationary point of the optimizer.
    """

    kappa: float
    c_mean: float
    c_second: float
    exact_when: str = "always"

    def to_noise_model(self) -> NoiseModel:
        """The same coefficients as a :class:`noetherflow.NoiseModel` (for the flows/solvers)."""
        from noetherflow.flow import NoiseModel

        return NoiseModel(kappa=self.kappa, c_mean=self.c_mean, c_second=self.c_second)


def momentum_noise(
    *,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    nesterov: bool = False,
    time: str = "discrete",
) -> EffectiveNoise:
    """Effective (κ_eff, c_mean, c_second) of SGD with momentum (module docstring).

    ``time="discrete"``: κ_eff as in the module docstring, c_mean = η_eff²(1 − 1/S),
    c_second = η_eff²/S, η_eff = η/(1 − β); exact for the stationary point when ⟨vᵀA∇L⟩ = 0.
    ``time="continuous"``: the η → 0 limit, SGF with η_eff (κ = 4γ, c = ∓η_eff/S), per unit
    τ = steps·η_eff. β = 0 gives ``NoiseModel.create(...)`` exactly.
    """
    _check(lr, momentum, weight_decay)
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(
            f"batch_size={batch_size!r} must be a positive integer S (the SGD batch size)."
        )
    eta, b, gam, s = float(lr), float(momentum), float(weight_decay), float(batch_size)
    when = "⟨vᵀA∇L⟩ = 0 (e.g. ∇L = 0 along A: noise dominated)" if b > 0 else "always"
    eff = eta / (1 - b)
    if time == "continuous":
        return EffectiveNoise(4 * gam, -eff / s, eff / s, when)
    if time != "discrete":
        raise ValueError(f"time={time!r} is not supported; expected 'continuous' or 'discrete'.")
    a = eta * gam
    if nesterov:
        kappa = (
            4
            * a
            * (1 - b + 2 * b * a)
            * (1 + b - a - 2 * b * a)
            / ((1 - b) ** 2 * (1 + b + 2 * b * a + 4 * b * b * a))
        )
    else:
        kappa = 4 * eta * gam * (1 + b - eta * gam) / ((1 - b) * (1 + b))
    return EffectiveNoise(kappa, eff**2 * (1 - 1 / s), eff**2 / s, when)
