"""Remark 4.4 / App. D: the four algorithms GF, GD, SGF and SGD and the Noether charges.

A two-layer linear net ``f(x) = UWx`` (``W ∈ R^{d×d_x}``, ``U ∈ R^{d_y×d}``, no biases) has the
double rotation symmetry ``(U, W) → (UG, G⁻¹W)`` with matrix charge ``C = UᵀU − WWᵀ``
(:class:`noetherflow.DoubleRotation`) and, as its diagonal subgroup, the per-hidden-neuron
rescaling with charges ``c_j = ‖W_j‖² − ‖U_{:,j}‖² = −C_jj`` (:class:`noetherflow.Rescaling`).
We declare both on the same two layers; they share parameters, so
:func:`noetherflow.solve_equilibrium` solves them as one coupled problem (block sweeps with
per-sample gradients transported along the orbit).

Remark 4.4 distinguishes the four dynamics:

* **GF** conserves every charge (eq. 11; weight decay 0). Integrated with DOP853 at
  ``rtol=1e-10``; the claim is that the charges move less than 1e-6 of their scale.
* **GD** changes every charge by exactly ``η²∇LᵀA∇L`` per step (App. D, eqs. 96–98, with the
  minibatch = the full batch): checked with :func:`noetherflow.exact_step_charges` at every
  step, in float64 (weight decay 0).
* **SGF** and **SGD** (with weight decay γ) relax to the noise equilibrium of Thm 4.3 / D.1,
  which :func:`noetherflow.solve_equilibrium` computes from gradient statistics.

The noise equilibrium of a linear pair is unique only up to the orthogonal subgroup
``(U, W) → (UO, OᵀW)``: those transformations are isometries, leave every loss and the
spectrum of ``C`` unchanged and conjugate ``C → OᵀCO``. Two runs with different noise land in
different hidden bases, and SGD noise slowly moves the basis of one run (second order in the
fluctuations), so the basis-independent content of the charges — what can be compared across
runs and averaged over time — is the spectrum of ``C`` (its trace is minus the total rescaling
charge; the individual rescaling charges are ``C``'s diagonal in the current basis). Hence
``sgf_sgd_same_equilibrium`` compares the *spectral charges* ``m_k = sign(p_k)|p_k|^{1/k}``,
``p_k = Tr[C^k]``, ``k = 1..d`` (``Tr C``, ``‖C‖_F``, ``(Tr C³)^{1/3}``; they fix the spectrum),
with each ``p_k`` averaged over the last ``avg_frac`` of every run (recorded every
``record_every`` steps) and over the ``n_runs`` independent runs per algorithm, all from the
same point. Power sums rather than sorted eigenvalues: the mean of a sorted eigenvalue is
pushed away from its neighbour by fluctuations (first order when two are close), the mean of
``Tr[C^k]`` only at second order. The solver's value: at ``n_solver_snapshots`` states per run
spread over the same window, collect the statistics on the full data set
(``nf.collect_stats``), solve (``nf.solve_equilibrium``; discrete time model for SGD states,
continuous for SGF states), teleport a copy there and take its ``p_k``; these are averaged
like the runs'. The same comparison in each run's own basis (diagonal of ``C``, i.e. the
rescaling charges) is recorded as a diagnostic. What we found, and why η = 0.04, S = 8: NOTES.

GD trains through :func:`noetherflow.train.run_gd`. SGD and SGF are written out with explicit
gradients on batched ``[runs, ...]`` tensors in float64 (the same updates as
:mod:`noetherflow.train`; the tests check them step for step against ``run_sgd`` /
``run_sgf``), GF by DOP853; charges, the exact-step prediction and the equilibrium come from
the library on an ``nn.Module`` holding the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

import noetherflow as nf
from noetherflow._divergence import find_divergence, is_finite
from noetherflow.experiments._base import Claim, Op, derive_seed, save_figure
from noetherflow.experiments._remark44_problem import (
    _DT,
    batch_grads,
    charge_matrix,
    loss_fn,
    make_model,
    make_problem,
    run_gd_checked,
    run_gf_checked,
)

DESCRIPTION = (
    "Remark 4.4: on a two-layer linear net GF conserves the charges, GD drifts by exactly "
    "η²∇LᵀA∇L per step, SGF and SGD reach the same noise equilibrium."
)

PAPER = (
    "Remark 4.4 (§4.3, App. D): the fixed-point theorem holds for GD, SGD and SGF (in "
    "expectation for the discrete ones); gradient flow is the only one of the four that does "
    "not obey it (it conserves the charges, eq. 11); each GD step changes a charge by "
    "η²∇LᵀA∇L (eqs. 96–98)."
)
PAPER_ORDER = 4.4


@dataclass(frozen=True)
class Config:
    """Settings of the Remark 4.4 experiment.

    Loss normalisation: per-sample ``ℓ = ‖UWx − y‖²`` (sum over outputs, paper eq. 12), batch
    loss the mean; weight decay ``γ‖θ‖²`` (gradient ``2γθ``); SGD samples with replacement; SGF
    is Euler–Maruyama with ``dt = η`` and noise covariance ``(η²/S)Σ`` per step (σ² = η/(2S)).

    Choices (the remark has no numbers) and why:

    - ``d_x=6``, ``d=3``, ``d_y=3``, ``n_samples=64``, ``x ~ N(0, I)``, ``y = Vx + 0.5ε`` with a
      random ``V`` (entries ``N(0, 1/d_x)``): label noise makes the gradient noise
      anisotropic between the layers (``Γ_W ∝ Tr Σ_ε Σ_x``, ``Γ_U ∝ Tr Σ_x Σ_ε`` with
      ``d_x ≠ d_y``), so the equilibrium is far from balanced (``Tr C ≈ −0.9 … −1.7``) while the
      init is near balanced (``W ~ N(0, 1/d_x)``, ``U ~ N(0, 1/d)``, ``Tr C₀ ≈ 0``).
    - ``lr=0.04``, ``batch_size=8``: per-step charge relaxation ``∝ η²/S``; the slowest mode
      (the largest-magnitude eigenvalue of ``C``) relaxes in ≈ 70 time units ≈ 1800 steps per
      e-fold (seed 0), with SGD fluctuations ``∝ η/S`` small enough that the solver applied to
      fluctuating states is within a few percent of the averages (see above).
      ``weight_decay=1e-3`` makes the equilibrium finite (ridge ``γS/η = 0.2`` against the
      noise ``Γ`` ≈ 0.75–1.5) without dominating it.
    - ``n_steps=20000`` per run, ``avg_frac=0.5`` (≈ 5.5 e-folds of the slowest mode before
      the window); ``n_runs=24`` runs per stochastic algorithm: one run's time average of an
      eigenvalue fluctuates by ≈ 1–2% of ``‖C‖``, the pooled average by < 0.5%.
      ``n_solver_snapshots=4`` solver states per run.
    - GF and GD have no weight decay (otherwise GF does not conserve the charges); they run for
      the same time ``t = η·n_steps``. GD checks the exact identity at each of its first
      ``gd_check_steps`` steps (where the charges move most; the library calls cost ~1 ms a
      step) and continues unchecked. GF records on ``gf_points`` grid points, DOP853 with
      ``gf_rtol=1e-10``, ``gf_atol=1e-12``.
    """

    d_x: int = 6
    d: int = 3
    d_y: int = 3
    n_samples: int = 64
    noise_std: float = 0.5
    lr: float = 0.04
    batch_size: int = 8
    weight_decay: float = 1e-3
    n_steps: int = 20000
    n_runs: int = 24
    avg_frac: float = 0.5
    record_every: int = 20
    n_solver_snapshots: int = 4
    gd_check_steps: int = 2000
    gf_points: int = 400
    gf_rtol: float = 1e-10
    gf_atol: float = 1e-12

    @classmethod
    def quick(cls) -> Config:
        """8000 steps (≈ 2.3 slow e-folds before the window; both the runs and the solver's
        snapshots then still drift slightly, together), 8 runs per stochastic algorithm."""
        return cls(n_steps=8000, n_runs=8, n_solver_snapshots=3, gd_check_steps=500, gf_points=200)


# --------------------------------------------------------------------------------------
# problem, model, gradients
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# the stochastic algorithms, batched over runs
# --------------------------------------------------------------------------------------


def run_stochastic(
    method: str,
    cfg: Config,
    prob: dict[str, Tensor],
    seeds: list[int],
    *,
    steps: int,
    snapshot_steps: list[int],
) -> dict[str, Any]:
    """SGD or SGF for ``len(seeds)`` runs from ``(U0, W0)``; one generator per run.

    Each run draws what :func:`noetherflow.train.run_sgd` (one ``randint`` of S indices per
    step) or :func:`noetherflow.train.run_sgf` (one ``randn`` of N normals per step) draws, so
    run ``i`` equals those integrators with ``torch.Generator().manual_seed(seeds[i])``.
    """
    X, Y = prob["X"], prob["Y"]
    n = X.shape[0]
    R = len(seeds)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    U = prob["U0"].expand(R, -1, -1).clone()
    W = prob["W0"].expand(R, -1, -1).clone()
    eta, gam, S = cfg.lr, cfg.weight_decay, cfg.batch_size
    decay = 1.0 - 2.0 * eta * gam
    noise_scale = eta / math.sqrt(S)  # sqrt(dt · 2σ²), σ² = η/(2S), dt = η
    rec_steps, eigs, traces, diag = [], [], [], []
    snaps: dict[int, tuple[Tensor, Tensor]] = {}
    snap_set = set(snapshot_steps)
    diverged_at: int | None = None
    for k in range(steps + 1):
        if k % cfg.record_every == 0 or k == steps:
            C = charge_matrix(U, W)
            if not is_finite(C):
                diverged_at = k
                break
            rec_steps.append(k)
            eigs.append(torch.linalg.eigvalsh(C))
            traces.append(C.diagonal(dim1=-2, dim2=-1).sum(-1))
            diag.append(C.diagonal(dim1=-2, dim2=-1).clone())
        if k in snap_set:
            snaps[k] = (U.clone(), W.clone())
        if k == steps:
            break
        if method == "sgd":
            idx = torch.stack([torch.randint(n, (S,), generator=g) for g in gens])
            g_u, g_w, _, _ = batch_grads(U, W, X[idx], Y[idx])
            U = decay * U - eta * g_u
            W = decay * W - eta * g_w
        else:
            g_u, g_w, r, h = batch_grads(U, W, X, Y)
            z = torch.stack([torch.randn(n, generator=g, dtype=_DT) for g in gens])  # [R, n]
            zs = z.sum(-1)[:, None, None]
            rz = r * z[..., None]
            # ξ = Σ_i z_i (g_i − ḡ)/√n, covariance exactly Σ (nf.train.gradient_noise)
            xi_u = (2.0 * rz.transpose(-2, -1) @ h - zs * g_u) / math.sqrt(n)
            xi_w = (2.0 * U.transpose(-2, -1) @ rz.transpose(-2, -1) @ X - zs * g_w) / math.sqrt(n)
            U = decay * U - eta * g_u + noise_scale * xi_u
            W = decay * W - eta * g_w + noise_scale * xi_w
    return {
        "step": np.asarray(rec_steps),
        "eig": torch.stack(eigs, dim=1).numpy() if eigs else np.zeros((R, 0, cfg.d)),  # [R, T, d]
        "trace": torch.stack(traces, dim=1).numpy() if traces else np.zeros((R, 0)),  # [R, T]
        "diag": torch.stack(diag, dim=1).numpy() if diag else np.zeros((R, 0, cfg.d)),
        "snapshots": snaps,
        "diverged_at": diverged_at,
        "U": U,
        "W": W,
    }


def solver_equilibrium(
    U: Tensor, W: Tensor, prob: dict[str, Tensor], cfg: Config, *, time: str
) -> dict[str, Any]:
    """Teleport ``(U, W)`` to its solved noise equilibrium; the charges there.

    Statistics: per-sample gradients on the full data set (``nf.collect_stats``); the solve is
    ``nf.solve_equilibrium`` for the coupled {rescaling, rotation} set.
    """
    model, syms = make_model(U, W)
    stats = nf.collect_stats(model, syms, loss_fn, prob["X"], prob["Y"])
    sol = nf.solve_equilibrium(
        syms,
        stats,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        weight_decay=cfg.weight_decay,
        time=time,
    )
    nf.teleport(model, sol)
    C = syms["rotation"].charge().clone()
    return {
        "C": C,
        "rescaling": syms["rescaling"].charge().clone(),
        "eig": torch.linalg.eigvalsh(C),
        "converged": bool(sol.converged),
        "at_infinity": len(sol.at_infinity),
    }


# --------------------------------------------------------------------------------------
# GD (exact identity) and GF (conservation)
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# run, claims, plot
# --------------------------------------------------------------------------------------


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def power_sums(eig: np.ndarray) -> np.ndarray:
    """``p_k = Tr[C^k] = Σ_j λ_j^k``, ``k = 1..d``, from eigenvalues ``[..., d]``; ``[..., d]``."""
    k = np.arange(1, eig.shape[-1] + 1)
    out: np.ndarray = (eig[..., None] ** k).sum(axis=-2)
    return out


def spectral_charges(mean_power_sums: np.ndarray) -> np.ndarray:
    """``m_k = sign(p_k)|p_k|^{1/k}``: the averaged power sums in units of a charge.

    ``m_1 = Tr C`` (minus the total rescaling charge), ``m_2 = ‖C‖_F``, ``m_3 = (Tr C³)^{1/3}``,
    …: for ``d`` of them they fix the spectrum of ``C``, i.e. all charges up to the ``O(d)``
    freedom. Averages of ``p_k`` are smooth in ``C`` (unlike sorted eigenvalues, whose means
    are pushed apart by fluctuations when two eigenvalues are close).
    """
    k = np.arange(1, mean_power_sums.shape[-1] + 1)
    out: np.ndarray = np.sign(mean_power_sums) * np.abs(mean_power_sums) ** (1.0 / k)
    return out


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    """GF and GD (γ = 0), SGF and SGD (γ > 0, ``n_runs`` each) from the same point."""
    prob = make_problem(cfg, seed)
    model0, syms0 = make_model(prob["U0"], prob["W0"])
    verified = syms0.verify(model0, prob["X"], loss_fn=loss_fn, targets=prob["Y"], strict=False)

    gf = run_gf_checked(cfg, prob)
    gd = run_gd_checked(cfg, prob, cfg.n_steps)

    start = round((1.0 - cfg.avg_frac) * cfg.n_steps)
    snap_steps = [
        int(s) for s in np.linspace(start, cfg.n_steps, cfg.n_solver_snapshots + 1)[1:].round()
    ]
    stoch: dict[str, dict[str, Any]] = {}
    for method, time in (("sgd", "discrete"), ("sgf", "continuous")):
        seeds = [derive_seed(seed, "remark44", method, i) for i in range(cfg.n_runs)]
        res = run_stochastic(method, cfg, prob, seeds, steps=cfg.n_steps, snapshot_steps=snap_steps)
        win = res["step"] >= start
        eq_eigs, eq_c, eq_resc, conv, at_inf = [], [], [], True, 0
        for s in snap_steps:
            if s not in res["snapshots"]:
                continue
            U, W = res["snapshots"][s]
            per_run = [
                solver_equilibrium(U[i], W[i], prob, cfg, time=time) for i in range(U.shape[0])
            ]
            eq_eigs.append(np.stack([p["eig"].numpy() for p in per_run]))
            eq_c.append(np.stack([p["C"].numpy() for p in per_run]))
            eq_resc.append(np.stack([p["rescaling"].numpy() for p in per_run]))
            conv = conv and all(p["converged"] for p in per_run)
            at_inf += sum(p["at_infinity"] for p in per_run)
        eig_run = res["eig"][:, win].mean(axis=1)  # [R, d]: time average per run
        m_run = spectral_charges(power_sums(res["eig"][:, win]).mean(axis=(0, 1)))
        eq_stack = np.stack(eq_eigs) if eq_eigs else np.full((1, 1, cfg.d), np.nan)
        m_eq = spectral_charges(power_sums(eq_stack).mean(axis=(0, 1)))
        # own-basis diagnostic: time-averaged C (diagonal) vs the solver's C (diagonal), per run
        diag_run = res["diag"][:, win].mean(axis=1)
        eq_diag = np.stack(eq_c).diagonal(axis1=-2, axis2=-1).mean(axis=0) if eq_c else diag_run
        stoch[method] = {
            "res": res,
            "time_model": time,
            "eig_avg": eig_run.mean(axis=0),
            "eig_run_sd": eig_run.std(axis=0),
            "eq_eig_avg": eq_stack.mean(axis=(0, 1)),
            "m": m_run,
            "eq_m": m_eq,
            "own_basis_rel_err": float(
                np.mean([_rel(diag_run[i], eq_diag[i]) for i in range(diag_run.shape[0])])
            ),
            "solver_converged": conv,
            "solver_at_infinity": at_inf,
            "trace_window_avg": float(res["trace"][:, win].mean()),
            "diverged_at": res["diverged_at"],
        }

    sgd, sgf = stoch["sgd"], stoch["sgf"]
    eq_pool = 0.5 * (sgd["eq_eig_avg"] + sgf["eq_eig_avg"])
    m_pool = 0.5 * (sgd["eq_m"] + sgf["eq_m"])
    d_between = float(np.linalg.norm(sgd["m"] - sgf["m"]) / np.linalg.norm(m_pool))
    d_sgd = _rel(sgd["m"], sgd["eq_m"])
    d_sgf = _rel(sgf["m"], sgf["eq_m"])
    div = find_divergence(
        np.concatenate([sgd["res"]["trace"].ravel(), sgf["res"]["trace"].ravel()])
    )

    series: dict[str, Any] = {
        "gf_time": gf["time"],
        "gf_trace": gf["trace"],
        "gf_rescaling0": gf["rescaling0"],
        "gd_time": cfg.lr * gd["step"],
        "gd_trace": gd["trace"],
        "gd_rescaling0": gd["rescaling0"],
    }
    for m, st in stoch.items():
        series[f"{m}_time"] = cfg.lr * st["res"]["step"]
        series[f"{m}_trace_mean"] = st["res"]["trace"].mean(axis=0)
        series[f"{m}_trace_run0"] = st["res"]["trace"][0]
        series[f"{m}_eig_mean"] = st["res"]["eig"].mean(axis=0)  # [T, d]
        series[f"{m}_eq_eig"] = st["eq_eig_avg"]
    return {
        "series": series,
        "verified": {r.name: r.rel_change for r in verified},
        "gf_max_rel_charge_change": gf["max_rel_change"],
        "gf_n_fev": gf["n_fev"],
        "gf_final_loss": gf["final_loss"],
        "gd_max_rel_residual": gd["max_rel_residual"],
        "gd_max_residual_over_change": gd["max_residual_over_change"],
        "gd_rel_change_of_charges": gd["rel_change_of_charges"],
        "gd_final_loss": gd["final_loss"],
        "averaging_start_step": start,
        "solver_snapshot_steps": snap_steps,
        "sgd_eig_avg": sgd["eig_avg"],
        "sgf_eig_avg": sgf["eig_avg"],
        "sgd_eig_run_sd": sgd["eig_run_sd"],
        "sgf_eig_run_sd": sgf["eig_run_sd"],
        "sgd_solver_eig": sgd["eq_eig_avg"],
        "sgf_solver_eig": sgf["eq_eig_avg"],
        "solver_eig_pooled": eq_pool,
        "sgd_spectral_charges": sgd["m"],
        "sgf_spectral_charges": sgf["m"],
        "sgd_solver_spectral_charges": sgd["eq_m"],
        "sgf_solver_spectral_charges": sgf["eq_m"],
        "rel_sgd_vs_sgf": d_between,
        "rel_sgd_vs_solver": d_sgd,
        "rel_sgf_vs_solver": d_sgf,
        "equilibrium_rel_err": max(d_between, d_sgd, d_sgf),
        "sgd_own_basis_rel_err": sgd["own_basis_rel_err"],
        "sgf_own_basis_rel_err": sgf["own_basis_rel_err"],
        "solver_converged": sgd["solver_converged"] and sgf["solver_converged"],
        "solver_at_infinity": sgd["solver_at_infinity"] + sgf["solver_at_infinity"],
        "sgd_trace_window_avg": sgd["trace_window_avg"],
        "sgf_trace_window_avg": sgf["trace_window_avg"],
        "stochastic_divergence": div.to_dict(),
    }


def setup(cfg: Config) -> list[dict[str, str]]:
    full = Config()
    rows = [
        {
            "quantity": "model, data",
            "paper": "— (no experiment)",
            "ours": f"f(x) = UWx, d_x = {cfg.d_x}, d = {cfg.d}, d_y = {cfg.d_y}; {cfg.n_samples} "
            f"Gaussian samples, y = Vx + {cfg.noise_std}ε; float64",
            "why": "double rotation and rescaling on the same pair, exact statistics",
        },
        {
            "quantity": "η, S, γ",
            "paper": "—",
            "ours": f"η = {cfg.lr}, S = {cfg.batch_size} (with replacement), γ = "
            f"{cfg.weight_decay} for SGD/SGF, 0 for GF/GD",
            "why": "GF conserves the charges only with γ = 0",
        },
        {
            "quantity": "SGF noise",
            "paper": "σ² = η/(2S), eq. 7 with σ²Tr[ΣA]",
            "ours": "Euler–Maruyama, dt = η, covariance (η²/S)Σ per step (2σ² in eq. 7)",
            "why": "Itô's lemma on eq. 1 (docs/concepts/flow.md)",
        },
        {
            "quantity": "loss",
            "paper": "eq. 12: ‖UWx − y‖²",
            "ours": "sum over outputs, batch mean",
            "why": "—",
        },
        {
            "quantity": "steps, runs",
            "paper": "—",
            "ours": f"{cfg.n_steps} steps, {cfg.n_runs} runs per stochastic algorithm, averages "
            f"over the last {cfg.avg_frac:.0%}",
            "why": "time and ensemble averages",
        },
    ]
    if cfg.n_steps != full.n_steps:
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "—",
                "ours": f"{cfg.n_steps} steps, {cfg.n_runs} runs",
                "why": f"time (full: {full.n_steps} steps, {full.n_runs} runs)",
            }
        )
    return rows


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    r = results
    fmt = lambda v: "[" + ", ".join(f"{float(x):.3f}" for x in v) + "]"  # noqa: E731
    return [
        Claim(
            id="gf_conserves",
            statement="Gradient flow (γ = 0) keeps every charge constant (max over time and "
            "charges of |C(t) − C(0)| / ‖θ₀‖²; DOP853, rtol 1e-10)",
            value=r["gf_max_rel_charge_change"],
            op=Op.LT,
            threshold=1e-6,
        ),
        Claim(
            id="gd_exact_drift",
            statement="Each GD step (γ = 0) changes every charge by exactly η²∇LᵀA∇L "
            "(max over steps and charges of |C_{k+1} − nf.exact_step_charges_k| / ‖θ_k‖², "
            "float64)",
            value=r["gd_max_rel_residual"],
            op=Op.LT,
            threshold=1e-10,
            note=f"relative to the change itself (steps where it exceeds 1e-6 ‖θ‖²): "
            f"{r['gd_max_residual_over_change']:.2g}; GD moved the charges by "
            f"{r['gd_rel_change_of_charges']:.3g} (relative) in {cfg.n_steps} steps",
        ),
        Claim(
            id="sgf_sgd_same_equilibrium",
            statement="With weight decay, SGF and SGD reach charges within 10% of each other and "
            "of nf.solve_equilibrium's noise equilibrium (max of the three relative distances "
            "between the basis-free charges (Tr C, ‖C‖_F, (Tr C³)^{1/3}), C = UᵀU − WWᵀ, "
            "averaged over the last part of the runs and over the runs)",
            value=r["equilibrium_rel_err"],
            op=Op.LT,
            threshold=0.1,
            note=f"(Tr C, ‖C‖_F, (Tr C³)^⅓): SGD {fmt(r['sgd_spectral_charges'])}, SGF "
            f"{fmt(r['sgf_spectral_charges'])}, solver {fmt(r['sgd_solver_spectral_charges'])} "
            f"(SGD states) / {fmt(r['sgf_solver_spectral_charges'])} (SGF states); distances "
            f"SGD–SGF {r['rel_sgd_vs_sgf']:.3f}, SGD–solver {r['rel_sgd_vs_solver']:.3f}, "
            f"SGF–solver {r['rel_sgf_vs_solver']:.3f}; mean eigenvalues SGD "
            f"{fmt(r['sgd_eig_avg'])}, SGF {fmt(r['sgf_eig_avg'])}, solver "
            f"{fmt(r['solver_eig_pooled'])}; averaged over steps ≥ {r['averaging_start_step']} "
            f"and {cfg.n_runs} runs each",
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s = results["series"]
    fig = Figure(figsize=(14, 4.8))
    ax, ax2 = fig.subplots(1, 2)
    ax.plot(s["gf_time"], s["gf_trace"], "--", color="C3", lw=2, label="GF (γ = 0)")
    ax.plot(s["gd_time"], s["gd_trace"], color="C2", lw=1.5, label="GD (γ = 0)")
    for m, col in (("sgd", "C0"), ("sgf", "C1")):
        ax.plot(s[f"{m}_time"], s[f"{m}_trace_run0"], color=col, lw=0.5, alpha=0.5)
        ax.plot(
            s[f"{m}_time"],
            s[f"{m}_trace_mean"],
            color=col,
            lw=1.8,
            label=f"{m.upper()} (γ = {cfg.weight_decay:g}; mean of {cfg.n_runs} runs; one thin)",
        )
    eq = float(np.sum(results["solver_eig_pooled"]))
    ax.axhline(eq, color="k", ls=":", lw=1.2, label="solver's noise equilibrium")
    ax.axvline(cfg.lr * results["averaging_start_step"], color="0.6", lw=0.8)
    ax.set_xlabel("time t = η · steps")
    ax.set_ylabel("Tr[UᵀU − WWᵀ] = −Σ_j rescaling charge_j")
    ax.set_title("one charge under the four algorithms")
    ax.legend(fontsize=8)

    for m, col in (("sgd", "C0"), ("sgf", "C1")):
        e = np.asarray(s[f"{m}_eig_mean"])
        for j in range(e.shape[1]):
            ax2.plot(
                s[f"{m}_time"], e[:, j], color=col, lw=1.2, label=m.upper() if j == 0 else None
            )
    for j, v in enumerate(results["solver_eig_pooled"]):
        ax2.axhline(float(v), color="k", ls=":", lw=1.0, label="solver" if j == 0 else None)
    ax2.axvline(cfg.lr * results["averaging_start_step"], color="0.6", lw=0.8)
    ax2.set_xlabel("time t = η · steps")
    ax2.set_ylabel("eigenvalues of UᵀU − WWᵀ (mean over runs)")
    ax2.set_title("basis-free charges: SGD, SGF and the solved equilibrium")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "remark44.png")]
