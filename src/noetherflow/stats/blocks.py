"""GradStats = ḡ + one statistics block per family: the families' registry and the assembly.

Each symmetry family's kernel (:mod:`noetherflow.kernels`) is registered here, by symmetry
class (:data:`KERNELS`, resolved by MRO; ``noetherflow.kernels.register_kernel`` writes it),
and collects its block from a :class:`~noetherflow.stats.source.GradSource`
(:meth:`BlockCollector.collect`). The registry lives at the statistics layer so that the
estimators (``collect_stats``: hooks, reference, micro-batch) assemble :class:`GradStats`
without importing the kernels above them; this module asks a kernel only for its block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

from torch import Tensor, nn

from noetherflow._registry import Registry
from noetherflow.stats.core import GradStats, Level, StatsBlock, check_batch
from noetherflow.stats.sample_factors import SampleFactors
from noetherflow.stats.source import GradSource, SampleSource
from noetherflow.symmetry.base import Symmetry, unique_params
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "KERNELS",
    "BlockCollector",
    "assemble",
    "collectors_of",
    "needs_samples",
    "refresh_stats_",
    "stats_from_samples",
]


class BlockCollector(Protocol):
    """What the assembly asks of a family's kernel: its block's key and the block itself."""

    name: ClassVar[str]

    def sample_params(self, syms: Sequence[Any]) -> list[nn.Parameter]:
        """Parameters whose per-sample gradients the kernel needs (materialised first)."""
        ...

    def collect(self, syms: Sequence[Any], src: GradSource, level: Level) -> StatsBlock:
        """The statistics block of ``syms`` from ``src``."""
        ...


KERNELS: Registry[BlockCollector] = Registry(
    "kernel", register_with="noetherflow.kernels.register_kernel(cls, kernel)", flag="overwrite"
)


def collectors_of(
    syms: SymmetrySet | Sequence[Symmetry],
) -> list[tuple[BlockCollector, list[Any]]]:
    """(kernel, its symmetries in set order) for every kernel in use, in registration order.

    Raises:
        TypeError: a symmetry whose class has no kernel (the message names the fix).
    """
    # The built-in kernels register themselves when noetherflow.kernels is imported; a caller
    # of collect_stats may not have imported it (the one upward import of this layer).
    import noetherflow.kernels  # noqa: F401

    groups: dict[int, tuple[BlockCollector, list[Any]]] = {}
    for s in syms:
        try:
            k = KERNELS[type(s)]
        except KeyError as e:
            raise TypeError(f"{e.args[0]} (See the docs' Extending page.)") from None
        groups.setdefault(id(k), (k, []))[1].append(s)
    order = {id(k): i for i, k in enumerate(dict.fromkeys(KERNELS.values()))}
    return sorted(groups.values(), key=lambda kv: order.get(id(kv[0]), len(order)))


def needs_samples(syms: SymmetrySet) -> list[nn.Parameter]:
    """Parameters whose per-sample gradients a solver must keep: those of coupled groups.

    The solver sweeps over each coupled group (:meth:`SymmetrySet.coupled_groups`) with its
    per-sample gradients transported along the orbit; the other symmetries need none.
    """
    return unique_params([syms[i] for g in syms.coupled_groups() for i in g])


def assemble(
    src: GradSource,
    syms: SymmetrySet,
    *,
    level: Level,
    estimator: str,
    min_n: int = 2,
    keep_samples: bool = True,
) -> GradStats:
    """:class:`GradStats` of ``syms`` from a gradient source: ḡ, then one block per kernel.

    ``min_n=1`` admits a single sample: a micro-batch whose statistics are merged with
    others (:func:`noetherflow.stats.accumulate.merge_accumulated`) before Σ is used.
    ``keep_samples=False``: no per-sample gradients are kept for the coupled solver
    (:func:`needs_samples`), for statistics that no solve will read (the monitor's flow
    records); the same statistics otherwise, to round-off.
    """
    check_batch(src.n, min_n)
    st = GradStats(n=src.n, estimator=estimator)
    groups = collectors_of(syms)
    keep = needs_samples(syms) if keep_samples else []
    for p in keep:
        st.samples[p] = src.samples(p)
        fac = src.sample_factors(p)
        if fac is not None:  # the same samples, smaller: the coupled solver's form
            st.factors[p] = (st.samples[p], fac)
    for k, members in groups:  # materialise first, so later statistics reduce them
        for p in k.sample_params(members):
            src.samples(p)
    for p in syms.params():
        st.mean[p] = src.mean(p)
    for k, members in groups:
        st.blocks[k.name] = k.collect(members, src, level)
    return st


def stats_from_samples(
    samples: Mapping[nn.Parameter, Tensor | SampleFactors],
    syms: SymmetrySet,
    *,
    estimator: str,
    level: Level = Level.DIAG,
    keep_samples: bool = True,
) -> GradStats:
    """Build :class:`GradStats` from per-sample gradients ``[N, *shape]`` per parameter.

    An entry may be :class:`SampleFactors` (:class:`SampleSource`). ``level="solve"``: the
    diagonal statistics the solver needs, per-neuron sums wherever they suffice
    (:class:`SampleSource` ``reduced``). ``keep_samples``: as in :func:`assemble` (the
    coupled solver keeps its own mapping of them).
    """
    n = next(iter(samples.values())).shape[0]
    check_batch(n)
    src = SampleSource(samples, reduced=level is Level.SOLVE)
    return assemble(src, syms, level=level, estimator=estimator, keep_samples=keep_samples)


def refresh_stats_(
    stats: GradStats,
    samples: Mapping[nn.Parameter, Tensor | SampleFactors],
    syms: Sequence[Symmetry],
    *,
    means: bool = True,
    level: Level = Level.DIAG,
) -> None:
    """Recompute in place ḡ and each kernel's statistics of ``syms`` only, from ``samples``.

    What :func:`stats_from_samples` would give for these symmetries; the entries of other
    symmetries are kept. The coupled solver calls it after a move, for the symmetries whose
    coordinates the move touched, instead of re-assembling every block. ``means=False``
    keeps ḡ: the caller moved it along with the samples (ḡ is their mean, and the transport
    T^{-T} is linear), which spares a pass over every sample of a large fused parameter per
    move. ``level``: as in :func:`stats_from_samples`.
    """
    if not syms:
        return
    src = SampleSource(samples, reduced=level is Level.SOLVE)
    for p in unique_params(syms) if means else ():
        stats.mean[p] = src.mean(p)
    for k, members in collectors_of(syms):
        new = k.collect(members, src, level)
        old = stats.blocks.get(k.name)
        if old is None:
            stats.blocks[k.name] = new
            continue
        for f in dataclasses.fields(new):
            getattr(old, f.name).update(getattr(new, f.name))
