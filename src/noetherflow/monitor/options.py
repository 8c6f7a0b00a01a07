"""The monitor's options and their checks (one place for the error messages)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["DistanceMode", "SharpnessOptions", "check_sweeps", "multiple"]


@dataclass(frozen=True)
class SharpnessOptions:
    """Sharpness measured by the monitor (see :func:`noetherflow.sharpness.sharpness`).

    Attributes:
        n_samples: Rademacher vectors of the Hutchinson trace.
        max_iter, tol: power iteration budget and relative tolerance on the eigenvalue.
        seed: seed of the random vectors (the same at every record: common random numbers).
        every: measure every this many steps (a multiple of the monitor's ``every``);
            ``None`` measures at every record.
        method: ``"auto"``, ``"fwd-rev"`` or ``"rev-rev"`` Hessian-vector products.
    """

    n_samples: int = 10
    max_iter: int = 20
    tol: float = 1e-3
    seed: int = 0
    every: int | None = None
    method: str = "auto"


class DistanceMode(str, Enum):
    """How the monitor obtains ``distance/*`` between full solves.

    ``"track"``: a full solve every ``solve_every`` steps (and whenever the update below
    leaves its range), a first-order update from the last full solve at the other distance
    records (:mod:`noetherflow.monitor.first_order`). ``"solve"``: a full (warm-started) solve
    at every distance record.
    """

    TRACK = "track"
    SOLVE = "solve"


def parse_distance_mode(value: str | DistanceMode) -> DistanceMode:
    """The :class:`DistanceMode` of ``value``; a clear error for anything else."""
    try:
        return DistanceMode(value)
    except ValueError:
        raise ValueError(
            f"distance_mode={value!r} is not supported; expected one of "
            f"{[m.value for m in DistanceMode]}."
        ) from None


def multiple(name: str, value: int | None, every: int) -> int:
    """``value`` checked to be a positive multiple of ``every`` (``None``: ``every`` itself)."""
    if value is None:
        return every
    if int(value) != value or value < 1 or value % every:
        raise ValueError(
            f"{name}={value!r} must be a positive multiple of every={every} (records happen "
            "only every `every` steps)."
        )
    return int(value)


def check_sweeps(value: int | None) -> int | None:
    """``distance_sweeps`` checked: a positive integer, or ``None`` (sweep until converged)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"distance_sweeps={value!r} must be a positive integer (coupled sweeps per distance "
            "record) or None (sweep until converged)."
        )
    return value
