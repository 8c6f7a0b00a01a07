"""Teleport instead of warmup in the Fig. 4 setting (rank-1 factorisation, Kaiming start).

The setting, data stream and initialisations are those of :mod:`noetherflow.experiments.fig4`
(imported, not copied): ``f(x) = UWx``, ``U ∈ R^{d×1}``, ``W ∈ R^{1×d}``, per-sample loss
``ℓ = ‖UWx − y‖²`` (sum over outputs, no weight decay), online SGD with batch size 1, the
paper's ``η_small = 0.001`` (warmup) and ``η_max = 0.008``. Three runs share each seed's
Kaiming initialisation and data stream:

* ``warmup``: ``η_small`` for ``warmup_steps`` steps, then ``η_max`` (the paper's recipe);
* ``teleport``: :class:`~noetherflow.teleportation.tool.EquilibriumTeleport` at step 0 (the
  noise equilibrium of SGD at ``η_max``, S = 1), then ``η_max`` from the first step;
* ``none``: ``η_max`` from the Kaiming start (the control that diverges in Fig. 4).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow._divergence import find_divergence
from noetherflow.experiments import _rank1, fig4
from noetherflow.experiments._base import Claim, Op, derive_seed, save_figure

DESCRIPTION = (
    "Fig. 4 setting: teleport a Kaiming init to the noise equilibrium and train at η_max "
    "without warmup; Hessian top eigenvalue vs 2/η_max; steps to the warmup run's loss."
)

PAPER = (
    "§5.2 (warmup, Fig. 4): the noise moves a Kaiming init along its symmetry orbit to a stabler "
    "point where η_max can be used; tested by teleporting to the noise equilibrium instead of "
    "warming up (not in the paper: a consequence of its mechanism)."
)
PAPER_ORDER = 4.05
KIND = "beyond"  # every claim is ours (the paper has no such experiment)


def setup(cfg: Config) -> list[dict[str, str]]:
    """Deviations from the paper's setup (fig4's rows apply; these are the additions)."""
    quick = Config.quick()
    rc = cfg.reachable()
    return [
        {
            "quantity": "setting",
            "paper": "Fig. 4 (sizes and data not given)",
            "ours": f"fig4's: d = {cfg.d_io}, x ~ N(0, {cfg.input_var:g}·I), label noise "
            f"{cfg.noise_var:g}, batch size {cfg.batch_size}, fresh samples",
            "why": "the same problem as fig4",
        },
        {
            "quantity": "second setting",
            "paper": "—",
            "ours": f"input variance {rc.input_var:g}, label noise {rc.noise_var:g} "
            "(claims reachable_*)",
            "why": "in the first no orbit point is stable at η_max",
        },
        {
            "quantity": "teleport",
            "paper": "— (warmup only)",
            "ours": f"nf.EquilibriumTeleport at step 0, SGD at η_max, {cfg.stats_batch} fresh "
            "samples for the statistics",
            "why": "the paper's mechanism without warmup",
        },
        {
            "quantity": "steps / seeds",
            "paper": "not given",
            "ours": f"{cfg.n_steps} / {cfg.n_seeds} (quick {quick.n_steps} / {quick.n_seeds})",
            "why": "cost",
        },
        {
            "quantity": "loss convention",
            "paper": "ℓ = ‖UWx − y‖² (eq. 12)",
            "ours": "same, mean over the batch, no weight decay",
            "why": "—",
        },
    ]


_RUNS = ("warmup", "teleport", "none")
_F4 = fig4.Config()


@dataclass(frozen=True)
class Config:
    """Settings of ``teleport-fig4``. The problem is fig4's (same defaults, same helpers).

    Choices and why:

    - Everything fig4 fixes is kept: ``d_io = 16``, hidden width 1, ``x ~ N(0, 5I)``,
      label noise variance 1, rank-1 target of norm 1, batch size 1, fresh samples every step,
      ``η_small = 0.001`` for ``warmup_steps = 5000`` then ``η_max = 0.008``. Loss
      normalisation: per-sample ``‖UWx − y‖²`` summed over outputs, mean over the batch.
    - The teleport solves the joint noise equilibrium (here: one double rotation of width 1,
      i.e. the rescaling ``U → e^{−λ}U, W → e^{λ}W``) of SGD at ``η_max`` with batch size 1 in
      the discrete time model (one SGD step), with statistics from ``stats_batch = 4096``
      fresh samples (a Monte-Carlo estimate of the population moments; the batch does not
      enter training). No weight decay, as in fig4.
    - "Top Hessian eigenvalue" (``teleport_flattens``): the issue compares it with the
      stability threshold ``2/η_max`` of the step. Each SGD step here descends a one-sample
      loss, so the Hessian that the threshold applies to is that of the minibatch loss at the
      training batch size: we use ``E_x[λ_max(∇²ℓ_x)]`` (closed form per sample, checked
      against autograd, averaged over ``hessian_samples`` samples and over seeds). The top
      eigenvalue of the population Hessian ``∇²L`` is reported alongside (it is the
      large-batch limit), and so is the smallest ``E_x[λ_max]`` anywhere on the symmetry orbit
      of the initialisation (a grid of ``orbit_grid`` values of λ): if that is above
      ``2/η_max``, no function-preserving teleport can make ``η_max`` stable at step 0.
    - Divergence: a run whose loss becomes non-finite (``find_divergence``) diverged; the
      claim counts seeds.
    - ``teleport_faster``: the warmup run's final loss is the mean over seeds and over the
      last ``end_window`` of the steps of the population loss; the steps to reach it are the
      first logged step at which a run's seed-mean population loss is at or below it (never
      reached: ∞). A run with a diverged seed has a non-finite seed mean and never reaches it.
    - Both of fig4's settings run (issue #17): the figure's (input variance 5), where no
      orbit point is stable at ``η_max``, and ``reachable()`` (input variance 1.5, label
      noise 4; claims ``reachable_*``), where the orbit reaches stability.
    """

    d_io: int = _F4.d_io
    hidden: int = _F4.hidden
    input_var: float = _F4.input_var
    noise_var: float = _F4.noise_var
    target_norm: float = _F4.target_norm
    batch_size: int = _F4.batch_size
    lr_small: float = _F4.lr_small
    lr_max: float = _F4.lr_max
    warmup_steps: int = _F4.warmup_steps
    n_steps: int = 20000
    n_seeds: int = 16
    log_every: int = 50
    end_window: float = 0.2
    stats_batch: int = 4096
    hessian_samples: int = 512
    orbit_grid: int = 61
    orbit_span: float = 3.0
    reachable_input_var: float = _F4.reachable_input_var
    reachable_noise_var: float = _F4.reachable_noise_var

    @classmethod
    def quick(cls) -> Config:
        """Same problem, fewer steps and seeds (warmup still switches at 5000)."""
        return cls(n_steps=8000, n_seeds=6, stats_batch=2048, hessian_samples=256)

    def fig4_config(self) -> fig4.Config:
        return fig4.Config(
            d_io=self.d_io,
            hidden=self.hidden,
            input_var=self.input_var,
            noise_var=self.noise_var,
            target_norm=self.target_norm,
            batch_size=self.batch_size,
            lr_small=self.lr_small,
            lr_max=self.lr_max,
            warmup_steps=self.warmup_steps,
            n_steps=self.n_steps,
            n_seeds=self.n_seeds,
            log_every=self.log_every,
            reachable_input_var=self.reachable_input_var,
            reachable_noise_var=self.reachable_noise_var,
        )

    def reachable(self) -> Config:
        """fig4's second setting: the variances where the orbit of the init reaches stability."""
        return dataclasses.replace(
            self, input_var=self.reachable_input_var, noise_var=self.reachable_noise_var
        )


