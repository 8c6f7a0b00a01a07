"""The kernel interface: everything the paper says about one family's noise, in one object.

A :class:`Kernel` owns, for the symmetries of its family:

* the statistics it needs (:meth:`Kernel.collect`), from any :class:`GradSource`: per-sample
  gradients (reference, micro-batch) or layer factors a/g (hooks), through one interface;
* its noise term Tr[A·M] (:meth:`Kernel.noise`) and so its flow −κC + Tr[A·M];
* its solve step with its at-infinity reports (:meth:`Kernel.solve`), how elements compose
  and the distance to equilibrium they measure;
* its record for the monitor (:meth:`Kernel.record`, :meth:`Kernel.mark_infinity`) and
  its transport of optimizer state (:meth:`Kernel.transport_`).

What a family's *action* covers (which coordinates, a signature for comparisons) stays on the
:class:`~noetherflow.symmetry.base.Symmetry` itself (``covered_slabs``, ``covered_mask``,
``signature``; noetherflow/symmetry/cover.py).

Kernels are registered by symmetry class (:func:`register_kernel`) and found by MRO
(:func:`kernel_for`). The drivers (``collect_stats``, ``noether_flow``,
``solve_equilibrium``, the DDP reduction, the monitor) know no family.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
from torch import Tensor, nn

from noetherflow.kernels.decay import decay_charge, decay_cross
from noetherflow.kernels.noise import NoiseModel
from noetherflow.stats.blocks import (
    KERNELS,
    assemble,
    collectors_of,
    needs_samples,
    refresh_stats_,
    stats_from_samples,
)
from noetherflow.stats.core import GradStats, Level, StatsBlock
from noetherflow.stats.sample_factors import HeldSamples
from noetherflow.stats.source import GradSource, SampleSource
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.cover import cover_classes as _cover_classes
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "GradSource",
    "GroupSolve",
    "InfinityReport",
    "Kernel",
    "NoSettings",
    "SampleSource",
    "StepOptions",
    "assemble",
    "kernel_for",
    "kernels_of",
    "overlaps",
    "overlaps_by_param",
    "refresh_stats_",
    "needs_samples",
    "register_kernel",
    "stats_from_samples",
    "transport_cotangent",
]

S = TypeVar("S", bound=Symmetry)
B = TypeVar("B", bound=StatsBlock)


# -- solving -------------------------------------------------------------------------------
@dataclass(frozen=True)
class InfinityReport:
    """Part of an equilibrium that lies at infinity.

    ``direction`` is the generator direction (diagonal: a vector over that symmetry's
    generators; rotation: an orthonormal basis ``[d, k]`` of the hidden directions; dense:
    ±1) along which the noise keeps pushing. A diagonal direction may combine generators of
    several symmetries, each bounded alone (F decreases only when they move together,
    docs/concepts/equilibrium.md): each symmetry's report then holds its part of the direction
    (same scale across the reports) and ``coupled`` names the other symmetries in it.
    """

    name: str
    direction: Tensor
    reason: str
    coupled: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoSettings:
    """The settings of a kernel whose solve reads none (a closed form, a scan)."""


@dataclass(frozen=True)
class StepOptions:
    """What every kernel's solve step is told: only what is common to all families.

    Attributes:
        coupled: the step is one of a coupled block's sweeps (its ``progress`` is then the
            flow it found before its move, the sweeps' stopping measure).
        init: warm start: the element per symmetry name of an earlier solution.
        fixed: generators held at a value (kernels with ``can_hold``), per symmetry name:
            λ ``[J]`` float64 on the CPU (finite entries; NaN: free), the move of this solve
            step (0 in later sweeps).
        settings: per kernel name, that kernel's own settings in this solve (an instance of
            its :attr:`Kernel.settings`: the shared ``SolveOptions`` values with
            ``SolveOptions.kernels`` over them, :func:`noetherflow.solve_options.kernel_settings`);
            a kernel left out takes the defaults of its settings class (:meth:`of`).
    """

    coupled: bool = False
    init: Mapping[str, Any] | None = None
    fixed: Mapping[str, Tensor] | None = None
    settings: Mapping[str, Any] | None = None

    def of(self, kernel: Kernel[Any, Any]) -> Any:
        """``kernel``'s own settings in this solve (its :attr:`Kernel.settings` defaults)."""
        own = (self.settings or {}).get(kernel.name)
        return kernel.settings() if own is None else own


