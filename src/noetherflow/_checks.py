"""Private: the one place where options and numbers are validated.

Every public entry point parses its string options with :func:`parse_enum` and checks its
numbers with the validators below, so that each error names the value, what was expected and
the fix, in one wording.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "check_bool",
    "check_finite_number",
    "check_nonnegative",
    "check_positive",
    "check_positive_int",
    "check_stats_cover",
    "parse_enum",
]

E = TypeVar("E", bound=Enum)


def parse_enum(cls: type[E], value: object, name: str, hint: str = "") -> E:
    """``cls(value)``, or a ``ValueError`` naming ``name``, the value and the accepted members.

    ``hint`` (optional) explains the members, e.g. ``"'mean' (batch mean) or 'sum'"``.
    """
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = hint or ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{name}={value!r} is not supported; expected {allowed}.") from None


def check_finite_number(value: object, name: str, meaning: str = "") -> float:
    """``float(value)`` if it is a finite real number, else a ``ValueError``."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(
            f"{name}={value!r} is not a number; expected a finite real{_of(meaning)}."
        ) from None
    if not math.isfinite(v):
        raise ValueError(f"{name}={value!r} is not finite; expected a finite real{_of(meaning)}.")
    return v


def check_positive(value: object, name: str, meaning: str = "") -> float:
    """A finite ``value > 0`` as a float, else a ``ValueError``."""
    v = check_finite_number(value, name, meaning)
    if v <= 0:
        raise ValueError(f"{name}={value!r} must be > 0{_of(meaning)}.")
    return v


def check_nonnegative(value: object, name: str, meaning: str = "", fix: str = "") -> float:
    """A finite ``value >= 0`` as a float, else a ``ValueError`` (``fix`` is appended)."""
    v = check_finite_number(value, name, meaning)
    if v < 0:
        raise ValueError(f"{name}={value!r} must be >= 0{_of(meaning)}{'; ' + fix if fix else ''}.")
    return v


def check_positive_int(value: object, name: str, meaning: str = "") -> int:
    """An integer ``value >= 1`` (Python, NumPy or integral float), else a ``ValueError``."""
    bad = ValueError(f"{name}={value!r} must be a positive integer{_of(meaning)}.")
    if isinstance(value, bool):
        raise bad
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise bad from None
    if not math.isfinite(v) or not v.is_integer() or v < 1:
        raise bad
    return int(v)


def check_bool(value: object, name: str) -> bool:
    """``value`` if it is a bool (NumPy's too), else a ``TypeError`` (no truthiness of strings)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name}={value!r} is a {type(value).__name__}; expected True or False.")
    return bool(value)


def check_stats_cover(params: Sequence[Any], mean: Mapping[Any, Any], who: str) -> None:
    """Refuse statistics that lack some parameters of the symmetry set (another set's)."""
    missing = [tuple(getattr(p, "shape", ())) for p in params if p not in mean]
    if missing:
        raise ValueError(
            f"{who}: the statistics have no entry for {len(missing)} parameter(s) of the "
            f"symmetry set (shapes {missing}); expected statistics collected for this set. "
            "Call collect_stats(model, syms, ...) with the same SymmetrySet."
        )


def _of(meaning: str) -> str:
    return f" ({meaning})" if meaning else ""