# --------------------------------------------------------------------------------------
# Hessians of the rank-1 factorisation (hidden width d = 1): fig4's closed forms
# --------------------------------------------------------------------------------------

per_sample_top_eig = _rank1.per_sample_top_eig
population_top_eig = _rank1.population_top_eig


def _autograd_check(U: np.ndarray, W: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Max relative error of :func:`per_sample_top_eig` against torch.func.hessian."""
    import torch

    dy = U.shape[1]

    def loss(theta: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        u, w = theta[:dy], theta[dy:]
        r = u * (w @ xi) - yi
        return (r * r).sum()

    theta = torch.as_tensor(np.concatenate([U[0, :, 0], W[0, 0]]))
    hs = [
        torch.func.hessian(loss)(theta, torch.as_tensor(xi), torch.as_tensor(yi))
        for xi, yi in zip(x, y, strict=True)
    ]
    ref = np.array([float(torch.linalg.eigvalsh(h)[-1]) for h in hs])
    got = per_sample_top_eig(U[:1], W[:1], x, y)[0]
    return float(np.max(np.abs(got - ref) / np.abs(ref)))


# --------------------------------------------------------------------------------------
# Teleport and training
# --------------------------------------------------------------------------------------


def _sample(
    rng: np.random.Generator, cfg: Config, V: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    return _rank1.sample_population(rng, cfg.fig4_config(), V, n)


def _teleport_inits(
    cfg: Config, seed: int, U: np.ndarray, W: np.ndarray, V: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """Teleport every seed's initialisation with the tool, on a torch copy of the model."""
    import torch

    import noetherflow as nf
    from noetherflow.teleportation.tool import EquilibriumTeleport

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).sum(1).mean()

    Ut, Wt, info = np.empty_like(U), np.empty_like(W), []
    rng = np.random.default_rng(derive_seed(seed, "teleport-fig4", "stats"))
    for s in range(U.shape[0]):
        first = torch.nn.Linear(cfg.d_io, cfg.hidden, bias=False).double()
        second = torch.nn.Linear(cfg.hidden, cfg.d_io, bias=False).double()
        net = torch.nn.Sequential(first, second)
        with torch.no_grad():
            first.weight.copy_(torch.as_tensor(W[s]))
            second.weight.copy_(torch.as_tensor(U[s]))
        x, y = (torch.as_tensor(a) for a in _sample(rng, cfg, V, cfg.stats_batch))
        syms = nf.find_symmetries(net, x[:8])
        tp = EquilibriumTeleport(net, syms, loss_fn, lr=cfg.lr_max, batch_size=cfg.batch_size)
        with torch.no_grad():
            before = net(x[:64]).clone()
        sol = tp.teleport(x, y)
        with torch.no_grad():
            change = float((net(x[:64]) - before).abs().max() / before.abs().max())
        Ut[s] = second.weight.detach().numpy()
        Wt[s] = first.weight.detach().numpy()
        info.append(
            {
                "symmetries": [sym.family.value for sym in syms],
                "distance": sol.max_distance(),
                "converged": sol.converged,
                "output_rel_change": change,
                "seconds": tp.history[-1].seconds,
            }
        )
    return Ut, Wt, info


