"""Thm 4.5 / Lemma B.5: SGD follows a drifting noise equilibrium (used by ``timescales``).

Model: one linear neuron ``f(x) = u·(wᵀx)``, ``w ∈ R^d``, per-sample ``ℓ = (f(x) − y)²``, no
weight decay; rescaling symmetry ``A = diag(I_d, −1)``, charge ``C = ‖w‖² − u²``. The data
distribution moves during training: at step k, ``x ~ N(0, diag(s_k, 1, …, 1))``,
``y = ‖p‖x₁ + σ_ε ε`` (teacher ``p = ‖p‖e₁``), fresh samples every step (online SGD).
The population minimum ``u·w = p`` does not move, but its noise equilibrium does.

Closed form (ours, at the minimum): ``r = y − f = σ_ε ε`` is independent of x, so
``Tr[ΣA] = 4σ_ε²(u²Tr Σ_x − wᵀΣ_x w)`` vanishes at ``w = a·e₁``, ``u = ‖p‖/a`` with
``a⁴ = ‖p‖² Tr Σ_x / (e₁ᵀΣ_x e₁) = ‖p‖²(s + d − 1)/s``, and
``C*(s) = a² − ‖p‖²/a²`` (:func:`equilibrium_charge`). We choose ``s_k`` so that C* grows
linearly in SGF time ``t = η·k`` (a drifted motion ``dC* = μ dt`` with ``s = 0``: Lemma B.5's
Brownian part is zero), from ``charge_start`` to ``charge_end``.

Lemma B.5 (paper, with the library's factor: dC/dt = (η/S)Tr[ΣA], docs/concepts/flow.md): if
``Tr[Σ(θ*)A±²]/θ*ᵀA±²θ* ≥ c₀`` on both blocks, ``E(C − C*)² ≤ (2μ² + s²)/(2r₀²)`` with
``r₀ = (η/S)c₀``; for ``s = 0`` the lag ``|C − C*|`` is at most ``|μ|/r₀`` in mean square.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from noetherflow.experiments._base import derive_seed

__all__ = [
    "DriftConfig",
    "equilibrium_charge",
    "input_variance_for_charge",
    "simulate_drift",
    "summarise_drift",
]


@dataclass(frozen=True)
class DriftConfig:
    """Settings of the drifting-equilibrium run (see :mod:`timescales`' Config for the why)."""

    d_in: int = 4
    teacher_norm: float = 1.0
    noise_std: float = 1.0
    lr: float = 0.012
    batch_size: int = 1
    n_chains: int = 8
    charge_start: float = 0.5
    charge_end: float = 1.5
    lam0: float = -1.0
    burn_steps: int = 6000
    drift_steps: int = 24000
    n_logs: int = 40
    stats_samples: int = 4096


def equilibrium_charge(s: float | np.ndarray, d: int, teacher_norm: float) -> Any:
    """``C*(s) = a² − ‖p‖²/a²``, ``a⁴ = ‖p‖²(s + d − 1)/s`` (closed form above). Same shape."""
    a2 = teacher_norm * np.sqrt((np.asarray(s) + d - 1) / np.asarray(s))
    return a2 - teacher_norm**2 / a2


def input_variance_for_charge(c: float | np.ndarray, d: int, teacher_norm: float) -> Any:
    """Inverse of :func:`equilibrium_charge`: the variance ``s`` of x₁ giving ``C* = c`` (> 0)."""
    c = np.asarray(c, dtype=float)
    a2 = 0.5 * (c + np.sqrt(c * c + 4.0 * teacher_norm**2))  # a² − ‖p‖²/a² = c
    ratio = (a2 / teacher_norm) ** 2  # (s + d − 1)/s
    return (d - 1) / (ratio - 1.0)


def _schedule(cfg: DriftConfig) -> tuple[np.ndarray, float]:
    """Per-step variance s_k (burn-in at the start value, then the ramp) and μ per unit time."""
    n = cfg.burn_steps + cfg.drift_steps
    c = np.full(n + 1, cfg.charge_start)
    ramp = np.linspace(cfg.charge_start, cfg.charge_end, cfg.drift_steps + 1)
    c[cfg.burn_steps :] = ramp
    mu = (cfg.charge_end - cfg.charge_start) / (cfg.lr * cfg.drift_steps)
    return input_variance_for_charge(c, cfg.d_in, cfg.teacher_norm), float(mu)


class _Probe:
    """A torch copy of the neuron: nf.charges, nf.collect_stats + nf.solve_equilibrium."""

    def __init__(self, cfg: DriftConfig, seed: int) -> None:
        import torch
        from torch import nn

        import noetherflow as nf

        self.first = nn.Linear(cfg.d_in, 1, bias=False).double()
        self.second = nn.Linear(1, 1, bias=False).double()
        self.model = nn.Sequential(self.first, self.second)
        self.syms = nf.SymmetrySet([nf.Rescaling(self.first, self.second, label="neuron")])
        g = torch.Generator().manual_seed(derive_seed(seed, "drift", "stats") % 2**62)
        self.z = torch.randn(cfg.stats_samples, cfg.d_in, generator=g, dtype=torch.float64)
        self.eps = torch.randn(cfg.stats_samples, 1, generator=g, dtype=torch.float64)
        self.cfg = cfg

    @staticmethod
    def loss_fn(out: Any, target: Any) -> Any:
        return ((out - target) ** 2).sum(dim=1).mean()

    def measure(self, u: float, w: np.ndarray, s: float) -> dict[str, float]:
        """Charge, equilibrium charge and Lemma B.5's block rates at (u, w) under variance s."""
        import torch
        from torch import nn

        import noetherflow as nf

        cfg = self.cfg
        with torch.no_grad():
            self.first.weight.copy_(torch.as_tensor(w, dtype=torch.float64)[None, :])
            self.second.weight.fill_(float(u))
        scale = torch.ones(cfg.d_in, dtype=torch.float64)
        scale[0] = math.sqrt(s)
        x = self.z * scale
        y = cfg.teacher_norm * x[:, :1] + cfg.noise_std * self.eps
        c = float(nf.charges(self.syms)["neuron"][0])
        stats = nf.collect_stats(self.model, self.syms, self.loss_fn, x, y)
        sol = nf.solve_equilibrium(self.syms, stats, lr=cfg.lr, batch_size=cfg.batch_size)
        handle = nf.teleport(self.model, sol)
        c_star = float(nf.charges(self.syms)["neuron"][0])
        w_eq = self.first.weight.detach()
        u_eq = self.second.weight.detach()
        stats_eq = nf.collect_stats(self.model, self.syms, self.loss_fn, x, y)
        wp, up = cast(nn.Parameter, self.first.weight), cast(nn.Parameter, self.second.weight)
        var_w = float((stats_eq.sq[wp] - stats_eq.mean[wp] ** 2).sum())
        var_u = float((stats_eq.sq[up] - stats_eq.mean[up] ** 2).sum())
        rate_plus = var_w / float((w_eq**2).sum())
        rate_minus = var_u / float((u_eq**2).sum())
        handle.undo()
        return {"C": c, "C_star": c_star, "c0_plus": rate_plus, "c0_minus": rate_minus}


def simulate_drift(cfg: DriftConfig, seed: int) -> dict[str, Any]:
    """SGD chains from ``e^{λ₀A}θ*(0)`` while the equilibrium drifts; library measurements at
    ``n_logs`` logged steps (every chain)."""
    s_k, mu = _schedule(cfg)
    n_steps = len(s_k) - 1
    c, d, eta, b = cfg.n_chains, cfg.d_in, cfg.lr, cfg.batch_size
    c0 = cfg.charge_start
    a2 = 0.5 * (c0 + math.sqrt(c0 * c0 + 4.0 * cfg.teacher_norm**2))
    w = np.zeros((c, d))
    w[:, 0] = math.sqrt(a2) * math.exp(cfg.lam0)
    u = np.full(c, cfg.teacher_norm / math.sqrt(a2) * math.exp(-cfg.lam0))
    log_steps = np.unique(np.linspace(0, n_steps, cfg.n_logs + 1).round().astype(np.int64))
    probe = _Probe(cfg, seed)
    rng = np.random.default_rng(derive_seed(seed, "drift", "sgd"))
    rows: list[list[dict[str, float]]] = []
    block = 2000
    li = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, n_steps + 1, block):
            stop = min(start + block, n_steps + 1)
            z = rng.standard_normal((stop - start, c, b, d))
            eps = rng.standard_normal((stop - start, c, b))
            for j in range(stop - start):
                k = start + j
                if li < len(log_steps) and k == log_steps[li]:
                    rows.append([probe.measure(float(u[q]), w[q], float(s_k[k])) for q in range(c)])
                    li += 1
                if k == n_steps:
                    break
                x = z[j].copy()
                x[..., 0] *= math.sqrt(s_k[k])
                y = cfg.teacher_norm * x[..., 0] + cfg.noise_std * eps[j]
                h = np.einsum("cbd,cd->cb", x, w)
                r = u[:, None] * h - y  # [c, b]
                g_w = 2.0 * np.einsum("cb,cbd->cd", r, x) * u[:, None] / b
                g_u = 2.0 * (r * h).mean(1)
                w, u = w - eta * g_w, u - eta * g_u
    arr = {key: np.array([[m[key] for m in row] for row in rows]) for key in rows[0][0]}
    steps = log_steps[: len(rows)]
    return {
        "log_steps": steps,
        "t": eta * steps,
        "s": s_k[steps],
        "C_star_closed_form": equilibrium_charge(s_k[steps], d, cfg.teacher_norm),
        "mu": mu,
        **arr,  # C, C_star, c0_plus, c0_minus: [logs, chains]
    }


