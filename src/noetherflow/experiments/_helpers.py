"""Helpers an experiment's ``run`` and ``plot`` use: figure saving, and the package's one
divergence helper (:func:`find_divergence`, :class:`Divergence`, re-exported from
:mod:`noetherflow._divergence`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from noetherflow._divergence import Divergence, find_divergence
from noetherflow._io import atomic_write_bytes

__all__ = ["Divergence", "find_divergence", "save_figure"]


def save_figure(fig: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically; returns the path.

    Create figures with ``matplotlib.figure.Figure(...)`` (no pyplot, no global backend
    state, safe in worker processes).
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())
