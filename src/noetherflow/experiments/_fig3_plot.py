"""Figures of the Fig. 3 experiment (kept apart from its runs and claims)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments._base import save_figure


def plot_fig3(results: dict[str, Any], cfg: Any, out_dir: Path) -> list[Path]:
    """Fig. 3's two figures (balance and sharpness; relaxation) from ``results``."""
    from matplotlib.figure import Figure

    s = results["series"]
    phis = np.asarray(s["phi_x"], dtype=float)
    fine = np.linspace(phis.min(), phis.max(), 200)
    fig = Figure(figsize=(21, 4.6))
    ax1, ax2, ax3, ax4 = fig.subplots(1, 4)

    ax1.plot(fine, 1.0 / np.sqrt(fine * (2.0 - fine)), "k-", lw=1, label="Thm 5.2")
    ax1.plot(phis, s["sgd_norm_ratio"], "o", color="C0", label="SGD")
    ax1.plot(phis, s["sgdwd_norm_ratio"], "x", color="C1", ms=8, label="SGD + WD 1e-4")
    ax1.plot(phis, s["gdwd_norm_ratio"], "s", color="C2", mfc="none", label="GD + WD")
    ax1.axhline(1.0, color="0.5", ls=":", lw=0.8)
    ax1.set_xlabel("φ_x")
    ax1.set_ylabel("‖W‖_F² / ‖U‖_F²")
    ax1.set_title("layer balance")
    ax1.legend(fontsize=8)

    ax2.plot(phis, s["theory_sharpness"], "k-", lw=1, label="Prop 5.3 at Thm 5.2 (SGD)")
    ax2.plot(phis, s["theory_gdwd_sharpness"], "k--", lw=1, label="balanced (GD + WD)")
    ax2.plot(phis, s["sgd_sharpness"], "o", color="C0", label="SGD")
    ax2.plot(phis, s["sgdwd_sharpness"], "x", color="C1", ms=8, label="SGD + WD 1e-4")
    ax2.plot(phis, s["gdwd_sharpness"], "s", color="C2", mfc="none", label="GD + WD")
    ax2.set_xlabel("φ_x")
    ax2.set_ylabel("Tr ∇²L")
    ax2.set_title("sharpness of the converged model")
    ax2.legend(fontsize=8)

    ax3.plot(fine, (np.sqrt(fine) + np.sqrt(2.0 - fine)) / 2.0, "k:", lw=1, label="theory, γ → 0")
    ax3.plot(
        phis,
        s["theory_sharpness_ratio"],
        "k-",
        lw=1,
        label=f"theory, GD γ = {cfg.gd_weight_decay:g}",
    )
    ax3.plot(phis, s["sharpness_ratio"], "o", color="C0", label="measured")
    ax3.axhline(1.0, color="0.5", ls=":", lw=0.8)
    ax3.set_xlabel("φ_x")
    ax3.set_ylabel("S_SGD / S_GD+WD")
    ax3.set_title("< 1: SGD flatter than the weight-decay solution")
    ax3.legend(fontsize=8)

    if "label_noise_sgd_sharpness" in s:
        bal = np.asarray(s["label_noise_balanced_sharpness"], dtype=float)
        half = (np.sqrt(fine) + np.sqrt(2 - fine)) / 2  # Tr Σ_ε^{1/2} / n
        inv_half = (1 / np.sqrt(fine) + 1 / np.sqrt(2 - fine)) / 2  # Tr Σ_ε^{-1/2} / n
        ax4.plot(fine, (half + inv_half) / 2, "k-", lw=1, label="theory (Thm 5.2, Prop. 5.3)")
        ax4.plot(
            phis,
            np.asarray(s["label_noise_sgd_sharpness"], dtype=float) / bal,
            "o",
            color="C3",
            label="SGD, measured",
        )
        ax4.axhline(1.0, color="0.5", ls=":", lw=0.8)
        ax4.set_xlabel("φ_ε (Σ_x = I)")
        ax4.set_ylabel("S_SGD / S_balanced")
        ax4.set_title("anisotropic label noise: > 1, SGD sharper")
        ax4.legend(fontsize=8)
    fig.tight_layout()
    paths = [save_figure(fig, out_dir / "fig3.png")]

    fig2 = Figure(figsize=(11, 4))
    b1, b2 = fig2.subplots(1, 2)
    traj = np.asarray(s["sgd_ratio_traj"], dtype=float)
    gtraj = np.asarray(s["gdwd_ratio_traj"], dtype=float)
    for i, p in enumerate(phis):
        b1.semilogy(s["traj_step"], traj[i], color=f"C{i % 10}", label=f"φ_x = {p:g}")
        b1.axhline(float(np.asarray(s["theory_norm_ratio"])[i]), color=f"C{i % 10}", ls=":")
        b2.semilogy(s["gd_traj_step"], gtraj[i], color=f"C{i % 10}")
    b1.set_xlabel("SGD step")
    b1.set_ylabel("‖W‖_F² / ‖U‖_F²")
    b1.set_title("SGD relaxes to Thm 5.2 (dotted)")
    b1.legend(fontsize=7, ncol=2)
    b2.axhline(1.0, color="k", ls=":")
    b2.set_xlabel("GD step")
    b2.set_title("GD + WD relaxes to balance")
    fig2.tight_layout()
    paths.append(save_figure(fig2, out_dir / "fig3_relaxation.png"))
    return paths
