"""Solve for the noise equilibrium (paper Thm 4.3, eq. 9): the sweep driver.

Each family's solve step lives in its kernel (:mod:`noetherflow.kernels`):

* diagonal generators (rescaling, scale), jointly: Newton on the convex F(λ) whose gradient
  is minus the flows;
* a double rotation: the matrix geometric mean, G = P^{1/2} with P Y P = X;
* a dense A: the flow along the orbit is monotone in λ: bracket + Brent.

Coupled symmetries (chains of rotations, rotations sharing parameters with rescalings) are
solved by block Gauss–Seidel sweeps over the kernels' steps, with per-sample gradients
transported along the orbit (∇ℓ(Tθ) = T^{-T}∇ℓ(θ), eqs. 34–37), until the largest relative
flow is below ``tol``.

An equilibrium may sit at infinity along some direction (e.g. scale invariance without weight
decay, paper eq. 24, or a combination of diagonal generators each bounded alone): it is
reported in :attr:`EquilibriumSolution.at_infinity` and the problem is solved on the
remaining directions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, cast

import torch
from torch import Tensor, nn

from noetherflow import _shard
from noetherflow._anderson import diagonal_point, split_point, sweep_accelerator
from noetherflow._blas import one_thread as blas_one_thread
from noetherflow._checks import (
    fingerprint,
)
from noetherflow._divergence import is_finite
from noetherflow._errors import StatisticsError
from noetherflow._scratch import reuse
from noetherflow._solve_checks import check_fixed, check_inputs, parse_call
from noetherflow._sweep_plan import (
    accelerated,
    at_rest,
    coupled_samples,
    covariant,
    move,
    move_disjoint,
    parallel,
    plan_sweep,
    steps_apart,
)
from noetherflow._threads import side_by_side
from noetherflow.kernels import (
    InfinityReport,
    StepOptions,
    geometric_mean,
    kernel_for,
    kernels_of,
)
from noetherflow.kernels.base import (
    overlaps_by_param,
    refresh_stats_,
    transport_cotangent,
)
from noetherflow.kernels.decay import ParamDecay
from noetherflow.kernels.noise import NoiseModel, TimeModel, check_decay, resolve_noise
from noetherflow.solve_options import SolveOptions, kernel_settings, resolve_options
from noetherflow.stats.core import GradStats, Level, axis_norm_sq, with_displacement
from noetherflow.stats.sample_factors import HeldSamples
from noetherflow.stats.source import SampleSource
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "EquilibriumSolution",
    "InfinityReport",
    "fingerprint",
    "geometric_mean",
    "solve_equilibrium",
]


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
        progress: the largest relative flow the last sweep measured (the sweeps' stopping
            measure, over every block): at most ``tol`` when converged, and how far a solve
            stopped by ``max_sweeps`` is from it (e.g. the monitor's solve spread over records).
        fingerprint: signature of the parameters the solution was computed at
            (:func:`fingerprint` of ``syms.params()``); :func:`noetherflow.teleport` refuses
            parameters that changed since. None: not checked.
        momentum_terms: SGD with momentum (discrete time, γ > 0): per symmetry the stationary
            (C*, B*, E*) — charge θᵀAθ, cross term θᵀAv and buffer term vᵀAv, each of the
            charge's shape — that the solution puts the model at
            (:func:`noetherflow.optim.stationary_terms`, with H* = vᵀA∇L of the displacement
            moved along with θ; 0 without one). NaN where the equilibrium is at infinity (the
            generators of a diagonal report, a whole rotation). Empty otherwise; a symmetry
            whose parameters have different γ (per-parameter decay) is left out.
        eps_tolerance: the tolerance on the relative output change that the scale
            invariances before normalisations were kept within
            (:func:`noetherflow.solve_within_eps`, :func:`noetherflow.clip_to_eps`); None: not
            checked, and :func:`noetherflow.teleport` warns (:class:`noetherflow.EpsWarning`)
            if it moves such a scale invariance.
        probe: inputs :func:`noetherflow.teleport` checks the outputs on (set by
            :func:`noetherflow.solve_within_eps` to its inputs); None: the symmetry set's.
    """

    syms: SymmetrySet
    steps: list[tuple[int, Any]]
    elements: dict[str, Any]
    distance: dict[str, Tensor]
    at_infinity: list[InfinityReport] = field(default_factory=list)
    residual: dict[str, float] = field(default_factory=dict)
    converged: bool = True
    iterations: int = 0
    progress: float = 0.0
    fingerprint: tuple[tuple[float, float, float], ...] | None = None
    eps_tolerance: float | None = None
    probe: Any = None
    momentum_terms: dict[str, tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict)

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


