"""Plots of a monitor history (matplotlib, imported when a plot is drawn).

One panel per kind of quantity (loss, charge, flow, distance, sharpness), legends outside
the panels. Readable with many symmetries: when a panel has more than ``top_k`` lines, the
``top_k`` with the largest ``max |value|`` over the run are drawn in colour and named, the
others as thin grey lines under one legend entry "others", and the panel says so.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_history"]


def _series(
    key: str, v: np.ndarray, label: str, max_lines: int
) -> list[tuple[str, np.ndarray, tuple[np.ndarray, np.ndarray] | None]]:
    """Lines of one history entry ``[records, *shape]``: (label, y, optional 10–90 % band)."""
    if v.ndim == 1:
        return [(label, v, None)]
    flat = v.reshape(v.shape[0], -1)
    if flat.shape[1] <= max_lines:
        return [(f"{label}[{j}]", flat[:, j], None) for j in range(flat.shape[1])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows
        lo, med, hi = np.nanpercentile(flat, [10, 50, 90], axis=1)
    return [(f"{label} (median)", med, (lo, hi))]


def _size(y: np.ndarray) -> float:
    """Ranking score of a line: its largest |value| (inf first, all-NaN last)."""
    a = np.abs(y[~np.isnan(y)])
    return float(a.max()) if a.size else -1.0


def _short(label: str, width: int = 40) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def plot_history(
    history: Mapping[str, np.ndarray],
    path: str | os.PathLike[str] | None = None,
    *,
    kinds: Sequence[str] = ("loss", "charge", "flow", "distance", "sharpness"),
    max_lines: int = 8,
    top_k: int = 8,
    labels: Mapping[str, str] | None = None,
) -> Any:
    """Plot a monitor history (see :meth:`NoetherMonitor.plot`); returns the figure.

    Args:
        history: ``key → [records, *shape]`` as :attr:`NoetherMonitor.history` or
            :func:`load_history` give it.
        path: save the figure there (PNG, PDF, … by suffix) when given.
        kinds: the panels, in order (those without entries are left out).
        max_lines: vector entries with at most this many components are drawn one line per
            component, longer ones as the median with a 10–90 % band over components.
        top_k: at most this many named lines per panel; the rest are grey, unnamed.
        labels: display names of the symmetry keys (``key → name``), e.g. :attr:`keys`
            inverted; default: the keys.
    """
    from matplotlib.figure import Figure

    if top_k < 1:
        raise ValueError(f"top_k={top_k!r}; expected a positive number of named lines.")
    names = dict(labels or {})
    steps = history.get("step", np.empty(0))
    panels = [k for k in kinds if any(key == k or key.startswith(k + "/") for key in history)]
    fig = Figure(figsize=(9, 2.6 * max(1, len(panels))), layout="constrained")
    axes = fig.subplots(max(1, len(panels)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, kind in zip(axes, panels, strict=False):
        lines = []
        for key in (k for k in history if k == kind or k.startswith(kind + "/")):
            sym = key.split("/", 1)[1] if "/" in key else key
            lines += _series(key, history[key], _short(names.get(sym, sym)), max_lines)
        order = sorted(range(len(lines)), key=lambda j: -_size(lines[j][1]))
        named = set(order[:top_k]) if len(lines) > top_k else set(range(len(lines)))
        handles: list[Any] = []
        others: list[Any] = []
        for j, (label, y, band) in enumerate(lines):
            # Only the records that measured it (e.g. distances every distance_every steps),
            # joined: NaN rows in between would leave isolated points undrawn.
            ok = np.isfinite(y)
            if j in named:
                (line,) = ax.plot(steps[ok], y[ok], lw=1.2, label=label)
                handles.append(line)
                if band is not None:
                    lo, hi = band
                    ax.fill_between(steps[ok], lo[ok], hi[ok], alpha=0.2, color=line.get_color())
            else:
                (line,) = ax.plot(steps[ok], y[ok], lw=0.6, color="0.6", alpha=0.5, zorder=1)
                if not others:
                    line.set_label(f"others ({len(lines) - len(named)})")
                    others.append(line)
        ax.set_ylabel(kind)
        if len(lines) > len(named):
            ax.set_title(
                f"{len(lines)} lines: the {len(named)} with the largest max |{kind}| named",
                fontsize="small",
                loc="left",
            )
        if lines:
            ax.legend(
                handles=handles + others,
                fontsize="x-small",
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
            )
    axes[-1].set_xlabel("step")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig
