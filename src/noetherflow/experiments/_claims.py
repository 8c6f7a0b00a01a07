"""Claims: a quantitative statement of the paper, measured (``value <op> threshold``).

:class:`Claim` is what an experiment's ``claims(results, cfg)`` returns; :class:`Op` the
comparison; :func:`evaluate` the one rule that decides whether a claim holds (a missing or
NaN value never holds); :func:`over_seeds` the mean and spread of a statistic measured once
per seed (a claim's value and its note). Claims round-trip through metrics.json
(:meth:`Claim.to_dict`, :meth:`Claim.from_dict`), ``holds`` being recomputed, never trusted.

Every claim has a :class:`Kind` (a result the paper states, a formula as the paper prints it,
or ours beyond the paper), counted apart in the report, and a failing claim states ``why``:
one sentence with the measured cause and its number, shown beside it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from noetherflow._io import to_jsonable

__all__ = ["KINDS", "Claim", "Kind", "Op", "SeedSpread", "evaluate", "over_seeds"]


class Op(str, enum.Enum):
    """Comparison of a claim: ``value <op> threshold``; ``abs<`` compares ``|value|``."""

    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    ABS_LT = "abs<"
    ABS_LE = "abs<="

    @classmethod
    def parse(cls, op: Op | str) -> Op:
        try:
            return cls(op)
        except ValueError:
            valid = ", ".join(repr(o.value) for o in cls)
            raise ValueError(
                f"unknown claim op {op!r}; expected one of {valid} (e.g. op='<')"
            ) from None


class Kind(str, enum.Enum):
    """What a claim checks; the report counts each kind apart.

    ``PAPER``: a result the paper states. ``PRINTED``: a formula as the paper prints it,
    where a failure confirms a correction (see :mod:`noetherflow.experiments.corrections`).
    ``BEYOND``: ours, beyond the paper (teleport, other optimizers, library checks).
    """

    PAPER = "paper"
    PRINTED = "printed"
    BEYOND = "beyond"

    @classmethod
    def parse(cls, kind: Kind | str) -> Kind:
        try:
            return cls(kind)
        except ValueError:
            valid = ", ".join(repr(k.value) for k in cls)
            raise ValueError(
                f"unknown claim kind {kind!r}; expected one of {valid} (e.g. kind='paper')"
            ) from None


#: The kinds in display order.
KINDS = tuple(k.value for k in Kind)


def _as_float(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, str):  # "inf" / "-inf" as written by to_jsonable
        try:
            return float(value)
        except ValueError:
            return math.nan
    return float(value)


def evaluate(value: Any, op: Op | str, threshold: Any) -> bool:
    """Whether ``value <op> threshold`` holds. A missing or NaN value never holds."""
    o = Op.parse(op)
    v, t = _as_float(value), _as_float(threshold)
    if math.isnan(v) or math.isnan(t):
        return False
    if o is Op.LT:
        return v < t
    if o is Op.LE:
        return v <= t
    if o is Op.GT:
        return v > t
    if o is Op.GE:
        return v >= t
    if o is Op.EQ:
        return v == t
    if o is Op.NE:
        return v != t
    if o is Op.ABS_LT:
        return abs(v) < t
    return abs(v) <= t  # Op.ABS_LE


@dataclass(frozen=True)
class Claim:
    """A quantitative statement of the paper, measured: ``value <op> threshold``.

    ``holds`` is computed from value, op and threshold; it cannot be passed in.
    Thresholds come from the paper or the issue, never tuned after the fact; a failing
    claim is reported as failing, not removed. ``note`` carries context (e.g. divergence).
    ``kind`` is a :class:`Kind` (None: the experiment's ``KIND``, else ``"paper"``, filled
    in by the runner); ``why`` is the sentence the report shows beside a failing claim (the
    measured cause, with its number), written whether or not the claim fails.
    """

    id: str
    statement: str
    value: float | int | bool | None
    op: Op | str  # a str is parsed into Op; after construction it is always an Op
    threshold: float | int | bool
    note: str = ""
    kind: Kind | str | None = None
    why: str = ""
    holds: bool = field(init=False)

    def __post_init__(self) -> None:
        op = Op.parse(self.op)
        value = self.value
        if value is not None and not isinstance(value, bool | int | float):
            value = float(value)  # numpy / torch scalars
        elif isinstance(value, float) and not isinstance(value, bool):
            value = float(value)
        object.__setattr__(self, "op", op)
        if self.kind is not None:
            object.__setattr__(self, "kind", Kind.parse(self.kind))
        if not isinstance(self.why, str):
            raise TypeError(f"why={self.why!r}; expected a str (one sentence, the measured cause)")
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "holds", evaluate(value, op, self.threshold))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "statement": self.statement,
            "value": to_jsonable(self.value),
            "op": Op.parse(self.op).value,
            "threshold": to_jsonable(self.threshold),
            "holds": self.holds,
            "note": self.note,
            "kind": None if self.kind is None else Kind.parse(self.kind).value,
            "why": self.why,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        """Rebuild a claim from metrics.json (``holds`` is recomputed)."""
        value = d.get("value")
        return cls(
            id=str(d["id"]),
            statement=str(d.get("statement", "")),
            value=None if value is None else _as_float(value),
            op=Op.parse(d["op"]),
            threshold=_as_float(d["threshold"]),
            note=str(d.get("note", "")),
            kind=d.get("kind"),
            why=str(d.get("why", "")),
        )

    def with_kind(self, kind: Kind | str) -> Claim:
        """This claim with ``kind`` (when it has none yet; an explicit kind is kept)."""
        if self.kind is not None:
            return self
        return dataclasses.replace(self, kind=Kind.parse(kind))


@dataclass(frozen=True)
class SeedSpread:
    """One claim statistic measured once per seed: its mean (the claim's value) and spread.

    Build it with :func:`over_seeds`; ``note()`` is the text a claim's note carries.
    """

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        """Mean over seeds (NaN if a seed's value is NaN: a diverged seed fails the claim)."""
        return math.fsum(self.values) / len(self.values) if self.values else math.nan

    @property
    def lo(self) -> float:
        """Smallest per-seed value."""
        return min(self.values) if self.values else math.nan

    @property
    def hi(self) -> float:
        """Largest per-seed value."""
        return max(self.values) if self.values else math.nan

    def note(self, fmt: str = ".3g") -> str:
        """``"mean 0.123 over 3 seeds (0.110–0.140; per seed 0.110/0.120/0.140)"``.

        Args:
            fmt: format spec of every number.
        """
        if len(self.values) == 1:
            return f"{format(self.values[0], fmt)} (one seed)"
        per = "/".join(format(v, fmt) for v in self.values)
        return (
            f"mean {format(self.mean, fmt)} over {len(self.values)} seeds "
            f"({format(self.lo, fmt)}–{format(self.hi, fmt)}; per seed {per})"
        )


def over_seeds(values: Any) -> SeedSpread:
    """A :class:`SeedSpread` from one value per seed (any 1-d array-like of numbers)."""
    vals = tuple(float(v) for v in values)
    if not vals:
        raise ValueError("over_seeds: no values; expected one value per seed (at least one).")
    return SeedSpread(vals)
