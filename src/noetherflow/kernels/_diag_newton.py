"""Private: damped Newton on the convex F(λ) of all diagonal generators (paper eq. 9).

Two ways to solve each Newton system H p = −∇F, chosen by :func:`choose_method`:

* ``dense`` — form H (``[n, n]``) and factor it (float32 Cholesky with float64 refinement,
  :func:`_spd_solve`): the reference, and the fastest for a few hundred generators;
* ``cg`` — matrix-free conjugate gradients on :class:`HessianOperator` (memory linear in the
  number of generators), preconditioned by H's diagonal (block-Jacobi: the block of one
  symmetry's own generators is diagonal, since two of its generators never share a
  coordinate) plus an additive coarse correction on one constant vector per symmetry
  (the smooth across-layer modes the diagonal misses), as an inexact (truncated) Newton
  method with the forcing term η = min(10⁻³, rel) (Eisenstat & Walker 1996: quadratic
  convergence, as the exact step).

Both stop on the same criterion, the largest relative flow |∂F/∂λ_j| / Σ_k |a_kj| F_k ≤ tol,
so they return the same λ* to the conditioning of the problem times ``tol``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from noetherflow.kernels._diag_problem import HessianOperator, _DiagProblem
from noetherflow.kernels._diag_recession import combined_directions
from noetherflow.kernels.base import InfinityReport

__all__ = ["NewtonMethod", "choose_method", "solve_diag"]

_LAM_MAX = 40.0  # |λ| beyond which a Newton iterate is taken as running off to infinity
DENSE_MAX = 512  # "auto": the dense Newton system up to this many free generators


class NewtonMethod(str, Enum):
    """How the joint diagonal Newton solve treats its linear systems (``solver=``)."""

    AUTO = "auto"  # dense up to DENSE_MAX free generators, else cg
    DENSE = "dense"  # dense Hessian + Cholesky: O(n²) memory, O(n³) time; the reference
    CG = "cg"  # matrix-free preconditioned conjugate gradients: O(n + grid) memory


def choose_method(method: NewtonMethod, n_free: int) -> NewtonMethod:
    """The method that ``auto`` resolves to for ``n_free`` free generators."""
    if method is NewtonMethod.AUTO:
        return NewtonMethod.DENSE if n_free <= DENSE_MAX else NewtonMethod.CG
    return method


# -- dense -----------------------------------------------------------------------------------
_MIXED_MIN = 256  # below this size a float64 Cholesky costs less than the refinement
_REFINE_MAX = 12  # float32-factor refinement steps before falling back to float64
_U64 = 2.0**-53  # unit round-off of float64
_REFINE_TOL = 16 * _U64  # correction size (relative, ∞-norm) at float64 round-off


def _chol_solve(chol: Tensor, rhs: Tensor) -> Tensor:
    """Solve L Lᵀ x = rhs for lower-triangular ``chol`` ``[n, n]``; ``rhs`` ``[n]``."""
    y = torch.linalg.solve_triangular(chol, rhs[:, None], upper=False)
    return torch.linalg.solve_triangular(chol.T, y, upper=True)[:, 0]


def _spd_solve(h: Tensor, rhs: Tensor) -> Tensor:
    """Solve H x = rhs for the (damped, convex) Newton Hessian ``[n, n]`` in float64 accuracy.

    Large systems factor H in float32 (about 2.5× cheaper) and refine the solution with
    float64 residuals until the correction itself is at float64 round-off,
    ``‖dx‖∞ ≤ 16·u·‖x‖∞`` (u = 2⁻⁵³, so the forward error, not only the backward error, is
    float64-accurate: a small residual alone still allows a forward error of κ(H)·u·64).
    A refinement whose correction stops shrinking by at least half per step has reached the
    limiting accuracy of float64 residuals (kept if its backward error is at round-off) or
    cannot contract with a float32 factor (then it falls back to a float64 Cholesky),
    and a numerically singular system to least squares.
    """
    n = h.shape[0]
    if n >= _MIXED_MIN:
        chol32, info = torch.linalg.cholesky_ex(h.to(torch.float32))
        if int(info) == 0:
            x = _chol_solve(chol32, rhs.to(torch.float32)).to(torch.float64)
            prev = float("inf")
            for _ in range(_REFINE_MAX):
                dx = _chol_solve(chol32, (rhs - h @ x).to(torch.float32)).to(torch.float64)
                x = x + dx
                size = float(dx.abs().max())
                if size <= _REFINE_TOL * float(x.abs().max()):
                    return x
                if not size <= 0.5 * prev:
                    # Stagnation: the corrections are the round-off of the float64 residual
                    # itself (limiting accuracy, Higham 2002 §12.1), as accurate as a float64
                    # factor, when the residual is at round-off; else (or NaN) fall back.
                    r = float((rhs - h @ x).abs().max())
                    scale = float(h.abs().sum(1).max())
                    bound = 64 * _U64 * (scale * float(x.abs().max()) + float(rhs.abs().max()))
                    if r <= bound:
                        return x
                    break
                prev = size
    chol, info = torch.linalg.cholesky_ex(h)
    if int(info) == 0:
        return _chol_solve(chol, rhs)
    return torch.linalg.lstsq(h, rhs[:, None]).solution[:, 0]


# -- matrix-free ------------------------------------------------------------------------------
_CG_MAX = 500  # conjugate-gradient iterations per Newton step at most
_ETA = 1e-3  # largest forcing term of the inexact Newton steps


class _Preconditioner:
    """M⁻¹ = D⁻¹ + Z (ZᵀHZ)⁻¹ Zᵀ on the free generators (additive two-level, SPD).

    D: H's diagonal (block-Jacobi over symmetries, whose own blocks are diagonal), Z: one
    indicator vector per symmetry's generator range (restricted to the free generators), so
    that the coarse matrix ZᵀHZ (``[R, R]``, R symmetries) captures the modes that move whole
    layers against each other, which the diagonal alone resolves slowly.
    """

    def __init__(
        self,
        op: Callable[[Tensor], Tensor],
        diag: Tensor,
        free: Tensor,
        ranges: list[tuple[int, int]],
    ) -> None:
        d = torch.where(free, diag, 1.0)
        self.inv_d = torch.where(free & (d > 0), 1.0 / d, 0.0)
        used = [(o, k) for o, k in ranges if bool(free[o : o + k].any())]
        self.r = len(used)
        # range index of each free generator (ranges are disjoint); r: none (a dump slot)
        self.rid = torch.full(free.shape, self.r, dtype=torch.long)
        for i, (o, k) in enumerate(used):
            self.rid[o : o + k] = i
        self.rid[~free] = self.r
        self.coarse: Tensor | None = None
        if self.r == 0:
            return
        hz = torch.stack([op((self.rid == i).to(torch.float64)) for i in range(self.r)], 1)
        e = self._zt(hz)  # [R, R] = Zᵀ H Z
        chol, info = torch.linalg.cholesky_ex((e + e.T) / 2)
        if int(info) == 0:
            self.coarse = chol

    def _zt(self, v: Tensor) -> Tensor:
        """Zᵀv: sums of ``v`` ``[n, ...]`` over each range's free generators. ``[R, ...]``."""
        out = v.new_zeros((self.r + 1, *v.shape[1:]))
        return out.index_add_(0, self.rid, v)[: self.r]

    def __call__(self, r: Tensor) -> Tensor:
        out = self.inv_d * r
        if self.coarse is not None:
            y = torch.cholesky_solve(self._zt(r)[:, None], self.coarse)[:, 0]
            out += torch.cat([y, y.new_zeros(1)])[self.rid]
        return out


