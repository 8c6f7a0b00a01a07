"""Private: the one divergence / finiteness helper of the package.

A run *diverges at step k* when the state θ_k (the parameters after k updates) has a
non-finite coordinate, or its loss is not finite. Training loops (``noetherflow.train``),
the monitor and the experiments stop or record there; :class:`~noetherflow.GradStats`
checks its statistics with :func:`all_finite`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DivergenceTracker", "all_finite", "is_finite"]


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
