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

from noetherflow.experiments._base import Claim, Kind, Op, derive_seed, parallel_map, save_figure
from noetherflow.experiments._claims import over_seeds
from noetherflow.experiments._two_layer import (
    library_flow_check,
    measured_norm_ratio,
    predicted_norm_ratio,
    train_two_layer,
    xavier_init,
)

DESCRIPTION = (
    "Matrix factorisation reaches the Thm 5.2 noise equilibrium for every learning rate, "
    "data dimension and batch size."
)

PAPER = (
    "Fig. 8 (App. A.2–A.3): matrix factorisation converges to the noise equilibrium of "
    "Thm 5.2 robustly across learning rates, data dimensions d_x = d_y and batch sizes "
    "(x_{1:50} ~ N(0, φ_x), x_{51:100} ~ N(0, 2 − φ_x), Σ_ε = I; η = 0.1, S = 100, d = 2000)."
)
PAPER_ORDER = 8.0

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
      over the last ``decay_frac=0.5`` of them the lr decays geometrically to
      ``lr · lr_final_factor`` (0.05): at constant η the instantaneous Δ fluctuates at ~0.1
      relative (η/S noise); the decay removes that fluctuation while the equilibrium is held.
      (An earlier version of this docstring said 0.4 and 0.1; the values used, here and in
      the measurements below, are those of the fields: 0.5 and 0.05.)
    - The paper's protocol (constant η, no decay) runs too, for every setting and the same
      number of steps; its claim averages the relative distance over the records after a
      burn-in of ``burn_in_frac=0.5`` of the steps (one seed per setting: 12 settings).
    - Measured (seed 0): worst final relative distance 0.063 (full, S = 25; all others
      0.032–0.052) and 0.064 (quick); ‖W‖²/‖U‖² within 2.7% of the Thm 5.2 value.
    - ``n_eval=4000`` fresh samples for the library's statistics at the centre setting.
    - ``init_scale=0.1`` × Xavier: a small init keeps the components of W outside U's row
      space (which only the noise removes, slowly) small at the wide width.
    - ``n_seeds=3`` independent replicates per setting (own init, own minibatch stream),
      trained together along the run axis. Each claim's statistic is computed per seed as
      before (max over the 12 settings) and the claim's value is its mean over the seeds;
      the note gives every seed's value and the spread. (Until this round: one seed per
      setting; the seed-0 numbers above are from then.)
    - ``dtype="float32"`` for training (as in Fig. 3): the runs are matmul- and
      sampling-bound, float32 is ~2× faster, which pays for the three seeds; its round-off
      (1e-7 relative) is far below the 0.1 thresholds. The library check at the centre, the
      norm ratios and the predictions run in float64 on the final weights.
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
    burn_in_frac: float = 0.5
    n_eval: int = 4000
    n_seeds: int = 3
    dtype: str = "float32"

    @classmethod
    def quick(cls) -> Config:
        """d = 20 (hidden 200): stability allows a 4× larger lr, so fewer, cheaper steps."""
        return cls(
            lr=0.04,
            dim=20,
            hidden=200,
            lrs=(0.03, 0.04, 0.06, 0.08),
            dims=(12, 14, 17, 20),
            base_steps=4000,
        )


