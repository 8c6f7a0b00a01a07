"""Fig. 1: under scale invariance SGD moves outward while gradient flow stays on its circle.

The loss ℓ(θ, z) = (θ̂ᵀx − y)², θ̂ = θ/‖θ‖, θ ∈ R², is invariant under θ → ρθ (ρ > 0), so
every per-sample gradient is orthogonal to θ (A = I, charge C = ‖θ‖²). For one SGD step
θ' = θ − ηg the cross term vanishes and

    ‖θ'‖² − ‖θ‖² = η²‖g‖²  exactly,

so ‖θ‖ can never decrease under SGD (nor under GD), whereas gradient flow conserves ‖θ‖
(paper, Fig. 1, eq. (4), Remark 4.4). We run SGD (minibatches sampled with replacement),
full-batch GD and gradient flow (scipy DOP853, tight tolerances) from the same initial
point in float64 and measure the three statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments._base import Claim, Op, derive_seed, find_divergence, save_figure

DESCRIPTION = "Scale-invariant 2-D loss: SGD spirals outward (‖θ‖ grows), gradient flow keeps ‖θ‖."


@dataclass(frozen=True)
class Config:
    """Settings of the Fig. 1 experiment.

    Choices and why:

    - ``n_samples=32`` Gaussian inputs x ~ N(0, I₂) with targets y = θ*ᵀx + noise
      (``noise_std=0.5``, θ* at angle ``target_angle``): label noise keeps the per-sample
      gradients non-zero at the minimum, so the noise-driven outward flow never stops.
    - ``batch_size=1``, ``lr=0.1``: a noisy, visibly discrete SGD, as in the paper's sketch;
      ``n_steps=1000`` makes the outward drift clear on the plot. GD uses the same lr and
      steps; gradient flow runs for the same time t = lr·n_steps.
    - ``init_radius=1`` at ``init_angle`` away from θ*, so the angular dynamics is visible.
    - ``gf_rtol=1e-10``, ``gf_atol=1e-12``: integration error far below the 1e-3 claim.
    - float64 throughout: the exact identity is checked to 1e-10 relative.
    """

    n_samples: int = 32
    noise_std: float = 0.5
    target_angle: float = 0.25 * np.pi
    init_angle: float = 0.9 * np.pi
    init_radius: float = 1.0
    batch_size: int = 1
    lr: float = 0.1
    n_steps: int = 1000
    gf_rtol: float = 1e-10
    gf_atol: float = 1e-12

    @classmethod
    def quick(cls) -> Config:
        """Same problem, fewer steps (the claims are per-step, so they are as strict)."""
        return cls(n_steps=200)


def _data(cfg: Config, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((cfg.n_samples, 2))
    theta_star = np.array([np.cos(cfg.target_angle), np.sin(cfg.target_angle)])
    y = x @ theta_star + cfg.noise_std * rng.standard_normal(cfg.n_samples)
    return x, y, theta_star


def _full_loss_np(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    u = theta / np.linalg.norm(theta)
    return float(np.mean((x @ u - y) ** 2))


def _full_grad_np(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """∇ of mean (θ̂ᵀx − y)²: (2/‖θ‖)(I − θ̂θ̂ᵀ) mean[(θ̂ᵀx − y) x]."""
    r = float(np.linalg.norm(theta))
    u = theta / r
    v = 2.0 * np.mean((x @ u - y)[:, None] * x, axis=0)
    grad: np.ndarray = (v - u * (u @ v)) / r
    return grad


def _sgd(
    cfg: Config, x_np: np.ndarray, y_np: np.ndarray, seed: int, *, full_batch: bool
) -> dict[str, Any]:
    import torch

    x = torch.as_tensor(x_np, dtype=torch.float64)
    y = torch.as_tensor(y_np, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    theta = torch.tensor(
        [cfg.init_radius * np.cos(cfg.init_angle), cfg.init_radius * np.sin(cfg.init_angle)],
        dtype=torch.float64,
    )
    traj = [theta.clone()]
    grad_sq: list[float] = []
    losses: list[float] = []
    for _ in range(cfg.n_steps):
        if full_batch:
            xb, yb = x, y
        else:
            idx = torch.randint(cfg.n_samples, (cfg.batch_size,), generator=gen)
            xb, yb = x[idx], y[idx]
        p = theta.detach().requires_grad_(True)
        loss = ((xb @ (p / p.norm()) - yb) ** 2).mean()
        (g,) = torch.autograd.grad(loss, p)
        losses.append(float(loss.detach()))
        if not np.isfinite(losses[-1]):
            break
        theta = (p - cfg.lr * g).detach()
        grad_sq.append(float(g @ g))
        traj.append(theta.clone())
    path = torch.stack(traj).numpy()
    return {"path": path, "grad_sq": np.asarray(grad_sq), "batch_loss": np.asarray(losses)}


def _gradient_flow(cfg: Config, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.integrate import solve_ivp

    theta0 = cfg.init_radius * np.array([np.cos(cfg.init_angle), np.sin(cfg.init_angle)])
    t_end = cfg.lr * cfg.n_steps
    t_eval = cfg.lr * np.arange(cfg.n_steps + 1)
    sol = solve_ivp(
        lambda _t, th: -_full_grad_np(th, x, y),
        (0.0, t_end),
        theta0,
        method="DOP853",
        t_eval=t_eval,
        rtol=cfg.gf_rtol,
        atol=cfg.gf_atol,
    )
    if not sol.success:
        raise RuntimeError(f"gradient flow integration failed: {sol.message}")
    return np.asarray(sol.y.T)


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """SGD, GD and gradient flow from the same init; norms and the per-step identity."""
    x, y, theta_star = _data(cfg, seed)
    sgd = _sgd(cfg, x, y, derive_seed(seed, "fig1", "sgd"), full_batch=False)
    gd = _sgd(cfg, x, y, derive_seed(seed, "fig1", "gd"), full_batch=True)
    gf = _gradient_flow(cfg, x, y)

    sgd_path, g2 = sgd["path"], sgd["grad_sq"]
    n2 = np.sum(sgd_path**2, axis=1)
    residual = np.abs(np.diff(n2) - cfg.lr**2 * g2) / n2[:-1]
    sgd_norm = np.sqrt(n2)
    gd_norm = np.linalg.norm(gd["path"], axis=1)
    gf_norm = np.linalg.norm(gf, axis=1)
    sgd_loss = np.array([_full_loss_np(t, x, y) for t in sgd_path])
    div = find_divergence(sgd["batch_loss"])
    angles = np.linspace(-np.pi, np.pi, 361)
    loss_by_angle = np.array(
        [_full_loss_np(np.array([np.cos(a), np.sin(a)]), x, y) for a in angles]
    )

    return {
        "series": {
            "step": np.arange(len(sgd_path)),
            "sgd_theta": sgd_path,
            "gd_theta": gd["path"],
            "gf_theta": gf,
            "sgd_norm": sgd_norm,
            "gd_norm": gd_norm,
            "gf_norm": gf_norm,
            "sgd_full_loss": sgd_loss,
            "identity_residual": residual,
            "angle": angles,
            "loss_by_angle": loss_by_angle,
        },
        "theta_star": theta_star,
        "sgd_decreasing_steps": int(np.sum(np.diff(sgd_norm) < 0)),
        "gd_decreasing_steps": int(np.sum(np.diff(gd_norm) < 0)),
        "identity_max_rel_residual": float(residual.max()) if residual.size else float("nan"),
        "gf_max_rel_norm_change": float(np.max(np.abs(gf_norm - gf_norm[0])) / gf_norm[0]),
        "sgd_norm_ratio": float(sgd_norm[-1] / sgd_norm[0]),
        "gd_norm_ratio": float(gd_norm[-1] / gd_norm[0]),
        "sgd_divergence": div.to_dict(),
    }


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    return [
        Claim(
            id="sgd_norm_monotone",
            statement="Under SGD on a scale-invariant loss ‖θ_t‖ never decreases "
            "(number of steps with ‖θ_{t+1}‖ < ‖θ_t‖)",
            value=results["sgd_decreasing_steps"],
            op=Op.EQ,
            threshold=0,
            note=f"‖θ_T‖/‖θ_0‖ = {results['sgd_norm_ratio']:.4g} after {cfg.n_steps} steps",
        ),
        Claim(
            id="identity_exact",
            statement="Each SGD step obeys ‖θ'‖² − ‖θ‖² = η²‖g‖² exactly "
            "(max over steps of |Δ‖θ‖² − η²‖g‖²| / ‖θ‖², float64)",
            value=results["identity_max_rel_residual"],
            op=Op.LT,
            threshold=1e-10,
        ),
        Claim(
            id="gf_norm_conserved",
            statement="Gradient flow conserves ‖θ‖ (max relative change of ‖θ_t‖)",
            value=results["gf_max_rel_norm_change"],
            op=Op.LT,
            threshold=1e-3,
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure
    from matplotlib.patches import Circle

    s = results["series"]
    sgd, gd, gf = (np.asarray(s[k]) for k in ("sgd_theta", "gd_theta", "gf_theta"))
    fig = Figure(figsize=(11, 5))
    ax, ax2 = fig.subplots(1, 2)

    r_max = 1.15 * float(max(np.max(s["sgd_norm"]), np.max(s["gd_norm"]), cfg.init_radius))
    theta_star = np.asarray(results["theta_star"])
    # loss depends on the angle only: draw it as a background
    grid = np.linspace(-r_max, r_max, 200)
    gx, gy = np.meshgrid(grid, grid)
    ang = np.arctan2(gy, gx)
    bg = np.interp(ang, np.asarray(s["angle"]), np.asarray(s["loss_by_angle"]))
    mesh = ax.pcolormesh(gx, gy, bg, cmap="Greys", alpha=0.45, shading="auto")
    fig.colorbar(mesh, ax=ax, label="full-batch loss L(θ)", shrink=0.8)
    for r in np.linspace(r_max / 6, r_max, 6):
        ax.add_patch(Circle((0, 0), r, fill=False, lw=0.6, ls=":", color="0.4"))
    ax.add_patch(Circle((0, 0), cfg.init_radius, fill=False, lw=1.0, color="0.2"))
    ax.plot(sgd[:, 0], sgd[:, 1], "-", lw=0.8, color="C0", label="SGD", alpha=0.9)
    ax.plot(gd[:, 0], gd[:, 1], "-", lw=1.5, color="C2", label="GD")
    ax.plot(gf[:, 0], gf[:, 1], "--", lw=2.0, color="C3", label="gradient flow")
    ax.plot(*sgd[0], "ko", ms=5, label="start")
    ax.plot(*sgd[-1], "o", color="C0", ms=5)
    ax.plot(*(theta_star * r_max * 0.95), "*", color="C1", ms=12, label="direction of θ*")
    ax.set_xlim(-r_max, r_max)
    ax.set_ylim(-r_max, r_max)
    ax.set_aspect("equal")
    ax.set_xlabel("θ₁")
    ax.set_ylabel("θ₂")
    ax.set_title("ℓ(θ) = ℓ(ρθ): trajectories over circles ‖θ‖ = const")
    ax.legend(loc="lower left", fontsize=8)

    steps = np.asarray(s["step"])
    ax2.plot(steps, s["sgd_norm"], color="C0", label="SGD")
    ax2.plot(np.arange(len(s["gd_norm"])), s["gd_norm"], color="C2", label="GD")
    ax2.plot(
        np.arange(len(s["gf_norm"])), s["gf_norm"], "--", color="C3", label="gradient flow (t/η)"
    )
    ax2.set_xlabel("step")
    ax2.set_ylabel("‖θ_t‖")
    ax2.set_title("norm: grows under SGD/GD, conserved under gradient flow")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "fig1.png")]
