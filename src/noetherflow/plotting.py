"""Plots of a monitor history (matplotlib, imported when a plot is drawn)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_history"]


def plot_history(
    history: Mapping[str, np.ndarray],
    path: str | os.PathLike[str] | None = None,
    *,
    kinds: Sequence[str] = ("loss", "charge", "flow", "distance", "sharpness"),
    max_lines: int = 8,
) -> Any:
    """Plot a monitor history (see :meth:`NoetherMonitor.plot`); returns the figure."""
    from matplotlib.figure import Figure

    steps = history.get("step", np.empty(0))
    panels = [k for k in kinds if any(key == k or key.startswith(k + "/") for key in history)]
    fig = Figure(figsize=(7, 2.4 * max(1, len(panels))), layout="constrained")
    axes = fig.subplots(max(1, len(panels)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, kind in zip(axes, panels, strict=False):
        keys = [k for k in history if k == kind or k.startswith(kind + "/")]
        for key in keys:
            v = history[key]
            label = key.split("/", 1)[1] if "/" in key else key
            if v.ndim == 1:
                ax.plot(steps, v, label=label)
            else:
                flat = v.reshape(v.shape[0], -1)
                if flat.shape[1] <= max_lines:
                    for j in range(flat.shape[1]):
                        ax.plot(steps, flat[:, j], lw=0.8, label=f"{label}[{j}]")
                else:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows
                        lo, med, hi = np.nanpercentile(flat, [10, 50, 90], axis=1)
                    (line,) = ax.plot(steps, med, label=f"{label} (median)")
                    ax.fill_between(steps, lo, hi, alpha=0.2, color=line.get_color())
        ax.set_ylabel(kind)
        if keys:
            ax.legend(fontsize="x-small", loc="best")
    axes[-1].set_xlabel("step")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig
