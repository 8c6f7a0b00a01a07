"""Helpers an experiment's ``run`` and ``plot`` use: divergence detection and figure saving."""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow._io import atomic_write_bytes

__all__ = ["Divergence", "find_divergence", "save_figure"]


@dataclass(frozen=True)
class Divergence:
    """Where a series first became non-finite. ``diverged`` is False if it never did."""

    diverged: bool
    step: int | None
    last_finite_step: int | None
    last_finite_value: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def find_divergence(values: Sequence[float] | np.ndarray, *, limit: float = math.inf) -> Divergence:
    """First index where ``values`` is NaN/inf or ``|value| > limit`` (a diverging run is data).

    Training loops should stop at that step and record this (step, last finite loss) in
    their results rather than raise.
    """
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(arr) | (np.abs(arr) > limit)
    if not bad.any():
        last = len(arr) - 1 if len(arr) else None
        return Divergence(False, None, last, None if last is None else float(arr[last]))
    step = int(np.argmax(bad))
    last_step = step - 1 if step > 0 else None
    return Divergence(True, step, last_step, None if last_step is None else float(arr[last_step]))


def save_figure(fig: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically; returns the path.

    Create figures with ``matplotlib.figure.Figure(...)`` (no pyplot, no global backend
    state, safe in worker processes).
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())