def _pcg(
    op: Callable[[Tensor], Tensor],
    b: Tensor,
    precond: Callable[[Tensor], Tensor],
    done: Callable[[Tensor], bool],
    max_iter: int,
) -> tuple[Tensor, int]:
    """Preconditioned conjugate gradients for H x = b from x = 0 until ``done(residual)``.

    Every iterate is a descent direction of the quadratic model, so a truncated solve still
    gives a Newton–CG step. Returns (x, iterations).
    """
    x = torch.zeros_like(b)
    r = b.clone()
    z = precond(r)
    p = z.clone()
    rz = float(r @ z)
    it = 0
    for it in range(1, max_iter + 1):
        q = op(p)
        pq = float(p @ q)
        if not pq > 0:  # round-off has made the model flat or indefinite along p: stop
            return (z if it == 1 else x), it
        alpha = rz / pq
        x.add_(p, alpha=alpha)
        r.sub_(q, alpha=alpha)
        if done(r):
            break
        z = precond(r)
        rz_new = float(r @ z)
        p.mul_(rz_new / rz).add_(z)
        rz = rz_new
    return x, it


def _cg_step(
    prob: _DiagProblem,
    terms: Any,
    g: Tensor,
    scale: Tensor,
    free: Tensor,
    rel: float,
    tol: float,
) -> tuple[Tensor, int]:
    """The inexact Newton step on the free generators. Has shape ``[n]`` (0 elsewhere)."""
    hop: HessianOperator = prob.hessian_operator(terms)
    ff = free.to(torch.float64)
    damp = 1e-12 * float(hop.diagonal[free].abs().max().clamp_min(1e-300))

    def op(v: Tensor) -> Tensor:
        return (hop.matvec(v * ff) + damp * v) * ff

    precond = _Preconditioner(op, hop.diagonal + damp, free, prob.ranges())
    inv_scale = torch.where(free & (scale > 0), 1.0 / scale.clamp_min(1e-300), 0.0)
    # forcing term: the relative flow the linear solve may leave, η·rel with η = min(10⁻³,
    # rel): quadratic convergence like the exact dense step (conjugate gradients are cheap
    # next to a Newton step's exponentials and line search), so the last step leaves flows
    # far below ``tol`` as the dense one does; not below 10⁻³·tol or float64 round-off
    target = max(min(_ETA, rel) * rel, 1e-3 * tol, 1e-16)

    def done(r: Tensor) -> bool:
        return float((r * inv_scale).abs().max()) <= target

    return _pcg(op, -g * ff, precond, done, min(_CG_MAX, 10 + 2 * int(free.sum())))


