"""§4.2, "Time Scales": the fast- and the slow-equilibrium phases of learning.

The paper: the dynamics of SGD split into risk minimisation, whose time scale ``t_erm`` is
independent of σ² in expectation, and the motion along the degenerate direction (eq. 5),
whose time scale ``t_equi`` depends on σ². With σ² large the parameters reach the noise
equilibrium early, while the risk is still being minimised (fast-equilibrium phase); with
σ² ≪ 1 the charge barely moves during risk minimisation and the degenerate direction only
takes off once the model is at a minimum (slow-equilibrium phase).

Model (ours; the paper states the phases for any exponential symmetry): a linear neuron
plus one slow linear feature, ``f(x, z) = u·wᵀx + b·z`` with ``x ~ N(0, I_d)``,
``z ~ N(0, v)`` independent, ``y = pᵀx + b*·z + σ_ε ε``, per-sample loss ``(f − y)²``, fresh
samples every step (online SGD), no weight decay. The neuron's rescaling ``w → e^λ w,
u → e^{−λ}u`` (``A = diag(I_d, −1)``, ``C = ‖w‖² − u²``) is the symmetry; ``b`` is the slow
part of the risk (``E[b]`` follows gradient descent exactly, ``t_erm ≈ ln 10/(2v)``).

Closed forms at the minimum ``uw = p, b = b*`` (residual ``σ_ε ε``, independent of x):
``Tr Σ_w = 4σ_ε²u²d``, ``Tr Σ_u = 4σ_ε²‖w‖²``, so the noise equilibrium has ``‖w*‖² = ‖p‖√d``,
``u*² = ‖p‖/√d``, ``C*_∞ = ‖p‖(√d − 1/√d)``, and the linear relaxation rate of C is
``r = (η/S)·Tr[ΣA²]/θ*ᵀA²θ* = (η/S)·8σ_ε²d/(d + 1)`` (``t_equi = 1/r``, the library's factor
(η/S)Tr[ΣA], docs/concepts/flow.md). Time is SGF time ``t = η·steps``; σ² = η/(2S) is
varied through S at fixed η.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments._base import Claim, derive_seed, save_figure

DESCRIPTION = (
    "§4.2's two phases: with σ² large the charge equilibrates while the risk is still being "
    "minimised; with σ² small it stays put until the minimum, then takes off."
)
PAPER = (
    "§4.2, Time Scales: t_erm is independent of σ² in expectation; when σ² is large the "
    "parameters stay close to the equilibrium early in training (fast-equilibrium phase); "
    "when σ² ≪ 1 the dynamics in the degenerate direction only take off once the model has "
    "reached a local minimum (slow-equilibrium phase)."
)
PAPER_ORDER = 4.21


@dataclass(frozen=True)
class Config:
    """Settings of ``phases`` (the paper gives none; all ours).

    - ``d = 4``, ``p = e₁`` (‖p‖ = 1), label noise ``σ_ε = 1``, slow feature variance
      ``v = 0.025`` with target ``b* = 1`` from ``b₀ = 0``: GD's ``t_erm`` (``|E b − b*|`` down
      to ``erm_level = 0.1`` of its start, i.e. 1% of the slow part's excess risk) is 46.
    - ``lr = 0.03`` for both phases; ``fast_batch = 1`` (t_equi ≈ 5.2 ≪ t_erm) and
      ``slow_batch = 128`` (t_equi ≈ 670 ≫ t_erm): σ² differs 128×.
    - start: the neuron on its function minimum ``uw = p`` but ``lam0 = −0.5`` along the orbit
      from the noise equilibrium (C(0) = −0.62 against C*_∞ = 1.5), near the linear regime.
    - charges and ``b`` are chain means over ``fast_chains`` / ``slow_chains`` independent
      chains (quick 1024 / 6; at S = 1 the mean of b needs many chains, notes); the progress
      ``f(t) = (C(t) − C(0))/(C*_∞ − C(0))`` is the share of the way to the equilibrium.
    - runs: the fast one to ``t_erm``; the slow one to ``t_erm + takeoff_equi·t_equi``.
    - thresholds (fixed before the first run, notes/phases.md): t_erm within
      ``erm_tol = 0.1`` of GD's for both S; fast phase ``f(t_erm/2) > fast_min = 0.9``; slow
      phase ``f(t_erm) < frozen_max = 0.1`` and ``f(t_erm + t_equi) > takeoff_min = 0.5``
      (the linear relaxation predicts 0.07 and 0.66).
    """

    d_in: int = 4
    teacher_norm: float = 1.0
    noise_std: float = 1.0
    slow_var: float = 0.025
    b_target: float = 1.0
    lr: float = 0.03
    fast_batch: int = 1
    slow_batch: int = 128
    lam0: float = -0.5
    fast_chains: int = 1024
    slow_chains: int = 16
    erm_level: float = 0.1
    takeoff_equi: float = 1.0
    erm_tol: float = 0.1
    fast_min: float = 0.9
    frozen_max: float = 0.1
    takeoff_min: float = 0.5
    separation_min: float = 5.0

    @classmethod
    def quick(cls) -> Config:
        """Six slow chains (same sizes, steps, fast chains and thresholds)."""
        return cls(slow_chains=6)


def setup(cfg: Config) -> list[dict[str, str]]:
    """Every deviation from the paper's setup, one row each."""
    rows = [
        {
            "quantity": "model and data",
            "paper": "general (any exponential symmetry)",
            "ours": f"linear neuron u·wᵀx (d = {cfg.d_in}) plus a slow feature b·z, "
            f"Var z = {cfg.slow_var:g}; Gaussian data, label noise {cfg.noise_std:g}, fresh "
            "samples each step",
            "why": "closed forms for C*, t_equi and t_erm; a slow risk direction separates "
            "the time scales without a saddle",
        },
        {
            "quantity": "time",
            "paper": "SGF, σ² = η/(2S)",
            "ours": "discrete SGD, t = η·steps; rates with the library's (η/S)Tr[ΣA]",
            "why": "eq. 7's factor 2 (docs/concepts/flow.md)",
        },
        {
            "quantity": "σ² large / small",
            "paper": "not given",
            "ours": f"η = {cfg.lr:g}, S = {cfg.fast_batch} (fast) and S = {cfg.slow_batch} (slow)",
            "why": "t_equi/t_erm ≈ 0.1 and ≈ 15",
        },
        {
            "quantity": "t_erm",
            "paper": "time scale of risk minimisation",
            "ours": f"first time |E b − b*| ≤ {cfg.erm_level:g}·|b₀ − b*| (chain mean)",
            "why": "the risk's slow direction; 'in expectation' as the paper says",
        },
        {
            "quantity": "chains",
            "paper": "—",
            "ours": f"{cfg.fast_chains} fast, {cfg.slow_chains} slow (full "
            f"{Config().fast_chains}, {Config().slow_chains})",
            "why": "cost",
        },
    ]
    if cfg != Config():
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "—",
                "ours": f"{cfg.slow_chains} slow chains (full {Config().slow_chains})",
                "why": "time; same thresholds",
            }
        )
    return rows


