"""The order of a solve's steps within one sweep (block Gauss–Seidel), and its batching.

Joint kernels solve all their symmetries in one step; the others one at a time, in set
order, after the joint ones (docs/concepts/equilibrium.md). A run of consecutive symmetries
of one ``batchable`` kernel whose coordinates are pairwise disjoint (the heads of one
attention layer) do not interact, so they are one batched step
(:meth:`~noetherflow.kernels.Kernel.solve_disjoint`): the same moves as one at a time.
:func:`sequential_sweeps` turns the batching off (the reference path, for tests).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from noetherflow.kernels import kernel_for, kernels_of
from noetherflow.symmetry.base import Symmetry

__all__ = ["Step", "plan_sweep", "sequential_sweeps"]

_SEQUENTIAL: ContextVar[bool] = ContextVar("noetherflow_sequential_sweeps", default=False)


@contextmanager
def sequential_sweeps() -> Iterator[None]:
    """Within: every non-joint symmetry is its own step (no batching), the reference order."""
    token = _SEQUENTIAL.set(True)
    try:
        yield
    finally:
        _SEQUENTIAL.reset(token)


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
    batch = not _SEQUENTIAL.get()
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