@dataclass
class GroupSolve:
    """What one kernel's solve step returns for a group of its symmetries.

    Attributes:
        steps: ``(symmetry, element)`` to apply, in order (identity moves left out).
        reports: directions whose equilibrium is at infinity.
        residual: predicted relative flow left, per symmetry.
        progress: the relative flow this step measured (the sweep's stopping measure).
        converged: the step's own convergence (None: it has none, e.g. a closed form).
        iterations: its own iteration count (None: not iterative).
        before: the relative flow at the step's start, before its move, where the kernel
            measured it (None: not measured). A coupled block's sweeps stop on it when the
            rest of the last sweep left nothing to move (noetherflow/equilibrium.py).
    """

    steps: list[tuple[Symmetry, Any]] = field(default_factory=list)
    reports: list[InfinityReport] = field(default_factory=list)
    residual: dict[Symmetry, float] = field(default_factory=dict)
    progress: float = 0.0
    converged: bool | None = None
    iterations: int | None = None
    before: float | None = None

    def add(self, other: GroupSolve) -> None:
        """Take ``other``'s steps, reports and residuals after these; the larger measures."""
        self.steps.extend(other.steps)
        self.reports.extend(other.reports)
        self.residual.update(other.residual)
        self.progress = max(self.progress, other.progress)
        if self.before is not None:
            self.before = None if other.before is None else max(self.before, other.before)


