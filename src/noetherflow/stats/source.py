"""Raw material of the statistics: the primitives every estimator gives, one interface.

A :class:`GradSource` answers the few questions a family's kernel asks of one batch (ḡ,
E[g ⊙ g], per-axis sums, d × d front moments, per-sample gradients), whatever the estimator:
:class:`SampleSource` over per-sample gradients (reference, micro-batch),
:class:`~noetherflow.stats.factor_source.FactorSource` over layer factors a/g (hooks). The
kernels (:mod:`noetherflow.kernels`) read only this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from torch import Tensor, nn
from typing_extensions import override

from noetherflow.stats.core import axis_sum
from noetherflow.stats.sample_factors import SampleFactors, axis_sq, block_grams, dense_of

__all__ = ["GradSource", "SampleSource"]


class GradSource(ABC):
    """Primitive gradient statistics of one batch, whatever the estimator.

    All results are averages over the N samples and keep the parameter's dtype.
    """

    n: int

    @abstractmethod
    def has_samples(self, p: nn.Parameter) -> bool:
        """Whether per-sample gradients of ``p`` are at hand (then reductions are cheap)."""

    @abstractmethod
    def samples(self, p: nn.Parameter) -> Tensor:
        """Per-sample gradients ``[N, *p.shape]`` (materialised if needed)."""

    def sample_factors(self, p: nn.Parameter) -> SampleFactors | None:
        """``p``'s per-sample gradients as a linear layer's factors, where held and smaller.

        :class:`SampleFactors`; None: use :meth:`samples`.
        """
        return None

    @abstractmethod
    def mean(self, p: nn.Parameter) -> Tensor:
        """ḡ of ``p`` (shape of ``p``)."""

    @abstractmethod
    def sq(self, p: nn.Parameter) -> Tensor:
        """E[g ⊙ g] of ``p`` per coordinate (shape of ``p``)."""

    @abstractmethod
    def axis_sq(
        self, want: Mapping[nn.Parameter, tuple[int, ...]]
    ) -> dict[tuple[nn.Parameter, int], Tensor]:
        """E[g ⊙ g] summed over every axis but ``axis``, for each (p, axis) in ``want``."""

    @abstractmethod
    def front_moment(self, p: nn.Parameter, axis: int, start: int, stop: int) -> Tensor:
        """(1/N) Σ_n F_n F_nᵀ. Has shape ``[d, d]``.

        F_n is the slice [start, stop) of g_n along ``axis``, moved to the front and
        flattened: ``[d, m]``.
        """


class SampleSource(GradSource):
    """A :class:`GradSource` over per-sample gradients ``[N, *shape]`` per parameter.

    An entry may be :class:`SampleFactors` instead (the coupled solver's form of a linear
    layer's samples): the reductions read the factors; :meth:`samples` materialises them.

    ``reduced``: kernels are told no samples are at hand, so that at ``level="solve"`` the
    diagonal statistics are per-neuron sums wherever the solver needs no more (the coupled
    sweeps rebuild them after every move: a grid per coordinate of a fused projection costs
    far more to build and to solve on than its per-neuron sums).
    """

    def __init__(
        self, samples: Mapping[nn.Parameter, Tensor | SampleFactors], *, reduced: bool = False
    ) -> None:
        self._samples = samples
        self.n = int(next(iter(samples.values())).shape[0])
        self._sq: dict[nn.Parameter, Tensor] = {}
        self._reduced = reduced

    @override
    def has_samples(self, p: nn.Parameter) -> bool:
        return not self._reduced

    @override
    def samples(self, p: nn.Parameter) -> Tensor:
        return dense_of(self._samples[p])

    def held(self, p: nn.Parameter) -> Tensor | SampleFactors:
        """``p``'s samples in the form they are held (:class:`SampleFactors` or ``[N, *shape]``)."""
        return self._samples[p]

    @override
    def sample_factors(self, p: nn.Parameter) -> SampleFactors | None:
        v = self._samples[p]
        return v if isinstance(v, SampleFactors) else None

    @override
    def mean(self, p: nn.Parameter) -> Tensor:
        v = self._samples[p]
        return v.mean() if isinstance(v, SampleFactors) else v.mean(0)

    @override
    def sq(self, p: nn.Parameter) -> Tensor:
        if p not in self._sq:
            self._sq[p] = self.samples(p).square().mean(0)
        return self._sq[p]

    @override
    def axis_sq(
        self, want: Mapping[nn.Parameter, tuple[int, ...]]
    ) -> dict[tuple[nn.Parameter, int], Tensor]:
        out = {}
        for p, axes in want.items():
            for ax in axes:
                if p in self._sq:
                    out[p, ax] = axis_sum(self._sq[p], ax)
                    continue
                # one fused reduction (or the factors'): no [N, *shape] temporary of squares
                # (a large fused projection's samples are refreshed after every coupled move)
                out[p, ax] = axis_sq(self._samples[p], ax) / self.n
        return out

    @override
    def front_moment(self, p: nn.Parameter, axis: int, start: int, stop: int) -> Tensor:
        v = self._samples[p]
        if isinstance(v, SampleFactors):
            return block_grams(v, axis, [start], stop - start)[0] / self.n
        # [N, *shape] → rows (n, other coordinates) × d: one matrix product, no einsum path
        f = v.movedim(axis + 1, -1)[..., start:stop].reshape(-1, stop - start)
        return (f.T @ f) / v.shape[0]
