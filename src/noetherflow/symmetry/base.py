"""The one small interface every symmetry family implements.

An exponential symmetry (paper Def. 4.1) is a linear group action θ ↦ Tθ that leaves every
per-sample loss unchanged. Each family stores which parameters it acts on, how a group
element acts on them (``apply_``), how it acts on gradients (the orbit transport law
∇ℓ(Tθ) = T^{-T}∇ℓ(θ), paper eqs. 34–37), and its Noether charge C(θ) = θᵀAθ (eq. 6).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, cast

import torch
from torch import Tensor, nn
from typing_extensions import override

from noetherflow import _shard
from noetherflow._errors import SymmetryDefinitionError

__all__ = ["DiagonalSymmetry", "DiagonalTerm", "Family", "Slab", "Symmetry"]

# (axis, start, stop): the coordinates of a parameter whose index along axis is in the range
Slab: TypeAlias = tuple[int, int, int]


class Family(str):
    """The name of a symmetry family: an open identity, not a closed list.

    The paper's families (§4.2) are the constants ``Family.RESCALING``, ``SCALE``,
    ``ROTATION`` and ``DENSE``; a new family names itself, ``Family("my-family")``. A family
    carries no behaviour: what callers need to know is a capability of the
    :class:`Symmetry` (``commuting``, ``scale_invariant``, ``needs_zero_eps``,
    ``normalisation``, :meth:`Symmetry.acted_axes`) or of its kernel.
    """

    RESCALING: ClassVar[Family]
    SCALE: ClassVar[Family]
    ROTATION: ClassVar[Family]
    DENSE: ClassVar[Family]

    def __new__(cls, name: str) -> Family:  # noqa: D102  # documented in the class
        if not isinstance(name, str) or not name:
            raise ValueError(f"Family({name!r}): expected a non-empty name, e.g. 'rescaling'.")
        return super().__new__(cls, name)

    @property
    def value(self) -> str:
        """The family's name (as the former enum's ``.value``)."""
        return str(self)

    def __repr__(self) -> str:
        return f"Family({str(self)!r})"


Family.RESCALING = Family("rescaling")
Family.SCALE = Family("scale")
Family.ROTATION = Family("rotation")
Family.DENSE = Family("dense")


@dataclass(frozen=True, eq=False)
class DiagonalTerm:
    """How a set of diagonal generators acts on one parameter.

    Generator j acts on the coordinates of ``param`` whose index along ``axis`` lies in
    ``[j·block, (j+1)·block)``, all with the same generator entry a = ``sign``; e.g. the rows
    of a layer's weight (axis 0, block 1, +1) or the flattened columns of a conv channel
    (axis 1, block H·W, −1). This structure turns every sum over coordinates into a reshape.

    ``groups`` > 1 (``axis`` ≥ 1): axis 0 is split into ``groups`` equal contiguous chunks
    and each chunk has generators of its own, generator γ·J + j acting on block j along
    ``axis`` within chunk γ (J = size along ``axis`` // ``block``): the input channels of a
    grouped convolution, whose weight ``[O, I/G, k…]`` reads input channel γ·I/G + i only in
    the rows of group γ, at column i.

    ``start`` and ``length`` (None: to the end) restrict the term to the slice
    ``[start, start + length)`` of ``axis``: the generators' blocks tile that slice and the
    rest of the axis has entry 0 (untouched). Two terms of one symmetry may act on two slices
    of one parameter, e.g. Mamba's ``x_proj`` rows of B (+1) against its rows of C (−1), with
    the Δ rows in neither.
    """

    param: nn.Parameter
    axis: int
    block: int
    sign: float
    groups: int = 1
    start: int = 0
    length: int | None = None

    def __post_init__(self) -> None:
        size = (
            int(self.param.shape[self.axis])
            if -self.param.dim() <= self.axis < self.param.dim()
            else -1
        )
        span = size - self.start if self.length is None else self.length
        if size < 0 or self.start < 0 or span < 1 or self.start + span > size:
            raise SymmetryDefinitionError(
                f"DiagonalTerm: slice start={self.start}, length={self.length} along axis "
                f"{self.axis} of a parameter of shape {tuple(self.param.shape)}; expected a "
                "non-empty slice inside the axis."
            )
        if self.groups > 1 and self.sliced:
            raise SymmetryDefinitionError(
                f"DiagonalTerm: groups={self.groups} with the slice start={self.start}, "
                f"length={self.length}; a grouped term covers its whole axis."
            )
        if self.groups < 1 or (self.groups > 1 and self.axis == 0):
            raise SymmetryDefinitionError(
                f"DiagonalTerm: groups={self.groups} along axis {self.axis}; expected groups "
                ">= 1, and groups > 1 only along an axis other than 0 (axis 0 holds the groups)."
            )
        if self.groups > 1 and self.param.shape[0] % self.groups != 0:
            raise SymmetryDefinitionError(
                f"DiagonalTerm: groups={self.groups} do not divide axis 0 of a parameter of "
                f"shape {tuple(self.param.shape)}; expected equal groups of rows."
            )

    @property
    def span(self) -> int:
        """The length of the slice the term covers along ``axis`` (the whole axis by default)."""
        size = int(self.param.shape[self.axis])
        return size - self.start if self.length is None else self.length

    @property
    def sliced(self) -> bool:
        """Whether the term covers part of its axis only."""
        return self.start != 0 or self.span != int(self.param.shape[self.axis])

    @property
    def per_group(self) -> int:
        """Generators per group J: the length of the slice along ``axis`` divided by ``block``."""
        return self.span // self.block

    @property
    def num_generators(self) -> int:
        """Number of generators: ``groups`` · J."""
        return self.groups * self.per_group

    def reduce(self, v: Tensor) -> Tensor:
        """Σ_{k ∈ generator j} a_k v_k for ``v`` of the parameter's shape. ``[num_generators]``."""
        if self.groups == 1:
            w = v.movedim(self.axis, 0).narrow(0, self.start, self.span)
            return self.sign * w.reshape(self.num_generators, -1).sum(1)
        w = v.reshape(self.groups, -1, *v.shape[1:]).movedim(self.axis + 1, 1)
        return self.sign * w.reshape(self.groups, self.per_group, -1).sum(2).reshape(-1)

    def reduce_axis(self, v: Tensor) -> Tensor:
        """:meth:`reduce` of a per-index vector ``v`` ``[param.shape[axis]]``. ``[J]``."""
        w = v.narrow(0, self.start, self.span)
        return self.sign * w.reshape(self.num_generators, -1).sum(1)

    def expand(self, lam: Tensor) -> Tensor:
        """a_k λ_{j(k)}, broadcastable to the parameter's shape (and to ``[N, *shape]``).

        0 outside the term's slice.
        """
        view = [1] * self.param.dim()
        view[self.axis] = -1
        if self.groups == 1:
            e = self.sign * lam.repeat_interleave(self.block)
            if self.sliced:
                size = int(self.param.shape[self.axis])
                e = torch.cat(
                    [e.new_zeros(self.start), e, e.new_zeros(size - self.start - self.span)]
                )
            return e.view(view)
        per = (self.sign * lam).reshape(self.groups, -1).repeat_interleave(self.block, dim=1)
        rows = int(self.param.shape[0])
        tail = [per.shape[1] if k == self.axis else 1 for k in range(1, self.param.dim())]
        full = per.reshape(self.groups, 1, *tail).expand(self.groups, rows // self.groups, *tail)
        return full.reshape(rows, *tail)


def check_params(params: Sequence[nn.Parameter], who: str) -> None:
    """Reject frozen, duplicated, or mixed-device/dtype parameters with a clear message."""
    if len(params) == 0:
        raise SymmetryDefinitionError(f"{who}: got no parameters; pass at least one nn.Parameter.")
    seen: set[int] = set()
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise SymmetryDefinitionError(
                f"{who}: parameter {i} is a {type(p).__name__}, expected an nn.Parameter "
                "(use e.g. model[0].weight)."
            )
        if not p.is_leaf:  # e.g. the weight of a weight_norm / parametrize'd layer
            raise SymmetryDefinitionError(
                f"{who}: parameter {i} with shape {tuple(p.shape)} is computed from other "
                "tensors (a parametrised weight, e.g. weight_norm), not an nn.Parameter; "
                "SGD moves the underlying parameters, so this symmetry would not be one of "
                "the trained parameters. Remove the parametrisation "
                "(torch.nn.utils.parametrize.remove_parametrizations) or declare the "
                "symmetry on the layer's own parameters."
            )
        if not p.requires_grad:
            raise SymmetryDefinitionError(
                f"{who}: parameter {i} with shape {tuple(p.shape)} is frozen "
                "(requires_grad=False); "
                "SGD does not move frozen parameters, so the charge has no noise-driven flow. "
                "Unfreeze it or leave it out of the symmetry."
            )
        if id(p) in seen:
            raise SymmetryDefinitionError(
                f"{who}: parameter {i} with shape {tuple(p.shape)} is listed twice; list each once."
            )
        seen.add(id(p))
    devices = {p.device for p in params}
    dtypes = {p.dtype for p in params}
    if len(devices) > 1 or len(dtypes) > 1:
        raise SymmetryDefinitionError(
            f"{who}: parameters mix devices {sorted(map(str, devices))} or dtypes "
            f"{sorted(map(str, dtypes))}; expected one device and one dtype. "
            "Move the model with model.to(device, dtype) first."
        )


class Symmetry(ABC):
    """An exponential symmetry θ ↦ e^{λA}θ of every per-sample loss.

    Subclasses are final. Group elements are family-specific: a vector λ of length
    ``num_generators`` for diagonal families, an invertible ``[d, d]`` matrix G for a double
    rotation, a scalar λ for a dense generator.
    """

    family: ClassVar[Family]
    #: Its generators commute with those of every other commuting symmetry (diagonal
    #: generators), so they are solved in one joint problem and a shared parameter does not
    #: couple them in the sweeps.
    commuting: ClassVar[bool] = False
    #: The loss is unchanged when the parameters of one generator are multiplied by any
    #: c > 0 alone (a scale invariance): AdamW's equilibrium-norm prediction applies.
    scale_invariant: ClassVar[bool] = False
    #: Exact only as the eps of the normalisation it feeds → 0: verification measures it on a
    #: copy with eps = 0, and a teleport's move is bounded by eps.
    needs_zero_eps: ClassVar[bool] = False
    #: :meth:`signature` determines the generator (its parameters, axes, blocks, slices):
    #: two symmetries of the class with equal signatures are one symmetry, which a
    #: :class:`~noetherflow.SymmetrySet` refuses twice. False where the signature leaves the
    #: generator out (a dense generator's matrix): only the same object is then a repeat.
    signature_is_generator: ClassVar[bool] = False

    def __init__(self, *, label: str | None = None) -> None:
        self.label = label

    @property
    @abstractmethod
    def params(self) -> list[nn.Parameter]:
        """The parameters the symmetry acts on, in a fixed order."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Neurons/channels for rescaling, groups for scale, hidden d for rotation, 1 for dense."""

    @abstractmethod
    def charge_of(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        """θᵀAθ evaluated on ``values`` (one tensor per parameter, e.g. parameters or gradients).

        Diagonal families return one charge per generator (``[num_generators]``), a rotation
        returns the ``[d, d]`` matrix charge UᵀU − WWᵀ, a dense symmetry a scalar.
        """

    def bilinear_of(
        self, x: Mapping[nn.Parameter, Tensor], y: Mapping[nn.Parameter, Tensor]
    ) -> Tensor:
        """xᵀAy of the generator(s) (symmetrised for a matrix charge). Shape of the charge.

        By default the polarisation ¼[C(x + y) − C(x − y)] of :meth:`charge_of`; families
        override it with the direct form (one product instead of two charges).
        """
        plus = {p: x[p] + y[p] for p in self.params}
        minus = {p: x[p] - y[p] for p in self.params}
        return (self.charge_of(plus) - self.charge_of(minus)) / 4

    @classmethod
    def charges_of(
        cls, syms: Sequence[Symmetry], values: Mapping[nn.Parameter, Tensor]
    ) -> list[Tensor]:
        """:meth:`charge_of` of each of ``syms`` (instances of this class) on the same values.

        One call per symmetry by default; a family with many members on one tensor (the
        heads of an attention) batches them. Same values to round-off, in ``syms`` order.
        """
        return [s.charge_of(values) for s in syms]

    @classmethod
    def bilinears_of(
        cls,
        syms: Sequence[Symmetry],
        x: Mapping[nn.Parameter, Tensor],
        y: Mapping[nn.Parameter, Tensor],
    ) -> list[Tensor]:
        """:meth:`bilinear_of` of each of ``syms`` (of this class), as :meth:`charges_of`."""
        return [s.bilinear_of(x, y) for s in syms]

    def charge(self) -> Tensor:
        """The Noether charge C(θ) = θᵀAθ (paper eq. 6) at the current parameters.

        Parameters sharded by FSDP2 are passed as they are: the diagonal families and the
        rotation sum over shards (``charge_of`` takes sharded values), the others gather.
        """
        _shard.check_current(self.params, "charge")
        with torch.no_grad():
            return self.charge_of({p: p.detach() for p in self.params})

    @abstractmethod
    def act_(self, element: Any, values: Mapping[nn.Parameter, Tensor]) -> None:
        """Apply the group element in place to ``values`` (one tensor per parameter)."""

    def apply_(self, element: Any) -> None:
        """Apply the group element to the parameters in place (function-preserving).

        A parameter sharded by FSDP2 is gathered whole, moved, and its local shard written
        back (families override this to act shard by shard where the action allows it).
        """
        _shard.check_current(self.params, "apply_")
        with torch.no_grad():
            if not any(_shard.is_sharded(p) for p in self.params):
                self.act_(element, {p: p.data for p in self.params})
                return
            whole = {p: _shard.full(p.detach()).clone() for p in self.params}
            self.act_(element, whole)
            for p, v in whole.items():
                _shard.write_local(p.data, v)

    @abstractmethod
    def transport_grads_(self, element: Any, grads: Mapping[nn.Parameter, Tensor]) -> None:
        """Apply the cotangent action T^{-T} to per-sample gradients ``[N, *param.shape]`` in place.

        This is the orbit transport law ∇ℓ(Tθ) = T^{-T}∇ℓ(θ) (paper eqs. 34–37).
        """

    @abstractmethod
    def random_element(self, scale: float, generator: torch.Generator) -> Any:
        """A random group element of moderate size, for numerical verification."""

    @abstractmethod
    def identity_element(self) -> Any:
        """The identity element."""

    def describe(self) -> str:
        """A short human-readable description of what the symmetry acts on."""
        return self.label or self.family.value

    @property
    def normalisation(self) -> nn.Module | None:
        """The normalisation whose input the symmetry scales (its eps matters), or None."""
        return None

    def acted_axes(self) -> list[tuple[nn.Parameter, int | None]]:
        """``(parameter, axis)`` pairs the symmetry acts along; axis None: any (unknown)."""
        return [(p, None) for p in self.params]

    def covered_slabs(self, p: Tensor) -> list[Slab] | None:
        """The coordinates of ``p`` (one of ``params``) acted on, as a union of slabs.

        Each slab ``(axis, start, stop)`` holds every coordinate whose index along ``axis``
        lies in ``[start, stop)``. None (the default): all of ``p``'s coordinates. A family
        whose covered set is no union of slabs overrides :meth:`covered_mask` instead.
        """
        return None

    def covered_mask(self, p: Tensor) -> Tensor:
        """Boolean mask (CPU) of the coordinates of ``p`` (one of ``params``) acted on.

        The union of :meth:`covered_slabs` (all coordinates where it is None).
        """
        slabs = self.covered_slabs(p)
        if slabs is None:
            return torch.ones(p.shape, dtype=torch.bool)
        mask = torch.zeros(p.shape, dtype=torch.bool)
        for axis, start, stop in slabs:
            mask.narrow(axis, start, stop - start).fill_(True)
        return mask

    def state_buffers(self) -> list[Tensor]:
        """Buffers that ``apply_`` transforms besides the parameters (default: none)."""
        return []

    def signature(self, names: Mapping[int, str]) -> tuple[Any, ...]:
        """A hashable description of what the symmetry acts on (``names``: id → name).

        Default ``(family, (parameter names…))``; families refine it. Used by tests and to
        compare symmetry sets across DDP ranks.
        """
        return (self.family.value, tuple(names[id(p)] for p in self.params))

    def generator_key(self) -> tuple[Any, ...] | None:
        """Equal for two symmetries with the same generator on the same parameter objects.

        ``(class, signature)`` with the parameters named by identity, where the signature
        determines the generator (``signature_is_generator``); None where it does not.
        """
        if not self.signature_is_generator:
            return None
        return (type(self).__qualname__, self.signature({id(p): str(id(p)) for p in self.params}))


class DiagonalSymmetry(Symmetry):
    """A family whose generators are all diagonal (they commute): rescaling and scale."""

    commuting: ClassVar[bool] = True

    @property
    @abstractmethod
    def num_generators(self) -> int:
        """Number of commuting generators (one per neuron, channel or group)."""

    @abstractmethod
    def terms(self) -> list[DiagonalTerm]:
        """The generator entries per parameter (see :class:`DiagonalTerm`)."""

    @property
    @override
    def params(self) -> list[nn.Parameter]:
        # one parameter may carry several terms (slices of one weight): each listed once
        return list({id(t.param): t.param for t in self.terms()}.values())

    @override
    def acted_axes(self) -> list[tuple[nn.Parameter, int | None]]:
        pairs = {(id(t.param), t.axis): (t.param, t.axis) for t in self.terms()}
        return list(pairs.values())

    @override
    def covered_slabs(self, p: Tensor) -> list[Slab]:
        """The slices of the terms on ``p``."""
        return [(t.axis, t.start, t.start + t.span) for t in self.terms() if t.param is p]

    @property
    @override
    def size(self) -> int:
        return self.num_generators

    def _exponent(self, term: DiagonalTerm, lam: Tensor) -> Tensor:
        """s_k = a_k·λ for the coordinates of ``term.param`` (broadcastable to its shape)."""
        # float64 whatever the model dtype, so that a round trip is exact to round-off.
        lam = torch.as_tensor(lam).to(device=term.param.device, dtype=torch.float64)
        return term.expand(lam)

    @override
    def charge_of(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        return self.weighted_sum({p: v.square() for p, v in values.items() if p in self._pset()})

    @override
    def bilinear_of(
        self, x: Mapping[nn.Parameter, Tensor], y: Mapping[nn.Parameter, Tensor]
    ) -> Tensor:
        return self.weighted_sum({p: x[p] * y[p] for p in self._pset()})

    def weighted_sum(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        """Σ_k a_kj v_k per generator j (e.g. Tr[A_j M] from M's diagonal). ``[J]``.

        A sum over coordinates, so over FSDP2 shards too: a sharded value contributes its
        local shard's per-generator sums, all-reduced once over the ranks (nothing gathered).
        """
        plain: Tensor | None = None
        partial: Tensor | None = None
        group = None
        for t in self.terms():
            v = values[t.param]
            if t.groups > 1 and _shard.is_sharded(v):  # generators span rows and columns
                v = _shard.full(v)
            if not _shard.is_sharded(v):
                c = t.reduce(v)
                plain = c if plain is None else plain + c
                continue
            ls = _shard.local_slice(v)
            per_index = _shard.axis_sums(ls, t.axis, int(v.shape[t.axis]))
            c = t.reduce_axis(per_index)
            partial, group = (c if partial is None else partial + c), ls.group
        if partial is not None:
            total = _shard.sum_over_shards(partial, group)
            plain = total if plain is None else plain + total
        assert plain is not None
        return plain

    def _pset(self) -> set[nn.Parameter]:
        return set(self.params)

    def _check_lam(self, lam: Tensor) -> Tensor:
        lam = torch.as_tensor(lam)
        if lam.shape != (self.num_generators,):
            raise ValueError(
                f"Shape mismatch: expected a group element λ of shape ({self.num_generators},) "
                f"for {self.describe()}, got {tuple(lam.shape)}."
            )
        return lam

    @override
    def act_(self, element: Any, values: Mapping[nn.Parameter, Tensor]) -> None:
        lam = self._check_lam(element)
        for t in self.terms():
            v = values[t.param]
            v.mul_(torch.exp(self._exponent(t, lam)).to(v.dtype))

    @override
    def apply_(self, element: Any) -> None:
        """Scale every coordinate by e^{a_k λ_j(k)}; an FSDP2 shard by its own coordinates only."""
        if not any(_shard.is_sharded(t.param) for t in self.terms()):
            super().apply_(element)
            return
        lam = self._check_lam(element)
        with torch.no_grad():
            for t in self.terms():
                ls = _shard.local_slice(t.param.data)
                e = torch.exp(self._exponent(t, lam))
                if e.shape[ls.dim] > 1:  # the generators of the local rows only
                    e = e.narrow(ls.dim, ls.offset, ls.local.shape[ls.dim])
                ls.local.mul_(e.to(ls.local.dtype))

    @override
    def transport_grads_(self, element: Any, grads: Mapping[nn.Parameter, Tensor]) -> None:
        lam = self._check_lam(element)
        for t in self.terms():
            g = grads[t.param]
            g.mul_(torch.exp(-self._exponent(t, lam)).to(g.dtype))

    @override
    def random_element(self, scale: float, generator: torch.Generator) -> Tensor:
        p = self.terms()[0].param
        lam = torch.rand(self.num_generators, generator=generator, dtype=torch.float64) * 2 - 1
        return (lam * scale).to(p.device)

    @override
    def identity_element(self) -> Tensor:
        p = self.terms()[0].param
        return torch.zeros(self.num_generators, dtype=torch.float64, device=p.device)


def by_class(symmetries: Iterable[Symmetry]) -> list[tuple[type[Symmetry], list[int]]]:
    """(class, indices of its members) in first-seen order: the groups of the batched forms."""
    groups: dict[type[Symmetry], list[int]] = {}
    for i, s in enumerate(symmetries):
        groups.setdefault(type(s), []).append(i)
    return list(groups.items())


def _per_class(
    symmetries: Sequence[Symmetry],
    form: Callable[[type[Symmetry], list[Symmetry]], list[Tensor]],
) -> list[Tensor]:
    """``form(cls, members)`` for each class's members of ``symmetries``, back in their order."""
    out: list[Tensor | None] = [None] * len(symmetries)
    for cls, idx in by_class(symmetries):
        for i, c in zip(idx, form(cls, [symmetries[i] for i in idx]), strict=True):
            out[i] = c
    assert all(c is not None for c in out)  # by_class covers every index once
    return cast("list[Tensor]", out)


def charges_of_all(
    symmetries: Sequence[Symmetry], values: Mapping[nn.Parameter, Tensor]
) -> list[Tensor]:
    """:meth:`Symmetry.charge_of` of each symmetry on ``values``, batched per class. In order."""
    return _per_class(symmetries, lambda cls, members: cls.charges_of(members, values))


def bilinears_of_all(
    symmetries: Sequence[Symmetry],
    x: Mapping[nn.Parameter, Tensor],
    y: Mapping[nn.Parameter, Tensor],
) -> list[Tensor]:
    """:meth:`Symmetry.bilinear_of` of each symmetry, batched per class. In order."""
    return _per_class(symmetries, lambda cls, members: cls.bilinears_of(members, x, y))


def unique_params(symmetries: Iterable[Symmetry]) -> list[nn.Parameter]:
    """All parameters acted on by any of ``symmetries``, each once, in first-seen order."""
    seen: dict[int, nn.Parameter] = {}
    for s in symmetries:
        for p in s.params:
            seen.setdefault(id(p), p)
    return list(seen.values())
