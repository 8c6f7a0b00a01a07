"""The ``distance/*`` columns: when to solve in full, and the incremental solve in between.

A full solve is :func:`noetherflow.solve_equilibrium`, warm-started from the last converged
solution (same answer, fewer Newton iterations). With ``mode="track"`` (the default) a full
solve happens at the first distance record, every ``solve_every`` steps after it, and when η
or γ moved by more than 5% since; at the other distance records the scaled chord iterations
of :func:`noetherflow.monitor.first_order.chord_solve` start from the last record's λ and
run until the correction is at most ``tol`` (then the row says ``distance_exact = 0``), or
fall back to a full solve when they do not get there in ``max_iter`` steps or when a
generator's equilibrium moved to or from infinity (its F one-sided on this batch). This applies to
sets of diagonal symmetries that share no parameter with a rotation or dense symmetry;
other sets are solved in full at every distance record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from noetherflow import _shard
from noetherflow.equilibrium import EquilibriumSolution, InfinityReport, solve_equilibrium
from noetherflow.kernels import kernel_for
from noetherflow.kernels.noise import NoiseModel
from noetherflow.monitor.estimate import jacobi_estimate
from noetherflow.monitor.first_order import (
    ChordFactor,
    at_infinity,
    chord_solve,
    diagonal_problem,
    factor,
    span,
)
from noetherflow.monitor.options import DistanceMode, check_sweeps
from noetherflow.solve_options import split_options
from noetherflow.stats.core import GradStats
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["DistanceResult", "DistanceTracker"]

_HYPER_RTOL = 0.05  # relative change of η or γ that calls for a full solve


def _hyper_of(nm: NoiseModel) -> tuple[float, float]:
    """(η, γ) of a noise model (the largest γ under per-parameter decay).

    A model built from its coefficients has no η, γ: then (c_second, κ), which move with them.
    """
    if nm.lr is None:
        return nm.c_second, nm.kappa
    return float(nm.lr), float(nm.weight_decay or 0.0)


@dataclass
class DistanceResult:
    """One record's distances.

    Attributes:
        distance: per symmetry name, as :attr:`EquilibriumSolution.distance`.
        at_infinity: the reports of the full solve these distances come from.
        exact: ``True`` for a converged full solve, ``False`` for the first-order update and
            for a provisional solve.
        converged: ``False`` for a provisional solve (coupled sweeps stopped by the budget
            of a record, continued at the next one); the incremental solve always converged.
        residual: the largest relative flow the solve's last sweep measured (at most the
            solver's ``tol`` when converged; NaN for the incremental solve, whose measure is
            ``correction``).
        sweeps: coupled sweeps done towards this solution, over the records since the last
            converged one (0 for the incremental solve and sets without coupled symmetries).
        correction: the last chord correction ‖δ‖∞ (0 for a full solve).
        iterations: chord iterations (0 for a full solve).
    """

    distance: dict[str, Tensor]
    at_infinity: list[InfinityReport] = field(default_factory=list)
    exact: bool = True
    converged: bool = True
    residual: float = float("nan")
    sweeps: int = 0
    correction: float = 0.0
    iterations: int = 0


class DistanceTracker:
    """Distances to the noise equilibrium at the monitor's distance records.

    Args:
        syms: the symmetries.
        mode: :class:`DistanceMode` (``"track"`` or ``"solve"``).
        solve_every: steps between full solves in ``"track"`` mode.
        tol: the chord correction ‖δ‖∞ at which the incremental solve stops (units of λ).
        max_iter: chord iterations before falling back to a full solve.
        solver_options: the fields of :class:`noetherflow.SolveOptions` (or ``options=`` one).
        sweeps: block Gauss–Seidel sweeps of the coupled symmetries per record (``None``:
            until converged, ``max_sweeps`` of the options). A solve stopped by this budget
            is provisional; the next record continues it from its partial solution
            (``init``) on its own statistics.
    """

    def __init__(
        self,
        syms: SymmetrySet,
        *,
        mode: DistanceMode,
        solve_every: int,
        tol: float,
        solver_options: Mapping[str, Any],
        max_iter: int = 8,
        sweeps: int | None = None,
    ) -> None:
        self.syms, self.mode = syms, mode
        self.solve_every, self.tol, self.max_iter = int(solve_every), float(tol), int(max_iter)
        self.solver_options, self.options = split_options(
            solver_options, "NoetherMonitor(solver_options=...)"
        )
        self.trackable = (
            mode is DistanceMode.TRACK
            and not syms.coupled_groups()
            and all(kernel_for(s).incremental for s in syms)
        )
        budget = check_sweeps(sweeps)
        self.sweeps = budget if syms.coupled_groups() else None
        self._pending = 0  # sweeps done towards a solution not converged yet
        self._estimated = False  # the first estimate (coupled sets) was given
        self.warm: EquilibriumSolution | None = None  # the last solve (converged or partial)
        self._fac: ChordFactor | None = None
        self._lam: Tensor | None = None  # the last record's λ (the next chord start)
        self._solved_at = -1
        self._hyper: tuple[float, float] = (0.0, 0.0)
        self._reports: list[InfinityReport] = []
        self.solves = 0

    def measure(self, step: int, stats: GradStats, nm: NoiseModel) -> DistanceResult:
        """The distances at ``step`` from this record's statistics and noise model.

        ``nm`` is the one form in which η and γ reach the tracker: the full solve takes it as
        it is, and its (η, γ) decide when the hyper-parameters moved (:func:`_hyper_of`).
        """
        hyper = _hyper_of(nm)
        if self._fac is not None and not self._due(step, hyper):
            res = self._update(stats, nm)
            if res is not None:
                return res
        return self._solve(step, stats, nm, hyper)

    @property
    def solves_coupled(self) -> bool:
        """Whether the next :meth:`measure` runs the coupled solver on per-sample gradients.

        Not for sets without coupled symmetries (nothing reads them), nor at the first
        record of a coupled set under a sweep budget (:func:`jacobi_estimate` needs none).
        """
        if not self.syms.coupled_groups():
            return False
        return not (self.sweeps is not None and not self._estimated)

    def _due(self, step: int, hyper: tuple[float, float]) -> bool:
        if step - self._solved_at >= self.solve_every:
            return True
        return any(
            abs(new - old) > _HYPER_RTOL * abs(old)
            for new, old in zip(hyper, self._hyper, strict=True)
        )

    def _values(self) -> dict[Any, Tensor]:
        # per-coordinate θ beside whole-size statistics: an FSDP2 shard is gathered, as in
        # the full solve
        return {p: _shard.full(p.detach()) for p in self.syms.params()}

    def _update(self, stats: GradStats, nm: NoiseModel) -> DistanceResult | None:
        """The incremental solve, or ``None`` when it does not converge (then: a full solve)."""
        assert self._fac is not None
        prob = diagonal_problem(self.syms, self._values(), stats, nm)
        if not torch.equal(at_infinity(prob), ~self._fac.free):
            return None  # an equilibrium moved to or from infinity: the full solve reports it
        lam, ok, its, size = chord_solve(
            self._fac, prob, tol=self.tol, max_iter=self.max_iter, start=self._lam
        )
        if not ok:
            return None
        self._lam = lam
        out = {}
        for name, s in self.syms.items():
            element = lam[span(prob, s)].to(s.params[0].device)
            out[name] = kernel_for(s).distance(s, element)
        return DistanceResult(
            out, list(self._reports), exact=False, correction=size, iterations=its
        )

    def _solve(
        self,
        step: int,
        stats: GradStats,
        nm: NoiseModel,
        hyper: tuple[float, float],
    ) -> DistanceResult:
        if self.sweeps is not None and not self._estimated:
            # the first record with coupled symmetries: a cheap estimate, the sweeps follow
            self._estimated = True
            dist, reps = jacobi_estimate(self.syms, stats, nm, self.options)
            return DistanceResult(dist, reps, exact=False, converged=False)
        options = self.options
        if self.sweeps is not None:
            options = options.replace(max_sweeps=self.sweeps)
        kw = {"init": self.warm, **self.solver_options}
        sol = solve_equilibrium(self.syms, stats, nm, options=options, **kw)
        self.solves += 1
        # Warm start of the next solve: a converged one, or one stopped by the sweep budget
        # (its partial solution is where the next record continues); a failed solve is not.
        stopped = self.sweeps is not None and sol.iterations >= self.sweeps
        self.warm = sol if sol.converged or stopped else None
        sweeps = self._pending + sol.iterations if self.sweeps is not None else 0
        self._pending = sweeps if stopped and not sol.converged else 0
        self._fac = None
        if self.trackable and sol.converged:
            self._fac = self._factor(sol, stats, nm)
            self._lam = None if self._fac is None else self._fac.lam0
            self._solved_at, self._hyper, self._reports = step, hyper, list(sol.at_infinity)
        return DistanceResult(
            dict(sol.distance),
            list(sol.at_infinity),
            exact=sol.converged,
            converged=sol.converged,
            residual=sol.progress,
            sweeps=sweeps,
        )

    def _factor(
        self, sol: EquilibriumSolution, stats: GradStats, nm: NoiseModel
    ) -> ChordFactor | None:
        prob = diagonal_problem(self.syms, self._values(), stats, nm)
        lam0 = torch.zeros(prob.n, dtype=torch.float64)
        free = torch.ones(prob.n, dtype=torch.bool)
        for name, s in self.syms.items():
            lam0[span(prob, s)] = torch.as_tensor(sol.elements[name]).reshape(-1).to(lam0)
        for rep in sol.at_infinity:
            free[span(prob, self.syms[rep.name])] &= rep.direction.reshape(-1).cpu() == 0
        if not bool(free.any()):
            return None  # everything at infinity: the full solve costs nothing anyway
        return factor(prob, lam0, free)
