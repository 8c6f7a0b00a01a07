"""The diagonal kernel: rescaling, scale invariance and any diagonal A, solved jointly.

Every diagonal family is a list of :class:`~noetherflow.symmetry.base.DiagonalTerm` (axis,
block, sign per parameter), so its statistics are per-coordinate (or per-neuron) second
moments E[g²], its noise term is Tr[A_j M] = Σ_k a_kj M_kk (paper eq. 7 with diagonal A), and
the flows of all its charges are −∇F of one convex function (DESIGN §2.1, paper Thm 4.3):

    F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κ θ_k² e^{2a_k·λ}),

minimised by Newton with a line search over all diagonal generators at once. A generator
whose coordinates offer no restoring term (e.g. scale invariance without weight decay, paper
eq. 24) has its equilibrium at infinity and is reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from noetherflow._errors import StatisticsError
from noetherflow.kernels.base import (
    GradSource,
    GroupSolve,
    InfinityReport,
    Kernel,
    SolveOptions,
    register_kernel,
)
from noetherflow.kernels.noise import NoiseModel
from noetherflow.stats.core import GradStats, Level, StatsBlock, axis_sum
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry

__all__ = ["DiagonalKernel", "DiagonalStats"]

_LAM_MAX = 40.0  # |λ| beyond which a Newton iterate is taken as running off to infinity


@dataclass
class DiagonalStats(StatsBlock):
    """Second moments of the parameters of diagonal symmetries.

    Attributes:
        sq: E[g ⊙ g] per coordinate, per parameter (``level="diag"``; with ``"solve"`` only
            for parameters that generators act on along two axes).
        sq_axis: E[g ⊙ g] summed over every axis but one, keyed by (parameter, axis)
            (``level="neuron"`` and ``"solve"``: enough for flows, and for the solver on
            parameters that generators act on along one axis only).
    """

    key: ClassVar[str] = "diagonal"
    sq: dict[nn.Parameter, Tensor] = field(default_factory=dict)
    sq_axis: dict[tuple[nn.Parameter, int], Tensor] = field(default_factory=dict)

    def axis_sq(self, p: nn.Parameter, axis: int) -> Tensor:
        """E[g ⊙ g] of ``p`` summed over every axis but ``axis``. Has shape ``[p.shape[axis]]``."""
        if p in self.sq:
            return axis_sum(self.sq[p], axis)
        try:
            return self.sq_axis[(p, axis)]
        except KeyError:
            raise StatisticsError(
                f"These statistics hold no squared gradients of a parameter of shape "
                f"{tuple(p.shape)} along axis {axis}; collect them for this symmetry set."
            ) from None

    def second_moment_params(self) -> set[int]:
        return {id(p) for p in self.sq} | {id(p) for p, _ in self.sq_axis}


def _block(stats: GradStats) -> DiagonalStats:
    b = stats.block(DiagonalStats.key)
    if not isinstance(b, DiagonalStats):
        raise StatisticsError(
            "These statistics hold no block for diagonal symmetries (rescaling, scale); collect "
            "them with nf.collect_stats for the same symmetry set."
        )
    return b


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
    syms: Sequence[DiagonalSymmetry],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
) -> _DiagProblem:
    """F(λ) of ``syms`` at ``values`` from the diagonal block of ``stats``."""
    block = _block(stats)
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
        if p in block.sq:
            m = nm.diag(mean, block.sq[p].to(torch.float64)).clamp(min=0)
            grids.append(_Grid(_to_grid(m), _to_grid(c), rows, cols))
            continue
        # Generators along one axis only: F depends on the per-neuron sums along it.
        ax = 0 if rows else 1
        if (rows and cols) or (p, ax) not in block.sq_axis:
            raise StatisticsError(
                f"The solver needs per-coordinate squared gradients of a parameter of shape "
                f"{tuple(p.shape)} (generators act on {'both its axes' if rows and cols else 'it'}"
                "), but these statistics hold only per-neuron sums (level='neuron'); collect "
                "them with level='solve' or 'diag' (the default)."
            )
        msq = axis_sum(mean.square(), ax)
        m = (nm.c_mean * msq + nm.c_second * block.sq_axis[(p, ax)].to(torch.float64)).cpu()
        m, cs = m.clamp(min=0), axis_sum(c, ax).cpu()
        shape = (-1, 1) if ax == 0 else (1, -1)
        grids.append(_Grid(m.reshape(shape), cs.reshape(shape), rows, cols))
    return _DiagProblem(n, offsets, grids)


_MIXED_MIN = 256  # below this size a float64 Cholesky costs less than the refinement
_REFINE_MAX = 12  # float32-factor refinement steps before falling back to float64
_U64 = 2.0**-53  # unit round-off of float64
_REFINE_TOL = 16 * _U64  # correction size (relative, ∞-norm) at float64 round-off


def _chol_solve(chol: Tensor, rhs: Tensor) -> Tensor:
    """x with L Lᵀ x = rhs for lower-triangular ``chol`` ``[n, n]``; ``rhs`` ``[n]``."""
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


def _solve_diag(
    prob: _DiagProblem,
    names: Mapping[Any, str],
    *,
    tol: float,
    max_iter: int,
    init: Tensor | None = None,
) -> tuple[Tensor, list[InfinityReport], float, bool, int]:
    """Damped Newton on the convex F(λ) (paper eq. 9) over ``prob.n`` generators.

    ``init`` ``[n]`` (float64) warm-starts the iteration, e.g. from the previous solution of a
    slowly changing problem; generators with a one-sided F (equilibrium at infinity) start and
    stay at 0 regardless. The convergence criteria are the same as from 0.
    """
    sided = prob.one_sided()
    free = sided == 0
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


class DiagonalKernel(Kernel[DiagonalSymmetry, DiagonalStats]):
    """Kernel of every :class:`~noetherflow.symmetry.base.DiagonalSymmetry`, solved jointly."""

    name: ClassVar[str] = DiagonalStats.key
    block: ClassVar[type[StatsBlock]] = DiagonalStats
    joint: ClassVar[bool] = True

    # -- statistics ---------------------------------------------------------------------
    def collect(
        self, syms: Sequence[DiagonalSymmetry], src: GradSource, level: Level
    ) -> DiagonalStats:
        """E[g²] per coordinate, or per neuron where ``level`` allows (see :class:`Level`).

        Parameters with per-sample gradients at hand get per-coordinate squares (a cheap
        reduction); the others per-neuron sums along the axes their generators act on
        (``neuron``; ``solve`` where one axis only) or per-coordinate squares.
        """
        out = DiagonalStats()
        want: dict[nn.Parameter, tuple[int, ...]] = {}
        if level is not Level.DIAG:
            for s in syms:
                for t in s.terms():
                    have = want.get(t.param, ())
                    if not src.has_samples(t.param) and t.axis not in have:
                        want[t.param] = (*have, t.axis)
            if level is Level.SOLVE:  # the solver needs full grids only where two axes meet
                want = {p: ax for p, ax in want.items() if len(ax) == 1}
        if want:
            out.sq_axis = src.axis_sq(want)
        for s in syms:
            for p in s.params:
                if p in out.sq:
                    continue
                if src.has_samples(p) or (p not in want and level is not Level.NEURON):
                    out.sq[p] = src.sq(p)
        return out

    # -- noise --------------------------------------------------------------------------
    def noise(self, s: DiagonalSymmetry, stats: GradStats, nm: NoiseModel) -> Tensor:
        """Tr[A_j M] = Σ_k a_kj M_kk per generator j, from per-axis sums. ``[J]``."""
        block = _block(stats)
        out = torch.zeros(s.num_generators, dtype=torch.float64, device=s.params[0].device)
        for t in s.terms():
            mean = stats.mean[t.param]
            msq = axis_sum(mean.square(), t.axis)
            m = nm.c_mean * msq + nm.c_second * block.axis_sq(t.param, t.axis)
            out += t.sign * m.to(torch.float64).reshape(t.num_generators, t.block).sum(1)
        return out

    # -- solving ------------------------------------------------------------------------
    def solve(
        self,
        syms: Sequence[DiagonalSymmetry],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
        names: Mapping[Symmetry, str],
        opts: SolveOptions,
    ) -> GroupSolve:
        """Newton on F(λ) over the generators of all ``syms`` jointly."""
        prob = _diag_problem(syms, values, stats, nm)
        init = None
        if opts.init is not None:
            init = torch.zeros(prob.n, dtype=torch.float64)
            for ds in syms:
                prev = opts.init.get(names[ds])
                if prev is not None:
                    off = prob.offsets[ds]
                    init[off : off + ds.num_generators] = torch.as_tensor(prev).reshape(-1).cpu()
        lam, reps, rel, ok, its = _solve_diag(
            prob, names, tol=opts.tol, max_iter=opts.max_iter, init=init
        )
        out = GroupSolve(reports=reps, progress=rel, converged=ok, iterations=its)
        for ds in syms:
            off = prob.offsets[ds]
            sl = lam[off : off + ds.num_generators].to(ds.params[0].device)
            if bool(sl.abs().max() > 0):
                out.steps.append((ds, sl))
            out.residual[ds] = rel
        return out

    def compose(self, total: Any, element: Any) -> Any:
        return total + element

    def distance(self, s: DiagonalSymmetry, total: Any) -> Tensor:
        """|λ*| per generator."""
        return torch.as_tensor(total).abs()

    def distance_shape(self, s: DiagonalSymmetry) -> tuple[int, ...]:
        return (s.num_generators,)

    def mark_infinity(self, distance: Tensor, report: InfinityReport) -> tuple[Tensor, int]:
        """±1 on the generators that run off: those distances become inf."""
        mask = report.direction.detach().cpu().reshape(-1) != 0
        d = distance.detach().cpu().to(torch.float64).clone().reshape(-1)
        d[mask] = float("inf")
        return d.reshape(distance.shape), int(mask.sum())

    # -- optimizer state ------------------------------------------------------------------
    def transport_(
        self,
        s: DiagonalSymmetry,
        element: Any,
        tensors: Mapping[nn.Parameter, Tensor],
        *,
        squared: bool = False,
    ) -> bool:
        """Cotangents scale by e^{−a·λ}; squared gradients by e^{−2a·λ} (exact, diagonal)."""
        lam = s._check_lam(element)
        for t in s.terms():
            v = tensors.get(t.param)
            if v is None:
                continue
            e = -(2.0 if squared else 1.0) * s._exponent(t, lam)
            with torch.no_grad():
                v.mul_(torch.exp(e).to(v.dtype))
        return True


register_kernel(DiagonalSymmetry, DiagonalKernel())
