"""Per-channel rescaling between arbitrary parameter slices (a rescaling-family symmetry).

Generator j scales a set of "producer" coordinates by e^{λ_j} and the "consumer"
coordinates that read channel j by e^{-λ_j}: A_j = diag(+1 on producers, −1 on consumers)
(paper §4.2, the rescaling family), C_j = Σ_producers θ² − Σ_consumers θ². It covers what
:class:`~noetherflow.symmetry.rescaling.Rescaling` (one layer → one layer, any layer of the
layer registry, a weight stored ``[in, out]`` such as Hugging Face's ``Conv1D`` included)
cannot express: producers that are not a layer's output rows, or several consumers, e.g. a
normalisation's affine weight and bias → the next layer(s) (BatchNorm → ReLU → Conv,
LayerNorm/RMSNorm → several projections reading the same normalised vector), a layer scale
``x ⊙ γ`` → the next layer.

Why two classes and not one: both are the same family and kernel (their
:meth:`~noetherflow.symmetry.base.DiagonalSymmetry.terms` are all the solver sees), but
``Rescaling`` is built from two layers (the layer registry gives the axes, it checks that they
chain and refuses grouped convolutions, it keeps ``first``/``second`` and its signature names
the two weights), while this class is built from arbitrary terms. A layer pair is always a
``Rescaling``, from detection and by hand alike.

Every coordinate set is a :class:`~noetherflow.symmetry.base.DiagonalTerm`, so the diagonal
kernels of the rescaling family apply unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from typing_extensions import override

from noetherflow._errors import SymmetryDefinitionError
from noetherflow.symmetry.base import DiagonalSymmetry, DiagonalTerm, Family, check_params

__all__ = ["ChannelRescaling"]


class ChannelRescaling(DiagonalSymmetry):
    """Rescaling with producers ``up`` (entry +1) and consumers ``down`` (entry −1).

    Args:
        up: terms scaled by e^{λ_j}, e.g. ``DiagonalTerm(bn.weight, 0, 1, 1.0)``.
        down: terms scaled by e^{-λ_j}, e.g. ``DiagonalTerm(conv.weight, 1, 1, -1.0)``.
        label: optional name shown in tables.

    Every term must have the same number of generators; signs must be +1 (up) / −1 (down).
    """

    family: ClassVar[Family] = Family.RESCALING
    signature_is_generator: ClassVar[bool] = True

    def __init__(
        self, up: Sequence[DiagonalTerm], down: Sequence[DiagonalTerm], *, label: str | None = None
    ) -> None:
        super().__init__(label=label)
        up, down = list(up), list(down)
        if not up or not down:
            raise SymmetryDefinitionError(
                f"ChannelRescaling: got {len(up)} producer and {len(down)} consumer terms; "
                "expected at least one of each."
            )
        for t, sign in [(t, 1.0) for t in up] + [(t, -1.0) for t in down]:
            if t.sign != sign:
                raise SymmetryDefinitionError(
                    f"ChannelRescaling: a term on a parameter of shape {tuple(t.param.shape)} has "
                    f"sign {t.sign}; expected {sign:+g} (producers +1, consumers −1)."
                )
        counts = {t.num_generators for t in up + down}
        bad = [t for t in up + down if t.span % t.block != 0]
        if len(counts) != 1 or bad:
            raise SymmetryDefinitionError(
                "ChannelRescaling: terms do not chain: channel counts "
                f"{sorted(counts)} (size along axis // block) differ or do not divide; expected "
                "one channel count shared by producers and consumers."
            )
        # a parameter may carry several terms (two slices of one weight), on disjoint slices
        check_params(list({id(t.param): t.param for t in up + down}.values()), "ChannelRescaling")
        _check_disjoint(up + down)
        self._n = counts.pop()
        self.up = up
        self.down = down

    @property
    @override
    def num_generators(self) -> int:
        return self._n

    @override
    def terms(self) -> list[DiagonalTerm]:
        return [*self.up, *self.down]

    def signature(self, names: Mapping[int, str]) -> tuple[Any, ...]:
        """``("rescaling", producer terms, consumer terms)``.

        Each term is ``(param name, axis, block)``, with its groups appended when > 1 and its
        slice ``(start, length)`` when it covers part of its axis.
        """

        def terms(ts: Sequence[DiagonalTerm]) -> tuple[tuple[Any, ...], ...]:
            return tuple(
                (
                    names[id(t.param)],
                    t.axis,
                    t.block,
                    *((t.groups,) if t.groups > 1 else ()),
                    *(((t.start, t.span),) if t.sliced else ()),
                )
                for t in ts
            )

        return ("rescaling", terms(self.up), terms(self.down))

    @override
    def describe(self) -> str:
        return self.label or f"channel rescaling ({self._n} channels)"


def _check_disjoint(terms: Sequence[DiagonalTerm]) -> None:
    """Refuse two terms on overlapping slices of one axis of one parameter."""
    seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for t in terms:
        key = (id(t.param), t.axis % t.param.dim())
        for lo, hi in seen.get(key, []):
            if t.start < hi and lo < t.start + t.span:
                raise SymmetryDefinitionError(
                    f"ChannelRescaling: two terms act on overlapping slices [{lo}, {hi}) and "
                    f"[{t.start}, {t.start + t.span}) of axis {t.axis} of a parameter of shape "
                    f"{tuple(t.param.shape)}; expected disjoint slices (or one term)."
                )
        seen.setdefault(key, []).append((t.start, t.start + t.span))
