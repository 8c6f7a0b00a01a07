"""Eq. 9: the equilibrium charge across weight decay γ, measured on SGD runs.

A small net whose first weight ``W`` is scale invariant (``Linear(d_x, h, bias=False) →
LayerNorm(h, eps=0, no affine) → Linear(h, h) → ReLU → Linear(h, d_y)``; charge ``C = ‖W‖²``,
``A = I``) plus the rescaling of the ReLU layer, trained by plain SGD at constant η through
:func:`noetherflow.train.run_sgd` for several γ. In the stationary regime (after a burn-in,
time averages over a window) eq. 9 in our conventions reads, per SGD step,

    κ⟨C⟩ = ⟨η²(∇LᵀA∇L + Tr[ΣA]/S)⟩,   κ = 4ηγ(1 − ηγ)            (corrected, discrete)

(the expected one-step identity averaged over the stationary distribution), and in the SGF
limit ``4γ⟨C⟩ = (η/S)⟨Tr[ΣA]⟩`` (corrected: the paper's eq. 9 writes ``σ²Tr[ΣA]`` with
``σ² = η/(2S)``, a factor 2 smaller, claimed separately as printed). The right-hand sides
are the library's: ``nf.collect_stats`` (hooks) and ``nf.noether_flow`` with γ = 0 (which is
exactly the noise term) at every logged step of the window. At a few checkpoints per run
``nf.solve_equilibrium`` teleports a copy to its noise equilibrium (its ``C*``), and
``theory.scale_invariant_equilibrium_norm_sq`` computes ``C*`` from per-sample gradients taken
independently by ``torch.func`` (the oracle).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.experiments._base import Claim, Kind, Op, derive_seed, parallel_map, save_figure
from noetherflow.stats.reference import per_sample_grads
from noetherflow.theory import ziyin2024 as theory
from noetherflow.train import run_sgd

DESCRIPTION = (
    "Eq. 9 across γ: time-averaged charge of a scale-invariant layer under SGD at constant η "
    "against the library's noise term (corrected discrete and SGF forms, and as printed)."
)
PAPER = (
    "Eq. 9 (§4.3): a fixed point θ* of eq. 7 satisfies 4γC(θ*) = σ²Tr[Σ(θ*)A]: a large weight "
    "decay leads to a small |C(θ*)|, a large gradient noise to a large one."
)
PAPER_ORDER = 4.55  # eq. 9 follows Thm 4.5 in §4.3

_DT = torch.float64


@dataclass(frozen=True)
class Config:
    """Settings of ``eq9``. The paper gives no numbers for eq. 9; these are ours.

    - Data: ``n = 128`` samples, ``x ~ N(0, I_8)``, ``y = tanh(xV) + 0.5ε`` (3 outputs);
      per-sample loss ``‖f(x) − y‖²`` (sum over outputs), batch mean; float64.
    - Model: widths ``8 → 6 → 6 → 3`` as above, PyTorch's default initialisation.
    - SGD (``nf.train.run_sgd``): ``η = 0.1``, ``S = 8`` with replacement, constant η, weight
      decay γ ∈ ``weight_decays`` on every parameter (γ‖θ‖² in the loss).
    - Stationary window: ``burn_in`` steps, then ``window`` steps logged every ``log_every``;
      ``C`` relaxes at ≈ 8γη per step (scale invariance at its equilibrium, paper §4.2), i.e.
      ≥ 6 e-folds for the smallest γ before the window.
    - The solver and the theory oracle at every ``solver_every``-th logged step of the window.
    - Eq. 9's dependence on the noise level (issue #30): at ``noise_gamma`` the same runs at
      the batch sizes ``noise_batch_sizes`` besides ``batch_size`` (the noise η/S over a
      factor 16), ``n_seeds`` each with their own streams; the other claims use the γ runs
      only.
    """

    n: int = 128
    d_x: int = 8
    hidden: int = 6
    d_y: int = 3
    lr: float = 0.1
    batch_size: int = 8
    weight_decays: tuple[float, ...] = (0.01, 0.03, 0.1)
    burn_in: int = 2000
    window: int = 6000
    log_every: int = 5
    solver_every: int = 4
    n_seeds: int = 3
    noise_gamma: float = 0.1
    noise_batch_sizes: tuple[int, ...] = (2, 32)

    @classmethod
    def quick(cls) -> Config:
        """A shorter burn-in (≥ 4.8 e-folds at γ = 0.01) and window, fewer logs."""
        return cls(burn_in=600, window=900)


def loss_fn(out: Tensor, target: Tensor) -> Tensor:
    """Batch mean of ``‖f(x) − y‖²`` (sum over outputs)."""
    return ((out - target) ** 2).sum(dim=-1).mean()


def make_problem(cfg: Config, seed: int) -> tuple[nn.Sequential, nf.SymmetrySet, Tensor, Tensor]:
    g = torch.Generator().manual_seed(derive_seed(seed, "eq9", "data"))
    X = torch.randn(cfg.n, cfg.d_x, generator=g, dtype=_DT)
    V = torch.randn(cfg.d_x, cfg.d_y, generator=g, dtype=_DT) / math.sqrt(cfg.d_x)
    Y = torch.tanh(X @ V) + 0.5 * torch.randn(cfg.n, cfg.d_y, generator=g, dtype=_DT)
    torch.manual_seed(derive_seed(seed, "eq9", "init"))
    first = nn.Linear(cfg.d_x, cfg.hidden, bias=False)
    mid, last = nn.Linear(cfg.hidden, cfg.hidden), nn.Linear(cfg.hidden, cfg.d_y)
    model = nn.Sequential(
        first, nn.LayerNorm(cfg.hidden, eps=0.0, elementwise_affine=False), mid, nn.ReLU(), last
    ).to(_DT)
    syms = nf.SymmetrySet(
        [
            nf.ScaleInvariance([cast(nn.Parameter, first.weight)], label="scale"),
            nf.Rescaling(mid, last, label="resc"),
        ]
    )
    return model, syms, X, Y


def _rescaling_gross(model: nn.Sequential) -> float:
    """Σ_j (‖incoming_j‖² + ‖outgoing_j‖²) of the ReLU layer: the scale of its κC_j terms."""
    mid, last = cast(nn.Linear, model[2]), cast(nn.Linear, model[4])
    with torch.no_grad():
        return float(
            mid.weight.square().sum() + mid.bias.square().sum() + last.weight.square().sum()
        )


def _oracle_charge(model: nn.Sequential, X: Tensor, Y: Tensor, cfg: Config, gamma: float) -> float:
    """``C*`` of the scale charge from ``theory`` with the per-sample gradients of W from the
    package's torch.func reference (:mod:`noetherflow.stats.reference`; the library's flow
    uses the hooks estimator, an independent path)."""
    w = cast(nn.Parameter, cast(nn.Linear, model[0]).weight)
    with torch.no_grad():
        g = per_sample_grads(model, [w], loss_fn, X, Y)[w]
    g = g.reshape(g.shape[0], -1)
    norm_sq = float(w.detach().square().sum())
    gbar = g.mean(0)
    trace = float(g.square().sum(1).mean() - gbar.square().sum())
    # Σ(θ) = Σ(θ̂)/‖θ‖², ∇L(θ) = ∇L(θ̂)/‖θ‖: unit-norm quantities
    return theory.scale_invariant_equilibrium_norm_sq(
        trace * norm_sq,
        cfg.lr,
        cfg.batch_size,
        gamma,
        time="discrete",
        mean_grad_sq_unit=float(gbar.square().sum()) * norm_sq,
    )


def run_one(job: tuple[float, int] | tuple[float, int, int], cfg: Config) -> dict[str, Any]:
    """One SGD run at weight decay γ from problem seed ``seed`` (and batch size S, when the
    job names one); window averages."""
    gamma, seed = job[0], job[1]
    if len(job) == 3:
        cfg = dataclasses.replace(cfg, batch_size=job[2])
    model, syms, X, Y = make_problem(cfg, seed)
    kappa = nf.NoiseModel.create(
        lr=cfg.lr, batch_size=cfg.batch_size, weight_decay=gamma, time="discrete"
    ).kappa
    steps = cfg.burn_in + cfg.window
    solver_at = set(range(cfg.burn_in, steps + 1, cfg.log_every * cfg.solver_every))
    checks: list[dict[str, float]] = []

    def callback(step: int, m: Any) -> dict[str, float] | None:
        if step < cfg.burn_in:
            return None
        stats = nf.collect_stats(m, syms, loss_fn, X, Y)
        ch = nf.charges(syms)
        flow = functools.partial(
            nf.noether_flow, syms, stats, lr=cfg.lr, batch_size=cfg.batch_size, charges=ch
        )  # weight_decay = 0: the flow is the noise term alone
        disc = flow(time="discrete")  # = η²Tr[A(ḡḡᵀ + Σ/S)]
        cont = flow(time="continuous")  # = (η/S)Tr[ΣA]
        row = {
            "C": float(ch["scale"][0]),
            "T_disc": float(disc["scale"][0]),
            "T_cont": float(cont["scale"][0]),
            "resc_gap": float((kappa * ch["resc"] - disc["resc"]).abs().sum()),
            "resc_gross": kappa * _rescaling_gross(m),
        }
        if step in solver_at:
            sol = nf.solve_equilibrium(
                syms,
                stats,
                lr=cfg.lr,
                batch_size=cfg.batch_size,
                weight_decay=gamma,
                time="discrete",
            )
            handle = nf.teleport(m, sol)
            c_star = float(nf.charges(syms)["scale"][0])
            handle.undo()
            # scale invariance: both noise terms scale as 1/‖W‖², so C* = sqrt(C·T/κ)
            checks.append(
                {
                    "step": step,
                    "solver_C": c_star,
                    "flow_C": math.sqrt(row["C"] * row["T_disc"] / kappa),
                    "theory_C": _oracle_charge(model, X, Y, cfg, gamma),
                }
            )
        return row

    res = run_sgd(
        model,
        loss_fn,
        X,
        Y,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        steps=steps,
        weight_decay=gamma,
        generator=torch.Generator().manual_seed(derive_seed(seed, "eq9-sgd")),
        callback=callback,
        log_every=cfg.log_every,
    )
    h = res.history
    win = h["step"] >= cfg.burn_in
    c_mean = float(np.mean(h["C"][win]))
    td, tc = float(np.mean(h["T_disc"][win])), float(np.mean(h["T_cont"][win]))
    return {
        "gamma": gamma,
        "seed": seed,
        "batch_size": cfg.batch_size,
        "diverged": res.diverged,
        "kappa": kappa,
        "C_mean": c_mean,
        "C_std": float(np.std(h["C"][win])),
        "T_disc_mean": td,
        "T_cont_mean": tc,
        "rel_err_discrete": abs(kappa * c_mean - td) / td,
        "rel_err_continuous": abs(4 * gamma * c_mean - tc) / tc,
        "rel_err_printed": abs(4 * gamma * c_mean - 0.5 * tc) / (0.5 * tc),
        "resc_rel_gap": float(np.mean(h["resc_gap"][win]) / np.mean(h["resc_gross"][win])),
        "solver_C_mean": float(np.mean([c["solver_C"] for c in checks])),
        "solver_vs_flow": max(abs(c["solver_C"] - c["flow_C"]) / c["flow_C"] for c in checks),
        "theory_vs_solver": max(abs(c["solver_C"] - c["theory_C"]) / c["theory_C"] for c in checks),
        "step": h["step"][win].tolist(),
        "C": h["C"][win].tolist(),
        "loss": h["loss"].tolist(),
    }


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    jobs = [
        (g, derive_seed(seed, "eq9", i) % 2**31)
        for g in cfg.weight_decays
        for i in range(cfg.n_seeds)
    ]
    noise_jobs = [
        (cfg.noise_gamma, derive_seed(seed, "eq9", "noise", S, i) % 2**31, S)
        for S in cfg.noise_batch_sizes
        for i in range(cfg.n_seeds)
    ]
    every = parallel_map(functools.partial(run_one, cfg=cfg), [*jobs, *noise_jobs])
    runs, noise_runs = every[: len(jobs)], every[len(jobs) :]
    per_gamma: dict[str, Any] = {}
    for g in cfg.weight_decays:
        rs = [r for r in runs if r["gamma"] == g]
        kappa = rs[0]["kappa"]
        c, td, tc = (
            float(np.mean([r[k] for r in rs])) for k in ("C_mean", "T_disc_mean", "T_cont_mean")
        )
        per_gamma[str(g)] = {
            "C_mean": c,
            "C_seed_std": float(np.std([r["C_mean"] for r in rs])),
            "solver_C_mean": float(np.mean([r["solver_C_mean"] for r in rs])),
            "rel_err_discrete": abs(kappa * c - td) / td,
            "rel_err_continuous": abs(4 * g * c - tc) / tc,
            "rel_err_printed": abs(4 * g * c - 0.5 * tc) / (0.5 * tc),
            "resc_rel_gap": float(np.mean([r["resc_rel_gap"] for r in rs])),
        }
        for k in ("rel_err_discrete", "rel_err_continuous", "rel_err_printed"):
            per_gamma[str(g)][k + "_per_seed"] = [r[k] for r in rs]
    series = {
        "gamma": list(cfg.weight_decays),
        "C_mean": [per_gamma[str(g)]["C_mean"] for g in cfg.weight_decays],
        "runs": [{k: r[k] for k in ("gamma", "seed", "step", "C")} for r in runs],
    }
    keep = [{k: v for k, v in r.items() if k not in ("step", "C", "loss")} for r in runs]
    return {
        "runs": keep,
        "per_gamma": per_gamma,
        "per_noise": _per_noise(cfg, runs, noise_runs),
        "series": series,
    }


def _per_noise(
    cfg: Config, runs: list[dict[str, Any]], noise_runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """Pooled window means at ``noise_gamma`` per batch size (``batch_size`` from the γ runs)."""
    out: dict[str, Any] = {}
    base = [r for r in runs if r["gamma"] == cfg.noise_gamma]
    for S in sorted({cfg.batch_size, *cfg.noise_batch_sizes}):
        rs = base if S == cfg.batch_size else [r for r in noise_runs if r["batch_size"] == S]
        if not rs:
            continue
        kappa = rs[0]["kappa"]
        c, td, tc = (
            float(np.mean([r[k] for r in rs])) for k in ("C_mean", "T_disc_mean", "T_cont_mean")
        )
        out[str(S)] = {
            "C_mean": c,
            "rel_err_discrete": abs(kappa * c - td) / td,
            "rel_err_continuous": abs(4 * cfg.noise_gamma * c - tc) / tc,
            "rel_err_discrete_per_seed": [r["rel_err_discrete"] for r in rs],
            "diverged": any(r["diverged"] for r in rs),
        }
    return out


def setup(cfg: Config) -> list[dict[str, str]]:
    rows = [
        {
            "quantity": "setting",
            "paper": "none (eq. 9 is a derived identity)",
            "ours": f"SGD on a {cfg.d_x}-{cfg.hidden}-{cfg.hidden}-{cfg.d_y} net with a "
            "scale-invariant first layer (LayerNorm, eps = 0), synthetic data",
            "why": "scale invariance has a finite equilibrium only with γ > 0",
        },
        {
            "quantity": "eq. 9",
            "paper": "4γC* = σ²Tr[ΣA]",
            "ours": "4γC* = 2σ²Tr[ΣA] = (η/S)Tr[ΣA]; discrete κC* = η²(ḡᵀAḡ + Tr[ΣA]/S)",
            "why": "Itô's lemma on eq. 1; the exact one-step identity (docs/concepts/flow.md)",
        },
        {
            "quantity": "η, S",
            "paper": "—",
            "ours": f"η = {cfg.lr} constant, S = {cfg.batch_size}",
            "why": "ηγ ≤ 0.01: discrete and SGF forms close",
        },
        {
            "quantity": "γ",
            "paper": "—",
            "ours": f"{list(cfg.weight_decays)}",
            "why": "a decade; relaxation ≈ 8γη per step must fit the run",
        },
        {
            "quantity": "steps",
            "paper": "—",
            "ours": f"burn-in {cfg.burn_in}, window {cfg.window}, logged every {cfg.log_every}",
            "why": "time averages of the stationary regime",
        },
        {
            "quantity": "loss",
            "paper": "—",
            "ours": "‖f(x) − y‖² summed over outputs, batch mean",
            "why": "the paper's eq. 12 convention",
        },
        {
            "quantity": "seeds",
            "paper": "—",
            "ours": f"{cfg.n_seeds} (data, init, batches)",
            "why": "mean and spread in the claims' notes",
        },
    ]
    full = Config()
    if (cfg.burn_in, cfg.window, cfg.log_every) != (full.burn_in, full.window, full.log_every):
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "—",
                "ours": f"burn-in {cfg.burn_in}, window {cfg.window}, every {cfg.log_every}",
                "why": f"time (full: {full.burn_in}, {full.window}, {full.log_every})",
            }
        )
    return rows


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    pg, runs = results["per_gamma"], results["runs"]

    def worst(key: str) -> tuple[float, str]:
        note = "; ".join(
            f"γ={g:g}: {pg[str(g)][key]:.4f} (per seed "
            + ", ".join(f"{v:.3f}" for v in pg[str(g)][key + "_per_seed"])
            + ")"
            for g in cfg.weight_decays
        )
        return max(pg[str(g)][key] for g in cfg.weight_decays), (
            f"pooled means over {cfg.n_seeds} seeds: {note}"
        )

    d, dn = worst("rel_err_discrete")
    c, cn = worst("rel_err_continuous")
    p, pn = worst("rel_err_printed")
    cm = [pg[str(g)]["C_mean"] for g in cfg.weight_decays]
    sol = max(
        abs(pg[str(g)]["solver_C_mean"] - pg[str(g)]["C_mean"]) / pg[str(g)]["C_mean"]
        for g in cfg.weight_decays
    )
    slope = float(np.polyfit(np.log(cfg.weight_decays), np.log(cm), 1)[0])
    resc = ", ".join(f"γ={g:g}: {pg[str(g)]['resc_rel_gap']:.3f}" for g in cfg.weight_decays)
    noise = results.get("per_noise", {})
    sizes = sorted(int(k) for k in noise)
    noise_worst = max((noise[str(S)]["rel_err_discrete"] for S in sizes), default=math.nan)
    worst_s = max(sizes, key=lambda S: noise[str(S)]["rel_err_discrete"]) if sizes else 0
    c_by_s = [noise[str(S)]["C_mean"] for S in sizes]
    noise_slope = (
        float(np.polyfit(np.log(sizes), np.log(c_by_s), 1)[0]) if len(sizes) > 1 else math.nan
    )
    noise_note = (
        ", ".join(
            f"S={S}: ⟨C⟩ {noise[str(S)]['C_mean']:.4g}, discrete "
            f"{noise[str(S)]['rel_err_discrete']:.3f} (per seed "
            + "/".join(f"{v:.3f}" for v in noise[str(S)]["rel_err_discrete_per_seed"])
            + f"), SGF {noise[str(S)]['rel_err_continuous']:.3f}"
            for S in sizes
        )
        + f"; log-log slope of ⟨C⟩ against S {noise_slope:.3f} (the SGF form alone gives −1/2)"
    )
    return [
        Claim(
            id="corrected_discrete_across_noise",
            statement=f"Eq. 9's dependence on the noise level, corrected discrete form: at γ = "
            f"{cfg.noise_gamma:g}, η = {cfg.lr:g} and S ∈ {sizes} (noise η/S over a factor "
            f"{max(sizes) // min(sizes) if sizes else 0}), κ⟨C⟩ = ⟨η²(ḡᵀAḡ + Tr[ΣA]/S)⟩; worst "
            "relative difference over S (pooled means over seeds)",
            value=noise_worst,
            op=Op.LT,
            threshold=0.05,
            note=noise_note,
            why=f"at S = {worst_s} the pooled mean misses by {noise_worst:.1%}; its seeds "
            "scatter by "
            + "/".join(
                f"{v:.1%}" for v in noise.get(str(worst_s), {}).get("rel_err_discrete_per_seed", [])
            )
            + " (the window average of a noisier charge), while S = "
            f"{cfg.batch_size} is within "
            f"{noise.get(str(cfg.batch_size), {}).get('rel_err_discrete', math.nan):.1%}",
        ),
        Claim(
            id="corrected_discrete_constant",
            statement="Eq. 9, corrected, per SGD step at constant η: κ⟨C⟩ = ⟨η²(ḡᵀAḡ + "
            "Tr[ΣA]/S)⟩ for the scale-invariant layer (library noise term); worst over γ of the "
            "relative difference (mean over seeds)",
            value=d,
            op=Op.LT,
            threshold=0.05,
            note=f"{dn}; rescaling charges of the ReLU layer (not claimed; Σ_j|κ⟨C_j⟩ − ⟨T_j⟩| "
            f"over κ⟨Σ_j(‖in_j‖² + ‖out_j‖²)⟩, per seed, mean): {resc}",
        ),
        Claim(
            id="corrected_sgf_constant",
            statement="Eq. 9, corrected, SGF form: 4γ⟨C⟩ = (η/S)⟨Tr[ΣA]⟩; worst over γ of the "
            "relative difference",
            value=c,
            op=Op.LT,
            threshold=0.10,
            note=cn,
            why=f"the SGF form omits the η²ḡᵀAḡ term of the discrete step (η = {cfg.lr:g}, S = "
            f"{cfg.batch_size}); the corrected discrete form, which keeps it, is within {d:.1%}",
        ),
        Claim(
            id="printed_eq9_constant",
            kind=Kind.PRINTED,
            statement="Eq. 9 as printed: 4γ⟨C⟩ = σ²⟨Tr[ΣA]⟩, σ² = η/(2S); worst over γ of the "
            "relative difference",
            value=p,
            op=Op.LT,
            threshold=0.10,
            note=f"{pn}; the printed σ² is half of Itô's 2σ² (docs/concepts/flow.md)",
            why=f"the measured 4γ⟨C⟩ is {1 + p:.2f}× the printed σ²⟨Tr[ΣA]⟩: Itô's term is 2σ², "
            f"not σ² (factor 2), times the SGF form's own gap of {c:.1%}",
        ),
        Claim(
            id="solver_vs_time_average",
            kind=Kind.BEYOND,
            statement="nf.solve_equilibrium's C* at states of the window (mean over checkpoints "
            "and seeds) equals the time-averaged charge; worst relative difference over γ",
            value=sol,
            op=Op.LT,
            threshold=0.05,
            note="for scale invariance C*(θ) = sqrt(C(θ)T(θ)/κ), whose mean is at most ⟨C⟩ "
            "(Cauchy–Schwarz, with ⟨T⟩ = κ⟨C⟩): fluctuations of T bias it low; per γ "
            + ", ".join(
                f"{g:g}: {pg[str(g)]['solver_C_mean']:.4g} vs {pg[str(g)]['C_mean']:.4g}"
                for g in cfg.weight_decays
            ),
        ),
        Claim(
            id="library_vs_theory",
            kind=Kind.BEYOND,
            statement="C* of the library (solver teleport) equals theory.scale_invariant_"
            "equilibrium_norm_sq from torch.func per-sample gradients, at every checkpoint",
            value=max(r["theory_vs_solver"] for r in runs),
            op=Op.LT,
            threshold=1e-8,
            note="and the solver's C* equals sqrt(C·T/κ), T the noise term of nf.noether_flow "
            "(scale invariance: both parts of T scale as 1/‖W‖²), to "
            f"{max(r['solver_vs_flow'] for r in runs):.2g}",
        ),
        Claim(
            id="charge_decreases_with_gamma",
            statement="A larger weight decay gives a smaller equilibrium charge: violations of "
            "⟨C⟩(γ_i) > ⟨C⟩(γ_{i+1}) over the γ grid",
            value=int(sum(a <= b for a, b in itertools.pairwise(cm))),
            op=Op.EQ,
            threshold=0,
            note=f"⟨C⟩ = {', '.join(f'{v:.4g}' for v in cm)}; log-log slope {slope:.3f} "
            "(−1/2 if Tr Σ at unit norm did not change with γ)",
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s = results["series"]
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    for i, g in enumerate(cfg.weight_decays):
        for r in s["runs"]:
            if r["gamma"] == g:
                ax1.plot(r["step"], r["C"], color=f"C{i}", lw=0.8, alpha=0.7)
        ax1.plot([], [], color=f"C{i}", label=f"γ = {g:g}")
    ax1.set_xlabel("SGD step (window only)")
    ax1.set_ylabel("C = ‖W‖² (scale-invariant layer)")
    ax1.set_title(f"charge in the stationary window ({cfg.n_seeds} seeds)")
    ax1.legend(fontsize=8)
    pg = results["per_gamma"]
    gs = np.asarray(cfg.weight_decays)
    ax2.loglog(gs, s["C_mean"], "o-", label="time average ⟨C⟩")
    for key, lab, st in (("solver_C_mean", "solver's C* (mean over checkpoints)", "s--"),):
        ax2.loglog(gs, [pg[str(g)][key] for g in cfg.weight_decays], st, label=lab)
    ax2.set_xlabel("γ")
    ax2.set_ylabel("equilibrium charge")
    ax2.set_title("eq. 9 across γ")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "eq9.png")]
