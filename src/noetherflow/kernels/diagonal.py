"""The diagonal kernel: rescaling, scale invariance and any diagonal A, solved jointly.

Every diagonal family is a list of :class:`~noetherflow.symmetry.base.DiagonalTerm` (axis,
block, sign per parameter), so its statistics are per-coordinate (or per-neuron) second
moments E[g²], its noise term is Tr[A_j M] = Σ_k a_kj M_kk (paper eq. 7 with diagonal A), and
the flows of all its charges are −∇F of one convex function (docs/concepts/equilibrium.md, paper
Thm 4.3):

    F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κ θ_k² e^{2a_k·λ}),

minimised by Newton with a line search over all diagonal generators at once. A generator
whose coordinates offer no restoring term (e.g. scale invariance without weight decay, paper
eq. 24) has its equilibrium at infinity and is reported; so is a direction combining several
generators, each bounded alone, along which F still decreases (found exactly from the sign
pattern of F's terms, :mod:`._diag_recession`). Both are left unmoved, the rest solved.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn
from typing_extensions import override

from noetherflow._errors import StatisticsError
from noetherflow.kernels._diag_newton import NewtonMethod, solve_diag
from noetherflow.kernels._diag_problem import Term, _DiagProblem, _Grid, balance, compress
from noetherflow.kernels.base import (
    GradSource,
    GroupSolve,
    InfinityReport,
    Kernel,
    StepOptions,
    register_kernel,
)
from noetherflow.kernels.decay import decay_cross
from noetherflow.kernels.noise import NoiseModel, cross_displacement
from noetherflow.stats.core import GradStats, Level, StatsBlock, axis_norm_sq, axis_sum
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry

__all__ = ["DiagonalKernel", "DiagonalStats"]


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

    @override
    def second_moment_params(self) -> set[int]:
        return {id(p) for p in self.sq} | {id(p) for p, _ in self.sq_axis}


def _grouped_sq(block: DiagonalStats, p: nn.Parameter) -> Tensor:
    """E[g ⊙ g] per coordinate of a parameter with grouped terms (a clear error when absent)."""
    if p not in block.sq:
        raise StatisticsError(
            f"These statistics hold no per-coordinate squared gradients of a parameter of "
            f"shape {tuple(p.shape)} (a grouped convolution's input channels); collect them "
            "for this symmetry set."
        )
    return block.sq[p]


def diagonal_block(stats: GradStats) -> DiagonalStats:
    """The diagonal families' statistics block of ``stats`` (a clear error when absent)."""
    b = stats.block(DiagonalStats.key)
    if not isinstance(b, DiagonalStats):
        raise StatisticsError(
            "These statistics hold no block for diagonal symmetries (rescaling, scale); collect "
            "them with nf.collect_stats for the same symmetry set."
        )
    return b


def _to_grid(v: Tensor) -> Tensor:
    v = v.to(torch.float64).cpu()
    if v.dim() == 1:
        return v[:, None]
    return v.reshape(v.shape[0], v.shape[1], -1).sum(-1)


