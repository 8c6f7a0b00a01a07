"""optim-adamw: equilibrium norms and angular updates under AdamW on the digits (beyond the paper).

Trains the normalised network (scale-invariant ‖W₁‖²) and the ReLU network (per-neuron
rescaling) of ``_optim`` with ``torch.optim.AdamW`` and compares the time averages over a
stationary window with :mod:`noetherflow.optim.adam`:

* (A1), exact for time averages, from the measured update moments ⟨uᵀAu⟩ and ⟨θᵀAu⟩
  (both networks);
* (A2) the random-walk equilibrium with momentum β₁, from the measured E[nᵀAn]
  (n = g/(√v̂ + ε)) and from its model value D (the number of coordinates), and Kosson et
  al.'s small-ηλ norm √(ηD/(2λ));
* (A3) the RMS angular update per step √(2ηλ(1 − β₁)/(1 + β₁)) (to O(ηλ)).

Plus the normalised network from three initial scales, converging to the predicted norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from noetherflow._divergence import is_finite
from noetherflow.experiments import _optim as O
from noetherflow.experiments._base import Claim, Op, derive_seed, save_figure
from noetherflow.optim.adam import (
    adamw_angular_update,
    adamw_equilibrium_charge,
    decoupled_stationary_charge,
    rotational_equilibrium_norm,
)

DESCRIPTION = (
    "AdamW on digits: equilibrium norm and angular update of a scale-invariant layer against "
    "the random-walk model (Kosson et al. 2024) and the exact stationary condition."
)
PAPER = (
    "Beyond the paper (issue #18): the paper covers plain SGD only. Checked here: the "
    "stationary charges of AdamW from the exact condition E[ΔC] = 0 with measured update "
    "moments, and the random-walk equilibrium norm √(ηD/(2λ)) and angular update of "
    "scale-invariant weights (Kosson, Messmer & Jaggi, ICML 2024), derived in our conventions."
)
PAPER_ORDER = 99.1
NOTES = (
    "Thresholds fixed before the first run, from issue #18: 10% for AdamW's scale-invariant "
    "norms (‖W₁‖ = √⟨C⟩ against √C*) and angular updates (RMS per step); 10% for the exact "
    "condition (A1) and for the agreement of the initialisations. History. First quick run "
    "(batch 32, window 2500; norm (η, λ, β₁) = (0.02, 0.1, 0.9), (0.01, 0.2, 0.5), relu "
    "(0.02, 0.1, 0.9), inits 0.3/1/3): random walk with D 0.19 and Kosson 0.20 failed, the "
    "angular update held (≤ 2%), (A1) 0.15 failed (ReLU; norm 2%), inits 0.28 failed. "
    "Diagnosis: E[nᵀn] ≈ 0.63–0.80·D (sparse pixels: a coordinate whose input is mostly 0 "
    "has E[g²/v̂] ≪ 1, against assumption (ii)); the charge fluctuated by ±20% with "
    "correlation ~100 steps, too much for a 2500-step window. Changed after seeing this: the "
    "claim with the measured E[nᵀn] was added (it was 3.8–4.7%; the one with D is kept and "
    "reported as measured); the batch size went from 32 to 8, the regime the random walk "
    "assumes (noise-dominated; probe: batch 128 made it worse, std/C 0.53 and 14% with the "
    "measured noise; batch 8 gave std/C 0.10–0.12, 2–4% with the measured noise, 11–15% "
    "with D); quick window 2500 → 4000. Thresholds unchanged. Second quick run: random walk "
    "with D 0.125 and Kosson 0.133 failed, with the measured noise 0.025, angular 0.012, "
    "(A1) 0.030, inits 0.138 failed (charges 145/154/165 over a 4000-step window: "
    "statistical). Full size (window 12000, 6 runs + 2 inits), first run: all six hold — "
    "random walk with D 0.075–0.086 (E[nᵀn] = 0.86–0.88·D), measured noise ≤ 0.014, Kosson "
    "≤ 0.089, angular ≤ 0.007, (A1) ≤ 0.014, inits 0.014. The quick runs' E[nᵀn] was "
    "0.80·D against 0.87·D at full size: the preconditioner (β₂ = 0.999) had not settled "
    "after 1500 steps. Quick burn-in 1500 → 3000 after seeing this (full size uses 4000); "
    "third quick run: random walk with D 0.098, measured noise 0.018, angular 0.013, (A1) "
    "0.037, inits 0.063 hold; Kosson 0.106 fails (reported as measured)."
)


@dataclass(frozen=True)
class Config:
    """Settings of ``optim-adamw`` (beyond the paper; nothing to deviate from).

    Choices and why:

    - Data and networks as in ``optim-sgdm`` (``_optim``): digits, ``hidden=32``, float64;
      ``batch_size=8`` with replacement (noise-dominated, as the random walk assumes; 32
      before the first run, see NOTES).
    - Grid ``runs``: (network, η, λ, β₁), β₂ = 0.999, ε = 1e-8. Relaxation of the
      scale-invariant charge ≈ 1/(2ηλ) steps (250–500); the default init
      (‖W₁‖² ≈ 11) is ~10× below the predicted level (ηD/(2λ) ≈ 100), so ``burn`` covers
      ≥ 4.5 relaxation times and the β₂ average (1000 steps); quick mode 3000 steps (1500
      at first, see NOTES).
    - Initialisations: the first normalised run from init × ``init_scales``.
    """

    hidden: int = 32
    batch_size: int = 8
    runs: tuple[tuple[str, float, float, float], ...] = (
        ("norm", 0.02, 0.1, 0.9),
        ("norm", 0.01, 0.2, 0.9),
        ("norm", 0.02, 0.1, 0.5),
        ("norm", 0.005, 0.2, 0.9),
        ("relu", 0.02, 0.1, 0.9),
        ("relu", 0.01, 0.2, 0.5),
    )
    burn: int = 4000
    window: int = 12000
    traj_every: int = 10
    init_scales: tuple[float, ...] = (0.3, 1.0, 3.0)

    @classmethod
    def quick(cls) -> Config:
        """Two normalised runs and one ReLU run; shorter windows."""
        return cls(
            runs=(("norm", 0.02, 0.1, 0.9), ("norm", 0.01, 0.2, 0.5), ("relu", 0.02, 0.1, 0.9)),
            burn=3000,
            window=4000,
            init_scales=(0.3, 3.0),
        )


def setup(cfg: Config) -> list[dict[str, str]]:
    rows = [
        {
            "quantity": "optimizer",
            "paper": "plain SGD only",
            "ours": "torch.optim.AdamW(lr=η, weight_decay=λ, betas=(β₁, 0.999)), "
            f"(net, η, λ, β₁) ∈ {list(cfg.runs)}",
            "why": "issue #18: the equilibrium under AdamW (beyond the paper)",
        },
        {
            "quantity": "data / model",
            "paper": "—",
            "ours": f"digits 1797×64 standardised; LayerNorm net and ReLU net, H = {cfg.hidden}",
            "why": "MNIST is not available offline",
        },
        {
            "quantity": "window",
            "paper": "—",
            "ours": f"burn-in {cfg.burn} steps, window {cfg.window} steps",
            "why": "≥ 4.5 relaxation times of burn-in; window averages",
        },
    ]
    if cfg.window < Config().window:
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "—",
                "ours": f"{len(cfg.runs)} runs, window {cfg.window}",
                "why": "fast CI run; full size has 6 runs and window 12000",
            }
        )
    return rows


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        raise RuntimeError(f"parameter of shape {tuple(p.shape)} has no gradient after backward.")
    return p.grad.detach().clone()


def _run_one(
    cfg: Config, net: str, lr: float, lam: float, b1: float, init: float, seed: int
) -> dict[str, Any]:
    x, y = O.digits()
    m, sym = O.build(net, cfg.hidden, seed, init)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=lam, betas=(b1, 0.999))
    gen = torch.Generator().manual_seed(seed)
    k = 1 - lr * lam
    cs, us, xs, ns, angs, traj = [], [], [], [], [], []
    lossf = torch.nn.functional.cross_entropy
    for t in range(cfg.burn + cfg.window):
        idx = torch.randint(0, x.shape[0], (cfg.batch_size,), generator=gen)
        opt.zero_grad()
        loss = lossf(m(x[idx]), y[idx])
        if not is_finite(loss):
            return {"diverged": True, "step": t, "net": net}
        loss.backward()
        before = {p: p.detach().clone() for p in sym.params}
        grads = {p: _grad(p) for p in sym.params}
        opt.step()
        c = sym.charge_of(before)
        if t % cfg.traj_every == 0:
            traj.append(float(c.sum()))
        if t < cfg.burn:
            continue
        after = {p: p.detach() for p in sym.params}
        u = {p: after[p] - k * before[p] for p in sym.params}
        cs.append(c)
        us.append(sym.charge_of(u))
        xs.append(sym.weighted_sum({p: before[p] * u[p] for p in sym.params}))
        if net == "norm":
            state = opt.state[sym.params[0]]
            vhat = state["exp_avg_sq"] / (1 - 0.999 ** float(state["step"]))
            n = {p: grads[p] / (vhat.sqrt() + 1e-8) for p in sym.params}
            ns.append(sym.charge_of(n))
            w0, w1 = before[sym.params[0]], after[sym.params[0]]
            cos = (w0 * w1).sum() / (w0.norm() * w1.norm())
            angs.append(torch.arccos(cos.clamp(max=1.0)).square())
    c_meas = torch.stack(cs).mean(0)
    a1 = decoupled_stationary_charge(
        torch.stack(us).mean(0), torch.stack(xs).mean(0), lr=lr, weight_decay=lam
    )
    out: dict[str, Any] = {
        "net": net,
        "lr": lr,
        "weight_decay": lam,
        "beta1": b1,
        "init_scale": init,
        "diverged": False,
        "charge": c_meas.tolist(),
        "pred_exact": a1.tolist(),
        "rel_exact": O.rel(c_meas, a1),
        "cross_over_update": float(
            (2 * k * torch.stack(xs).mean(0)).norm() / torch.stack(us).mean(0).norm()
        ),
        "traj": traj,
    }
    if net == "norm":
        d = sum(p.numel() for p in sym.params)
        n_mean = torch.stack(ns).mean()
        a2n = float(adamw_equilibrium_charge(n_mean, lr=lr, weight_decay=lam, beta1=b1))
        a2d = float(adamw_equilibrium_charge(d, lr=lr, weight_decay=lam, beta1=b1))
        kos = rotational_equilibrium_norm(d, lr=lr, weight_decay=lam)
        norm = math.sqrt(float(c_meas))
        ang = float(torch.stack(angs).mean().sqrt())
        ang_pred = adamw_angular_update(lr=lr, weight_decay=lam, beta1=b1)
        out |= {
            "n_coords": d,
            "noise_over_D": float(n_mean) / d,
            "pred_random_walk_measured_noise": a2n,
            "pred_random_walk": a2d,
            "pred_norm_kosson": kos,
            "norm": norm,
            "norm_rel_random_walk_measured": abs(norm / math.sqrt(a2n) - 1),
            "norm_rel_random_walk": abs(norm / math.sqrt(a2d) - 1),
            "norm_rel_kosson": abs(norm / kos - 1),
            "angular_update": ang,
            "angular_update_pred": ang_pred,
            "angular_rel": abs(ang / ang_pred - 1),
        }
    return out


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    runs = [
        _run_one(cfg, net, lr, lam, b1, 1.0, derive_seed(seed, "run", i))
        for i, (net, lr, lam, b1) in enumerate(cfg.runs)
    ]
    main = next(i for i, r in enumerate(cfg.runs) if r[0] == "norm")
    _, lr, lam, b1 = cfg.runs[main]
    inits = [runs[main]]
    for j, s in enumerate(cfg.init_scales):
        if s != 1.0:
            inits.append(_run_one(cfg, "norm", lr, lam, b1, s, derive_seed(seed, "init", j)))
    levels = [r["charge"][0] for r in inits if not r["diverged"]]
    return {
        "runs": runs,
        "inits": inits,
        "any_diverged": any(r["diverged"] for r in runs + inits),
        "init_spread": (max(levels) - min(levels)) / min(levels) if levels else float("nan"),
    }


def _worst(results: dict[str, Any], key: str, net: str | None = None) -> float:
    vals = [
        r[key]
        for r in results["runs"]
        if not r["diverged"] and key in r and (net is None or r["net"] == net)
    ]
    return max(vals) if vals else float("nan")


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    div = "a run diverged (excluded)" if results["any_diverged"] else ""
    return [
        Claim(
            id="adamw_norm_random_walk",
            statement="scale-invariant ‖W₁‖ (√ of the window-averaged charge) vs the "
            "random-walk equilibrium (A2) with E[nᵀn] = D — worst relative error over η, λ, β₁",
            value=_worst(results, "norm_rel_random_walk"),
            op=Op.LT,
            threshold=0.1,
            note=div,
        ),
        Claim(
            id="adamw_norm_random_walk_measured_noise",
            statement="the same against (A2) with the measured E[nᵀn] = ⟨Σ g²/(√v̂ + ε)²⟩ "
            "(added after the first run; see NOTES)",
            value=_worst(results, "norm_rel_random_walk_measured"),
            op=Op.LT,
            threshold=0.1,
            note=div,
        ),
        Claim(
            id="adamw_norm_kosson",
            statement="the same against Kosson et al.'s √(ηD/(2λ))",
            value=_worst(results, "norm_rel_kosson"),
            op=Op.LT,
            threshold=0.1,
            note=div,
        ),
        Claim(
            id="adamw_angular_update",
            statement="RMS per-step angle of W₁ vs (A3) √(ηλ(2 − ηλ)(1 − β₁ + β₁ηλ)/(1 + β₁ − "
            "β₁ηλ)) — worst relative error",
            value=_worst(results, "angular_rel"),
            op=Op.LT,
            threshold=0.1,
            note=div,
        ),
        Claim(
            id="adamw_exact_condition",
            statement="both networks: window-averaged charges vs (A1) with the measured "
            "⟨uᵀAu⟩, ⟨θᵀAu⟩ (relative L2 over neurons for ReLU) — worst relative error",
            value=_worst(results, "rel_exact"),
            op=Op.LT,
            threshold=0.1,
            note=div,
        ),
        Claim(
            id="adamw_inits_agree",
            statement="normalised net: window averages from three init scales agree: "
            "(max − min)/min",
            value=results["init_spread"],
            op=Op.LT,
            threshold=0.1,
            note=div,
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    ax = fig.add_subplot(1, 2, 1)
    for r in results["inits"]:
        if r["diverged"]:
            continue
        steps = [i * cfg.traj_every for i in range(len(r["traj"]))]
        ax.plot(steps, r["traj"], lw=0.8, label=f"init × {r['init_scale']}")
    first = results["inits"][0]
    if not first["diverged"]:
        ax.axhline(first["pred_random_walk"], color="k", ls="--", label="random walk (A2), D")
    ax.axvspan(cfg.burn, cfg.burn + cfg.window, color="0.9", zorder=0)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("‖W₁‖²")
    ax.set_title("normalised net, AdamW")
    ax.legend(fontsize=8)
    ax2 = fig.add_subplot(1, 2, 2)
    rs = [r for r in results["runs"] if not r["diverged"] and r["net"] == "norm"]
    ax2.scatter([r["angular_update_pred"] for r in rs], [r["angular_update"] for r in rs])
    lo = min([r["angular_update_pred"] for r in rs] + [1e-3])
    hi = max([r["angular_update_pred"] for r in rs] + [1e-2])
    ax2.plot([lo, hi], [lo, hi], "k:", lw=0.8)
    ax2.set_xlabel("predicted RMS angular update (A3)")
    ax2.set_ylabel("measured")
    ax2.set_title("angular update per step")
    return [save_figure(fig, out_dir / "optim_adamw.png")]
