"""Private: the one divergence / finiteness helper of the package.

A run *diverges at step k* when the state θ_k (the parameters after k updates) has a
non-finite coordinate, or its loss is not finite (or, where a caller sets a ``limit``,
larger than it in absolute value). Training loops (``noetherflow.train``), the monitor and
the experiments stop or record there; :class:`~noetherflow.GradStats` checks its
statistics with :func:`all_finite`. On tensors: :func:`is_finite`, :func:`all_finite`,
:class:`DivergenceTracker`; on recorded series (NumPy): :func:`diverged_mask`,
:func:`find_divergence`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Divergence",
    "DivergenceTracker",
    "all_finite",
    "diverged_mask",
    "find_divergence",
    "is_finite",
]


def is_finite(t: Tensor) -> bool:
    """Every entry of ``t`` is finite (one device sync).

    One reduction first (NaN and Inf propagate to the sum); only when the sum is not finite
    (a NaN/Inf entry, or an overflow of finite entries) is the exact elementwise test run.
    """
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def all_finite(tensors: Sequence[Tensor] | Iterable[Tensor]) -> Tensor:
    """Return a 0-dim bool tensor: every entry of every tensor is finite (one sync to read)."""
    ts = list(tensors)
    if len(ts) == 0:
        return torch.tensor(True)
    flags = [torch.isfinite(t).all() for t in ts]
    return torch.stack([f.to(flags[0].device) for f in flags]).all()


@dataclass
class DivergenceTracker:
    """Remember the last finite loss and the step of divergence, if any."""

    diverged: bool = False
    diverged_at_step: int | None = None
    _last_finite: Tensor | None = None

    def observe_loss(self, loss: Tensor, step: int) -> bool:
        """Record ``loss`` (0-dim) of the state θ_step; return False (and mark) if not finite."""
        if bool(torch.isfinite(loss).item()):
            self._last_finite = loss.detach()
            return True
        self.mark(step)
        return False

    def record_finite(self, loss: Tensor) -> None:
        """Record a loss already known to be finite (no device sync)."""
        self._last_finite = loss.detach()

    def mark(self, step: int) -> None:
        """Mark divergence at ``step`` (the first one wins)."""
        if not self.diverged:
            self.diverged = True
            self.diverged_at_step = step

    @property
    def last_finite_loss(self) -> float | None:
        """The last finite loss observed, as a float (None if none was)."""
        return None if self._last_finite is None else float(self._last_finite.item())


def diverged_mask(values: Any, limit: Any = math.inf) -> np.ndarray:
    """Elementwise: ``values`` is NaN/±inf or ``|values| > limit`` (the divergence test).

    Args:
        values: array-like of any shape.
        limit: a number, or an array broadcasting against ``values`` (a per-run bound).

    Returns:
        bool array of the broadcast shape.
    """
    arr = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(arr) | (np.abs(arr) > np.asarray(limit, dtype=np.float64))


@dataclass(frozen=True)
class Divergence:
    """Where a series first diverged (:func:`find_divergence`); ``diverged`` is False if never.

    ``step`` is the index of the first bad entry, ``last_finite_step`` / ``last_finite_value``
    the entry before it (or the last entry when the series never diverged).
    """

    diverged: bool
    step: int | None
    last_finite_step: int | None
    last_finite_value: float | None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


def find_divergence(values: Sequence[float] | np.ndarray, *, limit: float = math.inf) -> Divergence:
    """First index where ``values`` diverges (:func:`diverged_mask`); a diverging run is data.

    Args:
        values: a recorded series (losses, norms); flattened.
        limit: entries with ``|value| > limit`` count as diverged too.

    Training loops should stop at that step and record this (step, last finite value) in
    their results rather than raise.
    """
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    bad = diverged_mask(arr, limit)
    if not bad.any():
        last = len(arr) - 1 if len(arr) else None
        return Divergence(False, None, last, None if last is None else float(arr[last]))
    step = int(np.argmax(bad))
    last_step = step - 1 if step > 0 else None
    return Divergence(True, step, last_step, None if last_step is None else float(arr[last_step]))
