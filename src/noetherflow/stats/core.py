"""The statistics object every estimator returns, and its construction from per-sample gradients."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._errors import NonFiniteGradientError, StatisticsError
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.dense import DenseSymmetry
from noetherflow.symmetry.rotation import DoubleRotation
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["Estimator", "GradStats", "Level", "Reduction", "stats_from_samples"]


class Reduction(str, Enum):
    """How ``loss_fn`` reduces per-sample losses over the batch."""

    MEAN = "mean"
    SUM = "sum"


class Level(str, Enum):
    """How much per-coordinate detail the statistics of diagonal symmetries keep."""

    DIAG = "diag"  # E[g²] per coordinate of every parameter: flows, the solver, own analysis
    SOLVE = "solve"  # per coordinate only where the solver needs it, per-neuron sums elsewhere
    NEURON = "neuron"  # E[g²] summed per neuron/channel: flows only, O(B·d) extra work


class Estimator(str, Enum):
    """How per-sample gradient statistics are obtained."""

    HOOKS = "hooks"  # inputs and output-gradients of Linear/Conv layers; no per-sample gradients
    REFERENCE = "reference"  # torch.func vmap(grad): exact per-sample gradients (ground truth)
    MICROBATCH = "microbatch"  # one backward pass per micro-batch: any model, BatchNorm included


def axis_sum(v: Tensor, axis: int) -> Tensor:
    """Sum of ``v`` over every axis but ``axis``. Has shape ``[v.shape[axis]]``."""
    return v.movedim(axis, 0).reshape(v.shape[axis], -1).sum(1)


def parse_reduction(reduction: str | Reduction) -> Reduction:
    try:
        return Reduction(reduction)
    except ValueError:
        raise ValueError(
            f"reduction={reduction!r} is not supported; expected 'mean' (loss_fn returns the "
            "batch mean of per-sample losses) or 'sum' (their sum)."
        ) from None


@dataclass
class GradStats:
    """Sufficient statistics of the per-sample gradients g_n = ∇ℓ_n over a batch of N samples.

    Every entry is an average over samples (1/N Σ_n), so that ∇L = ``mean`` and the
    covariance is Σ = E[g gᵀ] − ḡḡᵀ (sampling with replacement; DESIGN §2).

    Attributes:
        n: number of samples N.
        mean: ḡ per parameter (shape of the parameter).
        sq: E[g ⊙ g] per parameter, for parameters of diagonal symmetries (``level="diag"``;
            with ``level="solve"`` only for parameters that generators act on along two axes).
        sq_axis: E[g ⊙ g] summed over every axis but one, keyed by (parameter, axis)
            (``level="neuron"`` and ``"solve"``: enough for flows, and for the solver on
            parameters that generators act on along one axis only).
        side: per rotation, (E[∇W_f ∇W_fᵀ], E[∇U_f ∇U_fᵀ]), each ``[d, d]`` (M_W and M_U of
            DESIGN §2.1 before scaling by the time model).
        dense: per dense symmetry, E[g gᵀ] over its parameters, ``[P, P]``.
        samples: per-sample gradients ``[N, *shape]`` where a solver needs to transport them
            (symmetries that share parameters with a rotation or dense symmetry), else empty.
        estimator: which estimator produced the statistics.
    """

    n: int
    mean: dict[nn.Parameter, Tensor] = field(default_factory=dict)
    sq: dict[nn.Parameter, Tensor] = field(default_factory=dict)
    sq_axis: dict[tuple[nn.Parameter, int], Tensor] = field(default_factory=dict)
    side: dict[Symmetry, tuple[Tensor, Tensor]] = field(default_factory=dict)
    dense: dict[Symmetry, Tensor] = field(default_factory=dict)
    samples: dict[nn.Parameter, Tensor] = field(default_factory=dict)
    estimator: str = "reference"

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

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteGradientError` if any statistic is NaN or infinite."""
        # A non-finite per-sample gradient makes its squares non-finite too, so the means of
        # parameters with squared statistics need no separate (full-size) pass.
        squared = set(self.sq) | {p for p, _ in self.sq_axis}
        groups: list[tuple[str, Mapping[Any, Tensor]]] = [
            ("mean gradient", {p: t for p, t in self.mean.items() if p not in squared}),
            ("squared gradient", self.sq),
            ("per-axis squared gradient", self.sq_axis),
            ("dense second moment", self.dense),
        ]
        for what, d in groups:
            for t in d.values():
                # One reduction instead of an elementwise mask: NaN and Inf propagate to the sum.
                if not torch.isfinite(t.sum()):
                    raise NonFiniteGradientError(
                        f"The {what} statistic has NaN/Inf entries (shape {tuple(t.shape)}); "
                        "expected finite per-sample gradients. Lower the learning rate or check "
                        "the data; pass check_finite=False to skip this check."
                    )
        for w, u in self.side.values():
            if not torch.isfinite(w.sum() + u.sum()):
                raise NonFiniteGradientError(
                    "A rotation second moment has NaN/Inf entries; expected finite per-sample "
                    "gradients. Pass check_finite=False to skip this check."
                )


def check_batch(n: int) -> None:
    if n < 2:
        raise StatisticsError(
            f"Got a batch of {n} sample(s); the gradient covariance Σ needs at least 2. "
            "Pass a larger batch (it is treated as the data distribution)."
        )


def needs_samples(syms: SymmetrySet) -> set[int]:
    """ids of parameters whose per-sample gradients a solver must keep (coupled or dense)."""
    # Once any symmetry is coupled, the solver sweeps over all of them with transported
    # per-sample gradients, so every parameter's samples are kept.
    if syms.coupled_groups():
        return {id(p) for p in syms.params()}
    return set()


def stats_from_samples(
    samples: Mapping[nn.Parameter, Tensor], syms: SymmetrySet, *, estimator: str
) -> GradStats:
    """Build :class:`GradStats` from per-sample gradients ``[N, *shape]`` per parameter."""
    n = next(iter(samples.values())).shape[0]
    check_batch(n)
    st = GradStats(n=n, estimator=estimator)
    keep = needs_samples(syms)
    for s in syms:
        for p in s.params:
            g = samples[p]
            if p not in st.mean:
                st.mean[p] = g.mean(0)
            if s.is_diagonal and p not in st.sq:
                st.sq[p] = g.square().mean(0)
            if id(p) in keep:
                st.samples[p] = g
        if isinstance(s, DoubleRotation):
            st.side[s] = (side_moment(s, "w", samples), side_moment(s, "u", samples))
        elif isinstance(s, DenseSymmetry):
            f = s.flat_batched(samples)
            st.dense[s] = f.T @ f / n
    return st


def side_moment(s: DoubleRotation, which: str, samples: Mapping[nn.Parameter, Tensor]) -> Tensor:
    """(1/N) Σ_n F_n F_nᵀ for the d-front per-sample gradients F_n of one side. ``[d, d]``."""
    blocks = s.w_blocks if which == "w" else s.u_blocks
    out: Tensor | None = None
    for b in blocks:
        f = b.front_batched(samples[b.param])
        m = torch.einsum("ndm,nem->de", f, f) / f.shape[0]
        out = m if out is None else out + m
    assert out is not None
    return out