def setup(cfg: Config) -> list[dict[str, str]]:
    """Deviations from the paper's setup (App. A.2, Fig. 8), one row each."""
    full = Config()
    rows = [
        {
            "quantity": "η",
            "paper": "0.1 (sweep around it)",
            "ours": f"{cfg.lr:g} (sweep {', '.join(f'{v:g}' for v in cfg.lrs)})",
            "why": "η = 0.1 diverges with the summed loss of eq. 12",
        },
        {
            "quantity": "schedule",
            "paper": "constant η",
            "ours": (
                "constant (paper's protocol claim) and, separately, annealed: geometric decay "
                f"to {cfg.lr_final_factor:g}·η over the last {cfg.decay_frac:.0%}"
            ),
            "why": "the annealed variant removes the η/S fluctuation (labelled claim)",
        },
        {
            "quantity": "d_x = d_y",
            "paper": "100 (sweep)",
            "ours": f"{cfg.dim} (sweep {', '.join(str(v) for v in cfg.dims)})",
            "why": "the paper's sizes" if cfg.dim == full.dim else "quick mode",
        },
        {
            "quantity": "hidden width",
            "paper": "2000",
            "ours": f"{cfg.hidden}, trained exactly in the ≤ 2n-dimensional span of the init",
            "why": "the same dynamics at a fraction of the cost",
        },
        {
            "quantity": "steps",
            "paper": "not stated",
            "ours": f"{cfg.base_steps} at the centre, scaled by (S/S₀)(η₀/η)²(n₀/n)",
            "why": "the relaxation time of the charges scales so",
        },
        {
            "quantity": "label noise",
            "paper": "y = x (text) / Σ_ε = I (caption)",
            "ours": "y = x + ε, Σ_ε = I",
            "why": "the caption's setting; without noise Γ = 0",
        },
        {
            "quantity": "φ_x",
            "paper": "not stated for Fig. 8",
            "ours": f"{cfg.phi_x:g}",
            "why": "anisotropic, so the equilibrium is not the balanced solution",
        },
        {
            "quantity": "init",
            "paper": "not stated",
            "ours": f"{cfg.init_scale:g} × Xavier",
            "why": "keeps the part of W outside U's row space small at the wide width",
        },
        {
            "quantity": "seeds",
            "paper": "one run per setting",
            "ours": f"{cfg.n_seeds} seeds per setting (own init and minibatches)",
            "why": "claims: mean over seeds of the per-seed worst setting; spread in the notes",
        },
        {
            "quantity": "precision",
            "paper": "-",
            "ours": f"training {cfg.dtype}, library check and predictions float64",
            "why": "~2× faster (pays for the seeds); round-off far below the thresholds",
        },
    ]
    if cfg != full:
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "-",
                "ours": f"d = {cfg.dim}, width {cfg.hidden}, η = {cfg.lr:g}, "
                f"{cfg.base_steps} base steps",
                "why": "a smaller net allows a 4× larger stable η",
            }
        )
    return rows


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