_ONE_SIDED = (
    "no restoring term along these generators (e.g. scale invariance without weight decay, "
    "paper eq. 24): the noise moves them without bound; left unmoved"
)
_COMBINED = (
    "F decreases along this combined direction of generators (each bounded alone): the "
    "equilibrium is at infinity there; left unmoved, the rest solved"
)
_FAINT = (
    "each term that would pull this generator back is below 1e-13 of the gross terms of a "
    "generator it touches, the cut-off below which a term counts as absent: its equilibrium "
    "is at infinity by that convention (a finite minimiser would lie beyond |λ| ≈ 7); left "
    "unmoved"
)
_RUN_OFF = (
    "F keeps decreasing along this combined direction: the joint equilibrium is at infinity; "
    "the iterate was stopped, not moved"
)


def _reports(
    prob: _DiagProblem, names: Mapping[Any, str], parts: list[tuple[Tensor, str, bool]]
) -> list[InfinityReport]:
    """One report per symmetry that ``parts`` touch: its slice of their sum, their reasons.

    ``parts``: (direction ``[n]``, reason, combined) with disjoint supports; a combined
    part's report names the other symmetries it touches (``coupled``).
    """
    out = []
    for s, off in prob.offsets.items():
        k = s.num_generators
        touching = [(d, why, c) for d, why, c in parts if bool((d[off : off + k] != 0).any())]
        if not touching:
            continue
        coupled: dict[str, None] = {}
        for d, _, c in touching:
            if c:
                for s2, o2 in prob.offsets.items():
                    if s2 is not s and bool((d[o2 : o2 + s2.num_generators] != 0).any()):
                        coupled[names[s2]] = None
        direction = sum(d[off : off + k] for d, _, _ in touching)
        assert isinstance(direction, Tensor)
        reason = "; ".join(dict.fromkeys(why for _, why, _ in touching))
        out.append(InfinityReport(names[s], direction.clone(), reason, tuple(coupled)))
    return out


# -- the Newton iteration -----------------------------------------------------------------------
def _held_mask(fixed: Tensor | None, n: int) -> Tensor:
    """Where ``fixed`` ``[n]`` holds a generator (finite entries); NaN entries are free."""
    if fixed is None:
        return torch.zeros(n, dtype=torch.bool)
    if tuple(fixed.shape) != (n,) or bool(torch.isinf(fixed).any()):
        raise ValueError(
            f"fixed has shape {tuple(fixed.shape)} (infinite entries: "
            f"{int(torch.isinf(fixed).sum())}); expected a vector of shape ({n},), one entry per "
            "generator: the value to hold it at, or NaN to leave it free"
        )
    return torch.isfinite(fixed)