def equilibrium(cfg: Config) -> dict[str, float]:
    """Closed forms at the minimum: θ* on the orbit, C*_∞, and t_equi for both batch sizes."""
    d, p, s2 = cfg.d_in, cfg.teacher_norm, cfg.noise_std**2
    w2, u2 = p * math.sqrt(d), p / math.sqrt(d)
    rate_coeff = 8.0 * s2 * d / (d + 1.0)  # Tr[ΣA²]/θ*ᵀA²θ*
    return {
        "w_star_sq": w2,
        "u_star_sq": u2,
        "charge_star": w2 - u2,
        "rate_coeff": rate_coeff,
        "t_equi_fast": cfg.fast_batch / (cfg.lr * rate_coeff),
        "t_equi_slow": cfg.slow_batch / (cfg.lr * rate_coeff),
        "t_erm_gd": cfg.lr
        * math.log(1.0 / cfg.erm_level)
        / -math.log1p(-2.0 * cfg.lr * cfg.slow_var),
    }


def start_point(cfg: Config) -> tuple[float, np.ndarray]:
    """``(u₀, w₀) = e^{λ₀A}θ*``: on the function minimum, ``lam0`` from the equilibrium."""
    eq = equilibrium(cfg)
    w = np.zeros(cfg.d_in)
    w[0] = math.sqrt(eq["w_star_sq"]) * math.exp(cfg.lam0)
    return math.sqrt(eq["u_star_sq"]) * math.exp(-cfg.lam0), w