def _run_setting(cfg: Config, seed: int, item: tuple[float, int, int, bool]) -> dict[str, Any]:
    """Train ``cfg.n_seeds`` replicates of one setting along the run axis (own inits; the
    minibatches of the runs are independent draws of one stream)."""
    lr, batch, dim, constant = item
    dt = getattr(torch, cfg.dtype)
    Ur, Wr = [], []
    for j in range(cfg.n_seeds):
        U0, W0 = xavier_init(
            dim, cfg.hidden, dim, scale=cfg.init_scale, seed=derive_seed(seed, "init", dim, j)
        )
        basis, _ = torch.linalg.qr(torch.cat([U0.T, W0], dim=1))  # [hidden, ≤2n], exact span
        Ur.append(U0 @ basis)
        Wr.append(basis.T @ W0)
    half = dim // 2
    sx = torch.full((dim,), 2.0 - cfg.phi_x, dtype=_DTYPE)
    sx[:half] = cfg.phi_x
    se = torch.ones(cfg.n_seeds, dim, dtype=_DTYPE)
    steps = n_steps(cfg, lr, batch, dim)
    # the annealed runs keep their seeds; the constant-η runs get their own streams
    key = (lr, batch, dim) if not constant else (lr, batch, dim, "constant")
    res = train_two_layer(
        torch.stack(Ur).to(dt),
        torch.stack(Wr).to(dt),
        sx.to(dt),
        se.to(dt),
        lr=lr,
        batch_size=batch,
        steps=steps,
        record_every=max(1, steps // cfg.n_records),
        seed=derive_seed(seed, "sgd", key),
        lr_final=None if constant else lr * cfg.lr_final_factor,
        decay_frac=cfg.decay_frac,
        average_from=math.ceil(cfg.burn_in_frac * steps) if constant else None,
    )
    U, W = res.U.to(_DTYPE), res.W.to(_DTYPE)
    window = res.step >= cfg.burn_in_frac * steps
    lib: dict[str, float] = {}
    if not constant and (lr, batch, dim) == (cfg.lr, cfg.batch_size, cfg.dim):
        # the centre setting (seed 0): the library's rotation flow against theory's Γ (fig2)
        lib = library_flow_check(
            U[0],
            W[0],
            sx,
            se[0],
            lr=lr,
            batch_size=batch,
            n_eval=cfg.n_eval,
            seed=derive_seed(seed, "eval", key),
        )
    bad = np.full(cfg.n_seeds, math.inf)
    bias = bad
    if res.delta_mean is not None and res.wgw_norm_mean is not None and not res.diverged:
        # the paper's quantity: the balance of the time-averaged charges (O(η) bias)
        bias = np.linalg.norm(res.delta_mean, axis=(-2, -1)) / res.wgw_norm_mean
    return {
        "step": res.step,
        "rel_err": res.rel_err,  # [n_seeds, T]
        "loss_excess": res.loss - dim,
        "final_rel_err": res.rel_err[:, -1] if not res.diverged else bad,
        # diagnostic: the mean of the instantaneous ‖Δ‖ (the parameters' own O(√η) noise)
        "time_avg_rel_err": res.rel_err[:, window].mean(axis=1) if not res.diverged else bad,
        "balance_bias": bias,  # [n_seeds] ‖⟨Δ⟩‖ / ⟨‖WΓ_WWᵀ‖⟩ (constant runs only)
        "ratio": measured_norm_ratio(U, W),
        "ratio_pred": predicted_norm_ratio(U, W, sx, se),
        "steps": steps,
        "diverged": res.diverged,
        "library": lib,
    }


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """``n_seeds`` SGD runs per setting of the three sweeps (settings in parallel when the
    harness allows). Per-seed arrays have the seeds along their first axis."""
    runs = settings(cfg)
    base = list(dict.fromkeys((lr, batch, dim) for _, _, lr, batch, dim in runs))
    items = [(*b, False) for b in base] + [(*b, True) for b in base]
    done = dict(
        zip(items, parallel_map(functools.partial(_run_setting, cfg, seed), items), strict=True)
    )
    outs = [done[(lr, batch, dim, False)] for _, _, lr, batch, dim in runs]
    consts = [done[(lr, batch, dim, True)] for _, _, lr, batch, dim in runs]
    series: dict[str, Any] = {}
    table = []
    for (panel, value, lr, batch, dim), o, c in zip(runs, outs, consts, strict=True):
        key = f"{panel}={value:g}"
        series[key] = {
            "step": o["step"],
            "rel_err": o["rel_err"].mean(axis=0),
            "loss_excess": o["loss_excess"].mean(axis=0),
            "constant_step": c["step"],
            "constant_rel_err": c["rel_err"].mean(axis=0),
        }
        table.append(
            {
                "panel": panel,
                "value": value,
                "lr": lr,
                "batch_size": batch,
                "dim": dim,
                "steps": o["steps"],
                "final_rel_err": o["final_rel_err"],
                "norm_ratio": o["ratio"],
                "norm_ratio_pred": o["ratio_pred"],
                "diverged": o["diverged"],
                "constant_time_avg_rel_err": c["time_avg_rel_err"],
                "constant_balance_bias": c["balance_bias"],
                "constant_diverged": c["diverged"],
            }
        )
    const_avg = np.stack([r["constant_time_avg_rel_err"] for r in table])  # [settings, seeds]
    const_bias = np.stack([r["constant_balance_bias"] for r in table])  # [settings, seeds]
    finals = np.stack([r["final_rel_err"] for r in table])
    ratio_dev = np.stack([np.abs(r["norm_ratio"] / r["norm_ratio_pred"] - 1.0) for r in table])
    return {
        "series": series,
        "runs": table,
        "worst_final_rel_err_per_seed": finals.max(axis=0),
        "worst_setting_per_seed": [_label(table[i]) for i in finals.argmax(axis=0)],
        "max_norm_ratio_rel_dev": float(np.max(ratio_dev)),
        "any_diverged": bool(any(r["diverged"] for r in table)),
        "constant_worst_time_avg_rel_err_per_seed": const_avg.max(axis=0),
        "constant_worst_setting_per_seed": [_label(table[i]) for i in const_avg.argmax(axis=0)],
        "constant_worst_bias_per_seed": const_bias.max(axis=0),
        "constant_worst_bias_setting_per_seed": [
            _label(table[i]) for i in const_bias.argmax(axis=0)
        ],
        "constant_any_diverged": bool(any(r["constant_diverged"] for r in table)),
        "library_centre": done[(cfg.lr, cfg.batch_size, cfg.dim, False)]["library"],
    }


def _label(row: dict[str, Any]) -> str:
    return f"{row['panel']} = {row['value']:g}"


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    const = over_seeds(results["constant_worst_time_avg_rel_err_per_seed"])
    bias = over_seeds(results["constant_worst_bias_per_seed"])
    worst_b = ", ".join(results["constant_worst_bias_setting_per_seed"])
    final = over_seeds(results["worst_final_rel_err_per_seed"])
    vals = np.sort(
        np.concatenate(
            [np.asarray(r["constant_time_avg_rel_err"], dtype=float) for r in results["runs"]]
        )
    )
    worst_c = ", ".join(results["constant_worst_setting_per_seed"])
    return [
        Claim(
            id="all_converge_bias_constant_lr",
            statement="The paper's protocol (constant η): for every η, d and S of the sweep "
            "SGD's stationary state is the Thm 5.2 noise equilibrium up to an O(η) bias: "
            "‖⟨UᵀΓ_UU − WΓ_WWᵀ⟩‖_F / ⟨‖WΓ_WWᵀ‖_F⟩, time-averaged over the stationary window, "
            "max over settings (per seed; value: mean over seeds)",
            value=bias.mean,
            op=Op.LT,
            threshold=0.1,
            note=f"{bias.note()}; window: records after {cfg.burn_in_frac:.0%} of each run's "
            f"steps; worst setting per seed: {worst_b}. Diagnostic (not the claim): the time "
            "average of the instantaneous ‖Δ‖_F / ‖WΓ_WWᵀ‖_F, which measures the parameters' own "
            f"O(√η) fluctuation, {const.note()} (worst setting per seed: {worst_c}; over all "
            f"{len(vals)} (setting, seed) runs {vals[0]:.3g}–{vals[-1]:.3g})"
            + ("; a constant-η run diverged" if results["constant_any_diverged"] else ""),
            why=f"the balance of the time-averaged charges is off by {bias.mean:.3g} in the "
            f"worst setting ({worst_b}; threshold 0.1)",
        ),
        Claim(
            id="library_flow_matches_theory",
            kind=Kind.BEYOND,
            statement="At the centre setting, the library's rotation flow (nf.collect_stats + "
            "nf.noether_flow on the nn.Module at the end of SGD, fresh samples) equals the "
            "oracle −(4η/S)Δ from theory's sample Γ (relative Frobenius difference, float64)",
            value=results["library_centre"].get("flow_vs_theory", float("nan")),
            op=Op.LT,
            threshold=1e-8,
            note="seed 0 (an exact identity, not a statistic); the library's balance error on "
            f"the sample: {results['library_centre'].get('library_rel_err', float('nan')):.3g} "
            f"({cfg.n_eval} samples)",
        ),
        Claim(
            id="all_converge",
            statement="Annealed η (ours, not the paper's protocol: constant, then a geometric "
            "decay to η/20 over the second half): for every η, d and S of the sweep, SGD ends at "
            "the Thm 5.2 noise equilibrium (max over settings of ‖UᵀΓ_UU − WΓ_WWᵀ‖_F / "
            "‖WΓ_WWᵀ‖_F per seed; value: mean over seeds)",
            value=final.mean,
            op=Op.LT,
            threshold=0.1,
            note=f"{final.note()}; worst setting per seed: "
            f"{', '.join(results['worst_setting_per_seed'])}; max |ratio/ratio_pred − 1| of "
            f"‖W‖²/‖U‖² over settings and seeds = {results['max_norm_ratio_rel_dev']:.3g}",
        ),
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
                np.asarray(ser["step"]),
                np.asarray(ser["rel_err"]),
                color=f"C{k}",
                label=f"{titles[panel].split()[-1]} = {r['value']:g}",
            )
            if "constant_rel_err" in ser:
                ax.semilogy(
                    np.asarray(ser["constant_step"]),
                    np.asarray(ser["constant_rel_err"]),
                    color=f"C{k}",
                    lw=0.6,
                    alpha=0.5,
                )
        ax.axhline(0.1, color="k", ls=":", lw=0.8)
        ax.set_xlabel("step")
        ax.set_title(f"varying {titles[panel]} (thin: constant η; mean of {cfg.n_seeds} seeds)")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("‖UᵀΓ_UU − WΓ_WWᵀ‖_F / ‖WΓ_WWᵀ‖_F")
    fig.tight_layout()
    return [save_figure(fig, out_dir / "fig8.png")]
