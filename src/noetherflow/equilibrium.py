"""Solvers for the noise equilibrium (paper Thm 4.3, eq. 9; DESIGN §2.1).

* Diagonal generators (rescaling, scale), jointly: the flows of all charges are −∇F of the
  convex F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κ θ_k² e^{2a_k·λ}); Newton with a line search.
* Double rotation, one pair: the matrix geometric mean P = Y^{-1/2}(Y^{1/2} X Y^{1/2})^{1/2}
  Y^{-1/2} solves P Y P = X with X = M_U + κWWᵀ, Y = M_W + κUᵀU; G = P^{1/2}.
* Dense A: the flow along the orbit is strictly monotone in λ (Thm 4.3): bracket + brentq.
* Coupled symmetries (chains of rotations, rotations sharing parameters with rescalings):
  block Gauss–Seidel sweeps over the blocks above, with per-sample gradients transported
  along the orbit (∇ℓ(Tθ) = T^{-T}∇ℓ(θ), eqs. 34–37), until the largest relative flow is
  below ``tol``.

An equilibrium may sit at infinity along some direction (e.g. scale invariance without weight
decay, paper eq. 24): it is reported in :attr:`EquilibriumSolution.at_infinity` and the
problem is solved on the remaining directions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.optimize import brentq
from torch import Tensor, nn

from noetherflow._errors import StatisticsError
from noetherflow.flow import NoiseModel
from noetherflow.stats.core import GradStats, axis_sum, stats_from_samples
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry
from noetherflow.symmetry.dense import DenseSymmetry
from noetherflow.symmetry.rotation import DoubleRotation
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["EquilibriumSolution", "InfinityReport", "geometric_mean", "solve_equilibrium"]

_LAM_MAX = 40.0  # |λ| beyond which a Newton iterate is taken as running off to infinity


@dataclass(frozen=True)
class InfinityReport:
    """Part of an equilibrium that lies at infinity.

    ``direction`` is the generator direction (diagonal: a vector over that symmetry's
    generators; rotation: an orthonormal basis ``[d, k]`` of the hidden directions; dense:
    ±1) along which the noise keeps pushing; ``sign`` is +1 or −1 where it applies.
    """

    name: str
    direction: Tensor
    reason: str


@dataclass
class EquilibriumSolution:
    """The group elements that take a model to its noise equilibrium.

    Attributes:
        syms: the symmetry set solved for.
        steps: ``(index, element)`` pairs, applied in order by :func:`noetherflow.teleport`.
        elements: the total element per symmetry: λ (diagonal, ``[num_generators]``), G
            (rotation, ``[d, d]``), λ (dense, float).
        distance: the distance to equilibrium along each orbit: |λ*| per generator
            (diagonal), ‖log P‖_F with P = GGᵀ (rotation), |λ*| (dense).
        at_infinity: directions whose equilibrium is at infinity (not moved).
        residual: predicted relative flow left after the transport, per symmetry.
        converged, iterations: solver status (Newton iterations or sweeps).
    """

    syms: SymmetrySet
    steps: list[tuple[int, Any]]
    elements: dict[str, Any]
    distance: dict[str, Tensor]
    at_infinity: list[InfinityReport] = field(default_factory=list)
    residual: dict[str, float] = field(default_factory=dict)
    converged: bool = True
    iterations: int = 0

    def max_distance(self) -> float:
        """The largest distance over all symmetries (0 when already at equilibrium)."""
        vals = [float(d.max()) if d.numel() else 0.0 for d in self.distance.values()]
        return max(vals, default=0.0)

    def __repr__(self) -> str:
        inf = ", ".join(r.name for r in self.at_infinity) or "none"
        return (
            f"EquilibriumSolution({len(self.syms)} symmetries, max distance "
            f"{self.max_distance():.3g}, converged={self.converged}, at infinity: {inf})"
        )


# -- diagonal generators, jointly ------------------------------------------------------------
@dataclass
class _Grid:
    """One parameter's terms of F, summed over the axes no generator distinguishes.

    ``m`` and ``c`` have shape ``[n0, n1]`` (rows × columns; n1 = 1 for vectors); each row
    (column) term is ``(offset, n_generators, block, sign)`` in the global λ vector.
    """

    m: Tensor
    c: Tensor
    rows: list[tuple[int, int, int, float]]
    cols: list[tuple[int, int, int, float]]


def _spread(lam: Tensor, terms: list[tuple[int, int, int, float]], n: int) -> Tensor:
    out = torch.zeros(n, dtype=torch.float64)
    for off, k, b, sg in terms:
        out += sg * lam[off : off + k].repeat_interleave(b)
    return out


def _gather(v: Tensor, k: int, b: int) -> Tensor:
    """Sum consecutive blocks of b entries of ``v`` (length k·b). Has shape ``[k]``."""
    return v.reshape(k, b).sum(1)


@dataclass
class _DiagProblem:
    """F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κθ_k² e^{2a_k·λ}) for all diagonal generators jointly."""

    n: int
    offsets: dict[DiagonalSymmetry, int]
    grids: list[_Grid]

    def terms(self, lam: Tensor) -> list[tuple[_Grid, Tensor, Tensor]]:
        """Per grid, the two halves of F's terms at ``lam``: m e^{−2s} and c e^{2s}."""
        out = []
        for g in self.grids:
            n0, n1 = g.m.shape
            s = _spread(lam, g.rows, n0)[:, None] + _spread(lam, g.cols, n1)[None, :]
            e = torch.exp(-2 * s)  # one exp per coordinate: e^{2s} = 1/e^{−2s}
            out.append((g, g.m * e, g.c / e))
        return out

    @staticmethod
    def value_of(terms: list[tuple[_Grid, Tensor, Tensor]]) -> float:
        return float(sum(0.5 * (lo.sum() + hi.sum()) for _, lo, hi in terms))

    def value(self, lam: Tensor) -> float:
        return self.value_of(self.terms(lam))

    def derivatives(
        self,
        lam: Tensor,
        *,
        hessian: bool = True,
        terms: list[tuple[_Grid, Tensor, Tensor]] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """∇F (= −flow), its gross scale Σ_k |a_kj|(m e^{−2s} + c e^{2s}), and the Hessian.

        ``terms`` may pass :meth:`terms` at ``lam`` when already computed.
        """
        grad = torch.zeros(self.n, dtype=torch.float64)
        scale = torch.zeros(self.n, dtype=torch.float64)
        h = torch.zeros(self.n, self.n, dtype=torch.float64) if hessian else torch.empty(0)
        for g, lo, hi in self.terms(lam) if terms is None else terms:
            d, tot = hi - lo, lo + hi  # ∂/∂s and ½∂²/∂s² of each term
            sums = {}
            for axis, side in ((1, g.rows), (0, g.cols)):
                dsum, tsum = d.sum(axis), tot.sum(axis)
                sums[axis] = tsum
                for off, k, b, sg in side:
                    grad[off : off + k] += sg * _gather(dsum, k, b)
                    scale[off : off + k] += abs(sg) * _gather(tsum, k, b)
            if not hessian:
                continue
            for axis, side in ((1, g.rows), (0, g.cols)):
                wsum = 2 * sums[axis]
                pos = torch.arange(wsum.shape[0])
                for off1, _, b1, s1 in side:
                    for off2, _, b2, s2 in side:
                        h.index_put_(
                            (off1 + pos // b1, off2 + pos // b2), s1 * s2 * wsum, accumulate=True
                        )
            for off1, k1, b1, s1 in g.rows:
                rowsum = tot.reshape(k1, b1, -1).sum(1)
                for off2, k2, b2, s2 in g.cols:
                    blk = 2 * s1 * s2 * rowsum.reshape(k1, k2, b2).sum(2)
                    h[off1 : off1 + k1, off2 : off2 + k2] += blk
                    h[off2 : off2 + k2, off1 : off1 + k1] += blk.T
        return grad, scale, h

    def one_sided(self) -> Tensor:
        """Per generator: +1 if the noise pushes it to +∞ whatever the others do, −1 to −∞, 0 else.

        A generator whose coordinates offer no restoring term (no κθ² on its positive side and
        no M on its negative side, or the reverse) has no finite equilibrium.
        """
        up = torch.zeros(self.n, dtype=torch.float64)
        down = torch.zeros(self.n, dtype=torch.float64)
        for g in self.grids:
            for axis, terms in ((1, g.rows), (0, g.cols)):
                ms, cs = g.m.sum(axis), g.c.sum(axis)
                for off, k, b, sg in terms:
                    mk, ck = abs(sg) * _gather(ms, k, b), abs(sg) * _gather(cs, k, b)
                    up[off : off + k] += mk if sg > 0 else ck
                    down[off : off + k] += ck if sg > 0 else mk
        tiny = 1e-13 * (up + down)
        out = torch.zeros(self.n, dtype=torch.float64)
        out[(down <= tiny) & (up > 0)] = 1.0
        out[(up <= tiny) & (down > 0)] = -1.0
        return out


def _to_grid(v: Tensor) -> Tensor:
    v = v.to(torch.float64).cpu()
    if v.dim() == 1:
        return v[:, None]
    return v.reshape(v.shape[0], v.shape[1], -1).sum(-1)


def _diag_problem(
    syms: list[DiagonalSymmetry],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
) -> _DiagProblem:
    offsets: dict[DiagonalSymmetry, int] = {}
    n = 0
    for s in syms:
        offsets[s] = n
        n += s.num_generators
    per_param: dict[nn.Parameter, tuple[list[Any], list[Any]]] = {}
    for s in syms:
        for t in s.terms():
            rows, cols = per_param.setdefault(t.param, ([], []))
            entry = (offsets[s] + 0, t.num_generators, t.block, float(t.sign))
            if t.axis == 0:
                rows.append(entry)
            elif t.axis == 1:
                cols.append(entry)
            else:  # pragma: no cover - the built-in families act along axes 0 and 1
                raise NotImplementedError(f"diagonal terms along axis {t.axis} are not supported")
    grids = []
    for p, (rows, cols) in per_param.items():
        mean = stats.mean[p].to(torch.float64)
        c = nm.kappa * values[p].to(torch.float64).square()
        if p in stats.sq:
            m = nm.diag(mean, stats.sq[p].to(torch.float64)).clamp(min=0)
            grids.append(_Grid(_to_grid(m), _to_grid(c), rows, cols))
            continue
        # Generators along one axis only: F depends on the per-neuron sums along it.
        ax = 0 if rows else 1
        if (rows and cols) or (p, ax) not in stats.sq_axis:
            raise StatisticsError(
                f"The solver needs per-coordinate squared gradients of a parameter of shape "
                f"{tuple(p.shape)} (generators act on {'both its axes' if rows and cols else 'it'}"
                "), but these statistics hold only per-neuron sums (level='neuron'); collect "
                "them with level='solve' or 'diag' (the default)."
            )
        msq = axis_sum(mean.square(), ax)
        m = (nm.c_mean * msq + nm.c_second * stats.sq_axis[(p, ax)].to(torch.float64)).cpu()
        m, cs = m.clamp(min=0), axis_sum(c, ax).cpu()
        shape = (-1, 1) if ax == 0 else (1, -1)
        grids.append(_Grid(m.reshape(shape), cs.reshape(shape), rows, cols))
    return _DiagProblem(n, offsets, grids)


_MIXED_MIN = 256  # below this size a float64 Cholesky costs less than the refinement


def _chol_solve(chol: Tensor, rhs: Tensor) -> Tensor:
    """x with L Lᵀ x = rhs for lower-triangular ``chol`` ``[n, n]``; ``rhs`` ``[n]``."""
    y = torch.linalg.solve_triangular(chol, rhs[:, None], upper=False)
    return torch.linalg.solve_triangular(chol.T, y, upper=True)[:, 0]


def _spd_solve(h: Tensor, rhs: Tensor) -> Tensor:
    """Solve H x = rhs for the (damped, convex) Newton Hessian ``[n, n]`` in float64 accuracy.

    Large systems factor H in float32 (about 2.5× cheaper) and refine the solution with
    float64 residuals until the backward error is at float64 round-off; a system the float32
    factor cannot bring there falls back to a float64 Cholesky, and a numerically singular one
    to least squares.
    """
    n = h.shape[0]
    if n >= _MIXED_MIN:
        chol32, info = torch.linalg.cholesky_ex(h.to(torch.float32))
        if int(info) == 0:
            scale = float(h.abs().sum(1).max())
            x = _chol_solve(chol32, rhs.to(torch.float32)).to(torch.float64)
            for _ in range(6):
                r = rhs - h @ x
                bound = 64 * 2.2e-16 * (scale * float(x.abs().max()) + float(rhs.abs().max()))
                if float(r.abs().max()) <= bound:
                    return x
                x = x + _chol_solve(chol32, r.to(torch.float32)).to(torch.float64)
    chol, info = torch.linalg.cholesky_ex(h)
    if int(info) == 0:
        return _chol_solve(chol, rhs)
    return torch.linalg.lstsq(h, rhs[:, None]).solution[:, 0]


def _solve_diag(
    prob: _DiagProblem, names: Mapping[DiagonalSymmetry, str], *, tol: float, max_iter: int
) -> tuple[Tensor, list[InfinityReport], float, bool, int]:
    lam = torch.zeros(prob.n, dtype=torch.float64)
    sided = prob.one_sided()
    free = sided == 0
    reports: list[InfinityReport] = []
    for s, off in prob.offsets.items():
        sl = sided[off : off + s.num_generators]
        if (sl != 0).any():
            reports.append(
                InfinityReport(
                    names[s],
                    sl.clone(),
                    "no restoring term along these generators (e.g. scale invariance without "
                    "weight decay, paper eq. 24): the noise moves them without bound; left unmoved",
                )
            )
    converged, it, rel = True, 0, 0.0
    if not bool(free.any()):
        return lam, reports, 0.0, True, 0
    idx = free.nonzero().squeeze(1)
    all_free = bool(free.all())
    best, stalled = float("inf"), 0
    terms = prob.terms(lam)
    for it in range(1, max_iter + 1):
        g, scale, h = prob.derivatives(lam, terms=terms)
        gf, sf = g[idx], scale[idx]
        active = sf > 0
        rel = float((gf.abs()[active] / sf[active]).max()) if bool(active.any()) else 0.0
        if rel <= tol:
            break
        stalled = stalled + 1 if rel > 0.5 * best else 0
        if rel < 1e-9 and stalled >= 3:
            break  # three Newton steps without progress: the round-off floor is reached
        best = min(best, rel)
        hf = h if all_free else h[idx][:, idx]
        damp = 1e-12 * float(hf.diagonal().abs().max().clamp_min(1e-300))
        hf.diagonal().add_(damp)
        step = _spd_solve(hf, -gf)
        f0, t = prob.value_of(terms), 1.0
        slope = float(gf @ step)
        while t > 1e-12:
            trial = lam.clone()
            trial[idx] += t * step
            terms = prob.terms(trial)
            # Near the minimum F changes below its round-off; don't let that reject the step.
            if prob.value_of(terms) <= f0 + 1e-4 * t * slope + 1e-13 * abs(f0):
                break
            t /= 2
        else:
            # No decrease left at round-off level: accept if the flows are already negligible.
            converged = rel <= 1e-9
            break
        lam = trial
        if float(lam.abs().max()) > _LAM_MAX:
            direction = lam / lam.norm()
            for s, off in prob.offsets.items():
                d = direction[off : off + s.num_generators]
                if d.abs().max() > 1e-3:
                    reports.append(
                        InfinityReport(
                            names[s],
                            d.clone(),
                            "F keeps decreasing along this combined direction: the joint "
                            "equilibrium is at infinity; the iterate was stopped, not moved",
                        )
                    )
            return torch.zeros_like(lam), reports, rel, False, it
    else:
        converged = False
    return lam, reports, rel, converged, it


# -- rotation pair --------------------------------------------------------------------------
def _sym_fn(a: Tensor, fn: Any) -> Tensor:
    w, v = torch.linalg.eigh(a)
    return (v * fn(w)) @ v.T


def geometric_mean(X: Tensor, Y: Tensor) -> Tensor:
    """The SPD solution P of P Y P = X: P = Y^{-1/2}(Y^{1/2} X Y^{1/2})^{1/2} Y^{-1/2}.

    ``X``, ``Y``: symmetric positive definite ``[d, d]`` → ``[d, d]``.
    """
    yh = _sym_fn(Y, torch.sqrt)
    yih = _sym_fn(Y, lambda w: 1 / torch.sqrt(w))
    z = yh @ X @ yh
    z = (z + z.T) / 2
    p = yih @ _sym_fn(z, lambda w: torch.sqrt(w.clamp(min=0))) @ yih
    return (p + p.T) / 2


def _common_range(rx: Tensor, ry: Tensor, tol: float = 1e-8) -> Tensor:
    """Orthonormal basis of range X ∩ range Y from orthonormal range bases ``[d, r]``.

    The directions of range X whose distance from range Y (the sine of the principal angle)
    is at most ``tol``: right singular vectors of (I − R_Y R_Yᵀ) R_X, O(d·r²) not O(d³).
    """
    d = rx.shape[0]
    if rx.shape[1] == 0 or ry.shape[1] == 0:
        return rx.new_zeros(d, 0)
    _, sv, vh = torch.linalg.svd(rx - ry @ (ry.T @ rx), full_matrices=False)
    return rx @ vh[sv <= tol].T


def _complement(q: Tensor) -> Tensor:
    """Orthonormal basis ``[d, d − k]`` of the orthogonal complement of orthonormal ``q``."""
    d, k = q.shape
    if k == 0:
        return torch.eye(d, dtype=q.dtype)
    full, _ = torch.linalg.qr(q, mode="complete")
    return full[:, k:]


def _solve_rotation(
    X: Tensor, Y: Tensor, *, rtol: float, ridge: float | None
) -> tuple[Tensor, Tensor | None, float, float]:
    """G = P^{1/2} with P Y P = X on the common range.

    Returns (G, basis of the directions at infinity or None, relative flow before, after), the
    flows measured on the finite directions only. With singular statistics the geometric mean
    is taken in a basis of the common range (k×k), and G is the identity on its complement.
    """
    d = X.shape[0]
    X = (X + X.T) / 2
    Y = (Y + Y.T) / 2
    eye = torch.eye(d, dtype=torch.float64)
    if ridge is not None:
        X, Y = X + ridge * eye, Y + ridge * eye
    ex, vx = torch.linalg.eigh(X)
    ey, vy = torch.linalg.eigh(Y)
    top = float(max(ex.max(), ey.max(), 0.0))
    if top == 0.0:
        return eye, eye, 0.0, 0.0
    cut = rtol * top
    q: Tensor | None = None
    nb: Tensor | None = None
    xs, ys = X, Y
    if bool((ex <= cut).any() or (ey <= cut).any()):
        q = _common_range(vx[:, ex > cut], vy[:, ey > cut])
        nb = _complement(q)
        if q.shape[1] == 0:
            return eye, nb, 0.0, 0.0
        xs, ys = q.T @ X @ q, q.T @ Y @ q
    w, v = torch.linalg.eigh(geometric_mean(xs, ys))
    w = w.clamp(min=float(w.max()) * 1e-300)
    gr = (v * w.sqrt()) @ v.T
    gri = (v / w.sqrt()) @ v.T

    def rel(x: Tensor, y: Tensor) -> float:
        return float((x - y).norm() / (x.norm() + y.norm()).clamp_min(1e-300))

    before, after = rel(xs, ys), rel(gri @ xs @ gri, gr @ ys @ gr)
    if q is None:
        return gr, None, before, after
    return eye + q @ (gr - torch.eye(q.shape[1], dtype=gr.dtype)) @ q.T, nb, before, after


def _rotation_xy(
    s: DoubleRotation, values: Mapping[nn.Parameter, Tensor], stats: GradStats, nm: NoiseModel
) -> tuple[Tensor, Tensor]:
    from noetherflow.flow import rotation_noise

    mw, mu = rotation_noise(s, stats, nm)
    uf = DoubleRotation.side(s.u_blocks, values).to(torch.float64)
    wf = DoubleRotation.side(s.w_blocks, values).to(torch.float64)
    x = mu.to(torch.float64) + nm.kappa * wf @ wf.T
    y = mw.to(torch.float64) + nm.kappa * uf @ uf.T
    return x.cpu(), y.cpu()


# -- dense generator ------------------------------------------------------------------------
def _solve_dense(
    s: DenseSymmetry, values: Mapping[nn.Parameter, Tensor], stats: GradStats, nm: NoiseModel
) -> tuple[float, int, float]:
    """λ* of the monotone flow along e^{λA}; returns (λ*, sign if at infinity else 0, residual)."""
    mu, q = s.eigvals.cpu(), s.eigvecs.cpu()
    th = q.T @ s.flat(values).cpu()
    gbar = s.flat(stats.mean).cpu()
    mm = nm.matrix(torch.outer(gbar, gbar), stats.dense[s].to(torch.float64).cpu())
    mt = torch.einsum("ij,ik,kj->j", q, mm, q).clamp(min=0).numpy()
    c = (nm.kappa * th.square()).numpy()
    mun = mu.numpy()

    def dF(lam: float) -> float:  # = −flow, increasing in λ
        return float(np.sum(mun * (c * np.exp(2 * lam * mun) - mt * np.exp(-2 * lam * mun))))

    scale = float(np.sum(np.abs(mun) * (c + mt))) or 1.0
    f0 = dF(0.0)
    if abs(f0) <= 1e-14 * scale:
        return 0.0, 0, abs(f0) / scale
    limit = _LAM_MAX / max(float(np.abs(mun).max()), 1e-300)
    step = 1.0 / max(float(np.abs(mun).max()), 1e-300)
    direction = -1.0 if f0 > 0 else 1.0
    lo = 0.0
    hi = direction * step
    while np.sign(dF(hi)) == np.sign(f0):
        lo = hi
        hi *= 2
        if abs(hi) > limit:
            return 0.0, int(direction), 1.0
    root = brentq(dF, min(lo, hi), max(lo, hi), xtol=1e-14, rtol=1e-14, maxiter=500)
    return float(root), 0, abs(dF(root)) / scale


# -- driver ---------------------------------------------------------------------------------
def solve_equilibrium(
    model: nn.Module | None,
    syms: SymmetrySet,
    stats: GradStats,
    *,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    time: str = "continuous",
    tol: float = 1e-12,
    max_iter: int = 100,
    max_sweeps: int = 200,
    rtol_singular: float = 1e-10,
    ridge: float | None = None,
) -> EquilibriumSolution:
    """Solve for the noise equilibrium of every symmetry in ``syms`` (DESIGN §2.1).

    Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay``; ``time`` picks the time model
    of :func:`noetherflow.noether_flow`. The statistics are treated as fixed along the orbit
    and transported exactly (∇ℓ(e^{λA}θ) = e^{−λA}∇ℓ(θ)), so teleporting to the solution and
    recomputing the statistics gives zero flow.

    Args:
        tol: relative flow (|flow| / gross magnitude of its terms) at which to stop.
        max_iter: Newton iterations of the joint diagonal solve.
        max_sweeps: block sweeps when symmetries are coupled (chains).
        rtol_singular: eigenvalues of X or Y below this fraction of the largest count as zero;
            those hidden directions have their equilibrium at infinity and are reported.
        ridge: add ``ridge·I`` to X and Y instead (explicit regularisation, reported).

    Returns:
        An :class:`EquilibriumSolution`; apply it with :func:`noetherflow.teleport`.
    """
    nm = NoiseModel.create(lr=lr, batch_size=batch_size, weight_decay=weight_decay, time=time)
    names: dict[Any, str] = {s: n for n, s in syms.items()}
    index = {s: i for i, s in enumerate(syms)}
    coupled = bool(syms.coupled_groups())
    if coupled and not stats.samples:
        raise ValueError(
            "These symmetries share parameters with a rotation or dense symmetry (a chain), so "
            "the solver needs per-sample gradients, but the statistics hold none. Collect them "
            "with nf.collect_stats for this same symmetry set (it keeps them automatically)."
        )
    params = syms.params()
    values = {p: p.detach().to(torch.float64).clone() for p in params}
    if coupled:
        samples = {p: stats.samples[p].to(torch.float64).clone() for p in params}
        cur = stats_from_samples(samples, syms, estimator=stats.estimator)
    else:
        samples, cur = {}, stats

    diag: list[DiagonalSymmetry] = [s for s in syms if isinstance(s, DiagonalSymmetry)]
    steps: list[tuple[int, Any]] = []
    totals: dict[Symmetry, Any] = {s: s.identity_element() for s in syms}
    reports: dict[str, InfinityReport] = {}
    residual: dict[str, float] = {}
    converged, iterations = True, 0

    for sweep in range(1, (max_sweeps if coupled else 1) + 1):
        iterations = sweep
        worst = 0.0
        if diag:
            prob = _diag_problem(diag, values, cur, nm)
            lam, reps, rel, ok, its = _solve_diag(prob, names, tol=tol, max_iter=max_iter)
            if not coupled:
                converged = ok
            if not coupled:
                iterations = its
            for r in reps:
                reports[r.name] = r
            for ds in diag:
                off = prob.offsets[ds]
                sl = lam[off : off + ds.num_generators].to(ds.params[0].device)
                if bool(sl.abs().max() > 0):
                    steps.append((index[ds], sl))
                    totals[ds] = totals[ds] + sl
                    _move(ds, sl, values, samples)
                residual[names[ds]] = rel
                worst = max(worst, rel)
        for s in syms:
            if isinstance(s, DoubleRotation):
                if coupled:
                    cur = stats_from_samples(samples, syms, estimator=stats.estimator)
                x, y = _rotation_xy(s, values, cur, nm)
                g, nb, pre, res = _solve_rotation(x, y, rtol=rtol_singular, ridge=ridge)
                if nb is not None and nb.shape[1] > 0:
                    reports[names[s]] = InfinityReport(
                        names[s],
                        nb,
                        f"{nb.shape[1]} of {s.d} hidden directions lie outside the common range "
                        "of X = M_U + κWWᵀ and Y = M_W + κUᵀU (no gradient noise and no "
                        "weight-decay term on one side: the width exceeds what the weights and "
                        "data span): their equilibrium is at infinity; solved on the rest, "
                        "those left unmoved",
                    )
                g = g.to(s.params[0].device)
                steps.append((index[s], g))
                totals[s] = totals[s] @ g
                _move(s, g, values, samples)
                residual[names[s]] = res
                worst = max(worst, pre if coupled else res)
            elif isinstance(s, DenseSymmetry):
                if coupled:
                    cur = stats_from_samples(samples, syms, estimator=stats.estimator)
                lam_d, sign, res = _solve_dense(s, values, cur, nm)
                if sign:
                    reports[names[s]] = InfinityReport(
                        names[s],
                        torch.tensor(float(sign)),
                        "the flow keeps its sign along the whole orbit: equilibrium at "
                        f"{'+' if sign > 0 else '-'}infinity; left unmoved",
                    )
                if lam_d != 0.0:
                    steps.append((index[s], lam_d))
                    totals[s] = totals[s] + lam_d
                    _move(s, lam_d, values, samples)
                residual[names[s]] = res
                worst = max(worst, res)
        if coupled:
            cur = stats_from_samples(samples, syms, estimator=stats.estimator)
            converged = worst <= max(tol, 1e-10)
            if converged and sweep > 1:
                break

    distance: dict[str, Tensor] = {}
    for s in syms:
        t = totals[s]
        if isinstance(s, DoubleRotation):
            p = t @ t.T
            # ‖log P‖_F from the eigenvalues alone (P is symmetric positive definite)
            distance[names[s]] = torch.linalg.eigvalsh((p + p.T) / 2).log().norm()
        elif isinstance(s, DenseSymmetry):
            distance[names[s]] = torch.tensor(abs(float(t)))
        else:
            distance[names[s]] = torch.as_tensor(t).abs()
    elements = {names[s]: totals[s] for s in syms}
    return EquilibriumSolution(
        syms=syms,
        steps=steps,
        elements=elements,
        distance=distance,
        at_infinity=list(reports.values()),
        residual=residual,
        converged=converged,
        iterations=iterations,
    )


def _move(
    s: Symmetry,
    element: Any,
    values: Mapping[nn.Parameter, Tensor],
    samples: Mapping[nn.Parameter, Tensor],
) -> None:
    s.act_(element, values)
    if samples:
        s.transport_grads_(element, samples)
