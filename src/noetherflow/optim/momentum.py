"""The noise equilibrium of SGD with momentum (beyond the paper; issue #18).

Let η, β, d, γ, S denote ``lr``, ``momentum``, ``dampening``, ``weight_decay`` (γ‖θ‖² in the
loss; PyTorch's coupled ``SGD(weight_decay=λ)`` is γ = λ/2) and ``batch_size``. PyTorch's
``SGD(momentum=β, dampening=d)`` keeps a buffer b ← βb + (1 − d)(g + 2γθ); with the
displacement v = −η·b it reads

    heavy ball:  v' = βv − η(1 − d)(g + 2γθ),   θ' = θ + v'
    Nesterov:    v' = βv − η(g + 2γθ),          θ' = θ + βv' − η(g + 2γθ)

(g the minibatch gradient of the data loss). PyTorch refuses Nesterov with d ≠ 0, and so do
we. Its first step sets b = g + 2γθ, undamped (i.e. v = 0 before it and no factor 1 − d), so
with d ≠ 0 the map below holds from the second step on. Both are one linear step of (θ, v):

    θ' = p θ + q v + r g,    v' = s θ + t v + u g                          (1)

heavy ball (p, q, r, s, t, u) = (1 − 2a, β, −η(1 − d), −2a, β, −η(1 − d)) with
a = η(1 − d)γ — dampening is *exactly* heavy ball with learning rate η(1 − d); Nesterov
(1 − 2ηγ(1 + β), β², −η(1 + β), −2ηγ, β, −η).

**The exact one-step map.** For a symmetry generator A (θᵀA g = 0 for every minibatch
gradient), the charge C = θᵀAθ alone is not Markov; with the cross term B = θᵀAv and the
buffer term E = vᵀAv, (1) gives *exactly* (no expectation)

    C' = p²C + 2pq B + q²E + r² G + 2qr H
    B' = ps C + (pt + qs) B + qt E + ru G + (qu + rt) H                    (2)
    E' = s²C + 2st B + t²E + u² G + 2tu H

with G = gᵀAg and H = vᵀAg. For the heavy ball this is the map of docs/concepts/optimizers.md. The
relations hold entrywise for a rotation's matrix charge (every entry is a bilinear form). The update
Δθ = θ' − θ has the charge ΔθᵀAΔθ = (p − 1)²C + 2(p − 1)qB + q²E + r²G + 2qrH
(:func:`update_charge`; for a scale-invariant layer, the squared angular update ×C).

**Expectation.** Over the batch (drawn with replacement, independent of the past),
E[G] = Tr[A(∇L∇Lᵀ + Σ/S)] and E[H] = vᵀA∇L. H vanishes only where ∇L = 0 along A (noise
dominated); otherwise it is the correlation of the buffer with the mean gradient.

**Stationary point.** Averaging (2) over a stationary run gives (I − T)x = 𝐠⟨G⟩ + 𝐡⟨H⟩ for
x = (⟨C⟩, ⟨B⟩, ⟨E⟩): exact for time averages, whatever the noise. For the heavy ball,
with a = ηγ (η → η(1 − d) under dampening),

    C* = (1 + β)(η²⟨G⟩ − 2βη⟨H⟩) / (4a(1 − β)(1 + β − a))                   (3)
    B* = 2a C*/(1 + β),    E* = 4a C*/(1 + β)                               (4)

(4) holds step by step too: C' − B' = (1 − 2a)C + βB exactly, for every family. β = 0
gives C* = η²⟨G⟩/κ with κ = 4ηγ(1 − ηγ): §2's discrete result. For Nesterov, with
D = (1 − β + 2aβ)(1 + β − a − 2aβ),

    C* = η[η(1 + β + 2aβ + 4aβ²)⟨G⟩ − 2β²(1 + β)⟨H⟩] / (4aD)                 (3N)
    E* = η[η⟨G⟩ − 2β(1 − a)⟨H⟩] / D,    B* = (1 + 2β)E*/2                   (4N)

and step by step θ' − (1 + β)v' = θ − βv, so C' − 2(1 + β)B' + (1 + β)²E' = C − 2βB + β²E
exactly. Nesterov's update is not v' (it adds the fresh gradient once more): where ⟨H⟩ = 0,

    ⟨ΔθᵀAΔθ⟩/C* = 4a(1 + 2β − 2β³ + 2aβ(1 + β)(1 + 2β)) / (1 + β + 2aβ + 4aβ²)      (5N)

against the heavy ball's 4a/(1 + β) (any ⟨H⟩): at small a and the same η_eff, a
scale-invariant layer's squared angular update is larger by a factor (1 + 2β − 2β³): 1.75
at β = 0.5, 1.34 at β = 0.9. :func:`stationary_closed_form` evaluates (3)–(4N);
:func:`stationary_moments` solves the 3 × 3 system for any coefficients (the two agree to
round-off, tested).

**Effective coefficients.** Where ⟨H⟩ = 0, (3) has today's form κ_eff·C = Tr[A·M] with
M = η_eff²(∇L∇Lᵀ(1 − 1/S) + E[ggᵀ]/S), η_eff = η(1 − d)/(1 − β) (Nesterov: η/(1 − β)), and

    heavy ball: κ_eff = 4a(1 + β − a) / ((1 − β)(1 + β)),  a = η(1 − d)γ
    Nesterov:   κ_eff = 4a(1 − β + 2βa)(1 + β − a − 2βa) / ((1 − β)²(1 + β + 2βa + 4β²a))

(scaled by 1/(1 − β)² so that κ_eff ≈ the per-step decay of C once the buffer has relaxed;
the scale does not move the equilibrium). β = 0 gives today's discrete (κ, η²(1 − 1/S), η²/S)
exactly. Where ⟨H⟩ ≠ 0, (3) and (3N) are exactly κ_eff·C* = Tr[A·M] + c_cross·⟨H⟩ with

    heavy ball: c_cross = −2βη(1 − d)/(1 − β)²
    Nesterov:   c_cross = −2ηβ²(1 + β) / ((1 − β)²(1 + β + 2βa + 4β²a))

(tested against :func:`stationary_moments`). H = vᵀAg is a bilinear form of two cotangents, so
along a symmetry's orbit it moves like M (v is moved as a gradient, as teleport moves the
buffer): the flows and solvers take it as M + c_cross·sym(vḡᵀ), with v from
:func:`momentum_displacement` passed as ``displacement=``. In an expectation over the batch
E[vᵀAg] = vᵀA∇L, so the batch's ḡ gives an unbiased H. Without ``displacement`` the term is
dropped (H = 0).

**Continuous limit.** η → 0 at fixed β < 1 (the buffer relaxes in ~1/(1 − β) steps, fast
against the 1/(ηγ) steps of the charge): in the time τ = (steps)·η_eff the charge obeys
SGF with learning rate η_eff: dC/dτ = −4γC + (η_eff/S)Tr[ΣA]. The cross term is of the
order of the dropped η_eff²∇L∇Lᵀ term (v ≈ −η_eff∇L + noise), so c_cross = 0 there. Both
variants (and any dampening) have the same limit. It is not defined when β → 1 with
η(1 − β)⁻¹ fixed (the buffer is then slow too).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from noetherflow._checks import check_instance
from noetherflow.optim.groups import read_groups

if TYPE_CHECKING:
    from noetherflow.flow import NoiseModel

__all__ = [
    "EffectiveNoise",
    "MomentumStep",
    "moment_map",
    "momentum_displacement",
    "momentum_noise",
    "momentum_step_moments",
    "stationary_closed_form",
    "stationary_moments",
    "stationary_terms",
    "update_charge",
]


def _check(
    lr: float, momentum: float, weight_decay: float, dampening: float = 0.0, nesterov: bool = False
) -> None:
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
    if not 0 <= dampening < 1:
        raise ValueError(
            f"dampening={dampening!r} must lie in [0, 1) (PyTorch's SGD dampening d: the buffer "
            "takes (1 − d)·gradient); d = 1 never moves the parameters after the first step."
        )
    if nesterov and dampening != 0:
        raise ValueError(
            f"nesterov=True with dampening={dampening!r}: PyTorch's SGD refuses Nesterov "
            "momentum with dampening (it requires dampening=0), so there is no such optimizer "
            "to model; expected dampening=0 with nesterov=True."
        )


@dataclass(frozen=True)
class MomentumStep:
    """The coefficients of eq. (1): θ' = pθ + qv + rg, v' = sθ + tv + ug (v = −η·buffer)."""

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
    dampening: float = 0.0

    @classmethod
    def create(
        cls,
        *,
        lr: float,
        momentum: float,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        dampening: float = 0.0,
    ) -> MomentumStep:
        """PyTorch's ``SGD(lr, momentum, dampening, weight_decay=2γ, nesterov)``.

        With ``dampening=d`` (heavy ball only, as in PyTorch) the step is the heavy ball with
        learning rate η(1 − d), exactly, from the second step on (module docstring). Without
        momentum PyTorch keeps no buffer and ignores dampening; so does this (d is set to 0).
        """
        _check(lr, momentum, weight_decay, dampening, nesterov)
        eta, b, gam, d = float(lr), float(momentum), float(weight_decay), float(dampening)
        d = d if b > 0 else 0.0
        if nesterov:
            p, q, r = 1 - 2 * eta * gam * (1 + b), b * b, -eta * (1 + b)
            s, u = -2 * eta * gam, -eta
        else:
            e = eta * (1 - d)
            p, q, r, s, u = 1 - 2 * e * gam, b, -e, -2 * e * gam, -e
        return cls(p, q, r, s, b, u, eta, b, gam, bool(nesterov), d)


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


def update_charge(
    c: Tensor, b: Tensor, e: Tensor, g: Tensor, h: Tensor, step: MomentumStep
) -> Tensor:
    """ΔθᵀAΔθ of the update Δθ = θ' − θ (module docstring), exact. The charge's shape.

    Pass the realised G = gᵀAg and H = vᵀAg, or (for a stationary run) the stationary moments
    and ⟨G⟩, ⟨H⟩. For a scale-invariant layer, ``update_charge(...) / c`` is the squared angular
    update ‖Δθ‖²/‖θ‖² (heavy ball at stationarity: 4a/(1 + β), eq. 4; Nesterov: eq. 5N).
    """
    pm, q, r = step.p - 1, step.q, step.r
    return pm * pm * c + 2 * pm * q * b + q * q * e + r * r * g + 2 * q * r * h


def stationary_closed_form(
    g: Tensor | float, h: Tensor | float, step: MomentumStep
) -> tuple[Tensor, Tensor, Tensor]:
    """(C*, B*, E*) by the closed forms (3)–(4) (heavy ball, any dampening) or (3N)–(4N).

    (3N)–(4N) are Nesterov's. Same inputs and shapes as :func:`stationary_moments`, which
    solves the linear system instead; the two agree to round-off. Needs γ > 0.
    """
    if step.weight_decay <= 0:
        raise ValueError(
            f"weight_decay={step.weight_decay!r}: the closed forms (3)–(4N) need γ > 0 (no "
            "stationary point without weight decay); use momentum_noise(...) with the orbit "
            "solver."
        )
    gt = torch.as_tensor(g, dtype=torch.float64)
    ht = torch.as_tensor(h, dtype=torch.float64)
    beta, gam = step.momentum, step.weight_decay
    if step.nesterov:
        eta = step.lr
        a = eta * gam
        den = (1 - beta + 2 * a * beta) * (1 + beta - a - 2 * a * beta)
        lead = 1 + beta + 2 * a * beta + 4 * a * beta * beta
        c = eta * (eta * lead * gt - 2 * beta * beta * (1 + beta) * ht) / (4 * a * den)
        e = eta * (eta * gt - 2 * beta * (1 - a) * ht) / den
        return c, (1 + 2 * beta) * e / 2, e
    eta = step.lr * (1 - step.dampening)
    a = eta * gam
    c = (1 + beta) * (eta**2 * gt - 2 * beta * eta * ht) / (4 * a * (1 - beta) * (1 + beta - a))
    return c, 2 * a * c / (1 + beta), 4 * a * c / (1 + beta)


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
    check_instance(step, MomentumStep, "stationary_moments: step", "a MomentumStep(...)")
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


def stationary_terms(charge: Tensor, h: Tensor, noise: NoiseModel) -> tuple[Tensor, Tensor, Tensor]:
    """(C*, B*, E*) of a solved equilibrium from its charge C* and its cross term H* = vᵀA∇L.

    At the solution the flow vanishes, κ_eff·C* = η_eff²⟨G⟩ + c_cross·H*, which gives ⟨G⟩;
    :func:`stationary_moments` then gives B* and E* (and C* back). ``noise``: a discrete-time
    :class:`~noetherflow.NoiseModel` built with ``momentum=β > 0``. Shapes: the charge's.
    """
    if noise.lr is None or noise.momentum is None or noise.weight_decay is None:
        raise ValueError(
            "stationary_terms: the noise model holds no (lr, momentum, weight_decay); build it "
            "with NoiseModel.create(..., momentum=β, time='discrete')."
        )
    step = MomentumStep.create(
        lr=noise.lr,
        momentum=noise.momentum,
        weight_decay=noise.weight_decay,
        nesterov=bool(noise.nesterov),
        dampening=noise.dampening or 0.0,
    )
    c = charge.to(torch.float64)
    g = (noise.kappa * c - noise.c_cross * h.to(c)) / (noise.c_mean + noise.c_second)
    return stationary_moments(g, h.to(c), step)


@dataclass(frozen=True)
class EffectiveNoise:
    """flow = −κ C + Tr[A M] + c_cross·vᵀA∇L,  M = c_mean·ḡḡᵀ + c_second·E[ggᵀ].

    The form of ``NoiseModel``. ``exact_when`` says under which condition the stationary point
    of this flow without its cross term (v unknown) is the stationary point of the optimizer;
    with the cross term it is exact always.
    """

    kappa: float
    c_mean: float
    c_second: float
    exact_when: str = "always"
    c_cross: float = 0.0

    def to_noise_model(self) -> NoiseModel:
        """The same coefficients as a :class:`noetherflow.NoiseModel` (for the flows/solvers)."""
        from noetherflow.flow import NoiseModel

        return NoiseModel(
            kappa=self.kappa, c_mean=self.c_mean, c_second=self.c_second, c_cross=self.c_cross
        )


def momentum_noise(
    *,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    nesterov: bool = False,
    time: str = "discrete",
    dampening: float = 0.0,
) -> EffectiveNoise:
    """Effective (κ_eff, c_mean, c_second) of SGD with momentum (module docstring).

    ``time="discrete"``: κ_eff and c_cross as in the module docstring, c_mean =
    η_eff²(1 − 1/S), c_second = η_eff²/S, η_eff = η(1 − d)/(1 − β); exact for the stationary
    point with the measured cross term, or without it when ⟨vᵀA∇L⟩ = 0.
    ``time="continuous"``: the η → 0 limit, SGF with η_eff (κ = 4γ, c = ∓η_eff/S,
    c_cross = 0), per unit τ = steps·η_eff. β = 0 gives ``NoiseModel.create(...)`` exactly.
    ``dampening=d`` (heavy ball only, as in PyTorch) is the heavy ball with η(1 − d).
    """
    _check(lr, momentum, weight_decay, dampening, nesterov)
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(
            f"batch_size={batch_size!r} must be a positive integer S (the SGD batch size)."
        )
    eta, b, gam, s = float(lr), float(momentum), float(weight_decay), float(batch_size)
    if b > 0:  # PyTorch ignores dampening without momentum (there is no buffer)
        eta *= 1 - float(dampening)
    when = "⟨vᵀA∇L⟩ = 0 (e.g. ∇L = 0 along A: noise dominated)" if b > 0 else "always"
    eff = eta / (1 - b)
    if time == "continuous":
        return EffectiveNoise(4 * gam, -eff / s, eff / s, when)
    if time != "discrete":
        raise ValueError(f"time={time!r} is not supported; expected 'continuous' or 'discrete'.")
    a = eta * gam
    if nesterov:
        lead = 1 + b + 2 * b * a + 4 * b * b * a
        kappa = 4 * a * (1 - b + 2 * b * a) * (1 + b - a - 2 * b * a) / ((1 - b) ** 2 * lead)
        cross = -2 * eta * b * b * (1 + b) / ((1 - b) ** 2 * lead)
    else:
        kappa = 4 * eta * gam * (1 + b - eta * gam) / ((1 - b) * (1 + b))
        cross = -2 * b * eta / (1 - b) ** 2
    return EffectiveNoise(kappa, eff**2 * (1 - 1 / s), eff**2 / s, when, cross)


def momentum_displacement(
    optimizer: torch.optim.Optimizer, params: Iterable[torch.nn.Parameter] | None = None
) -> dict[torch.nn.Parameter, Tensor]:
    """The displacement v = −η·buffer of each parameter with a momentum buffer. ``p.shape`` each.

    The v of the module docstring (``torch.optim.SGD``), for ``displacement=`` of the flows
    and solvers: read it after ``loss.backward()`` and before ``optimizer.step()`` (the
    buffer of the past steps, independent of this batch). Parameters without a buffer yet
    (before the first step, or ``momentum=0``) are left out: v = 0 there. ``params``
    restricts the result (default: all).

    Raises:
        TypeError: ``optimizer`` is not a ``torch.optim.SGD`` (Adam's first moment is not a
            displacement of this model).
    """
    if not isinstance(optimizer, torch.optim.SGD):
        raise TypeError(
            f"momentum_displacement: got a {type(optimizer).__name__}; expected a "
            "torch.optim.SGD (its momentum_buffer). Adam/AdamW have no SGD noise model."
        )
    want = None if params is None else {id(p) for p in params}
    out: dict[torch.nn.Parameter, Tensor] = {}
    for group in read_groups(optimizer):
        for p in group.params:
            if want is not None and id(p) not in want:
                continue
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                out[p] = -group.lr * buf.detach()
    return out