def _train(
    cfg: Config, seed: int, U0: np.ndarray, W0: np.ndarray, V: np.ndarray
) -> dict[str, np.ndarray]:
    """All runs × seeds at once (run axis first), fig4's update; per-step and logged losses."""
    U, W = U0.copy(), W0.copy()  # [runs, seeds, d_y, 1], [runs, seeds, 1, d_x]
    n_runs, n_s, n = U.shape[0], U.shape[1], cfg.d_io
    bsz = cfg.batch_size
    rng = np.random.default_rng(derive_seed(seed, "teleport-fig4", "data"))
    sx, se = math.sqrt(cfg.input_var), math.sqrt(cfg.noise_var)
    lr_max = np.full(n_runs, cfg.lr_max)
    step_loss = np.empty((cfg.n_steps, n_runs, n_s))
    log_steps = [*range(0, cfg.n_steps, cfg.log_every), cfg.n_steps]
    pop: list[np.ndarray] = []
    l_star = n * cfg.noise_var

    def log() -> None:
        P = U @ W - V
        pop.append(cfg.input_var * (P * P).sum((-2, -1)) + l_star)

    warm = _RUNS.index("warmup")
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(cfg.n_steps):
            if k % cfg.log_every == 0:
                log()
            lr = lr_max.copy()
            if k < cfg.warmup_steps:
                lr[warm] = cfg.lr_small
            x = rng.standard_normal((n_s, bsz, n)) * sx  # shared by all runs
            y = x @ V.T + se * rng.standard_normal((n_s, bsz, n))
            h = x[None] @ W.swapaxes(-1, -2)
            r = h @ U.swapaxes(-1, -2) - y[None]
            step_loss[k] = (r * r).sum((-2, -1)) / bsz
            r *= (2.0 / bsz) * lr[:, None, None, None]
            W -= (r @ U).swapaxes(-1, -2) @ x[None]
            U -= r.swapaxes(-1, -2) @ h
        log()
    return {
        "log_steps": np.asarray(log_steps),
        "pop_loss": np.stack(pop, axis=-1),  # [runs, seeds, logs]
        "step_loss": step_loss,
    }


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """Both of fig4's settings (:func:`_analyse` each); the second under ``"reachable"``."""
    out = _analyse(cfg, seed)
    reach = _analyse(cfg.reachable(), seed)
    for key in ("orbit_top_eig", "loss_warmup", "loss_teleport", "loss_none"):
        out["series"][f"reachable_{key}"] = reach["series"][key]
    out["reachable"] = {k: v for k, v in reach.items() if k != "series"}
    return out


