"""The order of a solve's steps within one sweep (block Gauss–Seidel), and its batching.

Joint kernels solve all their symmetries in one step; the others one at a time, in set
order, after the joint ones (docs/concepts/equilibrium.md). A run of consecutive symmetries
of one ``batchable`` kernel whose coordinates are pairwise disjoint (the heads of one
attention layer) do not interact, so they are one batched step
(:meth:`~noetherflow.kernels.Kernel.solve_disjoint`): the same moves as one at a time.
:func:`sweep_options` turns the batching, the Anderson mixing of the sweeps
(noetherflow/_anderson.py), the closed-form moves of statistics, the factored samples
(noetherflow/stats/sample_factors.py) and the side-by-side blocks on or off;
:func:`sequential_sweeps` is the reference path with none of them. Below them, what the
sweeps hold (:func:`coupled_samples`) and how one move or a run's moves carry θ, the samples,
ḡ and v along (:func:`move`, :func:`move_disjoint`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from noetherflow._blas import use_numpy
from noetherflow.kernels import kernel_for, kernels_of
from noetherflow.kernels.base import GroupSolve, transport_cotangent
from noetherflow.stats.core import GradStats
from noetherflow.stats.sample_factors import HeldSamples, SampleFactors
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "Step",
    "accelerated",
    "at_rest",
    "coupled_samples",
    "covariant",
    "factored",
    "move",
    "move_disjoint",
    "parallel",
    "plan_sweep",
    "sequential_sweeps",
    "steps_apart",
    "sweep_options",
]

_BATCH: ContextVar[bool] = ContextVar("noetherflow_batched_sweeps", default=True)
_ACCELERATE: ContextVar[bool] = ContextVar("noetherflow_accelerated_sweeps", default=True)
_COVARIANT: ContextVar[bool] = ContextVar("noetherflow_covariant_sweeps", default=True)
_FACTORED: ContextVar[bool] = ContextVar("noetherflow_factored_sweeps", default=True)
_PARALLEL: ContextVar[bool] = ContextVar("noetherflow_parallel_blocks", default=True)


@contextmanager
def sweep_options(
    *,
    batch: bool = True,
    accelerate: bool = True,
    covariant: bool = True,
    factored: bool = True,
    parallel: bool = True,
    numpy_blas: bool = True,
) -> Iterator[None]:
    """Within: batched runs, Anderson mixing, closed-form moves, factors, parallel blocks, or not.

    ``batch``: a run of disjoint symmetries of one kernel is one step. ``accelerate``:
    noetherflow/_anderson.py. ``covariant``: a kernel moves a moved symmetry's own
    statistics by its element where it has the law
    (:meth:`~noetherflow.kernels.Kernel.move_stats_`) instead of rebuilding them from
    transported samples. ``factored``: a linear layer's samples that the hooks kept as
    their two smaller factors are moved and read as those
    (:class:`~noetherflow.stats.sample_factors.SampleFactors`, :attr:`GradStats.factors
    <noetherflow.stats.core.GradStats>`) instead of as ``[N, *shape]`` tensors. ``parallel``:
    the independent coupled blocks run side by side on the intra-op threads, each on one
    (:func:`noetherflow._threads.side_by_side`; the same numbers as one after the other on
    one thread). ``numpy_blas``: the large CPU products through NumPy's BLAS
    (:mod:`noetherflow._blas`; the same numbers to rounding). All are on by default.
    """
    tokens = (
        _BATCH.set(batch),
        _ACCELERATE.set(accelerate),
        _COVARIANT.set(covariant),
        _FACTORED.set(factored),
        _PARALLEL.set(parallel),
    )
    try:
        with use_numpy(numpy_blas):
            yield
    finally:
        _BATCH.reset(tokens[0])
        _ACCELERATE.reset(tokens[1])
        _COVARIANT.reset(tokens[2])
        _FACTORED.reset(tokens[3])
        _PARALLEL.reset(tokens[4])


def sequential_sweeps() -> AbstractContextManager[None]:
    """Within: plain block Gauss–Seidel sweeps, the reference path.

    Every non-joint symmetry is its own step, no Anderson mixing, and every statistic a move
    changed rebuilt from the transported ``[N, *shape]`` samples (tests, benchmarks).
    """
    return sweep_options(
        batch=False, accelerate=False, covariant=False, factored=False, parallel=False
    )


def accelerated() -> bool:
    """Whether the sweeps may be Anderson-mixed (:func:`sweep_options`)."""
    return _ACCELERATE.get()


def covariant() -> bool:
    """Whether kernels may move statistics in closed form (:func:`sweep_options`)."""
    return _COVARIANT.get()


def factored() -> bool:
    """Whether coupled sweeps may hold samples as their factors (:func:`sweep_options`)."""
    return _FACTORED.get()


def parallel() -> bool:
    """Whether independent coupled blocks may run side by side (:func:`sweep_options`)."""
    return _PARALLEL.get()


@dataclass(frozen=True)
class Step:
    """One step of a sweep: ``kernel`` solves ``members`` jointly, as a disjoint run, or one."""

    kernel: Any
    members: list[Symmetry]
    disjoint: bool = False


def plan_sweep(
    part: Sequence[Symmetry], touches: Mapping[Symmetry, Sequence[Symmetry]] | None
) -> list[Step]:
    """The steps of one sweep over ``part``.

    ``touches``: per symmetry, those acting on a coordinate it acts on
    (:func:`noetherflow.kernels.base.overlaps`); None: the symmetries share no parameter at
    all (an uncoupled part), so every run is disjoint.
    """
    steps = [Step(k, members) for k, members in kernels_of(part) if k.joint]
    batch = _BATCH.get()
    run: list[Symmetry] = []
    near: set[Symmetry] = set()  # what the run's members touch
    for s in part:
        k = kernel_for(s)
        if k.joint:
            continue
        fits = (
            batch
            and k.batchable
            and run
            and kernel_for(run[0]) is k
            and (touches is None or s not in near)
        )
        if not fits:
            if run:
                steps.append(Step(kernel_for(run[0]), run, len(run) > 1))
            run, near = [], set()
        run.append(s)
        near.update(touches.get(s, ()) if touches is not None else ())
    if run:
        steps.append(Step(kernel_for(run[0]), run, len(run) > 1))
    return steps


def steps_apart(groups: list[Step], touches: Mapping[Symmetry, Sequence[Symmetry]]) -> bool:
    """Whether the steps after the first act on no common coordinate (none moves another's)."""
    seen: dict[Symmetry, int] = {}
    for j, step in enumerate(groups[1:]):
        for s in step.members:
            seen[s] = j
    return all(
        seen.get(t, j) == j for s, j in seen.items() for t in touches.get(s, ()) if t is not s
    )


def at_rest(res: GroupSolve, settled: float | None, stop: float) -> bool:
    """Whether a sweep's first step found the state the last sweep left at equilibrium.

    ``res``: that step's solve (its ``before``: its flow there); ``settled``: the largest
    flow the last sweep's later steps left (None: no such sweep, or its steps may move one
    another's coordinates).
    """
    return (
        settled is not None
        and settled <= stop
        and res.before is not None
        and res.before <= stop
        and not res.reports
    )


# -- what the sweeps hold and move ------------------------------------------------------
def coupled_samples(part: SymmetrySet, stats: GradStats) -> dict[nn.Parameter, HeldSamples]:
    """Float64 copies of a coupled part's per-sample gradients, each in its cheaper form.

    A linear layer's factors where the statistics kept them (smaller than the samples,
    :attr:`GradStats.factors`) and every kernel acting on it moves them (``Kernel.factored``;
    :func:`noetherflow._sweep_plan.sweep_options`); else ``[N, *shape]``, contiguous, so that
    the heads' slices are views (the batched products of kernels/rotation_batch.py).
    """
    out: dict[nn.Parameter, HeldSamples] = {}
    use = factored()
    for p in part.params():
        fac = stats.sample_factors(p) if use else None
        if fac is not None and all(
            kernel_for(s).factored for s in part if any(q is p for q in s.params)
        ):
            out[p] = fac.to(torch.float64)
        else:
            out[p] = stats.samples[p].to(
                torch.float64, copy=True, memory_format=torch.contiguous_format
            )
    return out


def move_disjoint(
    k: Any,
    moves: list[tuple[Symmetry, Any]],
    values: Mapping[nn.Parameter, Tensor],
    samples: Mapping[nn.Parameter, HeldSamples],
    disp: dict[nn.Parameter, Tensor],
    mean: Mapping[nn.Parameter, Tensor],
    read: Mapping[nn.Parameter, None] | None = None,
) -> None:
    """:func:`move` for every move of a disjoint run, the kernel's batched products.

    ``read``: the only parameters whose samples are moved (the kernel moved the movers' own
    statistics, :meth:`~noetherflow.kernels.Kernel.move_stats_`); None: all of them.
    """
    params = {p: None for s, _ in moves for p in s.params}
    k.act_disjoint_(moves, values)
    k.transport_disjoint_(moves, samples if read is None else {p: samples[p] for p in read})
    k.transport_disjoint_(moves, {p: mean[p].unsqueeze(0) for p in params})
    if disp and all(p in disp for p in params):
        k.transport_disjoint_(moves, {p: disp[p].unsqueeze(0) for p in params})
    elif disp:  # some parameters without a displacement: zeros there, as transport_cotangent
        for s, element in moves:
            transport_cotangent(s, element, disp)


def move(
    s: Symmetry,
    element: Any,
    values: Mapping[nn.Parameter, Tensor],
    samples: Mapping[nn.Parameter, HeldSamples],
    disp: dict[nn.Parameter, Tensor],
    mean: Mapping[nn.Parameter, Tensor],
) -> None:
    """Move θ by ``element``, and the per-sample gradients, ḡ and v by T^{-T}, in place."""
    s.act_(element, values)
    if any(isinstance(samples.get(p), SampleFactors) for p in s.params):
        kernel_for(s).transport_disjoint_([(s, element)], samples)  # its moves of factors
    else:  # all [N, *shape] tensors
        s.transport_grads_(element, cast(Mapping[nn.Parameter, Tensor], samples))
    # ḡ is the samples' mean: moved the same way (as one more sample), not recomputed
    s.transport_grads_(element, {p: mean[p].unsqueeze(0) for p in s.params})
    if disp:
        transport_cotangent(s, element, disp)
