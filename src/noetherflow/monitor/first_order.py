"""The distance to equilibrium between full solves: a first-order (chord) update.

For diagonal generators (rescaling, scale invariance, any diagonal A) the joint equilibrium
minimises the convex function of docs/concepts/equilibrium.md (paper eq. 9, Thm 4.3)

    F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κ θ_k² e^{2a_k·λ}) − b·λ,      ∇F = −flows at e^{λA}θ,

built from the parameters θ and the statistics M of one record. F is the diagonal kernel's
own problem (:meth:`noetherflow.kernels.diagonal.DiagonalKernel.problem`, the one its Newton
solve minimises): with SGD momentum M holds the cross term c_cross·vᵀA∇L (its terms balanced
to non-negative ones, a group left negative has no stationary point and stays at infinity),
and with per-parameter decay in discrete time F has the linear term −b·λ. A full solve
(:func:`noetherflow.solve_equilibrium`) at record r₀ gives λ₀ = argmin F₀. At a later record
F changes (θ moved, a new batch, perhaps a new η); instead of solving again, take one chord
step from λ₀ with the Hessian H₀ = ∇²F₀(λ₀) factored at the full solve:

    λ₁ = λ₀ − H₀⁻¹ ∇F(λ₀)                                                        (C1)

**What is exact and what is approximate.** ∇F(λ₀) is exact: the current flows at the orbit
point e^{λ₀A}θ (orbit transport, paper eqs. 34–37), computed from the current statistics.
λ₁ is an approximation of λ* = argmin F, exact to first order in the change of the problem:
with e = λ₀ − λ*, ∇F(λ₀) = H̄e, H̄ = ∫₀¹∇²F(λ* + te)dt, so λ₁ − λ* = (I − H₀⁻¹H̄)e and

    ‖λ₁ − λ*‖_{H₀} ≤ β ‖λ₀ − λ*‖_{H₀},   β = max(1 − ℓ(1 − ρ), u(1 + ρ) − 1),        (C2)

where ν = max_k |a_k·e| (over the coordinates of F), ℓ = (1 − e^{−2ν})/(2ν),
u = (e^{2ν} − 1)/(2ν), and ρ = ‖H₀^{-1/2}(∇²F(λ₀) − H₀)H₀^{-1/2}‖₂. Proof: every term of F
is a·e^{±2a·λ} (the linear term has no curvature), so moving λ by te scales each
coordinate's Hessian weight by a factor in [e^{−2νt}, e^{2νt}]: ℓ∇²F(λ₀) ⪯ H̄ ⪯ u∇²F(λ₀),
and (1 − ρ)H₀ ⪯ ∇²F(λ₀) ⪯ (1 + ρ)H₀. Both ν and ρ are of the order of the change, so the
error of λ₁ is of second order. The monitor iterates the scaled chord steps
(:func:`chord_solve`) until the correction is below its tolerance and falls back to a full
solve when they do not get there. Equilibria at infinity (one-sided generators, groups left
negative by the momentum cross term) stay as the full solve found them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._errors import StatisticsError
from noetherflow.kernels import kernel_for
from noetherflow.kernels._diag_problem import HessianOperator, _DiagProblem, _spread
from noetherflow.kernels.noise import NoiseModel
from noetherflow.stats.core import GradStats
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "ChordFactor",
    "at_infinity",
    "chord_bound",
    "chord_solve",
    "chord_step",
    "derivatives",
    "diagonal_problem",
    "factor",
    "max_exponent",
    "span",
]

_S_MIN = 1e-3  # bounds of the chord steps' diagonal rescaling S (H̃ = S H₀ S)
_DT = torch.float64


def diagonal_problem(
    syms: SymmetrySet, values: dict[nn.Parameter, Tensor], stats: GradStats, nm: NoiseModel
) -> _DiagProblem:
    """F(λ) of the (diagonal) symmetries ``syms`` at ``values``: the kernel's own problem.

    The same F as the joint solve of :func:`noetherflow.solve_equilibrium` (float64, on the
    CPU); its ``offsets`` map each symmetry to the offset of its generators in λ.
    """
    kernels = {type(kernel_for(s)) for s in syms}
    k = kernel_for(next(iter(syms)))
    if len(kernels) != 1 or not k.incremental:
        raise StatisticsError(
            f"The first-order distance covers one kernel with an incremental problem; these "
            f"symmetries use {sorted(t.__name__ for t in kernels)}: use "
            "distance=nf.DistanceOptions(mode='solve')."
        )
    prob = k.problem(list(syms), values, stats, nm)
    assert isinstance(prob, _DiagProblem)
    return prob


def span(prob: _DiagProblem, s: Any) -> slice:
    """Where the generators of symmetry ``s`` sit in F's λ vector."""
    off = prob.offsets[s]
    return slice(off, off + s.num_generators)


def derivatives(prob: _DiagProblem, lam: Tensor) -> tuple[Tensor, Tensor, float]:
    """∇F(λ) ``[n]``, the Hessian's diagonal ``[n]`` and F(λ), from one pass over F's terms.

    (The diagonal leaves out coordinates where one generator acts on both a row and a column
    of the same weight; it only scales the chord steps, see :func:`chord_solve`.)
    """
    terms = prob.terms(lam)
    grad = prob.derivatives(lam, hessian=False, terms=terms)[0]
    return grad, HessianOperator(prob.n, terms).diagonal, prob.value_of(terms, lam)


def at_infinity(prob: _DiagProblem) -> Tensor:
    """Per generator (``[n]`` bool): whether its equilibrium is at infinity on its own.

    One-sided F (e.g. a neuron that never fired on this batch, scale invariance without
    decay) or a term group left negative by the momentum cross term: the rules of the joint
    solve (:func:`noetherflow.kernels._diag_newton.solve_diag`).
    """
    out = prob.one_sided() != 0
    return out if prob.negative is None else out | (prob.negative != 0)


def max_exponent(prob: _DiagProblem, delta: Tensor) -> float:
    """ν = max_k |a_k·δ| over the coordinates of F (``delta`` ``[n]``)."""
    nu = 0.0
    for g in prob.grids:
        n0, n1 = g.m.shape
        r, q = _spread(delta, g.rows, n0), _spread(delta, g.cols, n1)
        nu = max(nu, abs(float(r.max() + q.max())), abs(float(r.min() + q.min())))
    return nu


@dataclass
class ChordFactor:
    """What a full solve leaves for the chord steps after it.

    Attributes:
        lam0: λ₀ ``[n]`` (float64; zero on generators at infinity).
        free: which generators are solved for (``[n]`` bool; the others are at infinity).
        chol: the Cholesky factor of H₀ restricted to the free generators ``[f, f]``.
        diag0: the diagonal of the factored matrix on the free generators.
        flat0: free generators without any term of F at the full solve (a dead neuron): their
            row of H₀ is the damping alone.
        inv: H₀⁻¹ from the factor: a chord step is then one matrix–vector product (two
            triangular solves with one right-hand side run far slower).
    """

    lam0: Tensor
    free: Tensor
    chol: Tensor
    diag0: Tensor
    flat0: Tensor
    inv: Tensor


def factor(prob: _DiagProblem, lam0: Tensor, free: Tensor) -> ChordFactor:
    """Factor H₀ = ∇²F₀(λ₀) on the free generators (the Newton solve's relative damping)."""
    idx = free.nonzero().squeeze(1)
    h = prob.derivatives(lam0)[2][idx][:, idx]
    if len(idx):
        h.diagonal().add_(1e-12 * float(h.diagonal().abs().max().clamp_min(1e-300)))
    chol, info = torch.linalg.cholesky_ex(h)
    if int(info) != 0:
        raise StatisticsError(
            "The Hessian of F at the last solution is not positive definite; the first-order "
            "distance needs a full solve (distance=nf.DistanceOptions(mode='solve'))."
        )
    flat0 = derivatives(prob, lam0)[1][idx] == 0
    return ChordFactor(lam0, free, chol, chol.square().sum(1), flat0, torch.cholesky_inverse(chol))


