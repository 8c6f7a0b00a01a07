"""The statistics object every estimator returns: the mean gradient plus one block per kernel.

:class:`GradStats` knows no symmetry family. Each kernel (:mod:`noetherflow.kernels`) stores
what its family needs in its own typed :class:`StatsBlock`; the drivers (DDP reduction,
finiteness check, the solver) walk a block's tensors without knowing its fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from noetherflow import _shard
from noetherflow._checks import parse_enum
from noetherflow._divergence import is_finite
from noetherflow._errors import NonFiniteGradientError, StatisticsError
from noetherflow.stats.sample_factors import SampleFactors

__all__ = ["Estimator", "GradStats", "Level", "Reduction", "SmallBatchError", "StatsBlock"]


class SmallBatchError(StatisticsError):
    """Fewer samples than the gradient covariance Σ needs (a batch of one)."""


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

    HOOKS = "hooks"  # inputs and output-gradients of registered layers; no per-sample gradients
    REFERENCE = "reference"  # torch.func vmap(grad): exact per-sample gradients (ground truth)
    MICROBATCH = "microbatch"  # one backward pass per micro-batch: any model, BatchNorm included


def axis_sum(v: Tensor, axis: int) -> Tensor:
    """Sum of ``v`` over every axis but ``axis``. Has shape ``[v.shape[axis]]``."""
    return v.movedim(axis, 0).reshape(v.shape[axis], -1).sum(1)


def axis_norm_sq(v: Tensor, axis: int, dtype: torch.dtype | None = None) -> Tensor:
    """Σ of v² over every axis but ``axis``, in one fused reduction. ``[v.shape[axis]]``.

    ``dtype``: accumulate in it (float64 from a float32 ``v``: the numbers of reducing a
    float64 copy, bit for bit, with no copy made).
    """
    rest = [k for k in range(v.dim()) if k != axis]
    if not rest:
        return v.to(dtype or v.dtype).square()
    return torch.linalg.vector_norm(v, dim=rest, dtype=dtype).square()


def parse_reduction(reduction: str | Reduction) -> Reduction:
    """``Reduction(reduction)`` with an error that explains the members."""
    return parse_enum(
        Reduction,
        reduction,
        "reduction",
        "'mean' (loss_fn returns the batch mean of per-sample losses) or 'sum' (their sum)",
    )


def parse_level(level: str | Level) -> Level:
    """``Level(level)`` with an error that explains the members."""
    return parse_enum(
        Level,
        level,
        "level",
        "'diag' (per-coordinate E[g²] of every parameter), 'solve' (what solve_equilibrium "
        "needs, cheaper) or 'neuron' (per-neuron sums: flows only, cheapest)",
    )


def check_batch(n: int, minimum: int = 2) -> None:
    """Σ needs at least two samples (``minimum=1``: a part of a batch, merged later)."""
    if n < minimum:
        raise SmallBatchError(
            f"Got a batch of {n} sample(s); the gradient covariance Σ needs at least 2. "
            "Pass a larger batch (it is treated as the data distribution)."
        )


Entry = tuple[str, Any, int]  # (field, key, slot): one tensor of a block
_FIELDS: dict[type, tuple[str, ...]] = {}


@dataclass
class StatsBlock:
    """Base of a kernel's statistics: a dataclass whose fields are dicts of tensors.

    A value is a tensor or a tuple of tensors (e.g. the two moments of a rotation). Every
    entry is an average over samples (1/N Σ_n), so that the DDP reduction can combine blocks
    of any kernel as Σ_r (N_r/N)·stat_r without knowing their fields. ``key`` names the
    block in :attr:`GradStats.blocks` (the kernel's name).
    """

    key: ClassVar[str] = ""
    types: ClassVar[list[type[StatsBlock]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        StatsBlock.types.append(cls)

    def _fields(self) -> tuple[str, ...]:
        cls = type(self)
        names = _FIELDS.get(cls)
        if names is None:
            names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(self))
        return names

    def entries(self) -> list[Entry]:
        """(field, key, slot) of every tensor, in an order every rank shares."""
        out: list[Entry] = []
        for name in self._fields():
            for k, v in getattr(self, name).items():
                if isinstance(v, tuple):
                    out += [(name, k, i) for i in range(len(v))]
                else:
                    out.append((name, k, -1))
        return out

    def get_entry(self, entry: Entry) -> Tensor:
        """The tensor at ``entry`` (from :meth:`entries`)."""
        name, k, slot = entry
        v = getattr(self, name)[k]
        t: Tensor = v if slot < 0 else v[slot]
        return t

    def set_entry(self, entry: Entry, value: Tensor) -> None:
        """Replace the tensor at ``entry`` (from :meth:`entries`) by ``value``."""
        name, k, slot = entry
        d = getattr(self, name)
        if slot < 0:
            d[k] = value
        else:
            items = list(d[k])
            items[slot] = value
            d[k] = tuple(items)

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(description, tensor) of every entry, for finiteness checks and reports."""
        for name in self._fields():
            what = f"{self.key} {name}"
            for v in getattr(self, name).values():
                if isinstance(v, tuple):
                    for t in v:
                        yield what, t
                else:
                    yield what, v

    def second_moment_params(self) -> set[int]:
        """The ids of parameters each of whose coordinates enters a second moment of this block.

        A non-finite per-sample gradient makes its square non-finite too, so the mean of such
        a parameter needs no separate finiteness pass. Default: none.
        """
        return set()


@dataclass
class GradStats:
    """Sufficient statistics of the per-sample gradients g_n = ∇ℓ_n over a batch of N samples.

    Every entry is an average over samples (1/N Σ_n), so that ∇L = ``mean`` and the
    covariance is Σ = E[g gᵀ] − ḡḡᵀ (sampling with replacement; docs/concepts/flow.md).

    Attributes:
        n: number of samples N.
        mean: ḡ per parameter (shape of the parameter).
        blocks: one :class:`StatsBlock` per kernel in use, keyed by kernel name, with what
            that family's noise term needs (e.g. E[g²] for diagonal families, d×d moments for
            rotations, E[ggᵀ] for dense generators).
        samples: per-sample gradients ``[N, *shape]`` where a solver needs to transport them
            (coupled symmetry sets), else empty.
        factors: where the hooks read a parameter of ``samples`` as a linear layer's two
            factors and those are smaller, the same samples as
            :class:`~noetherflow.stats.sample_factors.SampleFactors` (the coupled solver moves
            and reads them instead, :meth:`sample_factors`); only valid while ``samples``
            holds the very tensor they were made with (a merge or rescaling of the samples
            leaves them out).
        estimator: which estimator produced the statistics.
        displacement: the momentum displacement v = −η·buffer per parameter (SGD with
            momentum; :func:`noetherflow.optim.momentum_displacement`), for the cross term
            c_cross·vᵀA∇L of the flows and solvers; empty: v = 0. Set by the ``displacement=``
            argument of the flows and solvers and by the monitor.
        fingerprint: :func:`~noetherflow._checks.fingerprint` of each parameter when the
            gradients were computed; the flows and solvers refuse statistics whose parameters
            changed since (an optimizer step in between). Empty: not checked.

    The fields of the blocks read as attributes too (``stats.sq`` is the diagonal block's
    ``sq``; an empty dict when no symmetry of that kind is in the set).
    """

    n: int
    mean: dict[nn.Parameter, Tensor] = field(default_factory=dict)
    blocks: dict[str, StatsBlock] = field(default_factory=dict)
    samples: dict[nn.Parameter, Tensor] = field(default_factory=dict)
    factors: dict[nn.Parameter, tuple[Tensor, SampleFactors]] = field(default_factory=dict)
    estimator: str = Estimator.REFERENCE.value
    displacement: dict[nn.Parameter, Tensor] = field(default_factory=dict)
    fingerprint: dict[nn.Parameter, tuple[float, float, float]] = field(default_factory=dict)

    def __repr__(self) -> str:
        # The tensors themselves would run to hundreds of lines for a small model.
        return (
            f"GradStats(n={self.n}, estimator={self.estimator!r}, params={len(self.mean)}, "
            f"blocks={sorted(self.blocks)}, samples={len(self.samples)})"
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: a field of some kernel's block.
        if name.startswith("_") or name in (
            "blocks",
            "mean",
            "samples",
            "factors",
            "n",
            "estimator",
            "displacement",
            "fingerprint",
        ):
            raise AttributeError(name)
        blocks = self.__dict__.get("blocks", {})
        for cls in StatsBlock.types:
            if name in {f.name for f in dataclasses.fields(cls)}:
                b = blocks.get(cls.key)
                return getattr(b, name) if b is not None else {}
        raise AttributeError(
            f"GradStats has no attribute {name!r}; its fields are n, mean, blocks, samples, "
            f"estimator, displacement and the fields of the kernels' blocks "
            f"{sorted({f.name for c in StatsBlock.types for f in dataclasses.fields(c)})}."
        )

    def sample_factors(self, p: nn.Parameter) -> SampleFactors | None:
        """The factors of ``p``'s samples, where kept and still those of ``samples[p]``."""
        entry = self.factors.get(p)
        if entry is None or self.samples.get(p) is not entry[0]:
            return None
        return entry[1]

    def block(self, key: str) -> StatsBlock | None:
        """The block of the kernel named ``key`` (None when no symmetry of that kind)."""
        return self.blocks.get(key)

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(description, tensor) of every statistic but the per-sample gradients."""
        for t in self.mean.values():
            yield "mean gradient", t
        for b in self.blocks.values():
            yield from b.tensors()

    def all_finite(self) -> bool:
        """Whether every statistic is finite (the check of :meth:`check_finite`, no raise)."""
        try:
            self.check_finite()
        except NonFiniteGradientError:
            return False
        return True

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteGradientError` if any statistic is NaN or infinite."""
        covered: set[int] = set()
        for b in self.blocks.values():
            covered |= b.second_moment_params()
        groups: list[tuple[str, Tensor]] = [
            ("mean gradient", t) for p, t in self.mean.items() if id(p) not in covered
        ]
        for b in self.blocks.values():
            groups += list(b.tensors())
        for what, t in groups:
            if not is_finite(t):
                raise NonFiniteGradientError(
                    f"The {what} statistic has NaN/Inf entries (shape {tuple(t.shape)}); "
                    "expected finite per-sample gradients. Lower the learning rate or check "
                    "the data; pass check_finite=False to skip this check."
                )


def with_displacement(
    stats: GradStats,
    displacement: Any,
    params: list[nn.Parameter],
    who: str,
    momentum: float | None = None,
) -> GradStats:
    """``stats`` with the momentum displacement v set (a shallow copy; ``None``: unchanged).

    ``displacement`` maps parameters to v (their shape; entries of parameters outside
    ``params`` are left out, but at least one must be in it), or is the ``torch.optim.SGD``
    to read it from (:func:`noetherflow.optim.momentum_displacement`). ``momentum``: the β of
    the noise model it is used with (checked against the optimizer's; a displacement without
    momentum is refused).

    Raises:
        TypeError: not a mapping or an SGD, keys that are not parameters, values that are not
            floating-point tensors.
        ValueError: no parameter of ``params``, a wrong shape, a noise model without
            momentum, or a β other than the optimizer's.
        NonFiniteGradientError: NaN/Inf entries.
    """
    if displacement is None:
        return stats
    fix = "pass the SGD itself (displacement=opt) or nf.momentum_displacement(opt, syms.params())"
    if not momentum:
        raise ValueError(
            f"{who}: displacement= was given but the noise model has no momentum (β = "
            f"{momentum!r}), so its cross term would be dropped; expected momentum=β of the "
            "SGD whose buffers these are (or NoiseModel.from_optimizer(opt, batch_size))."
        )
    if isinstance(displacement, torch.optim.Optimizer):
        from noetherflow.optim.groups import read_groups
        from noetherflow.optim.momentum import momentum_displacement

        ids = {id(p) for p in params}
        groups = [g for g in read_groups(displacement) if any(id(p) in ids for p in g.params)]
        if not groups:
            raise ValueError(
                f"{who}: the {type(displacement).__name__} given as displacement= holds none of "
                "the symmetry set's parameters (another model, or a copy?); expected the "
                "optimizer that trains these parameters."
            )
        betas = sorted({g.momentum if g.kind == "sgd" else 0.0 for g in groups})
        if betas != [float(momentum)]:
            raise ValueError(
                f"{who}: the optimizer's momentum is {betas} but the noise model's is "
                f"{momentum!r}; expected the same β (NoiseModel.from_optimizer(opt, batch_size) "
                "reads it)."
            )
        displacement = momentum_displacement(displacement, params)
    if not isinstance(displacement, Mapping):
        raise TypeError(
            f"{who}: displacement is a {type(displacement).__name__}; expected a mapping "
            f"parameter → v = −lr·momentum_buffer, or the torch.optim.SGD: {fix}."
        )
    known = {id(p) for p in params}
    for p, v in displacement.items():
        if not isinstance(p, torch.Tensor):
            raise TypeError(
                f"{who}: displacement has a key of type {type(p).__name__} ({p!r:.40}); "
                f"expected nn.Parameter keys (the parameters themselves, not names): {fix}."
            )
        if not isinstance(v, torch.Tensor) or not (v.is_floating_point() and not v.is_meta):
            what = type(v).__name__ if not isinstance(v, torch.Tensor) else f"{v.dtype} tensor"
            raise TypeError(
                f"{who}: the displacement of a parameter of shape {tuple(p.shape)} is a {what}; "
                f"expected a floating-point tensor v = −lr·momentum_buffer: {fix}."
            )
    mine = {p: v for p, v in displacement.items() if id(p) in known}
    if displacement and not mine:
        raise ValueError(
            f"{who}: displacement holds none of the symmetry set's parameters (another model's "
            f"parameters?); expected tensors keyed by the parameters the symmetries act on: "
            f"{fix}."
        )
    out: dict[nn.Parameter, Tensor] = {}
    for p, v in mine.items():
        v = _shard.full(v.detach())  # an FSDP2 buffer: whole, as the statistics are
        if tuple(v.shape) != tuple(p.shape):
            raise ValueError(
                f"{who}: displacement of a parameter of shape {tuple(p.shape)} has shape "
                f"{tuple(v.shape)}; expected the parameter's shape (v = −lr·momentum_buffer)."
            )
        if not is_finite(v):
            raise NonFiniteGradientError(
                f"{who}: the displacement of a parameter of shape {tuple(p.shape)} has NaN/Inf "
                "entries; expected a finite momentum buffer (the run has diverged?)."
            )
        out[p] = v.detach().to(stats.mean[p].dtype if p in stats.mean else v.dtype)
    return dataclasses.replace(stats, displacement=out)
