"""The distance to equilibrium between full solves: a first-order (chord) update.

For diagonal generators (rescaling, scale invariance, any diagonal A) the joint equilibrium
minimises the convex function of docs/concepts/equilibrium.md (paper eq. 9, Thm 4.3)

    F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κ θ_k² e^{2a_k·λ}),        ∇F = −flows at e^{λA}θ,

built from the parameters θ and the statistics M of one record. A full solve
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
is a·e^{±2a·λ}, so moving λ by te scales each coordinate's Hessian weight by a factor in
[e^{−2νt}, e^{2νt}]: ℓ∇²F(λ₀) ⪯ H̄ ⪯ u∇²F(λ₀), and (1 − ρ)H₀ ⪯ ∇²F(λ₀) ⪯ (1 + ρ)H₀. Both ν
and ρ are of the order of the change, so the error of λ₁ is of second order. The monitor
measures ν̂ = max_k |a_k·(λ₁ − λ₀)| (ν to first order) and falls back to a full solve when
it exceeds its tolerance.

Cost. ∇F(λ₀) is separable, e^{−2(r_i + q_j)} = e^{−2r_i}e^{−2q_j} on a weight's grid of rows
and columns, so it takes four matrix–vector products per weight instead of exponentials of
every coordinate, and the chord step two triangular solves with the factor kept from the
full solve. Equilibria at infinity (one-sided generators) stay as the full solve found them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._errors import StatisticsError
from noetherflow.kernels.diagonal import DiagonalStats
from noetherflow.kernels.noise import NoiseModel
from noetherflow.stats.core import GradStats, axis_sum

__all__ = [
    "ChordFactor",
    "DiagonalProblem",
    "chord_bound",
    "chord_solve",
    "chord_step",
    "diagonal_problem",
    "factor",
]

Term = tuple[int, int, int, float]  # (offset in λ, generators, block, sign)
_S_MIN = 1e-3  # bounds of the chord steps' diagonal rescaling S (H̃ = S H₀ S)
_DT = torch.float64


@dataclass
class _Grid:
    """One parameter's terms of F on a [rows, columns] grid (columns = 1 for vectors).

    ``m`` and ``c`` (``None`` when κ = 0) have shape ``[n0, n1]``.
    """

    m: Tensor
    c: Tensor | None
    rows: list[Term]
    cols: list[Term]


def _spread(lam: Tensor, terms: list[Term], n: int) -> Tensor:
    """Σ_terms a·λ along one axis of a grid. Has shape ``[n]``."""
    out = torch.zeros(n, dtype=_DT, device=lam.device)
    for off, k, b, sg in terms:
        out += sg * lam[off : off + k].repeat_interleave(b)
    return out


def _gather(v: Tensor, k: int, b: int) -> Tensor:
    """Sum consecutive blocks of b entries of ``v`` (length k·b). Has shape ``[k]``."""
    return v.reshape(k, b).sum(1)


@dataclass
class DiagonalProblem:
    """F(λ) of the module docstring over ``n`` diagonal generators.

    Attributes:
        n: the number of generators (all diagonal symmetries, in set order).
        offsets: symmetry name → (offset, number of generators) in the λ vector.
        grids: one per parameter.
    """

    n: int
    offsets: dict[str, tuple[int, int]]
    grids: list[_Grid]

    def _axes(self, lam: Tensor, g: _Grid) -> tuple[Tensor, Tensor]:
        n0, n1 = g.m.shape
        return _spread(lam, g.rows, n0), _spread(lam, g.cols, n1)

    def gradient(self, lam: Tensor) -> Tensor:
        """∇F(λ) = −(flows at e^{λA}θ). ``lam`` ``[n]`` → ``[n]``; matrix–vector products only."""
        return self.derivatives(lam)[0]

    def derivatives(self, lam: Tensor) -> tuple[Tensor, Tensor, float]:
        """∇F(λ), Σ_k a_kj² ∇²_s F_k per generator j (the Hessian's diagonal) and F(λ).

        One pass of matrix–vector products over each weight: e^{−2(r_i + q_j)} factorises.
        (The diagonal leaves out coordinates where one generator acts on both a row and a
        column of the same weight; it only scales the chord steps, see :func:`chord_solve`.)
        """
        grad = torch.zeros(self.n, dtype=_DT, device=lam.device)
        diag = torch.zeros(self.n, dtype=_DT, device=lam.device)
        value = 0.0
        for g in self.grids:
            r, q = self._axes(lam, g)
            er, eq = torch.exp(-2 * r).to(g.m.dtype), torch.exp(-2 * q).to(g.m.dtype)
            lo_row = (er * (g.m @ eq)).to(_DT)  # row sums of M e^{−2s}
            lo_col = (eq * (g.m.T @ er)).to(_DT)
            hi_row = hi_col = torch.zeros((), dtype=_DT, device=lam.device)
            if g.c is not None:  # row/column sums of κθ² e^{2s}
                hi_row = ((g.c @ (1 / eq)) / er).to(_DT)
                hi_col = ((g.c.T @ (1 / er)) / eq).to(_DT)
            value += 0.5 * float(lo_row.sum() + hi_row.sum())
            for terms, lo, hi in ((g.rows, lo_row, hi_row), (g.cols, lo_col, hi_col)):
                for off, k, b, sg in terms:
                    grad[off : off + k] += sg * _gather(hi - lo, k, b)
                    diag[off : off + k] += 2 * sg * sg * _gather(hi + lo, k, b)
        return grad, diag, value

    def hessian(self, lam: Tensor) -> Tensor:
        """∇²F(λ) = Σ_k a_k a_kᵀ·2(M_kk e^{−2a_k·λ} + κθ_k² e^{2a_k·λ}). Has shape ``[n, n]``."""
        h = torch.zeros(self.n, self.n, dtype=_DT, device=lam.device)
        for g in self.grids:
            r, q = self._axes(lam, g)
            e = torch.exp(-2 * (r[:, None] + q[None, :]))
            w = 2 * g.m.to(_DT) * e
            if g.c is not None:
                w = w + 2 * g.c.to(_DT) / e
            for axis, side in ((1, g.rows), (0, g.cols)):
                wsum = w.sum(axis)
                pos = torch.arange(wsum.shape[0], device=lam.device)
                for off1, _, b1, s1 in side:
                    for off2, _, b2, s2 in side:
                        h.index_put_(
                            (off1 + pos // b1, off2 + pos // b2), s1 * s2 * wsum, accumulate=True
                        )
            for off1, k1, b1, s1 in g.rows:
                rowsum = w.reshape(k1, b1, -1).sum(1)
                for off2, k2, b2, s2 in g.cols:
                    blk = s1 * s2 * rowsum.reshape(k1, k2, b2).sum(2)
                    h[off1 : off1 + k1, off2 : off2 + k2] += blk
                    h[off2 : off2 + k2, off1 : off1 + k1] += blk.T
        return h

    def one_sided(self) -> Tensor:
        """Per generator: whether F has terms on one side only (``[n]`` bool).

        Along such a generator F decreases without bound (the equilibrium is at infinity,
        e.g. a neuron that never fired on this batch); the rule of the joint solve.
        """
        dev = self.grids[0].m.device if self.grids else None
        up = torch.zeros(self.n, dtype=_DT, device=dev)
        down = torch.zeros(self.n, dtype=_DT, device=dev)
        for g in self.grids:
            for axis, terms in ((1, g.rows), (0, g.cols)):
                ms = g.m.sum(axis).to(_DT)
                cs = g.c.sum(axis).to(_DT) if g.c is not None else torch.zeros_like(ms)
                for off, k, b, sg in terms:
                    mk, ck = abs(sg) * _gather(ms, k, b), abs(sg) * _gather(cs, k, b)
                    up[off : off + k] += mk if sg > 0 else ck
                    down[off : off + k] += ck if sg > 0 else mk
        tiny = 1e-13 * (up + down)
        return ((down <= tiny) & (up > 0)) | ((up <= tiny) & (down > 0))

    def max_exponent(self, delta: Tensor) -> float:
        """ν = max_k |a_k·δ| over the coordinates of F (``delta`` ``[n]``)."""
        nu = 0.0
        for g in self.grids:
            r, q = self._axes(delta, g)
            hi = float(r.max() + q.max())
            lo = float(r.min() + q.min())
            nu = max(nu, abs(hi), abs(lo))
        return nu


def _to_grid(v: Tensor) -> Tensor:
    if v.dim() == 1:
        return v[:, None]
    if v.dim() == 2:
        return v
    return v.reshape(v.shape[0], v.shape[1], -1).sum(-1)


def diagonal_problem(
    syms: Sequence[tuple[str, Any]],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
) -> DiagonalProblem:
    """F(λ) of the diagonal symmetries ``syms`` (``(name, symmetry)``) at ``values``.

    The same F as the joint solve of :func:`noetherflow.solve_equilibrium`: per-coordinate
    M = c_mean·ḡ² + c_second·E[g²] where generators act on two axes of a weight, per-neuron
    sums along the one axis they act on elsewhere (``level="solve"`` statistics suffice).
    """
    block = stats.block(DiagonalStats.key)
    if not isinstance(block, DiagonalStats):
        raise StatisticsError(
            "These statistics hold no block for diagonal symmetries (rescaling, scale); collect "
            "them with nf.collect_stats for the same symmetry set."
        )
    offsets: dict[str, tuple[int, int]] = {}
    per_param: dict[nn.Parameter, tuple[list[Term], list[Term]]] = {}
    n = 0
    for name, s in syms:
        offsets[name] = (n, s.num_generators)
        for t in s.terms():
            rows, cols = per_param.setdefault(t.param, ([], []))
            (rows if t.axis == 0 else cols).append((n, t.num_generators, t.block, float(t.sign)))
        n += s.num_generators
    grids = []
    for p, (rows, cols) in per_param.items():
        mean = stats.mean[p]
        theta = values[p]
        if p in block.sq:
            # In the statistics' dtype: the matrix–vector products are the cost of a step.
            m = torch.addcmul(nm.c_second * block.sq[p], mean, mean, value=nm.c_mean)
            m = _to_grid(m.clamp_(min=0))
            kap = nm.at(p).kappa  # κ of this parameter's γ
            c = _to_grid(kap * theta.square()) if kap else None
            grids.append(_Grid(m, c, rows, cols))
            continue
        ax = 0 if rows else 1
        if (rows and cols) or (p, ax) not in block.sq_axis:
            raise StatisticsError(
                f"The first-order distance needs per-coordinate squared gradients of a "
                f"parameter of shape {tuple(p.shape)}, but these statistics hold only "
                "per-neuron sums (level='neuron'); collect them with level='solve' or 'diag'."
            )
        msq = axis_sum(mean.square(), ax)
        m = (nm.c_mean * msq + nm.c_second * block.sq_axis[(p, ax)]).to(_DT).clamp(min=0)
        shape = (-1, 1) if ax == 0 else (1, -1)
        kap = nm.at(p).kappa
        c = axis_sum(theta.to(_DT).square(), ax) * kap if kap else None
        grids.append(_Grid(m.reshape(shape), None if c is None else c.reshape(shape), rows, cols))
    return DiagonalProblem(n, offsets, grids)


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
        inv: H₀⁻¹ from the factor, in the statistics' dtype: a chord step is then one
            matrix–vector product (two triangular solves with one right-hand side run far
            slower). Its precision only sets how fast the steps converge, not where to.
    """

    lam0: Tensor
    free: Tensor
    chol: Tensor
    diag0: Tensor
    flat0: Tensor
    inv: Tensor


def factor(prob: DiagonalProblem, lam0: Tensor, free: Tensor) -> ChordFactor:
    """Factor H₀ = ∇²F₀(λ₀) on the free generators (the Newton solve's relative damping)."""
    idx = free.nonzero().squeeze(1)
    h = prob.hessian(lam0)[idx][:, idx]
    if len(idx):
        h.diagonal().add_(1e-12 * float(h.diagonal().abs().max().clamp_min(1e-300)))
    chol, info = torch.linalg.cholesky_ex(h)
    if int(info) != 0:
        raise StatisticsError(
            "The Hessian of F at the last solution is not positive definite; the first-order "
            "distance needs a full solve (distance_mode='solve')."
        )
    flat0 = prob.derivatives(lam0)[1][idx] == 0
    dtype = max((g.m.dtype for g in prob.grids), key=lambda t: torch.finfo(t).bits, default=_DT)
    inv = torch.cholesky_inverse(chol).to(dtype)
    return ChordFactor(lam0, free, chol, chol.square().sum(1), flat0, inv)


def _eps(prob: DiagonalProblem) -> float:
    """Relative round-off of F's sums (the grids' dtype)."""
    return max((16 * torch.finfo(g.m.dtype).eps for g in prob.grids), default=0.0)


def chord_solve(
    fac: ChordFactor,
    prob: DiagonalProblem,
    *,
    tol: float,
    max_iter: int,
    start: Tensor | None = None,
    search: bool = True,
) -> tuple[Tensor, bool, int, float]:
    """Scaled chord iterations on F from λ₀: (λ, converged, iterations, last correction).

    Step k: λ ← λ − H̃⁻¹∇F(λ) with H̃ = S H₀ S, S = diag(√(d(λ)/d₀)) (it gives up when S
    leaves [10⁻³, 10³]; generators with d = 0, flat, stay) where d is the Hessian's diagonal
    (:meth:`DiagonalProblem.derivatives`):
    H₀'s factor, rescaled so that its diagonal follows the current one (generators whose
    curvature changed — neurons that fire more or less often on this batch — are then no
    worse off than the others), and a backtracking line search on F shortens a step that
    overshoots. The first iterate (a full step) is eq. (C1) with H̃ for H₀; the bound (C2)
    holds with ρ measured against H̃. Stops when the correction ‖δ‖∞ ≤ ``tol`` (converged)
    or after ``max_iter`` steps. ``start`` (default λ₀): where to begin, e.g. the last
    record's λ; ``search=False`` takes full steps (no line search).
    """
    idx = fac.free.nonzero().squeeze(1)
    lam = (fac.lam0 if start is None else start).to(device=fac.chol.device).clone()
    g, d, f = prob.derivatives(lam)
    size, eps = math.inf, _eps(prob)
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
        step = -(fac.inv @ (g[idx] / scale).to(fac.inv.dtype)).to(_DT) / scale
        slope = float(g[idx] @ step)
        t = 1.0
        while True:  # backtracking (Armijo) on F: a step that overshoots is shortened
            trial = lam.clone()
            trial[idx] += t * step
            g2, d2, f2 = prob.derivatives(trial)
            if not search or (math.isfinite(f2) and f2 <= f + 1e-4 * t * slope + eps * abs(f)):
                break
            t /= 2
            if t < 1e-6:
                return lam, False, it, math.inf
        lam, g, d, f = trial, g2, d2, f2
        size = t * float(step.abs().max()) if len(idx) else 0.0
        if size <= tol:
            return lam, True, it, size
    return lam, False, max_iter, size


def chord_step(fac: ChordFactor, prob: DiagonalProblem) -> tuple[Tensor, float]:
    """Eq. (C1) with H̃ (one step of :func:`chord_solve`) and ν̂ = max_k |a_k·(λ₁ − λ₀)|."""
    lam, _, _, _ = chord_solve(fac, prob, tol=0.0, max_iter=1, search=False)
    return lam, prob.max_exponent(lam - fac.lam0.to(lam.device))


def chord_bound(nu: float, rho: float) -> float:
    """β of eq. (C2): the contraction of the chord step's error in the H₀-norm."""
    if nu == 0:
        lo = hi = 1.0
    else:
        lo = -math.expm1(-2 * nu) / (2 * nu)
        hi = math.expm1(2 * nu) / (2 * nu)
    return max(1 - lo * (1 - rho), hi * (1 + rho) - 1)
