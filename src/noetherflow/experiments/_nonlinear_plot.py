"""The heatmaps of Figs. 6 and 9: the two sides of each balance, side by side, per activation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_LABELS = {
    "sigma": ("WΣ̄_xWᵀ", "UᵀΣ̄_εU"),
    "gamma": ("WΓ_WWᵀ", "UᵀΓ_UU"),
    "noise": ("Cov ∇_Uᵀ∇_U", "Cov ∇_W∇_Wᵀ"),
}


def heatmaps(
    results: dict[str, Any], acts: Sequence[str], kind: str, modes: Sequence[str], path: Any
) -> Any:
    """Heat maps W-side | U-side of ``kind`` ("sigma", "gamma", "noise"), a row per run."""
    from matplotlib.figure import Figure

    from noetherflow.experiments._base import save_figure

    rows = [(a, m) for a in acts for m in modes]
    fig = Figure(figsize=(8.4, 3.8 * len(rows)))
    axes = np.asarray(fig.subplots(len(rows), 2)).reshape(len(rows), 2)
    for (act, mode), (ax_w, ax_u) in zip(rows, axes, strict=True):
        s = results["series"][f"{mode}_{act}"]
        a = np.asarray(s[f"w_{kind}_block"])
        b = np.asarray(s[f"u_{kind}_block"])
        vmax = float(max(np.abs(a).max(), np.abs(b).max()))
        for ax, m, lab in ((ax_w, a, _LABELS[kind][0]), (ax_u, b, _LABELS[kind][1])):
            im = ax.imshow(m, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
            ax.set_title(f"{act}, {mode.upper()}: {lab}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.colorbar(im, ax=[ax_w, ax_u], shrink=0.8)
        first = s.get(f"rel_diff_{kind}_seeds", [s[f"rel_diff_{kind}"]])[0]
        ax_w.set_ylabel(f"rel. diff {first:.3f} (seed 0)", fontsize=9)
    fig.suptitle(f"hidden-space matrices (first {results['n_show']} of the hidden units)")
    return save_figure(fig, path)