def simulate(
    cfg: Config, seed: int, batch_size: int, n_steps: int, n_chains: int
) -> dict[str, np.ndarray]:
    """Online SGD chains; chain means of C and b at every step.

    Returns ``{"charge": [n_steps + 1], "b": [n_steps + 1]}`` (means over ``n_chains``).
    """
    c, d, s, eta = n_chains, cfg.d_in, batch_size, cfg.lr
    u0, w0 = start_point(cfg)
    u = np.full(c, u0)
    w = np.tile(w0, (c, 1))
    b = np.zeros(c)
    p = np.zeros(d)
    p[0] = cfg.teacher_norm
    sz = math.sqrt(cfg.slow_var)
    rng = np.random.default_rng(derive_seed(seed, "phases", batch_size))
    charge = np.empty(n_steps + 1)
    b_mean = np.empty(n_steps + 1)
    block = max(1, 200_000 // (c * s))
    k = 0
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging chain is data
        while k <= n_steps:
            m = min(block, n_steps + 1 - k)
            x = rng.standard_normal((m, c, s, d))
            z = sz * rng.standard_normal((m, c, s))
            eps = rng.standard_normal((m, c, s))
            for j in range(m):
                charge[k] = float(np.mean((w * w).sum(1) - u * u))
                b_mean[k] = float(np.mean(b))
                if k == n_steps:
                    k += 1
                    break
                xj, zj = x[j], z[j]
                h = np.einsum("csd,cd->cs", xj, w)
                y = xj @ p + cfg.b_target * zj + cfg.noise_std * eps[j]
                r = u[:, None] * h + b[:, None] * zj - y  # [c, s]
                g_w = 2.0 * np.einsum("cs,csd->cd", r, xj) * u[:, None] / s
                g_u = 2.0 * (r * h).mean(1)
                g_b = 2.0 * (r * zj).mean(1)
                w, u, b = w - eta * g_w, u - eta * g_u, b - eta * g_b
                k += 1
    return {"charge": charge, "b": b_mean}


def crossing_time(t: np.ndarray, err: np.ndarray, level: float) -> float:
    """First time ``err(t)`` falls to ``level`` (linear interpolation); NaN if it never does."""
    below = np.nonzero(err <= level)[0]
    if below.size == 0:
        return math.nan
    k = int(below[0])
    if k == 0:
        return float(t[0])
    e0, e1 = err[k - 1], err[k]
    return float(t[k - 1] + (e0 - level) / (e0 - e1) * (t[k] - t[k - 1]))


def fitted_erm_time(t: np.ndarray, err: np.ndarray, t_fit: float, level: float) -> float:
    """``ln(1/level)/k``, k the least-squares decay rate of ``ln err`` over ``t ≤ t_fit``.

    ``err = |E b − b*|/|b*|`` decays as ``e^{−kt}`` in expectation; the first crossing of
    ``level`` by a chain mean is biased early by its fluctuations (notes/phases.md), the fit
    uses the whole window. ``t``, ``err``: [n]. NaN if fewer than two positive points.
    """
    keep = (t <= t_fit) & (err > 0)
    if keep.sum() < 2:
        return math.nan
    slope = float(np.polyfit(t[keep], np.log(err[keep]), 1)[0])
    return math.log(1.0 / level) / -slope if slope < 0 else math.nan


def _progress(charge: np.ndarray, target: float) -> np.ndarray:
    return (charge - charge[0]) / (target - charge[0])


def _at(t: np.ndarray, y: np.ndarray, when: float) -> float:
    return float(np.interp(when, t, y)) if when <= t[-1] else math.nan


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """GD's t_erm, the fast and the slow SGD runs, and the progress of C at the checkpoints."""
    eq = equilibrium(cfg)
    t_erm_gd = eq["t_erm_gd"]
    n_fast = math.ceil(1.2 * t_erm_gd / cfg.lr)
    n_slow = math.ceil((1.2 * t_erm_gd + cfg.takeoff_equi * eq["t_equi_slow"]) / cfg.lr)
    series: dict[str, Any] = {}
    out: dict[str, Any] = {"equilibrium": eq}
    phases = (
        ("fast", cfg.fast_batch, n_fast, cfg.fast_chains),
        ("slow", cfg.slow_batch, n_slow, cfg.slow_chains),
    )
    for name, size, n, chains in phases:
        sim = simulate(cfg, seed, size, n, chains)
        t = cfg.lr * np.arange(n + 1)
        err = np.abs(sim["b"] - cfg.b_target) / cfg.b_target
        t_erm = fitted_erm_time(t, err, t_erm_gd, cfg.erm_level)
        t_erm_first = crossing_time(t, err, cfg.erm_level)
        prog = _progress(sim["charge"], eq["charge_star"])
        stride = max(1, n // 400)
        series[f"{name}_t"] = t[::stride]
        series[f"{name}_progress"] = prog[::stride]
        series[f"{name}_b_error"] = err[::stride]
        out[name] = {
            "batch_size": size,
            "t_erm": t_erm,
            "t_erm_over_gd": t_erm / t_erm_gd,
            "t_erm_first_crossing_over_gd": t_erm_first / t_erm_gd,
            "progress_half_erm": _at(t, prog, 0.5 * t_erm_gd),
            "progress_erm": _at(t, prog, t_erm_gd),
            "progress_takeoff": _at(t, prog, t_erm_gd + cfg.takeoff_equi * eq["t_equi_slow"]),
            "charge_end": float(sim["charge"][-1]),
        }
    r_fast, r_slow = 1.0 / eq["t_equi_fast"], 1.0 / eq["t_equi_slow"]
    out["linear_prediction"] = {
        "fast_half_erm": 1.0 - math.exp(-0.5 * t_erm_gd * r_fast),
        "slow_erm": 1.0 - math.exp(-t_erm_gd * r_slow),
        "slow_takeoff": 1.0 - math.exp(-(t_erm_gd * r_slow + cfg.takeoff_equi)),
    }
    out["series"] = series
    return out


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    eq, fast, slow = results["equilibrium"], results["fast"], results["slow"]
    lin = results["linear_prediction"]
    erm_dev = max(abs(fast["t_erm_over_gd"] - 1.0), abs(slow["t_erm_over_gd"] - 1.0))
    sep = min(eq["t_equi_slow"] / eq["t_erm_gd"], eq["t_erm_gd"] / eq["t_equi_fast"])
    return [
        Claim(
            id="t_erm_independent_of_noise",
            statement=f"t_erm (chain-mean |b − b*| down to {cfg.erm_level:g} of its start, from "
            "its fitted decay rate) is "
            f"the same for S = {cfg.fast_batch} and S = {cfg.slow_batch} (σ² apart "
            f"{cfg.slow_batch // cfg.fast_batch}×) as for GD: max |t_erm/t_erm(GD) − 1| < "
            f"{cfg.erm_tol:g}",
            value=erm_dev,
            op="<",
            threshold=cfg.erm_tol,
            note=f"t_erm(GD) = {eq['t_erm_gd']:.4g}; SGD/GD: fast {fast['t_erm_over_gd']:.4g}, "
            f"slow {slow['t_erm_over_gd']:.4g} (E[b] follows GD exactly in this model, z being "
            "independent of the neuron, so this checks that the neuron's noise does not leak "
            "into the risk's time scale; from the decay rate of log|E b − b*| over "
            "[0, t_erm(GD)]); first crossing of the level instead: fast "
            f"{fast['t_erm_first_crossing_over_gd']:.4g}, slow "
            f"{slow['t_erm_first_crossing_over_gd']:.4g}",
            why=f"t_erm differs from GD's by {erm_dev:.3g} at the worst S (E[b] follows GD "
            "exactly in this model, so the gap is the chain mean's noise)",
        ),
        Claim(
            id="fast_phase_equilibrates_during_erm",
            statement=f"Fast phase (S = {cfg.fast_batch}, t_equi = {eq['t_equi_fast']:.3g}): "
            "halfway through risk minimisation (t = t_erm/2) the chain-mean charge has covered "
            f"more than {cfg.fast_min:g} of the way from C(0) to the equilibrium C*_∞",
            value=fast["progress_half_erm"],
            op=">",
            threshold=cfg.fast_min,
            note=f"linear relaxation predicts {lin['fast_half_erm']:.3g}; |b − b*| is still "
            f"{_b_err_half(results):.3g} of its start then",
            why=f"the charge covered only {fast['progress_half_erm']:.3g} of the way by t_erm/2",
        ),
        Claim(
            id="slow_phase_frozen_until_minimum",
            statement=f"Slow phase (S = {cfg.slow_batch}, t_equi = {eq['t_equi_slow']:.3g}): "
            "by the end of risk minimisation (t = t_erm) the chain-mean charge has covered "
            f"less than {cfg.frozen_max:g} of the way to C*_∞",
            value=slow["progress_erm"],
            op="<",
            threshold=cfg.frozen_max,
            note=f"linear relaxation predicts {lin['slow_erm']:.3g}",
            why=f"the charge already covered {slow['progress_erm']:.3g} of the way by t_erm",
        ),
        Claim(
            id="slow_phase_takes_off_at_minimum",
            statement=f"Slow phase: after the minimum the degenerate direction takes off: by "
            f"t_erm + {cfg.takeoff_equi:g}·t_equi the chain-mean charge has covered more than "
            f"{cfg.takeoff_min:g} of the way to C*_∞",
            value=slow["progress_takeoff"],
            op=">",
            threshold=cfg.takeoff_min,
            note=f"linear relaxation predicts {lin['slow_takeoff']:.3g}; C at the end "
            f"{slow['charge_end']:.4g} against C*_∞ = {eq['charge_star']:.4g}",
            why=f"the charge covered only {slow['progress_takeoff']:.3g} of the way",
        ),
        Claim(
            id="design_separates_timescales",
            statement="The design puts t_equi on both sides of t_erm: min(t_equi(slow)/t_erm, "
            f"t_erm/t_equi(fast)) > {cfg.separation_min:g} (closed forms)",
            value=sep,
            op=">",
            threshold=cfg.separation_min,
            kind="beyond",
            why=f"the time scales are only {sep:.3g}× apart",
        ),
    ]


def _b_err_half(results: dict[str, Any]) -> float:
    s = results["series"]
    t, err = np.asarray(s["fast_t"]), np.asarray(s["fast_b_error"])
    return float(np.interp(0.5 * results["equilibrium"]["t_erm_gd"], t, err))


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s, eq = results["series"], results["equilibrium"]
    t_erm = eq["t_erm_gd"]
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for ax, name, size in ((ax1, "fast", cfg.fast_batch), (ax2, "slow", cfg.slow_batch)):
        t = np.asarray(s[f"{name}_t"], dtype=float)
        ax.plot(t / t_erm, s[f"{name}_progress"], color="C0", label="charge: share of the way")
        ax.plot(t / t_erm, s[f"{name}_b_error"], color="C1", label="|E b − b*| (risk)")
        ax.axvline(1.0, color="0.4", ls="--", lw=0.8)
        ax.axhline(1.0, color="0.6", ls=":", lw=0.8)
        ax.set_xlabel("t / t_erm(GD)")
        ax.set_title(f"{name} phase: S = {size}, t_equi/t_erm = {eq[f't_equi_{name}'] / t_erm:.3g}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "phases.png")]