_EPS = 16 * torch.finfo(_DT).eps  # relative round-off of F's sums (float64)


def chord_solve(
    fac: ChordFactor,
    prob: _DiagProblem,
    *,
    tol: float,
    max_iter: int,
    start: Tensor | None = None,
    search: bool = True,
) -> tuple[Tensor, bool, int, float]:
    """Scaled chord iterations on F from λ₀: (λ, converged, iterations, last correction).

    Step k: λ ← λ − H̃⁻¹∇F(λ) with H̃ = S H₀ S, S = diag(√(d(λ)/d₀)) (it gives up when S
    leaves [10⁻³, 10³]; generators with d = 0, flat, stay) where d is the Hessian's diagonal
    (:func:`derivatives`):
    H₀'s factor, rescaled so that its diagonal follows the current one (generators whose
    curvature changed — neurons that fire more or less often on this batch — are then no
    worse off than the others), and a backtracking line search on F shortens a step that
    overshoots. The first iterate (a full step) is eq. (C1) with H̃ for H₀; the bound (C2)
    holds with ρ measured against H̃. Stops when the correction ‖δ‖∞ ≤ ``tol`` (converged)
    or after ``max_iter`` steps. ``start`` (default λ₀): where to begin, e.g. the last
    record's λ; ``search=False`` takes full steps (no line search).
    """
    idx = fac.free.nonzero().squeeze(1)
    lam = (fac.lam0 if start is None else start).clone()
    g, d, f = derivatives(prob, lam)
    size = math.inf
    for it in range(1, max_iter + 1):
        # A generator with no terms on this batch (a neuron that never fired: d = 0) has a
        # flat F: it stays where it is (S = ∞ in effect), as in the Newton solve. One that had
        # none at the full solve but has now gets H̃_jj = d_j (its row of H₀ is the damping
        # alone). One whose curvature moved by more than 10⁶ is beyond what a rescaled H₀
        # describes: give up (a full solve follows).
        di, flat = d[idx], d[idx] == 0
        scale = (di / fac.diag0).sqrt()
        ok = flat | fac.flat0 | ((scale >= _S_MIN) & (scale <= 1 / _S_MIN))
        if not bool(ok.all()):
            return lam, False, it, math.inf
        scale = torch.where(flat, 1e100, scale)
        step = -(fac.inv @ (g[idx] / scale)) / scale
        slope = float(g[idx] @ step)
        t = 1.0
        while True:  # backtracking (Armijo) on F: a step that overshoots is shortened
            trial = lam.clone()
            trial[idx] += t * step
            g2, d2, f2 = derivatives(prob, trial)
            if not search or (math.isfinite(f2) and f2 <= f + 1e-4 * t * slope + _EPS * abs(f)):
                break
            t /= 2
            if t < 1e-6:
                return lam, False, it, math.inf
        lam, g, d, f = trial, g2, d2, f2
        size = t * float(step.abs().max()) if len(idx) else 0.0
        if size <= tol:
            return lam, True, it, size
    return lam, False, max_iter, size


def chord_step(fac: ChordFactor, prob: _DiagProblem) -> tuple[Tensor, float]:
    """Eq. (C1) with H̃ (one step of :func:`chord_solve`) and ν̂ = max_k |a_k·(λ₁ − λ₀)|."""
    lam, _, _, _ = chord_solve(fac, prob, tol=0.0, max_iter=1, search=False)
    return lam, max_exponent(prob, lam - fac.lam0)


def chord_bound(nu: float, rho: float) -> float:
    """β of eq. (C2): the contraction of the chord step's error in the H₀-norm."""
    if nu == 0:
        lo = hi = 1.0
    else:
        lo = -math.expm1(-2 * nu) / (2 * nu)
        hi = math.expm1(2 * nu) / (2 * nu)
    return max(1 - lo * (1 - rho), hi * (1 + rho) - 1)