def _axis_m(
    nm: NoiseModel,
    mean: Tensor,
    axis_sq: Tensor,
    disp: Tensor | None,
    axis: int,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Σ of M_kk over every axis but ``axis``: c_mean·ḡ² + c_second·E[g²] (+ c_cross·vḡ).

    ``mean``, ``disp``: the parameter's shape; ``axis_sq`` and the result ``[p.shape[axis]]``;
    ``dtype``: the result's (default ``mean``'s), accumulated in it.
    """
    dt = dtype or mean.dtype
    m = nm.c_mean * axis_norm_sq(mean, axis, dt) + nm.c_second * axis_sq.to(dt)
    if disp is not None:  # the momentum cross term c_cross·vᵀA∇L
        m = m + nm.c_cross * axis_sum(disp.to(dt) * mean.to(dt), axis)
    return m


def _values_axis_sq(values: Mapping[nn.Parameter, Tensor], p: nn.Parameter, axis: int) -> Tensor:
    """Σ of θ² over every axis but ``axis``, float64. ``[p.shape[axis]]``.

    From the mapping's own ``axis_norm_sq`` where it has one (the solver's read-only parameters,
    :class:`noetherflow.equilibrium._Float64Reads`, reduce the parameter itself instead of a
    float64 copy of it: on GPT-2 124M twelve 18 MB copies of ``c_fc`` per solve).
    """
    own = getattr(values, "axis_norm_sq", None)
    if own is not None:
        return cast(Tensor, own(p, axis))
    return axis_norm_sq(values[p], axis, torch.float64)


def _diag_problem(
    syms: Sequence[DiagonalSymmetry],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
) -> _DiagProblem:
    """F(λ) of ``syms`` at ``values`` from the diagonal block of ``stats``."""
    block = diagonal_block(stats)
    offsets: dict[DiagonalSymmetry, int] = {}
    n = 0
    for s in syms:
        offsets[s] = n
        n += s.num_generators
    # rows: Terms (offset, n, block, sign); cols: the same with the term's groups appended
    per_param: dict[nn.Parameter, tuple[list[Term], list[tuple[int, int, int, float, int]]]] = {}
    chunks: dict[nn.Parameter, int] = {}  # row chunks of grouped terms (grouped convolutions)
    # terms over a slice of their axis, (axis, index of the term, start, length)
    slices: dict[nn.Parameter, list[tuple[int, int, int, int]]] = {}
    for s in syms:
        for t in s.terms():
            rows, gcols = per_param.setdefault(t.param, ([], []))
            if t.sliced and t.axis in (0, 1):
                sl = slices.setdefault(t.param, [])
                sl.append((t.axis, len(rows) if t.axis == 0 else len(gcols), t.start, t.span))
            if t.groups > 1 and t.per_group == 1 and t.axis == 1:
                # one column per group (a depthwise convolution): generator γ is row chunk γ
                size = int(t.param.shape[0]) // t.groups
                rows.append((offsets[s], t.groups, size, float(t.sign)))
                continue
            if t.groups > 1:
                chunks[t.param] = math.lcm(chunks.get(t.param, 1), t.groups)
            if t.axis == 0:
                rows.append((offsets[s], t.num_generators, t.block, float(t.sign)))
            elif t.axis == 1:
                gcols.append((offsets[s], t.num_generators, t.block, float(t.sign), t.groups))
            else:  # pragma: no cover - the built-in families act along axes 0 and 1
                raise NotImplementedError(f"diagonal terms along axis {t.axis} are not supported")
    grids = []
    signed = False
    for p, (rows, gcols) in per_param.items():
        cols: list[Term] = [(o, k, b, sg) for o, k, b, sg, _ in gcols]
        nmp = nm.at(p)  # this parameter's γ (and its noise coefficients)
        disp = cross_displacement(stats, nmp, p)
        signed = signed or disp is not None
        if p in block.sq:
            mean = stats.mean[p].to(torch.float64)
            c = nmp.kappa * values[p].to(torch.float64).square()  # κ_p θ² (eq. PD3)
            sq = block.sq[p].to(torch.float64)
            m = nmp.diag(mean, sq, None if disp is None else disp.to(torch.float64))
            if disp is None:  # else signed: balance() below
                m = m.clamp(min=0)
            if p in slices:
                grids += [
                    compress(g)
                    for g in _sliced(_to_grid(m), _to_grid(c), rows, gcols, slices[p], p, chunks)
                ]
                continue
            parts = _split_rows(_to_grid(m), _to_grid(c), rows, gcols, chunks.get(p, 1), p)
            grids += [compress(g) for g in parts]
            continue
        if p in chunks:
            raise StatisticsError(
                f"The solver needs per-coordinate squared gradients of a parameter of shape "
                f"{tuple(p.shape)} (a grouped convolution's input channels), but these "
                "statistics hold only per-neuron sums; collect them with level='solve' or "
                "'diag' (the default)."
            )
        # Generators along one axis only: F depends on the per-neuron sums along it.
        ax = 0 if rows else 1
        if (rows and cols) or (p, ax) not in block.sq_axis:
            raise StatisticsError(
                f"The solver needs per-coordinate squared gradients of a parameter of shape "
                f"{tuple(p.shape)} (generators act on {'both its axes' if rows and cols else 'it'}"
                "), but these statistics hold only per-neuron sums (level='neuron'); collect "
                "them with level='solve' or 'diag' (the default)."
            )
        # per-neuron sums accumulated in float64, no float64 copy of θ or ḡ made
        m = _axis_m(nmp, stats.mean[p], block.sq_axis[(p, ax)], disp, ax, torch.float64)
        if disp is None:  # else signed: balance() below
            m = m.clamp(min=0)
        m, cs = m.cpu(), (nmp.kappa * _values_axis_sq(values, p, ax)).cpu()  # Σ κ_p θ²
        shape = (-1, 1) if ax == 0 else (1, -1)
        if p in slices:
            grids += _sliced(m.reshape(shape), cs.reshape(shape), rows, gcols, slices[p], p, chunks)
            continue
        grids.append(_Grid(m.reshape(shape), cs.reshape(shape), rows, cols))
    lin = _decay_linear(syms, values, stats, nm, offsets, n)
    if not signed:
        return _DiagProblem(n, offsets, grids, lin=lin)
    grids, negative = balance(grids, n)
    neg = negative if bool(negative.ne(0).any()) else None
    return _DiagProblem(n, offsets, grids, neg, lin=lin)


def _split_rows(
    m: Tensor,
    c: Tensor,
    rows_in: list[Term],
    cols_in: list[tuple[int, int, int, float, int]],
    k: int,
    p: nn.Parameter,
) -> list[_Grid]:
    """One parameter's grid (``m``, ``c`` ``[n0, n1]``) as ``k`` grids of row chunks.

    Column terms ``(offset, n, block, sign, groups)``: a grouped one (G groups, G dividing
    ``k``) gives chunk r its group's generators, ``offset + γ·J`` with γ = r·G/k, so every
    chunk has plain row and column terms. A row term restricted to a chunk keeps the
    generators of its rows (its blocks must not straddle chunks, or the chunk must lie
    inside one block). ``k = 1``: the grid itself.
    """
    if k == 1:
        return [_Grid(m, c, rows_in, [(o, n, b, sg) for o, n, b, sg, _ in cols_in])]
    size = int(m.shape[0]) // k
    out = []
    for r in range(k):
        lo = r * size
        rows: list[Term] = []
        for off, _, b, sg in rows_in:
            if lo % b == 0 and size % b == 0:
                rows.append((off + lo // b, size // b, b, sg))
            elif lo // b == (lo + size - 1) // b:
                rows.append((off + lo // b, 1, size, sg))
            else:  # pragma: no cover - no built-in family straddles a group of rows
                raise StatisticsError(
                    f"A diagonal generator acts on blocks of {b} rows of a parameter of shape "
                    f"{tuple(p.shape)} that straddle its {k} groups of {size} rows; expected "
                    "blocks inside one group (or groups inside one block)."
                )
        cols: list[Term] = []
        for off, n, b, sg, grp in cols_in:
            per = n // grp
            cols.append((off, n, b, sg) if grp == 1 else (off + (r * grp // k) * per, per, b, sg))
        out.append(_Grid(m[lo : lo + size], c[lo : lo + size], rows, cols))
    return out


def _sliced(
    m: Tensor,
    c: Tensor,
    rows_in: list[Term],
    cols_in: list[tuple[int, int, int, float, int]],
    slices: list[tuple[int, int, int, int]],
    p: nn.Parameter,
    chunks: Mapping[nn.Parameter, int],
) -> list[_Grid]:
    """One parameter's grid (``m``, ``c`` ``[n0, n1]``) cut where its terms' slices begin and end.

    ``slices``: ``(axis, index of the term in rows_in or cols_in, start, length)`` of the terms
    covering part of their axis (the others cover it whole). Each piece gets every term that
    covers it, restricted to the generators of its rows (columns), so every term of a piece
    spans the piece's whole axis, as the solver's grids assume; a piece no term covers does
    not depend on λ and is left out. A generator's block must not straddle a cut.
    """
    if p in chunks:
        raise StatisticsError(
            f"A parameter of shape {tuple(p.shape)} has both grouped terms (a grouped "
            "convolution's input channels) and terms over a slice of an axis; the solver takes "
            "one or the other per parameter."
        )
    n0, n1 = int(m.shape[0]), int(m.shape[1])
    span: dict[tuple[int, int], tuple[int, int]] = {(ax, i): (a, b) for ax, i, a, b in slices}
    rows = [(t, span.get((0, i), (0, n0))) for i, t in enumerate(rows_in)]
    cols = [
        ((o, k, b, sg), span.get((1, i), (0, n1))) for i, (o, k, b, sg, _) in enumerate(cols_in)
    ]

    def cuts(terms: list[tuple[Term, tuple[int, int]]], n: int) -> list[int]:
        return sorted({0, n} | {x for _, (a, ln) in terms for x in (a, a + ln)})

    def restrict(terms: list[tuple[Term, tuple[int, int]]], lo: int, hi: int) -> list[Term]:
        out: list[Term] = []
        for (off, _, b, sg), (a, ln) in terms:
            if not (a <= lo and hi <= a + ln):
                continue  # the term does not cover this piece
            if (lo - a) % b or (hi - lo) % b:
                raise StatisticsError(
                    f"A diagonal generator acts on blocks of {b} indices of a parameter of shape "
                    f"{tuple(p.shape)} that straddle the slice [{lo}, {hi}) of another term; "
                    "expected slices made of whole blocks."
                )
            out.append((off + (lo - a) // b, (hi - lo) // b, b, sg))
        return out

    rc, cc = cuts(rows, n0), cuts(cols, n1)
    if len(rows_in) == 0:
        rc = [0, n0]
    if len(cols_in) == 0:
        cc = [0, n1]
    out = []
    for r0, r1 in itertools.pairwise(rc):
        rt = restrict(rows, r0, r1)
        for c0, c1 in itertools.pairwise(cc):
            ct = restrict(cols, c0, c1)
            if rt or ct:
                out.append(_Grid(m[r0:r1, c0:c1], c[r0:r1, c0:c1], rt, ct))
    return out


def _decay_linear(
    syms: Sequence[DiagonalSymmetry],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    offsets: Mapping[DiagonalSymmetry, int],
    n: int,
) -> Tensor | None:
    """The b ``[n]`` of F's linear term −b·λ: b_j = 4η²·Q_j(Γθ, ḡ) (docs/concepts/flow.md).

    Discrete time with per-parameter γ only (None otherwise); θ_kḡ_k is invariant along the
    diagonal orbit, so the term is exactly linear in λ.
    """
    lin = None
    for s in syms:
        if nm.uniform(s.params) is not None:
            continue  # one γ: Q(γθ, ḡ) = γθᵀAḡ = 0 by symmetry
        mix = nm.mixed_terms(s.params, "solve_equilibrium")
        if not mix.cross:
            continue
        if lin is None:
            lin = torch.zeros(n, dtype=torch.float64)
        b = mix.cross * decay_cross(s, values, stats.mean, mix.gamma)
        lin[offsets[s] : offsets[s] + s.num_generators] = b.to(torch.float64).cpu().reshape(-1)
    return lin


_CROSS_REASON = (
    "with the momentum cross term c_cross·vᵀA∇L the noise term of a group of coordinates "
    "sharing these generators is negative (beyond the weight decay on that side): the buffer "
    "pushes the charges faster than the noise restores them, so there is no stationary point "
    "along them; left unmoved"
)


def _cross_reports(
    syms: Sequence[DiagonalSymmetry],
    offsets: Mapping[DiagonalSymmetry, int],
    names: Mapping[Symmetry, str],
    runoff: Tensor,
    reps: list[InfinityReport],
) -> list[InfinityReport]:
    """``reps`` with the generators that the cross term leaves without a stationary point.

    ``runoff`` ``[n]``: the sign of their run-off, 0 elsewhere. A symmetry with a report
    already gets one report with both parts.
    """
    by_name = {r.name: r for r in reps}
    for ds in syms:
        off = offsets[ds]
        part = runoff[off : off + ds.num_generators]
        if not bool(part.ne(0).any()):
            continue
        name = names[ds]
        old = by_name.get(name)
        if old is None:
            by_name[name] = InfinityReport(name, part.clone(), _CROSS_REASON)
            continue
        d = old.direction.reshape(-1).clone().to(part)
        d = torch.where(d == 0, part, d)
        by_name[name] = dataclasses.replace(
            old, direction=d.reshape(old.direction.shape), reason=f"{old.reason}; {_CROSS_REASON}"
        )
    return list(by_name.values())


@dataclass(frozen=True)
class DiagonalSettings:
    """What the joint diagonal Newton solve reads (the fields of ``nf.SolveOptions`` it takes).

    Attributes:
        tol: relative flow at which Newton stops.
        max_iter: Newton iterations.
        solver: its linear systems: dense Hessian, matrix-free CG, or by size (``_diag_newton``).
    """

    tol: float = 1e-12
    max_iter: int = 100
    solver: NewtonMethod = NewtonMethod.AUTO


class DiagonalKernel(Kernel[DiagonalSymmetry, DiagonalStats]):
    """Kernel of every :class:`~noetherflow.symmetry.base.DiagonalSymmetry`, solved jointly."""

    name: ClassVar[str] = DiagonalStats.key
    block: ClassVar[type[StatsBlock]] = DiagonalStats
    joint: ClassVar[bool] = True
    decay_commutes: ClassVar[bool] = True
    can_hold: ClassVar[bool] = True
    factored: ClassVar[bool] = True
    incremental: ClassVar[bool] = True
    settings: ClassVar[type[Any]] = DiagonalSettings

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
        # a grouped term's generators span rows and columns: per-coordinate squares
        grouped = {t.param for s in syms for t in s.terms() if t.groups > 1}
        if level is not Level.DIAG:
            for s in syms:
                for t in s.terms():
                    if t.param in grouped:
                        continue
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
                if (
                    src.has_samples(p)
                    or p in grouped
                    or (p not in want and level is not Level.NEURON)
                ):
                    out.sq[p] = src.sq(p)
        return out

    # -- noise --------------------------------------------------------------------------
    def noise(self, s: DiagonalSymmetry, stats: GradStats, nm: NoiseModel) -> Tensor:
        """Tr[A_j M] = Σ_k a_kj M_kk per generator j, from per-axis sums. ``[J]``."""
        block = diagonal_block(stats)
        out = torch.zeros(s.num_generators, dtype=torch.float64, device=s.params[0].device)
        for t in s.terms():
            disp = cross_displacement(stats, nm, t.param)
            mean = stats.mean[t.param]
            if t.groups > 1:  # per-coordinate M, summed over each group's block
                sq = _grouped_sq(block, t.param)
                m = nm.diag(mean, sq.to(mean.dtype), None if disp is None else disp.to(mean))
                out += t.reduce(m.to(torch.float64))
                continue
            m = _axis_m(nm, mean, block.axis_sq(t.param, t.axis), disp, t.axis)
            out += t.reduce_axis(m.to(torch.float64))
        return out

    # -- solving ------------------------------------------------------------------------
    @override
    def problem(
        self,
        syms: Sequence[DiagonalSymmetry],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
    ) -> _DiagProblem:
        """F(λ) of ``syms`` at ``values`` (float64): what :meth:`solve` minimises."""
        return _diag_problem(syms, values, stats, nm)

    def solve(
        self,
        syms: Sequence[DiagonalSymmetry],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
        names: Mapping[Symmetry, str],
        opts: StepOptions,
    ) -> GroupSolve:
        """Newton on F(λ) over the generators of all ``syms`` jointly.

        Its settings (:class:`DiagonalSettings`): ``solver`` dense Hessian or matrix-free
        conjugate gradients, see :mod:`._diag_newton`. ``opts.fixed``: generators held at
        given values (the rest solved with them in place).
        """
        prob = _diag_problem(syms, values, stats, nm)
        init = None
        if opts.init is not None:
            init = torch.zeros(prob.n, dtype=torch.float64)
            for ds in syms:
                prev = opts.init.get(names[ds])
                if prev is not None:
                    off = prob.offsets[ds]
                    init[off : off + ds.num_generators] = torch.as_tensor(prev).reshape(-1).cpu()
        fixed = None
        if opts.fixed:
            fixed = torch.full((prob.n,), float("nan"), dtype=torch.float64)
            for ds in syms:
                held = opts.fixed.get(names[ds])
                if held is not None:
                    off = prob.offsets[ds]
                    fixed[off : off + ds.num_generators] = held.reshape(-1).cpu()
        runoff = None  # generators of term groups left negative by the cross term
        if prob.negative is not None:
            free = prob.negative.ne(0) if fixed is None else prob.negative.ne(0) & fixed.isnan()
            runoff = torch.where(free, prob.negative, 0.0)
            if fixed is None:
                fixed = torch.full((prob.n,), float("nan"), dtype=torch.float64)
            fixed[free] = 0.0  # left unmoved, reported below
        own: DiagonalSettings = opts.of(self)
        info: dict[str, Any] = {}
        lam, reps, rel, ok, its = solve_diag(
            prob,
            names,
            tol=own.tol,
            max_iter=own.max_iter,
            init=init,
            method=NewtonMethod(own.solver),
            fixed=fixed,
            info=info,
        )
        if runoff is not None and bool(runoff.ne(0).any()):
            reps = _cross_reports(syms, prob.offsets, names, runoff, reps)
        out = GroupSolve(
            reports=reps,
            progress=rel,
            converged=ok,
            iterations=its,
            before=info.get("initial_flow"),
        )
        for ds in syms:
            off = prob.offsets[ds]
            sl = lam[off : off + ds.num_generators].to(ds.params[0].device)
            if bool(sl.abs().max() > 0):
                out.steps.append((ds, sl))
            out.residual[ds] = rel
        return out

    @override
    def compose(self, total: Any, element: Any) -> Any:
        return total + element

    def distance(self, s: DiagonalSymmetry, total: Any) -> Tensor:
        """|λ*| per generator."""
        return torch.as_tensor(total).abs()

    @override
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