def solve_diag(
    prob: _DiagProblem,
    names: Mapping[Any, str],
    *,
    tol: float,
    max_iter: int,
    init: Tensor | None = None,
    method: NewtonMethod = NewtonMethod.AUTO,
    info: dict[str, Any] | None = None,
    fixed: Tensor | None = None,
) -> tuple[Tensor, list[InfinityReport], float, bool, int]:
    """Damped Newton on the convex F(λ) (paper eq. 9) over ``prob.n`` generators.

    Before Newton, the directions at infinity are found and their generators frozen at 0
    (left unmoved, reported): single generators with a one-sided F
    (:meth:`_DiagProblem.one_sided`), then combined directions by the recession condition of
    :mod:`._diag_recession`. That runs a linear program only when its pinning pre-check
    (O(size of the grids)) cannot prove the equilibrium finite, and before Newton, not after
    a failure to converge: Newton is not a detector (along a combined direction the relative
    flow decays with the terms that run off, so it may stop at a large finite λ). Newton then
    solves on the remaining generators, whose equilibrium is finite. A Newton iterate beyond
    |λ| = 40 (a finite minimiser that far out, from terms near the cut-off) is still reported
    at infinity and nothing is moved.

    ``init`` ``[n]`` (float64) warm-starts the iteration, e.g. from the previous solution of a
    slowly changing problem; frozen generators start and stay at 0 regardless. The
    convergence criteria are the same as from 0 and for either ``method``. ``fixed`` ``[n]``
    (float64) holds the generators where it is finite at that value and leaves those where it
    is NaN free: the result minimises F over the free ones with the held ones in place (the
    reduced problem; its flows vanish on the free generators only); a held generator is never
    reported at infinity, and the directions at infinity are sought among the free ones only
    (a held generator adds a constant factor to its terms, which does not change F's recession
    cone). ``info`` (optional) receives the method used, the conjugate-gradient iterations and
    whether the recession LP ran (``recession_lp``) and the relative flow of the free
    generators at the start (``initial_flow``, before any step). Returns (λ ``[n]``,
    at-infinity reports, one per symmetry, relative flow of the free generators, converged,
    iterations).
    """
    up, down = prob.sides()
    held = _held_mask(fixed, prob.n)
    sided = torch.where(held, 0.0, prob.one_sided((up, down)))  # a held one does not run off
    free = (sided == 0) & ~held
    combined, lp = combined_directions(prob, ~free, up + down)
    for d in combined:
        free &= d == 0
    if init is None:
        lam = torch.zeros(prob.n, dtype=torch.float64)
    else:
        if tuple(init.shape) != (prob.n,) or not bool(torch.isfinite(init).all()):
            raise ValueError(
                f"init has shape {tuple(init.shape)} (finite: {bool(torch.isfinite(init).all())});"
                f" expected a finite vector of shape ({prob.n},), one entry per generator: pass"
                " the λ of a previous solve of the same symmetries, or None"
            )
        lam = torch.where(free, init.to(torch.float64), 0.0)
    if fixed is not None:
        lam = torch.where(held, fixed.to(torch.float64), lam)
    parts = [(sided, _ONE_SIDED, False)] + [
        (d, _COMBINED, True) if int((d != 0).sum()) > 1 else (d, _FAINT, False) for d in combined
    ]
    reports = _reports(prob, names, parts)
    used = choose_method(method, int(free.sum()))
    cg_iters: list[int] = []
    if info is not None:
        info.update(method=used.value, cg_iterations=cg_iters, recession_lp=lp)
    converged, it, rel = True, 0, 0.0
    if not bool(free.any()):
        if info is not None:
            info["initial_flow"] = 0.0
        return lam, reports, 0.0, True, 0
    idx = free.nonzero().squeeze(1)
    all_free = bool(free.all())
    best, stalled = float("inf"), 0
    terms = prob.terms(lam)
    dense = used is NewtonMethod.DENSE
    for it in range(1, max_iter + 1):
        g, scale, h = prob.derivatives(lam, terms=terms, hessian=dense)
        gf, sf = g[idx], scale[idx]
        active = sf > 0
        rel = float((gf.abs()[active] / sf[active]).max()) if bool(active.any()) else 0.0
        if it == 1 and info is not None:
            info["initial_flow"] = rel
        if rel <= tol:
            break
        stalled = stalled + 1 if rel > 0.5 * best else 0
        if rel < 1e-9 and stalled >= 3:
            break  # three Newton steps without progress: the round-off floor is reached
        best = min(best, rel)
        if dense:
            hf = h if all_free else h[idx][:, idx]
            damp = 1e-12 * float(hf.diagonal().abs().max().clamp_min(1e-300))
            hf.diagonal().add_(damp)
            step = _spd_solve(hf, -gf)
        else:
            full, n_cg = _cg_step(prob, terms, g, scale, free, rel, tol)
            cg_iters.append(n_cg)
            step = full[idx]
        f0, t = prob.value_of(terms, lam), 1.0
        slope = float(gf @ step)
        while t > 1e-12:
            trial = lam.clone()
            trial[idx] += t * step
            terms = prob.terms(trial)
            # Near the minimum F changes below its round-off; don't let that reject the step.
            if prob.value_of(terms, trial) <= f0 + 1e-4 * t * slope + 1e-13 * abs(f0):
                break
            t /= 2
        else:
            # No decrease left at round-off level: accept if the flows are already negligible.
            converged = rel <= 1e-9
            break
        lam = trial
        if float(lam[idx].abs().max()) > _LAM_MAX:
            # Bounded by (R) yet running off: a minimiser beyond |λ| = 40 (terms near the
            # NEGLIGIBLE cut-off), at infinity in float64 terms.
            direction = torch.where(free, lam, 0.0)
            direction = direction / direction.norm()
            for s, off in prob.offsets.items():
                if direction[off : off + s.num_generators].abs().max() <= 1e-3:
                    direction[off : off + s.num_generators] = 0.0
            parts.append((direction, _RUN_OFF, True))
            return torch.where(held, lam, 0.0), _reports(prob, names, parts), rel, False, it
    else:
        converged = False
    return lam, reports, rel, converged, it
