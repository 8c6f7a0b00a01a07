"""Private: re-export of the package's divergence helper (:mod:`noetherflow._divergence`)."""

from __future__ import annotations

from noetherflow._divergence import DivergenceTracker, all_finite

__all__ = ["DivergenceTracker", "all_finite"]
