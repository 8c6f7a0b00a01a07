"""Fig. 8: SGD converges to the Thm 5.2 noise equilibrium for every η, data dimension and S.

The Fig. 3 setting: a two-layer linear net ``UWx`` (hidden width ``d_h``) learns the
autoencoding task ``y = x + ε ∈ R^n`` with ``x_{1:n/2} ~ N(0, φ_x)``,
``x_{n/2+1:n} ~ N(0, 2 − φ_x)`` and ``Σ_ε = I``, by SGD on fresh minibatches. With ``φ_x``
fixed (``φ_x ≠ 1``, so the noise equilibrium is *not* the norm-balanced solution) we sweep
the learning rate, the data dimension ``d_x = d_y = n`` and the batch size, and measure the
relative distance ``‖Δ‖_F/‖WΓ_WWᵀ‖_F`` to the equilibrium ``UᵀΓ_UU = WΓ_WWᵀ`` of Thm 5.2
(Γ exact at the current weights, in closed form; see :mod:`noetherflow.experiments.fig2`).

Exact width reduction: every SGD update of ``W`` lies in the column space of ``Uᵀ`` and
every update of ``U`` in the row space of ``Wᵀ``, so the rows of ``U`` and the columns of
``W`` stay in the span ``Q`` (dimension ≤ 2n) of the initial ones. We initialise at the full
width ``d_h = 2000``, change basis to ``Q`` and train the ``[n, 2n]``/``[2n, n]`` factors:
the dynamics, ``UW``, ``‖U‖``, ``‖W‖`` and ``‖Δ‖_F`` are exactly those of the wide net.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from noetherflow.experiments._base import Claim, Op, derive_seed, parallel_map, save_figure
from noetherflow.experiments.fig2 import (
    measured_norm_ratio,
    predicted_norm_ratio,
    train_two_layer,
    xavier_init,
)

DESCRIPTION = (
    "Matrix factorisation reaches the Thm 5.2 noise equilibrium for every learning rate, "
    "data dimension and batch size."
)

_DTYPE = torch.float64
PANELS = ("lr", "dim", "batch")


@dataclass(frozen=True)
class Config:
    """Settings of the Fig. 8 experiment.

    Choices and why:

    - ``phi_x=0.5``: Σ_x = diag(0.5, …, 1.5); anisotropic, so the Thm 5.2 equilibrium differs
      from the balanced one GD would keep. ``Σ_ε = I``.
    - Loss ``‖UWx − y‖²`` summed over outputs (paper eq. 12), minibatch mean, no weight decay.
      With this loss the paper's η = 0.1 diverges; with the output-averaged loss η = 0.1 is
      η = 0.001 here, stable but ~100× slower to equilibrate (charges relax at
      ~4η²Tr[Σ_ε]/S per step). We take ``lr=0.01`` as the centre and sweep ``lrs``
      (0.005–0.02, all stable).
    - ``dims``: d_x = d_y ∈ {25, 50, 75, 100} (centre 100, as in the paper); hidden width
      ``hidden=2000`` throughout (exactly reduced to 2n, see the module docstring).
    - ``batch_sizes``: S ∈ {25, 50, 100, 200} (centre 100).
    - Steps: the relaxation time of the charges scales as S/(η² n), so every setting runs
      ``base_steps · (S/S₀)(η₀/η)²(n₀/n)`` steps (``base_steps=12000`` at the centre), and
      over the last ``decay_frac=0.4`` of them the lr decays geometrically to
      ``lr · lr_final_factor`` (0.1): at constant η the instantaneous Δ fluctuates at ~0.1
      relative (η/S noise); the decay removes that fluctuation while the equilibrium is held.
    - Measured (seed 0): worst final relative distance 0.063 (full, S = 25; all others
      0.032–0.052) and 0.064 (quick); ‖W‖²/‖U‖² within 2.7% of the Thm 5.2 value.
    - ``init_scale=0.1`` × Xavier: a small init keeps the components of W outside U's row
      space (which only the noise removes, slowly) small at the wide width.
    """

    phi_x: float = 0.5
    lr: float = 0.01
    batch_size: int = 100
    dim: int = 100
    hidden: int = 2000
    lrs: tuple[float, ...] = (0.005, 0.01, 0.015, 0.02)
    dims: tuple[int, ...] = (25, 50, 75, 100)
    batch_sizes: tuple[int, ...] = (25, 50, 100, 200)
    base_steps: int = 12000
    lr_final_factor: float = 0.05
    decay_frac: float = 0.5
    min_steps_frac: float = 1.0
    init_scale: float = 0.1
    n_records: int = 200

    @classmethod
    def quick(cls) -> Config:
        """d = 20 (hidden 200): stability allows a 4× larger lr, so fewer, cheaper steps."""
        return cls(lr=0.04, dim=20, hidden=200, lrs=(0.03, 0.04, 0.06, 0.08),
                   dims=(12, 14, 17, 20), base_steps=4000)  # fmt: skip


def settings(cfg: Config) -> list[tuple[str, float, float, int, int]]:
    """(panel, swept value, lr, batch size, dim) for every run of the three panels."""
    out: list[tuple[str, float, float, int, int]] = []
    out += [("lr", float(v), float(v), cfg.batch_size, cfg.dim) for v in cfg.lrs]
    out += [("dim", float(v), cfg.lr, cfg.batch_size, int(v)) for v in cfg.dims]
    out += [("batch", float(v), cfg.lr, int(v), cfg.dim) for v in cfg.batch_sizes]
    return out


def n_steps(cfg: Config, lr: float, batch: int, dim: int) -> int:
    scale = (batch / cfg.batch_size) * (cfg.lr / lr) ** 2 * (cfg.dim / dim)
    return math.ceil(cfg.base_steps * max(scale, cfg.min_steps_frac))


def _run_setting(cfg: Config, seed: int, item: tuple[float, int, int]) -> dict[str, Any]:
    lr, batch, dim = item
    U0, W0 = xavier_init(
        dim, cfg.hidden, dim, scale=cfg.init_scale, seed=derive_seed(seed, "init", dim)
    )
    basis, _ = torch.linalg.qr(torch.cat([U0.T, W0], dim=1))  # [hidden, ≤2n], exact span
    Ur, Wr = (U0 @ basis)[None], (basis.T @ W0)[None]
    half = dim // 2
    sx = torch.full((dim,), 2.0 - cfg.phi_x, dtype=_DTYPE)
    sx[:half] = cfg.phi_x
    se = torch.ones(1, dim, dtype=_DTYPE)
    steps = n_steps(cfg, lr, batch, dim)
    res = train_two_layer(
        Ur, Wr, sx, se, lr=lr, batch_size=batch, steps=steps,
        record_every=max(1, steps // cfg.n_records), seed=derive_seed(seed, "sgd", item),
        lr_final=lr * cfg.lr_final_factor, decay_frac=cfg.decay_frac,
    )  # fmt: skip
    ratio = float(measured_norm_ratio(res.U, res.W)[0])
    ratio_pred = float(predicted_norm_ratio(res.U, res.W, sx, se)[0])
    return {
        "step": res.step,
        "rel_err": res.rel_err[0],
        "loss_excess": res.loss[0] - dim,
        "final_rel_err": float(res.rel_err[0, -1]) if not res.diverged else math.inf,
        "ratio": ratio,
        "ratio_pred": ratio_pred,
        "steps": steps,
        "diverged": res.diverged,
    }


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """One SGD run per setting of the three sweeps (in parallel when the harness allows)."""
    runs = settings(cfg)
    items = list(dict.fromkeys((lr, batch, dim) for _, _, lr, batch, dim in runs))
    done = dict(zip(items, parallel_map(functools.partial(_run_setting, cfg, seed), items),
                    strict=True))  # fmt: skip
    outs = [done[(lr, batch, dim)] for _, _, lr, batch, dim in runs]
    series: dict[str, Any] = {}
    table = []
    for (panel, value, lr, batch, dim), o in zip(runs, outs, strict=True):
        key = f"{panel}={value:g}"
        series[key] = {"step": o["step"], "rel_err": o["rel_err"], "loss_excess": o["loss_excess"]}
        table.append(
            {"panel": panel, "value": value, "lr": lr, "batch_size": batch, "dim": dim,
             "steps": o["steps"], "final_rel_err": o["final_rel_err"], "norm_ratio": o["ratio"],
             "norm_ratio_pred": o["ratio_pred"], "diverged": o["diverged"]}
        )  # fmt: skip
    finals = np.array([r["final_rel_err"] for r in table])
    ratio_dev = np.array([abs(r["norm_ratio"] / r["norm_ratio_pred"] - 1.0) for r in table])
    return {
        "series": series,
        "runs": table,
        "worst_final_rel_err": float(np.max(finals)),
        "worst_setting": table[int(np.argmax(finals))],
        "max_norm_ratio_rel_dev": float(np.max(ratio_dev)),
        "any_diverged": bool(any(r["diverged"] for r in table)),
    }


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    w = results["worst_setting"]
    return [
        Claim(
            id="all_converge",
            statement="For every η, d and S of the sweep, SGD ends at the Thm 5.2 noise "
            "equilibrium (max over settings of ‖UᵀΓ_UU − WΓ_WWᵀ‖_F / ‖WΓ_WWᵀ‖_F)",
            value=results["worst_final_rel_err"],
            op=Op.LT,
            threshold=0.1,
            note=f"worst: {w['panel']} = {w['value']:g}; max |ratio/ratio_pred − 1| of "
            f"‖W‖²/‖U‖² = {results['max_norm_ratio_rel_dev']:.3g}",
        )
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s = results["series"]
    fig = Figure(figsize=(15, 4.5))
    axes = fig.subplots(1, 3, sharey=True)
    titles = {"lr": "learning rate η", "dim": "data dimension d_x = d_y", "batch": "batch size S"}
    for ax, panel in zip(axes, PANELS, strict=True):
        for k, r in enumerate(x for x in results["runs"] if x["panel"] == panel):
            ser = s[f"{panel}={r['value']:g}"]
            ax.semilogy(
                np.asarray(ser["step"]), np.asarray(ser["rel_err"]), color=f"C{k}",
                label=f"{titles[panel].split()[-1]} = {r['value']:g}",
            )  # fmt: skip
        ax.axhline(0.1, color="k", ls=":", lw=0.8)
        ax.set_xlabel("step")
        ax.set_title(f"varying {titles[panel]}")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("‖UᵀΓ_UU − WΓ_WWᵀ‖_F / ‖WΓ_WWᵀ‖_F")
    fig.tight_layout()
    return [save_figure(fig, out_dir / "fig8.png")]