def solve_equilibrium(
    syms: SymmetrySet | nn.Module | None,
    stats: GradStats | SymmetrySet,
    noise: NoiseModel | GradStats | None = None,
    *,
    lr: float | None = None,
    batch_size: int | None = None,
    weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay | None = None,
    time: str | TimeModel | None = None,
    momentum: float | None = None,
    nesterov: bool | None = None,
    dampening: float | None = None,
    options: SolveOptions | None = None,
    init: EquilibriumSolution | None = None,
    **legacy: Any,
) -> EquilibriumSolution:
    """Solve for the noise equilibrium of every symmetry in ``syms`` (paper Thm 4.3, eq. 9).

    Call as ``solve_equilibrium(syms, stats, noise)`` with a :class:`NoiseModel`, or with the
    keywords ``lr=η, batch_size=S, weight_decay=γ, time=...`` (the time model of
    :func:`noetherflow.noether_flow`). The statistics are treated as fixed along the orbit and
    transported exactly (∇ℓ(e^{λA}θ) = e^{−λA}∇ℓ(θ)), so teleporting to the solution and
    recomputing the statistics gives zero flow. The old form
    ``solve_equilibrium(model, syms, stats, ...)`` still works and warns.

    Args:
        syms: the symmetries to solve for.
        stats: their gradient statistics (:func:`noetherflow.collect_stats`) at the current θ.
        noise: a :class:`NoiseModel`; or give ``lr``, ``batch_size``, ``weight_decay``,
            ``time`` (and ``momentum``, ``nesterov``) instead.
        lr: η (keyword form; :meth:`NoiseModel.create`).
        batch_size: S (keyword form).
        weight_decay: γ of γ‖θ‖² in the loss (keyword form): one float, or a mapping
            ``nn.Parameter`` → γ (or :class:`~noetherflow.ParamDecay` with a default) for
            per-parameter decay, e.g. a no-decay group (docs/concepts/flow.md, PD1–PD6).
        time: ``"continuous"`` or ``"discrete"`` (keyword form).
        options: how to solve, :class:`~noetherflow.SolveOptions` (tol, max_iter, max_sweeps,
            rtol_singular, ridge, solver, fixed, displacement); default: the reference
            settings.
        init: a previous solution of the same symmetry set (e.g. a few training steps ago):
            its diagonal λ warm-start the joint Newton solve (same convergence criteria, so the
            same answer, usually in fewer iterations); other families start from the identity.
        momentum: SGD with momentum β (keyword form; :meth:`NoiseModel.create`): effective
            coefficients; β = 0 is plain SGD exactly.
        nesterov: Nesterov momentum (keyword form).
        dampening: PyTorch SGD's momentum dampening d (keyword form).
        **legacy: the old loose spellings of the options (``tol=``, ``fixed=`` …): they still
            work and warn (:class:`FutureWarning`); an unknown keyword is a ``TypeError``.

    Returns:
        An :class:`EquilibriumSolution`; apply it with :func:`noetherflow.teleport`.

    Raises:
        NonFiniteGradientError: NaN/Inf statistics or parameters.
        ValueError: invalid hyper-parameters (see :meth:`NoiseModel.create`).
        TypeError: an unknown keyword, or ``options`` together with the old keywords.
    """
    syms, stats, noise = parse_call(syms, stats, noise)
    opts = resolve_options(options, legacy, "solve_equilibrium")
    nm = resolve_noise(
        noise,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        time=time,
        who="solve_equilibrium",
        momentum=momentum,
        nesterov=nesterov,
        dampening=dampening,
    )
    stamp = check_inputs(syms, stats)
    check_decay(nm, syms, "solve_equilibrium")
    if init is not None and not isinstance(init, EquilibriumSolution):
        raise TypeError(
            f"solve_equilibrium: init is a {type(init).__name__}; expected None or the "
            "EquilibriumSolution of an earlier solve of this set (a warm start)."
        )
    stats = with_displacement(
        stats, opts.displacement, syms.params(), "solve_equilibrium", nm.momentum
    )
    held = check_fixed(syms, opts.fixed)
    blocks = syms.coupled_groups()
    if blocks and not stats.samples:
        raise ValueError(
            "These symmetries share parameters with a rotation or dense symmetry (a chain), so "
            "the solver needs per-sample gradients, but the statistics hold none. Collect them "
            "with nf.collect_stats for this same symmetry set (it keeps them automatically)."
        )
    # the steps are written on whole parameters: an FSDP2 shard is gathered, once per solve
    # and here (a collective, in the same order on every rank); the other float64 copies are
    # made by each block's own task (_solve_parts), side by side
    values = {p: _float64(p) for p in syms.params() if _shard.is_sharded(p)}
    step = StepOptions(
        init=None if init is None else init.elements,
        fixed=held or None,
        settings=kernel_settings(opts, [k for k, _ in kernels_of(syms)]),
    )
    # one buffer per product shape for the sweeps' moves, per thread; NumPy's BLAS on one
    # thread, as the blocks run side by side (noetherflow._blas)
    with reuse(), blas_one_thread():
        out = _solve_parts(syms, blocks, values, stats, nm, step, (opts.max_sweeps, opts.tol), held)
    return _solution(syms, out, values, stats, nm, stamp)


