"""The order of a solve's steps within one sweep (block Gauss–Seidel), and its batching.

Joint kernels solve all their symmetries in one step; the others one at a time, in set
order, after the joint ones (docs/concepts/equilibrium.md). A run of consecutive symmetries
of one ``batchable`` kernel whose coordinates are pairwise disjoint (the heads of one
attention layer) do not interact, so they are one batched step
(:meth:`~noetherflow.kernels.Kernel.solve_disjoint`): the same moves as one at a time.
:func:`sweep_options` turns the batching, the Anderson mixing of the sweeps
(noetherflow/_anderson.py), the closed-form moves of statistics and the factored samples
(noetherflow/stats/sample_factors.py) on or off;
:func:`sequential_sweeps` is the reference path with none of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from noetherflow.kernels import kernel_for, kernels_of
from noetherflow.symmetry.base import Symmetry

__all__ = [
    "Step",
    "accelerated",
    "covariant",
    "factored",
    "parallel",
    "plan_sweep",
    "sequential_sweeps",
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
    one thread). All are on by default.
    """
    tokens = (
        _BATCH.set(batch),
        _ACCELERATE.set(accelerate),
        _COVARIANT.set(covariant),
        _FACTORED.set(factored),
        _PARALLEL.set(parallel),
    )
    try:
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