def _analyse(cfg: Config, seed: int) -> dict[str, Any]:
    """Teleport the Kaiming inits, train the three runs, measure Hessians and losses."""
    f4 = cfg.fig4_config()
    V = fig4._target(f4, seed)
    Uk, Wk = fig4._inits(f4, seed, "kaiming")
    Ut, Wt, tele_info = _teleport_inits(cfg, seed, Uk, Wk, V)
    # Hessians: same samples for both points
    rng = np.random.default_rng(derive_seed(seed, "teleport-fig4", "hessian"))
    xh, yh = _sample(rng, cfg, V, cfg.hessian_samples)
    eig_k = per_sample_top_eig(Uk, Wk, xh, yh).mean(1)  # [seeds]
    eig_t = per_sample_top_eig(Ut, Wt, xh, yh).mean(1)
    pop_k = population_top_eig(Uk, Wk, V, cfg.input_var)
    pop_t = population_top_eig(Ut, Wt, V, cfg.input_var)
    lams = np.linspace(-cfg.orbit_span, cfg.orbit_span, cfg.orbit_grid)
    xo, yo = xh[: min(128, len(xh))], yh[: min(128, len(yh))]
    orbit = np.stack(
        [
            per_sample_top_eig(Uk * math.exp(-lam), Wk * math.exp(lam), xo, yo).mean(1)
            for lam in lams
        ],
        axis=1,
    )  # [seeds, grid]
    check = _autograd_check(Ut, Wt, xh[:4], yh[:4])

    U0 = np.stack([Uk, Ut, Uk])
    W0 = np.stack([Wk, Wt, Wk])
    sim = _train(cfg, seed, U0, W0, V)
    steps = sim["log_steps"]
    per_run: dict[str, Any] = {}
    mean_curves: dict[str, np.ndarray] = {}
    for i, name in enumerate(_RUNS):
        divs = [find_divergence(sim["step_loss"][:, i, s]) for s in range(cfg.n_seeds)]
        curve = sim["pop_loss"][i].mean(0)  # non-finite if any seed diverged
        curve = np.where(np.isfinite(curve), curve, np.nan)
        mean_curves[name] = curve
        per_run[name] = {
            "n_diverged": int(sum(d.diverged for d in divs)),
            "diverged_at_step": [d.step for d in divs],
            "last_finite_loss": [d.last_finite_value for d in divs],
        }
    window = steps >= (1.0 - cfg.end_window) * cfg.n_steps
    target = float(np.mean(mean_curves["warmup"][window]))
    for name in _RUNS:
        hit = np.nonzero(mean_curves[name] <= target)[0]
        per_run[name]["steps_to_warmup_final_loss"] = int(steps[hit[0]]) if len(hit) else math.inf
        per_run[name]["final_loss"] = float(np.mean(mean_curves[name][window]))
    # diagnostic only (not a claim): the teleport seeds that did not diverge
    alive = np.array([d is None for d in per_run["teleport"]["diverged_at_step"]])
    survivors = sim["pop_loss"][_RUNS.index("teleport")][alive]
    surv_curve = survivors.mean(0) if len(survivors) else np.full(len(steps), np.nan)
    hit = np.nonzero(surv_curve <= target)[0]
    per_run["teleport"]["survivors"] = int(alive.sum())
    per_run["teleport"]["survivors_steps_to_warmup_final_loss"] = (
        int(steps[hit[0]]) if len(hit) else math.inf
    )
    per_run["teleport"]["survivors_final_loss"] = (
        float(np.mean(surv_curve[window])) if len(survivors) else math.nan
    )
    series: dict[str, Any] = {
        "step": steps,
        "orbit_lambda": lams,
        "orbit_top_eig": orbit,
        "loss_teleport_survivors": surv_curve,
    }
    for i, name in enumerate(_RUNS):
        series[f"loss_{name}"] = mean_curves[name]
        series[f"loss_{name}_per_seed"] = np.where(
            np.isfinite(sim["pop_loss"][i]), sim["pop_loss"][i], np.nan
        )
    return {
        "series": series,
        "runs": per_run,
        "teleport": tele_info,
        "threshold_2_over_lr_max": 2.0 / cfg.lr_max,
        "top_eig_minibatch_kaiming": eig_k,
        "top_eig_minibatch_teleported": eig_t,
        "top_eig_population_kaiming": pop_k,
        "top_eig_population_teleported": pop_t,
        "orbit_min_top_eig_minibatch": orbit.min(1),
        "hessian_closed_form_check_max_rel_err": check,
        "warmup_final_loss": target,
        "norms_kaiming": {"U2": (Uk**2).sum((1, 2)), "W2": (Wk**2).sum((1, 2))},
        "norms_teleported": {"U2": (Ut**2).sum((1, 2)), "W2": (Wt**2).sum((1, 2))},
        "input_var": cfg.input_var,
        "noise_var": cfg.noise_var,
    }


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    """The three claims in fig4's setting, and again (ids ``reachable_*``) in the setting
    where the orbit of the init reaches stability at η_max."""
    return [*_claims(results, cfg, ""), *_claims(results["reachable"], cfg, "reachable_")]