def _solve_parts(
    syms: SymmetrySet,
    blocks: list[list[int]],
    values: dict[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    step: StepOptions,
    sweeps: tuple[int, float],
    held: Mapping[str, Tensor],
) -> _Solved:
    """Solve the independent blocks of ``syms`` (no parameter shared across two).

    The symmetries of no coupled group are solved once, jointly; each coupled group by its own
    sweeps, until its own flows converge. Same answer as sweeping over all at once, as the
    blocks do not interact; so they may run side by side (``sweep_options(parallel=...)``).
    ``sweeps``: (max_sweeps, tol) of a coupled block's sweeps. ``values``: the float64
    copies made so far (the gathered shards); each part adds its own, moved to the solution.
    """
    names: dict[Any, str] = {s: n for n, s in syms.items()}
    index = {s: i for i, s in enumerate(syms)}
    coupled_ids = {i for g in blocks for i in g}
    parts = [[i for i in range(len(syms)) if i not in coupled_ids], *blocks]
    out = _Solved(totals={s: s.identity_element() for s in syms})

    def solve(part: list[int], coupled: bool) -> tuple[_Solved, dict[nn.Parameter, Tensor]]:
        sub = syms.subset(part)
        own = _Solved(totals={s: out.totals[s] for s in sub})
        kept = None
        if coupled or _needs_values(nm):
            kept = {p: values[p] if p in values else _float64(p) for p in sub.params()}
        # the uncoupled part: read by its one pass of steps, never moved (_Float64Reads)
        mine = kept if kept is not None else _Float64Reads(sub.params(), values)
        _solve_block(sub, coupled, mine, stats, nm, names, index, step, sweeps, held, own)
        # each block's distances in its own task (288 d × d spectra on GPT-2: side by side)
        own.distance = {s: kernel_for(s).distance(s, own.totals[s]) for s in sub}
        # the moved copies are read after the blocks only for the momentum terms (_solution);
        # else dropped with the task, so that the next block on this thread reuses their
        # memory (on GPT-2 124M 12 × 19 MB a solve, page-faulted in otherwise)
        return own, (kept if kept is not None and _needs_values(nm) else {})

    # the parts share no parameter (each moves its own float64 copies, made in its task): side
    # by side on the intra-op threads, each on one (see noetherflow._threads). The uncoupled
    # part (one short pass) is taken last, to fill the gap the last blocks leave; the results
    # are merged in the parts' order all the same.
    order = [*range(1, len(parts)), 0]
    tasks = {k: partial(solve, parts[k], k > 0) for k in order if parts[k]}
    ran = side_by_side(list(tasks.values()), torch.get_num_threads() if parallel() else 1)
    for _, (own, mine) in sorted(zip(tasks, ran, strict=True), key=lambda kr: kr[0]):
        out.merge(own)
        values.update(mine)
    return out


def _needs_values(nm: NoiseModel) -> bool:
    """Whether the solution needs θ at the equilibrium (the momentum terms' charges)."""
    return bool(nm.momentum) and nm.time is TimeModel.DISCRETE


class _Float64Reads(Mapping[nn.Parameter, Tensor]):
    """The parameters of the uncoupled part, each read as a fresh float64 copy, none kept.

    The uncoupled symmetries are solved in one pass whose steps act on parameters that no
    other step of the pass reads (symmetries sharing one are a coupled group, or solved
    jointly by one kernel), so θ need not move after them; where the solution needs θ at the
    equilibrium (:func:`_needs_values`) the part gets kept copies instead. Kept copies of an
    MLP's weights were a quarter of a GPT-2 solve's fresh memory (issue 28), page-faulted
    in at every solve.
    """

    def __init__(self, params: list[nn.Parameter], gathered: Mapping[nn.Parameter, Tensor]):
        self._params = {p: None for p in params}
        self._gathered = gathered  # FSDP2 shards, gathered once per solve (a collective)

    def __getitem__(self, p: nn.Parameter) -> Tensor:
        if p not in self._params:
            raise KeyError(p)
        if p in self._gathered:
            return self._gathered[p]
        return _float64(p)

    def __iter__(self) -> Iterator[nn.Parameter]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def axis_norm_sq(self, p: nn.Parameter, axis: int) -> Tensor:
        """Σ θ² over every axis of ``p`` but ``axis``, accumulated in float64, with no copy.

        The numbers of the float64 copy's reduction, bit for bit (the diagonal kernel's
        per-neuron sums read this). Has shape ``[p.shape[axis]]``.
        """
        if p not in self._params:
            raise KeyError(p)
        v = self._gathered[p] if p in self._gathered else _shard.full(p.detach())
        return axis_norm_sq(v, axis, torch.float64)


def _float64(p: nn.Parameter) -> Tensor:
    """A float64 copy of ``p``'s values, whole (an FSDP2 shard gathered)."""
    return _shard.full(p.detach()).to(torch.float64, copy=True)


def _solution(
    syms: SymmetrySet,
    out: _Solved,
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    stamp: tuple[tuple[float, float, float], ...],
) -> EquilibriumSolution:
    """The :class:`EquilibriumSolution` of the blocks' results (a non-finite one refused)."""
    distance = {
        n: out.distance[s] if s in out.distance else kernel_for(s).distance(s, out.totals[s])
        for n, s in syms.items()
    }
    bad = [n for n, d in distance.items() if not is_finite(torch.as_tensor(d))]
    if bad:
        raise StatisticsError(
            f"solve_equilibrium: the solution of {bad} is not finite although the inputs are; "
            "expected finite statistics of a moderate scale. Try time='continuous', a ridge, "
            "or report the problem."
        )
    return EquilibriumSolution(
        syms=syms,
        steps=out.steps,
        elements={n: out.totals[s] for n, s in syms.items()},
        distance=distance,
        at_infinity=list(out.reports.values()),
        residual=out.residual,
        converged=out.converged,
        iterations=max(out.sweeps or out.newton or [1]),
        progress=out.progress,
        fingerprint=stamp,
        momentum_terms=_momentum_terms(syms, values, stats, nm, out.steps, out.reports),
    )


@dataclass
class _Solved:
    """What the blocks of one solve have found so far (:func:`_solve_block` appends)."""

    totals: dict[Symmetry, Any]
    steps: list[tuple[int, Any]] = field(default_factory=list)
    reports: dict[str, InfinityReport] = field(default_factory=dict)
    residual: dict[str, float] = field(default_factory=dict)
    converged: bool = True
    progress: float = 0.0  # the largest relative flow of the blocks' last sweeps
    sweeps: list[int] = field(default_factory=list)  # per coupled block
    newton: list[int] = field(default_factory=list)  # iterations of the uncoupled solves
    distance: dict[Symmetry, Tensor] = field(default_factory=dict)  # of the totals, per block

    def merge(self, other: _Solved) -> None:
        """Take ``other``'s results (a later block's) after this one's, as if appended here."""
        self.totals.update(other.totals)
        self.steps.extend(other.steps)
        self.reports.update(other.reports)
        self.residual.update(other.residual)
        self.converged = self.converged and other.converged
        self.progress = max(self.progress, other.progress)
        self.sweeps.extend(other.sweeps)
        self.newton.extend(other.newton)
        self.distance.update(other.distance)


def _solve_block(
    part: SymmetrySet,
    coupled: bool,
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    names: Mapping[Any, str],
    index: Mapping[Symmetry, int],
    opts: StepOptions,
    sweeps: tuple[int, float],
    held: Mapping[str, Tensor],
    out: _Solved,
) -> None:
    """Solve one block: once (uncoupled), or by block Gauss–Seidel sweeps (a coupled group).

    ``values`` (float64 parameters) move in place, but for the uncoupled part's read-only
    :class:`_Float64Reads`; steps, totals and reports go to ``out``.
    ``sweeps``: at most this many sweeps, until the largest relative flow is ``tol``.
    """
    max_sweeps, tol = sweeps
    if coupled:
        samples = coupled_samples(part, stats)
        cur = _means_of(stats, samples, part)
        # the displacement moves with the samples (a cotangent), in place in _move
        cur.displacement = {
            p: v.to(torch.float64, copy=True) for p, v in stats.displacement.items() if p in samples
        }
        pairs = overlaps_by_param(list(part), part._cover_memo())
        if _warm_start(part, opts, held, names, index, values, samples, cur, out):
            opts = replace(opts, init=None)  # the start is where the values are now
    else:
        samples, cur, pairs = {}, stats, {}
    touches = {s: list(v) for s, v in pairs.items()}
    opts = replace(opts, coupled=coupled)
    groups = plan_sweep(list(part), touches if coupled else None)
    # per symmetry, the parameters on which moves since its last use changed its statistics:
    # in a coupled block all of them at first (each kernel's are built at its first step, as
    # the steps before it would leave a copy built here stale)
    stale: dict[Symmetry, dict[nn.Parameter, None]] = (
        {s: dict.fromkeys(s.params) for s in part} if coupled else {}
    )
    caches: dict[str, dict[Any, Any]] = {}  # each kernel's own scratch (Kernel.refresh_)
    fast = covariant()  # statistics moved in closed form where a kernel has the law
    accel = sweep_accelerator(groups) if coupled and accelerated() else None

    def mark(k: Any, moves: list[tuple[Symmetry, Any]]) -> bool:
        """Record the moves' staleness; whether the kernel moved their own statistics."""
        own = fast and k.move_stats_(moves, cur, caches.setdefault(k.name, {}))
        for s, element in moves:
            out.steps.append((index[s], element))
            out.totals[s] = k.compose(out.totals[s], element)
            for t, ps in pairs.get(s, {}).items():
                if t is not s or not own:
                    stale.setdefault(t, {}).update(ps)
        return own

    def take(k: Any, s: Symmetry, element: Any) -> None:
        if coupled:
            mark(k, [(s, element)])
            move(s, element, values, samples, cur.displacement, cur.mean)
        else:
            out.steps.append((index[s], element))
            out.totals[s] = k.compose(out.totals[s], element)
            if not isinstance(values, _Float64Reads):  # no copy to move (read only)
                s.act_(element, values)

    def take_disjoint(k: Any, moves: list[tuple[Symmetry, Any]]) -> None:
        """:func:`take` for each move of a disjoint run, the products batched by the kernel."""
        if not coupled:
            for s, element in moves:
                out.steps.append((index[s], element))
                out.totals[s] = k.compose(out.totals[s], element)
            if not isinstance(values, _Float64Reads):
                k.act_disjoint_(moves, values)
            return
        own = mark(k, moves)
        # where the kernel moved the statistics itself, only samples another symmetry reads
        # need moving: those of parameters on which one shares a coordinate with a mover
        read = (
            {p: None for s, _ in moves for t, ps in pairs[s].items() if t is not s for p in ps}
            if own
            else None
        )
        move_disjoint(k, moves, values, samples, cur.displacement, cur.mean, read)

    own_iterations: list[int] = []
    done, sweep, stop = False, 0, max(tol, 1e-10)
    apart = coupled and steps_apart(groups, touches)
    settled: float | None = None  # the largest flow the last sweep's later steps left
    for sweep in range(1, (max_sweeps if coupled else 1) + 1):
        worst, rest = 0.0, 0.0
        for i, step in enumerate(groups):
            k, members = step.kernel, step.members
            start = diagonal_point(members, out.totals) if accel is not None and i == 0 else None
            todo = [s for s in members if stale.get(s)]
            if todo and fast:  # rebuild only the statistics the moves since their use touched
                k.refresh_(todo, samples, cur, stale, caches.setdefault(k.name, {}))
            elif todo:  # the reference path: each of them whole
                refresh_stats_(cur, samples, todo, means=False, level=Level.SOLVE)
            if todo:
                for s in todo:
                    del stale[s]
            if step.disjoint:  # the kernel's scratch only where refresh_ keeps it true
                own_cache = caches.setdefault(k.name, {}) if fast and coupled else None
                res = k.solve_disjoint(members, values, cur, nm, names, opts, own_cache)
            else:
                res = k.solve(members, values, cur, nm, names, opts)
            if i == 0 and at_rest(res, settled, stop):
                # where the last sweep left the values, every flow is at most tol: the first
                # step measured its own, and the later ones, touching one another nowhere,
                # were solved exactly with nothing moved after them. Stop without moving.
                out.residual.update({names[s]: cast(float, res.before) for s in members})
                worst, done = max(cast(float, res.before), cast(float, settled)), True
                break
            if i > 0:  # a direction at infinity, or a residual not reported: not at rest
                left = [res.residual.get(s, math.inf) for s in members]
                rest = max(rest, *left, math.inf if res.reports else 0.0)
            if not coupled:
                if res.converged is not None:
                    out.converged = out.converged and res.converged
                if res.iterations is not None:
                    own_iterations.append(res.iterations)
            for r in res.reports:
                out.reports[r.name] = r
            if step.disjoint and len(res.steps) > 1:
                take_disjoint(k, res.steps)
            else:
                for s, element in res.steps:
                    take(k, s, element)
            for s, r in res.residual.items():
                out.residual[names[s]] = r
            worst = max(worst, res.progress)
            if accel is not None and start is not None:
                if res.reports or held:  # directions at infinity: λ is not a plain point
                    accel = None
                elif sweep > 1 and res.steps:
                    # rotations are at their optimum for λ from sweep 2 on: Φ(λ) is defined
                    after = diagonal_point(members, out.totals)
                    for s, element in split_point(members, accel.step(start, after) - after):
                        take(k, s, element)
        if done:
            break
        # later sweeps continue from the moved values: held generators move no more
        opts = replace(opts, init=None, fixed=_nomove(held))
        settled = rest if apart else None
        done = worst <= stop
        if coupled and done and sweep > 1:
            break
    out.progress = max(out.progress, worst)
    if coupled:
        out.converged = out.converged and done
        out.sweeps.append(sweep)
    else:
        out.newton.extend(own_iterations)


def _means_of(
    stats: GradStats, samples: Mapping[nn.Parameter, HeldSamples], part: SymmetrySet
) -> GradStats:
    """ḡ of ``part``'s parameters, float64 copies of the statistics' own; each kernel's block empty.

    The statistics' ḡ, not the samples' mean recomputed in float64: the same vector to the
    statistics' precision (float32 rounding at most, for a float32 model), the one every
    uncoupled symmetry and :func:`noetherflow.noether_flow` read, and no product of the
    factors (on GPT-2 124M a [768, 512] × [512, 2304] product per block). The coupled sweeps
    build a kernel's statistics at its first step (its members start stale), from the
    samples as :func:`stats_from_samples` does.
    """
    cur = GradStats(n=SampleSource(samples, reduced=True).n, estimator=stats.estimator)
    for p in part.params():
        cur.mean[p] = stats.mean[p].to(torch.float64, copy=True)
    for k, _ in kernels_of(part):
        cur.blocks[k.name] = k.block()
    return cur


def _warm_start(
    part: SymmetrySet,
    opts: StepOptions,
    held: Mapping[str, Tensor],
    names: Mapping[Any, str],
    index: Mapping[Symmetry, int],
    values: Mapping[nn.Parameter, Tensor],
    samples: dict[nn.Parameter, HeldSamples],
    cur: GradStats,
    out: _Solved,
) -> bool:
    """Start a coupled block's sweeps at the previous solution (``init``), if it has all of it.

    Every member is moved by its element of ``init`` first (θ, the samples, ḡ and v, as a
    sweep's steps move them; the statistics are built there, at each kernel's first step): the
    sweeps run from there to the same stopping criterion, so to the same equilibrium, usually
    in fewer sweeps. Not with held generators (their values are measured from the current θ).
    Returns whether it moved.
    """
    init = opts.init
    if not init or held or any(names[s] not in init for s in part):
        return False
    for s in part:
        k = kernel_for(s)
        element = init[names[s]]
        move(s, element, values, samples, cur.displacement, cur.mean)
        out.steps.append((index[s], element))
        out.totals[s] = k.compose(out.totals[s], element)
    return True


def _momentum_terms(
    syms: SymmetrySet,
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    steps: list[tuple[int, Any]],
    at_infinity: Mapping[str, InfinityReport],
) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """(C*, B*, E*) per symmetry at the solution (SGD with momentum, discrete time)."""
    if not nm.momentum or nm.time is not TimeModel.DISCRETE:
        return {}
    from noetherflow.optim.momentum import stationary_terms

    params = syms.params()
    g = {p: stats.mean[p].detach().to(torch.float64).clone() for p in params}
    v = {
        p: stats.displacement[p].to(torch.float64).clone()
        if p in stats.displacement
        else torch.zeros_like(g[p])
        for p in params
    }
    for i, element in steps:  # both are cotangents: ∇ℓ(Tθ) = T^{-T}∇ℓ(θ)
        transport_cotangent(syms[i], element, g)
        transport_cotangent(syms[i], element, v)
    out = {}
    for name, s in syms.items():
        sub = nm.uniform(s.params)  # one γ per symmetry (mixed: refused with momentum)
        if sub is None or not sub.weight_decay:
            continue
        c = s.charge_of({p: values[p] for p in s.params})
        # H* = vᵀA∇L by polarisation of the charge's quadratic form
        plus = s.charge_of({p: v[p] + g[p] for p in s.params})
        minus = s.charge_of({p: v[p] - g[p] for p in s.params})
        terms = stationary_terms(c, (plus - minus) / 4, sub)
        rep = at_infinity.get(name)
        if rep is not None:  # per generator where the direction is one, else all of them
            off = rep.direction.reshape(c.shape) != 0 if rep.direction.shape == c.shape else None
            terms = tuple(  # type: ignore[assignment]
                t.masked_fill(off.to(t.device), float("nan"))
                if off is not None
                else torch.full_like(t, float("nan"))
                for t in terms
            )
        out[name] = terms
    return out


def _nomove(held: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
    """The held generators kept where they are: 0 where held, NaN (free) elsewhere."""
    zero = {n: torch.where(torch.isnan(v), v, 0.0) for n, v in held.items()}
    return zero or None