# -- the kernel ----------------------------------------------------------------------------
class Kernel(ABC, Generic[S, B]):
    """The noise physics of one symmetry family. Subclasses are stateless singletons.

    Class attributes:
        name: the key of its statistics block in :attr:`GradStats.blocks`.
        block: its :class:`StatsBlock` type.
        joint: its symmetries are solved together in one step (they commute), else one
            at a time.
        matrix_valued: its charges are matrices (the monitor records their norm).
    """

    name: ClassVar[str]
    block: ClassVar[type[StatsBlock]]
    joint: ClassVar[bool] = False
    matrix_valued: ClassVar[bool] = False
    # solve_equilibrium(options=SolveOptions(fixed=...)) may hold its generators at given values
    can_hold: ClassVar[bool] = False
    # the monitor may follow its equilibrium between full solves (monitor/first_order.py):
    # then :meth:`problem` gives the convex F(λ) its solve minimises
    incremental: ClassVar[bool] = False
    # Γ constant on each parameter commutes with every generator of the family (a diagonal
    # A, a rotation of an index that no parameter is split along): then the per-parameter
    # decay term is −C(√κ ⊙ θ) (docs/concepts/flow.md, eq. PD3)
    decay_commutes: ClassVar[bool] = False
    # one at a time (not joint), but a run on disjoint coordinates may be solved as one
    # batched step (:meth:`solve_disjoint`)
    batchable: ClassVar[bool] = False
    # its moves and statistics take per-sample gradients held as a linear layer's factors
    # (stats/sample_factors.py: a move along one axis, Grams and per-axis sums of squares)
    factored: ClassVar[bool] = False
    # the settings its solve reads, with the family's defaults: a frozen dataclass whose fields
    # are named as those of nf.SolveOptions; the solve reads them as ``opts.of(self)``
    settings: ClassVar[type[Any]] = NoSettings
    # their names (from :attr:`settings`): what SolveOptions(kernels={name: {...}}) may set
    # for this family alone
    solve_options: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.solve_options = frozenset(f.name for f in fields(cls.settings))

    # statistics
    def sample_params(self, syms: Sequence[S]) -> list[nn.Parameter]:
        """Parameters whose per-sample gradients this kernel needs (materialised first)."""
        return []

    @abstractmethod
    def collect(self, syms: Sequence[S], src: GradSource, level: Level) -> B:
        """The statistics block of ``syms`` from ``src``."""

    def problem(
        self,
        syms: Sequence[S],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
    ) -> Any:
        """The function F(λ) whose minimiser :meth:`solve` finds (kernels with ``incremental``)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no incremental problem (incremental = False); the "
            "monitor solves its symmetries in full."
        )

    # noise and flow
    @abstractmethod
    def noise(self, s: S, stats: GradStats, nm: NoiseModel) -> Tensor:
        """Tr[A·M] of one symmetry, in the shape of its charge."""

    def flow(self, s: S, stats: GradStats, nm: NoiseModel, charge: Tensor) -> Tensor:
        """The flow −κC + Tr[A·M] (paper eqs. 7–8 in the convention of docs/concepts/flow.md).

        Where the parameters of ``s`` have different γ (``weight_decay=`` a mapping):
        :meth:`mixed_flow`.
        """
        sub = nm.uniform(s.params)
        if sub is not None:
            return -sub.kappa * charge + self.noise(s, stats, sub)
        return self.mixed_flow(s, stats, nm)

    def mixed_flow(self, s: S, stats: GradStats, nm: NoiseModel) -> Tensor:
        """The flow with per-parameter γ (docs/concepts/flow.md, eqs. PD1–PD4).

        −C(√κ ⊙ θ) + Tr[A·M] + 4η²·Q(Γθ, ∇L) (the last in discrete time only), for families
        whose generators commute with Γ; others must override it.
        """
        if not self.decay_commutes:
            raise NotImplementedError(
                f"{type(self).__name__} has no flow for parameters with different weight "
                "decay; give the parameters of this symmetry one γ, or override mixed_flow."
            )
        mix = nm.mixed_terms(s.params, "noether_flow")
        values = {p: p.detach() for p in s.params}
        out = -decay_charge(s, values, mix.kappa) + self.noise(s, stats, mix.noise)
        if mix.cross:
            out = out + mix.cross * decay_cross(s, values, stats.mean, mix.gamma)
        return out

    # solving
    @abstractmethod
    def solve(
        self,
        syms: Sequence[S],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
        names: Mapping[Symmetry, str],
        opts: StepOptions,
    ) -> GroupSolve:
        """One solve step for ``syms`` (all of them if ``joint``, else one) at ``values``."""

    def solve_disjoint(
        self,
        syms: Sequence[S],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
        names: Mapping[Symmetry, str],
        opts: StepOptions,
        cache: dict[Any, Any] | None = None,
    ) -> GroupSolve:
        """One step for each of ``syms`` (pairwise disjoint coordinates), merged in order.

        What :meth:`solve` gives one at a time, as they do not interact; kernels with
        ``batchable`` override it with one batched step. ``cache``: the kernel's scratch
        that :meth:`refresh_` and :meth:`move_stats_` keep in a coupled solve (None
        elsewhere), for what the step may reuse from one sweep to the next.
        """
        out = GroupSolve(before=0.0)
        for s in syms:
            out.add(self.solve([s], values, stats, nm, names, opts))
        return out

    def act_disjoint_(
        self, moves: Sequence[tuple[S, Any]], values: Mapping[nn.Parameter, Tensor]
    ) -> None:
        """Move ``values`` by each ``(symmetry, element)`` of ``moves``, in place.

        The moves act on pairwise disjoint coordinates (one batched step's), so their order
        does not matter; what ``s.act_(element, values)`` for each gives. Kernels with
        ``batchable`` override it with batched products.
        """
        for s, element in moves:
            s.act_(element, values)

    def transport_disjoint_(
        self, moves: Sequence[tuple[S, Any]], grads: Mapping[nn.Parameter, HeldSamples]
    ) -> None:
        """Transport per-sample gradients ``[N, *shape]`` along each move (T^{-T}), in place.

        What ``s.transport_grads_(element, grads)`` for each gives (disjoint coordinates, as
        in :meth:`act_disjoint_`). :class:`SampleFactors` only for kernels with ``factored``
        (the diagonal families' moves scale one factor: ``SampleFactors.mul_``).
        """
        for s, element in moves:
            s.transport_grads_(element, cast(Mapping[nn.Parameter, Tensor], grads))

    def refresh_(
        self,
        members: Sequence[S],
        samples: Mapping[nn.Parameter, HeldSamples],
        stats: GradStats,
        stale: Mapping[Symmetry, Mapping[nn.Parameter, None]],
        cache: dict[Any, Any],
    ) -> None:
        """Rebuild in place the statistics of ``members`` that moves since their use changed.

        ``stale[s]``: the parameters of ``s`` on which other symmetries moved (whose
        per-sample gradients changed under ``s``'s coordinates); ``cache``: this kernel's own
        scratch for the solve (kept across sweeps). Default: all of each member's statistics
        from ``samples`` (:func:`refresh_stats_`).
        """
        refresh_stats_(stats, samples, members, means=False, level=Level.SOLVE)

    def move_stats_(
        self, moves: Sequence[tuple[S, Any]], stats: GradStats, cache: dict[Any, Any]
    ) -> bool:
        """Move each moved symmetry's own statistics by its own element, exactly, in place.

        Where the family has the closed form (a covariant law, e.g. M → GᵀMG) and the
        statistics were fresh, the solver needs no rebuild of them after the move, and no
        transport of the per-sample gradients that only the moved symmetries read. Returns
        False (changing nothing) where it has none: then the solver rebuilds them from
        transported samples. A kernel that returns True must take per-sample mappings that
        leave such parameters out in :meth:`transport_disjoint_`.
        """
        return False

    @abstractmethod
    def compose(self, total: Any, element: Any) -> Any:
        """The element ``total`` followed by ``element``."""

    @abstractmethod
    def distance(self, s: S, total: Any) -> Tensor:
        """The distance to equilibrium that the total element measures."""

    def distance_shape(self, s: S) -> tuple[int, ...]:
        """Shape of :meth:`distance` (scalar unless overridden)."""
        return ()

    # monitor
    def record(self, value: Tensor) -> Tensor:
        """What the monitor writes for a charge or flow of this family (default: itself)."""
        return value

    @abstractmethod
    def mark_infinity(self, distance: Tensor, report: InfinityReport) -> tuple[Tensor, int]:
        """The distance with the at-infinity part marked (inf), and how many directions."""

    # optimizer state
    def transport_(
        self, s: S, element: Any, tensors: Mapping[nn.Parameter, Tensor], *, squared: bool = False
    ) -> bool:
        """Transport single (unbatched) tensors along ``element`` in place.

        Gradient-like tensors (momentum, ``.grad``) move as cotangents, T^{-T}; with
        ``squared`` the tensors are squared gradients (Adam's second moment), which only a
        diagonal action maps exactly (g² → e^{−2s}g²). Returns False, changing nothing, where
        the family has no exact law (the caller then resets that state).
        """
        if squared:
            return False
        transport_cotangent(s, element, tensors)
        return True


def transport_cotangent(s: Symmetry, element: Any, tensors: Mapping[nn.Parameter, Tensor]) -> None:
    """Move single gradient-like tensors by T^{-T}, in place.

    Only the entries of ``s``'s parameters move (zeros stand in for missing ones); other
    entries of ``tensors`` are left as they are.
    """
    full = {}
    for p in s.params:
        t = tensors.get(p)
        full[p] = (torch.zeros_like(p) if t is None else t).detach().unsqueeze(0).clone()
    s.transport_grads_(element, full)
    with torch.no_grad():
        for p, t in tensors.items():
            if p in full:
                t.copy_(full[p][0])


# -- registry ------------------------------------------------------------------------------
# Symmetry class → kernel, resolved by MRO (the rule of noetherflow._registry.Registry).
def register_kernel(cls: type, kernel: Kernel[Any, Any], *, overwrite: bool = False) -> None:
    """Register ``kernel`` for symmetry class ``cls`` and its subclasses (resolved by MRO).

    Raises:
        ValueError: ``cls`` has a kernel already and ``overwrite`` is False.
    """
    if not (isinstance(cls, type) and issubclass(cls, Symmetry)):
        raise TypeError(f"register_kernel: {cls!r} is not a Symmetry subclass.")
    KERNELS.register(cls, kernel, replace=overwrite)


def kernel_for(s: Symmetry | type[Symmetry]) -> Kernel[Any, Any]:
    """The kernel of a symmetry (or class): the nearest registered class in its MRO.

    Raises:
        TypeError: no class in its MRO has a kernel (the message names the fix).
    """
    cls = s if isinstance(s, type) else type(s)
    try:
        return cast("Kernel[Any, Any]", KERNELS[cls])
    except KeyError as e:
        raise TypeError(f"{e.args[0]} (See the docs' Extending page.)") from None


def kernels_of(syms: SymmetrySet | Sequence[Symmetry]) -> list[tuple[Kernel[Any, Any], list[Any]]]:
    """(kernel, its symmetries in set order) for every kernel in use, in registration order."""
    return [(cast("Kernel[Any, Any]", k), m) for k, m in collectors_of(syms)]


def overlaps(syms: Sequence[Symmetry]) -> dict[Symmetry, list[Symmetry]]:
    """For each symmetry, the symmetries (itself included) acting on a coordinate it acts on.

    Moving one changes the per-sample gradients of exactly its covered coordinates (the
    transport T^{-T} acts there only), so these are the statistics a move makes stale.
    """
    return {s: list(v) for s, v in overlaps_by_param(syms).items()}


def overlaps_by_param(
    syms: Sequence[Symmetry], memo: dict[tuple[int, ...], list[list[Symmetry]]] | None = None
) -> dict[Symmetry, dict[Symmetry, dict[nn.Parameter, None]]]:
    """:func:`overlaps` with the parameters on which each pair shares a coordinate.

    ``out[s][t]``: the parameters (in order) on which ``t`` acts on a coordinate ``s`` acts
    on; ``out[s][s]`` holds all of ``s``'s parameters. ``memo``: the cover classes found
    before, by the ids of the parameter and its members (the memo of the
    :class:`~noetherflow.SymmetrySet` that holds them alive). The classes come from the
    symmetries' slabs (:func:`noetherflow.symmetry.cover.cover_classes`).
    """
    out = {s: {s: dict.fromkeys(s.params)} for s in syms}
    users: dict[int, list[Symmetry]] = {}
    params: dict[int, nn.Parameter] = {}
    for s in syms:
        for p in s.params:
            users.setdefault(id(p), []).append(s)
            params[id(p)] = p
    for key, group in users.items():
        if len(group) < 2:
            continue
        classes = None if memo is None else memo.get((key, *map(id, group)))
        if classes is None:
            classes = _cover_classes(params[key], group)
            if memo is not None:
                memo[(key, *map(id, group))] = classes
        for members in classes:
            for a in members:
                for b in members:
                    out[a].setdefault(b, {})[params[key]] = None
    return out