def _claims(results: dict[str, Any], cfg: Config, prefix: str) -> list[Claim]:
    where = (
        f"[input variance {results['input_var']:g}, label-noise variance {results['noise_var']:g}] "
    )
    runs = results["runs"]
    thr = float(results["threshold_2_over_lr_max"])
    eig_k = float(np.mean(results["top_eig_minibatch_kaiming"]))
    eig_t = float(np.mean(results["top_eig_minibatch_teleported"]))
    pop_k = float(np.mean(results["top_eig_population_kaiming"]))
    pop_t = float(np.mean(results["top_eig_population_teleported"]))
    orbit_min = float(np.mean(results["orbit_min_top_eig_minibatch"]))
    tele, warm = runs["teleport"], runs["warmup"]
    div_steps = [s for s in tele["diverged_at_step"] if s is not None]
    return [
        Claim(
            id=f"{prefix}teleport_no_warmup_stable",
            statement=where
            + f"Kaiming + teleport at step 0, then η_max = {cfg.lr_max} from the first "
            "step: fraction of seeds that diverged",
            value=tele["n_diverged"] / cfg.n_seeds,
            op=Op.EQ,
            threshold=0.0,
            note=(f"divergence steps {sorted(div_steps)}; " if div_steps else "")
            + f"no warmup, no teleport: {runs['none']['n_diverged']}/{cfg.n_seeds} diverged; "
            f"warmup: {warm['n_diverged']}/{cfg.n_seeds}",
            why=f"{tele['n_diverged']} of {cfg.n_seeds} seeds diverge at η_max after the teleport: "
            f"the flattest point of the init's orbit has E_x λ_max {orbit_min:.4g} against "
            f"2/η_max = {thr:.4g}, so no teleport can make η_max stable in this setting",
        ),
        Claim(
            id=f"{prefix}teleport_flattens",
            statement=where + "top Hessian eigenvalue (E over samples of λ_max of the batch-size-1 "
            "loss, mean over seeds) after teleport below 2/η_max and at Kaiming above it: "
            "max(λ_teleport·η_max/2, 2/(η_max·λ_Kaiming)) (< 1 iff both hold)",
            value=max(eig_t / thr, thr / eig_k),
            op=Op.LT,
            threshold=1.0,
            note=f"2/η_max = {thr:.4g}; λ_max Kaiming {eig_k:.4g}, teleported {eig_t:.4g}; "
            f"smallest over the orbit of the init {orbit_min:.4g}; population Hessian "
            f"λ_max Kaiming {pop_k:.4g}, teleported {pop_t:.4g}",
            why=f"the teleported λ_max is {eig_t:.4g} against 2/η_max = {thr:.4g}; the flattest "
            f"point of the init's orbit is {orbit_min:.4g}, so no teleport can go below",
        ),
        Claim(
            id=f"{prefix}teleport_faster",
            statement=where + "steps to reach the warmup run's final population loss: teleport run "
            "(value) fewer than the warmup run (threshold)",
            value=float(tele["steps_to_warmup_final_loss"]),
            op=Op.LT,
            threshold=float(warm["steps_to_warmup_final_loss"]),
            note=f"warmup final loss {results['warmup_final_loss']:.4g}; teleport run final "
            f"loss {tele['final_loss']:.4g}; the {tele['survivors']} teleport seeds that did "
            f"not diverge: steps {tele['survivors_steps_to_warmup_final_loss']}, final loss "
            f"{tele['survivors_final_loss']:.4g}",
            why=f"{tele['n_diverged']} of {cfg.n_seeds} teleport seeds diverge, so the seed-mean "
            "loss never reaches warmup's; the survivors reach it at steps "
            f"{tele['survivors_steps_to_warmup_final_loss']}",
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s = results["series"]
    steps = np.asarray(s["step"], dtype=float)
    fig = Figure(figsize=(12, 4.5))
    ax, ax2 = fig.subplots(1, 2)
    colors = {"warmup": "C2", "teleport": "C0", "none": "C1"}
    labels = {
        "warmup": f"warmup: η={cfg.lr_small} for {cfg.warmup_steps} steps, then η={cfg.lr_max}",
        "teleport": f"teleport at step 0, then η={cfg.lr_max}",
        "none": f"no warmup: η={cfg.lr_max}",
    }
    for name in _RUNS:
        per = np.asarray(s[f"loss_{name}_per_seed"], dtype=float)
        for row in per:
            ax.plot(steps, row, color=colors[name], lw=0.4, alpha=0.25)
        n_div = results["runs"][name]["n_diverged"]
        ax.plot(
            steps,
            np.asarray(s[f"loss_{name}"], dtype=float),
            color=colors[name],
            lw=1.8,
            label=f"{labels[name]} (diverged {n_div}/{cfg.n_seeds})",
        )
    surv = np.asarray(s["loss_teleport_survivors"], dtype=float)
    if np.isfinite(surv).any():
        ax.plot(steps, surv, color="C0", lw=1.2, ls="--", label="teleport: seeds that survived")
    ax.axhline(float(results["warmup_final_loss"]), color="k", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("population loss")
    ax.set_title("Rank-1 factorisation: teleport vs warmup")
    ax.legend(fontsize=7)
    lam = np.asarray(s["orbit_lambda"], dtype=float)
    orbit = np.asarray(s["orbit_top_eig"], dtype=float)
    for i, row in enumerate(orbit):
        ax2.plot(
            lam,
            row,
            color="C0",
            lw=0.6,
            alpha=0.5,
            label=f"input variance {cfg.input_var:g}" if i == 0 else None,
        )
    rc = cfg.reachable()
    for i, row in enumerate(np.asarray(s["reachable_orbit_top_eig"], dtype=float)):
        ax2.plot(
            lam,
            row,
            color="C2",
            lw=0.6,
            alpha=0.5,
            label=f"input var. {rc.input_var:g} (reachable)" if i == 0 else None,
        )
    thr = float(results["threshold_2_over_lr_max"])
    ax2.axhline(thr, color="k", ls="--", lw=1, label="2/η_max")
    ax2.axvline(0.0, color="C1", lw=0.8, label="Kaiming init (λ = 0)")
    ax2.set_yscale("log")
    ax2.set_xlabel("λ   (U → e^{−λ}U, W → e^{λ}W)")
    ax2.set_ylabel("E_x λ_max(∇²ℓ_x)")
    ax2.set_title("Top eigenvalue along the symmetry orbit of each init")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "teleport_fig4.png")]
