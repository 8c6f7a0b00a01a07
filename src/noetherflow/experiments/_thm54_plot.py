"""Figure of the Thm 5.4 experiment (kept apart from its runs and claims)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments._base import save_figure


def plot_thm54(results: dict[str, Any], cfg: Any, out_dir: Path) -> list[Path]:
    """The Thm 5.4 figure: layer norms over training per depth, and the final norms."""
    from matplotlib.figure import Figure

    s = results["series"]
    n = len(cfg.depths)
    fig = Figure(figsize=(5.2 * (n + 1), 4.4))
    axes = fig.subplots(1, n + 1)
    for ax, depth in zip(axes[:n], cfg.depths, strict=True):
        d = s[f"D{depth}"]
        steps = np.asarray(d["step"])
        norms = np.asarray(d["norms_over_time"])  # [R, T, D]
        pred_all = np.asarray(d["predicted_sq_norms_all_layers"])
        for i in range(depth):
            color = f"C{i}"
            for r in range(norms.shape[0]):
                ax.plot(
                    steps,
                    norms[r, :, i],
                    color=color,
                    lw=0.7,
                    alpha=0.6,
                    label=f"‖W_{i + 1}‖²" if r == 0 else None,
                )
            ax.axhline(pred_all[i], color=color, ls="--", lw=1.2)
        ax.axhline(
            float(d["paper_eq19_sq_norm"]), color="k", ls=":", lw=1.2, label="printed eq. 19"
        )
        ax.set_xlabel("SGD step")
        ax.set_ylabel("‖W_i‖_F²")
        ax.set_title(f"D = {depth}: layer norms (dashed: Thm 5.4, general form)")
        ax.legend(fontsize=7, ncol=2)
    ax = axes[n]
    width = 0.8 / n
    for j, depth in enumerate(cfg.depths):
        d = s[f"D{depth}"]
        meas = np.asarray(d["measured_sq_norms"])
        pred_all = np.asarray(d["predicted_sq_norms_all_layers"])
        xpos = np.arange(depth) + j * width
        ax.bar(
            xpos,
            meas.mean(axis=0),
            width=width * 0.9,
            color=f"C{j}",
            alpha=0.6,
            yerr=meas.std(axis=0),
            label=f"SGD, D = {depth}",
        )
        ax.plot(xpos, pred_all, "k_", ms=14, mew=2)
        ax.plot(xpos[1:-1], [float(d["paper_eq19_sq_norm"])] * (depth - 2), "r_", ms=14, mew=2)
    ax.plot([], [], "k_", ms=14, mew=2, label="Thm 5.4 (general)")
    ax.plot([], [], "r_", ms=14, mew=2, label="printed eq. 19")
    ax.set_xticks(np.arange(max(cfg.depths)) + 0.4 * (1 - 1 / n))
    ax.set_xticklabels([f"W_{i + 1}" for i in range(max(cfg.depths))])
    ax.set_ylabel("final ‖W_i‖_F²")
    chain_err = results["chain_max_gram_rel_err"]
    ax.set_title(f"final norms; chain solver error {chain_err:.1e}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "thm54.png")]