def summarise_drift(res: dict[str, Any], cfg: DriftConfig) -> dict[str, Any]:
    """The numbers behind the drift claims (window: the second half of the drift)."""
    steps = np.asarray(res["log_steps"])
    c, c_star = np.asarray(res["C"]), np.asarray(res["C_star"])
    c_closed = np.asarray(res["C_star_closed_form"])
    half = cfg.burn_steps + cfg.drift_steps // 2
    win = steps >= half
    burn_end = int(np.nonzero(steps <= cfg.burn_steps)[0][-1])
    c0 = np.minimum(np.asarray(res["c0_plus"]), np.asarray(res["c0_minus"])).mean(1)
    r0 = cfg.lr / cfg.batch_size * float(np.min(c0[win]))
    bound = abs(float(res["mu"])) / r0
    lag = c.mean(1) - c_closed
    rel = (c - c_star) / c_star
    stationary_bias = float(
        np.mean(lag[(steps >= cfg.burn_steps // 2) & (steps <= cfg.burn_steps)])
    )
    return {
        "window_start_step": half,
        "relative_rms": float(np.sqrt(np.mean(rel[win] ** 2))),
        "lag_rms": float(np.sqrt(np.mean(lag[win] ** 2))),
        "lemma_b5_bound": bound,
        "r0": r0,
        "mu": float(res["mu"]),
        "follow_ratio": float(
            (c.mean(1)[-1] - c.mean(1)[burn_end]) / (c_closed[-1] - c_closed[burn_end])
        ),
        "stationary_bias_before_drift": stationary_bias,
        "library_vs_closed_form_rms": float(np.sqrt(np.mean((c_star.mean(1) - c_closed) ** 2))),
        "spread_rms": float(np.sqrt(np.mean(c[win].var(1)))),
        "lag_rms_minus_stationary_bias": float(np.sqrt(np.mean((lag[win] - stationary_bias) ** 2))),
        "relative_rms_closed_form": float(
            np.sqrt(np.mean(((c[win] - c_closed[win, None]) / c_closed[win, None]) ** 2))
        ),
    }
