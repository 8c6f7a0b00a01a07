"""App. B.3 (convergence): Lemmas B.2, B.3, Corollary B.4, Lemma B.5's constant and Thm B.6.

Two independent computations, no library code on the measured path:

* Lemmas B.2–B.4 (:mod:`._lemmas_b`): a two-layer linear net with a one-parameter double
  rotation (eigenvalues of B of both signs), per-sample gradients by ``torch.func`` at every
  point, dense ``A``, ``e^{λA}`` and ``A±`` by ``eigh``, ``λ*`` by ``brentq``; points
  ``θ = e^{−λA}θ*`` on a grid of λ* of both signs. Each inequality is checked as printed and,
  where it fails, in the corrected form (docs/concepts/appendix-b.md).
* Lemma B.5 and Thm B.6 (:mod:`._charge_sde`): the noise-driven charge flow of a neuron on
  its minimum, with C* a drifted Brownian motion, simulated by Euler–Maruyama over many paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from noetherflow.experiments import _charge_sde, _lemmas_b
from noetherflow.experiments._base import Claim, Kind, derive_seed, save_figure

DESCRIPTION = (
    "App. B.3: Lemma B.2 holds; Lemma B.3 and Corollary B.4 fail as printed (one block of A "
    "kept) and hold corrected; Lemma B.5's noise term scales as 1/r₀, not 1/r₀²; Thm B.6."
)
PAPER = (
    "App. B.3: Lemma B.2 (eq. 44, Ċ/λ* ≥ 2σ²Tr[Σ(θ*)A±²]), Lemma B.3 (eq. 55, −(C − C*)/λ* ≤ "
    "2θ*ᵀA±²θ*), Corollary B.4 (eq. 62), Lemma B.5 (eq. 63, E(C − C*)² ≤ (2μ² + s²)/(2σ⁴c₀²)) "
    "and Thm B.6 (E(C − C*)² → 0 if s = μ = 0, else (C − C*)²/(C*)² → 0 in probability)."
)
PAPER_ORDER = 4.51

#: relative float64 slack of the exact inequalities (sums of ~10³ products)
EXACT_TOL = 1e-10


@dataclass(frozen=True)
class Config:
    """Settings of ``appendix_b3`` (the lemmas have no experimental setting; all ours).

    - Lemmas B.2–B.4: ``n = 64`` samples, ``x ~ N(0, I_5)``, ``y = tanh(xV) + 0.5ε`` (3
      outputs), width 3, B with eigenvalues (1, 0.4, −0.7) in a random basis, three problem
      seeds; λ* ∈ ``lams`` (both signs, 10⁻³ to 0.8; quick: four of them). Exact inequalities
      are checked to ``EXACT_TOL`` relative; the λ* → 0 limits to 1e-2 at |λ*| = 10⁻³ (O(λ*)).
    - Lemma B.5: ``k = (η/S)4σ_ε²s_x`` swept over ``rates`` (16×) at ``mu = 0``, ``s = 0.1``,
      C*(0) = C(0) = 3, horizon 40/k, the mean square over t ≥ 10/k and ``n_paths`` paths;
      the drift term at k = 1, μ = 0.1, s = 0 over t ≤ 40 (RMS lag over the second half).
      Slope tolerance 0.15 (fixed before the first run, notes/appendix_b3.md).
    - Thm B.6: at rest (s = μ = 0, C(0) = 1, C* = 3, t ≤ 20/k) and drifting (k = 1, μ = 0.1,
      s = 0.1, t ≤ 400, ``n_paths_b6`` paths).
    - Euler step ``dt = dt_rate/(2k)``.
    """

    n: int = 64
    d_x: int = 5
    hidden: int = 3
    d_y: int = 3
    b_eigs: tuple[float, ...] = (1.0, 0.4, -0.7)
    n_seeds: int = 3
    lams: tuple[float, ...] = (-0.8, -0.3, -0.05, -1e-3, 1e-3, 0.05, 0.3, 0.8)
    limit_tol: float = 1e-2
    rates: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    noise_s: float = 0.1
    drift_mu: float = 0.1
    c_star0: float = 3.0
    n_paths: int = 300
    n_paths_b6: int = 200
    b6_t_end: float = 400.0
    dt_rate: float = 0.02
    slope_tol: float = 0.15
    rest_tol: float = 1e-12
    rate_tol: float = 0.02

    @classmethod
    def quick(cls) -> Config:
        """Four λ*, fewer paths (same problems, rates and thresholds)."""
        return cls(lams=(-0.3, -1e-3, 1e-3, 0.3), n_paths=150, n_paths_b6=100)


def setup(cfg: Config) -> list[dict[str, str]]:
    """Every deviation from the paper's setup, one row each."""
    rows = [
        {
            "quantity": "B.2–B.4: model",
            "paper": "any exponential symmetry",
            "ours": f"linear net {cfg.d_x}→{cfg.hidden}→{cfg.d_y}, {cfg.n} samples, double "
            f"rotation with B eigenvalues {list(cfg.b_eigs)}, {cfg.n_seeds} seeds, λ* ∈ "
            f"{list(cfg.lams)}",
            "why": "a dense A with both signs and several magnitudes; exact per-sample Σ",
        },
        {
            "quantity": "Ċ",
            "paper": "σ²Tr[ΣA] (eq. 45)",
            "ours": "B.2/B.4 compared on Tr[ΣA]; B.5 with the corrected 2σ²Tr[ΣA] = (η/S)Tr[ΣA]",
            "why": "σ² cancels in B.4 and scales B.2; eq. 7's factor 2 in B.5's rate",
        },
        {
            "quantity": "B.5/B.6: dynamics",
            "paper": "SGF with dC* = μdt + s dW",
            "ours": "the charge's noise flow on the minimum of a neuron, C* driven through the "
            f"input variance; Euler–Maruyama, dt = {cfg.dt_rate:g}/(2k), {cfg.n_paths} paths",
            "why": "the lemma's own setting, with closed forms for C*, r₀ and the linear rate",
        },
        {
            "quantity": "B.5: rates",
            "paper": "one c₀",
            "ours": f"k ∈ {list(cfg.rates)} at s = {cfg.noise_s:g}, μ = 0; μ = {cfg.drift_mu:g} "
            "at s = 0",
            "why": "a slope in the rate separates the printed and the corrected constant",
        },
    ]
    if cfg != Config():
        rows.append(
            {
                "quantity": "quick mode",
                "paper": "—",
                "ours": f"λ* ∈ {list(cfg.lams)}, {cfg.n_paths}/{cfg.n_paths_b6} paths (full "
                f"{len(Config().lams)} λ*, {Config().n_paths}/{Config().n_paths_b6})",
                "why": "time; same thresholds",
            }
        )
    return rows


# ------------------------------------------------------------------------------------------
# Lemmas B.2–B.4
# ------------------------------------------------------------------------------------------


def run_lemmas(cfg: Config, seed: int) -> list[dict[str, float]]:
    """One record per (problem seed, λ*) (see :func:`._lemmas_b.case_record`)."""
    recs: list[dict[str, float]] = []
    for i in range(cfg.n_seeds):
        prob = _lemmas_b.make_problem(
            derive_seed(seed, "appendix_b3", i) % 2**32,
            cfg.n,
            cfg.d_x,
            cfg.hidden,
            cfg.d_y,
            cfg.b_eigs,
        )
        lam0 = _lemmas_b.solve_lambda_star(prob, prob.theta0)
        theta_star = _lemmas_b._expm(prob.a, lam0) @ prob.theta0
        for lam in cfg.lams:
            rec = _lemmas_b.case_record(prob, theta_star, lam)
            rec["seed"] = i
            rec["trace_at_star"] = _lemmas_b.trace_sigma_a(prob, theta_star)
            recs.append(rec)
    return recs


def _lemma_numbers(recs: list[dict[str, float]], cfg: Config) -> dict[str, float]:
    r = {k: np.array([x[k] for x in recs]) for k in recs[0]}
    small = np.abs(r["lam"]) <= 1e-3
    return {
        "b2_min_ratio": float(np.min(r["b2_lhs"] / r["b2_rhs"])),
        "b3_printed_max_ratio": float(np.max(r["b3_lhs"] / r["b3_rhs_printed"])),
        "b3_printed_violations": int(np.sum(r["b3_lhs"] > r["b3_rhs_printed"] * (1 + EXACT_TOL))),
        "b3_corrected_max_ratio": float(
            np.max(
                np.maximum(r["b3_lo_corrected"] / r["b3_lhs"], r["b3_lhs"] / r["b3_hi_corrected"])
            )
        ),
        "b4_printed_min_ratio": float(np.min(r["b4_lhs"] / r["b4_rhs_printed"])),
        "b4_printed_violations": int(np.sum(r["b4_lhs"] / r["b4_rhs_printed"] < 1 - EXACT_TOL)),
        "b4_corrected_min_ratio": float(np.min(r["b4_lhs"] / r["b4_rhs_corrected"])),
        "root_max_error": float(np.max(np.abs(r["lambda_root"] - r["lam"]))),
        "limit_b3_max_error": float(
            np.max(np.abs(r["b3_lhs"][small] / r["b3_both_blocks"][small] - 1))
        ),
        "limit_b2_max_error": float(np.max(np.abs(r["b2_lhs"][small] / r["b2_limit"][small] - 1))),
        "n_cases": len(recs),
        "max_trace_at_star": float(np.max(np.abs(r["trace_at_star"]))),
    }


# ------------------------------------------------------------------------------------------
# Lemma B.5 and Thm B.6
# ------------------------------------------------------------------------------------------


def run_b5(cfg: Config, seed: int) -> dict[str, Any]:
    """Noise sweep (μ = 0) over ``rates`` and the drift run (s = 0)."""
    mse, bound_c, bound_p, r0s = [], [], [], []
    for i, k in enumerate(cfg.rates):
        sim = _charge_sde.simulate_charge(
            k=k,
            mu=0.0,
            s=cfg.noise_s,
            c_star0=cfg.c_star0,
            c0=cfg.c_star0,
            t_end=40.0 / k,
            n_paths=cfg.n_paths,
            dt_rate=cfg.dt_rate,
            n_logs=81,
            seed=derive_seed(seed, "appendix_b3", "b5", i) % 2**32,
        )
        win = sim["t"] >= 10.0 / k
        m = float(np.mean((sim["C"][win] - sim["C_star"][win]) ** 2))
        r0 = float(sim["r0_path"].min())
        mse.append(m)
        r0s.append(r0)
        bound_c.append(cfg.noise_s**2 / (2.0 * r0))
        sigma2_c0 = r0 / 2.0  # the paper's rate σ²c₀ is half the corrected (η/S)c₀
        bound_p.append(cfg.noise_s**2 / (2.0 * sigma2_c0**2))
    slope = float(np.polyfit(np.log(cfg.rates), np.log(mse), 1)[0])
    drift = _charge_sde.simulate_charge(
        k=1.0,
        mu=cfg.drift_mu,
        s=0.0,
        c_star0=cfg.c_star0,
        c0=cfg.c_star0,
        t_end=40.0,
        n_paths=1,
        dt_rate=cfg.dt_rate,
        n_logs=81,
        seed=0,
    )
    win = drift["t"] >= 20.0
    lag = drift["C"][win, 0] - drift["C_star"][win, 0]
    lag_rms = float(np.sqrt(np.mean(lag**2)))
    r0 = float(drift["r0_path"].min())
    lin = float(np.mean(cfg.drift_mu / _charge_sde.linear_rate(1.0, drift["C_star"][win, 0])))
    return {
        "mse": mse,
        "r0": r0s,
        "bound_corrected": bound_c,
        "bound_printed": bound_p,
        "slope": slope,
        "drift_lag_rms": lag_rms,
        "drift_bound": cfg.drift_mu / r0,
        "drift_lag_linear": lin,
        "drift_t": drift["t"],
        "drift_lag": (drift["C"][:, 0] - drift["C_star"][:, 0]),
    }


def run_b6(cfg: Config, seed: int) -> dict[str, Any]:
    """At rest: (C − C*)² decays at 2r; drifting: the relative error against C*."""
    rest = _charge_sde.simulate_charge(
        k=1.0,
        mu=0.0,
        s=0.0,
        c_star0=cfg.c_star0,
        c0=1.0,
        t_end=20.0,
        n_paths=1,
        dt_rate=cfg.dt_rate,
        n_logs=81,
        seed=0,
    )
    e = (rest["C"][:, 0] - rest["C_star"][:, 0]) ** 2
    fit = (rest["t"] >= 4.0) & (rest["t"] <= 8.0)
    decay = -float(np.polyfit(rest["t"][fit], np.log(e[fit]), 1)[0])
    r_lin = float(_charge_sde.linear_rate(1.0, cfg.c_star0))
    drift = _charge_sde.simulate_charge(
        k=1.0,
        mu=cfg.drift_mu,
        s=cfg.noise_s,
        c_star0=cfg.c_star0,
        c0=cfg.c_star0,
        t_end=cfg.b6_t_end,
        n_paths=cfg.n_paths_b6,
        dt_rate=cfg.dt_rate,
        n_logs=101,
        seed=derive_seed(seed, "appendix_b3", "b6") % 2**32,
    )
    rel2 = np.mean(((drift["C"] - drift["C_star"]) / drift["C_star"]) ** 2, axis=1)
    c_mean = drift["C_star"].mean(1)
    late = drift["t"] >= 0.1 * cfg.b6_t_end
    slope = float(np.polyfit(np.log(c_mean[late]), np.log(rel2[late]), 1)[0])
    return {
        "rest_final_over_initial": float(e[-1] / e[0]),
        "rest_decay_over_2r": decay / (2.0 * r_lin),
        "rest_t": rest["t"],
        "rest_sq": e,
        "rel2_end": float(rel2[-1]),
        "rel2_at_tenth": float(rel2[np.nonzero(late)[0][0]]),
        "rel2_slope_vs_cstar": slope,
        "mse_end": float(np.mean((drift["C"][-1] - drift["C_star"][-1]) ** 2)),
        "drift_t": drift["t"],
        "drift_rel2": rel2,
    }


def run(cfg: Config, seed: int, out_dir: Path) -> dict[str, Any]:
    recs = run_lemmas(cfg, seed)
    b5, b6 = run_b5(cfg, seed), run_b6(cfg, seed)
    series = {
        "lemma_records": recs,
        "b5_rates": list(cfg.rates),
        "b5_mse": b5.pop("mse"),
        "b5_bound_corrected": b5.pop("bound_corrected"),
        "b5_bound_printed": b5.pop("bound_printed"),
        "b5_drift_t": b5.pop("drift_t"),
        "b5_drift_lag": b5.pop("drift_lag"),
        "b6_rest_t": b6.pop("rest_t"),
        "b6_rest_sq": b6.pop("rest_sq"),
        "b6_drift_t": b6.pop("drift_t"),
        "b6_drift_rel2": b6.pop("drift_rel2"),
    }
    return {"lemmas": _lemma_numbers(recs, cfg), "b5": b5, "b6": b6, "series": series}


def claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    return [*_lemma_claims(results["lemmas"], cfg), *_b5_b6_claims(results, cfg)]


def _lemma_claims(lm: dict[str, Any], cfg: Config) -> list[Claim]:
    n = lm["n_cases"]
    over = f"over {n} points (3 problems × λ* ∈ {list(cfg.lams)})"
    return [
        Claim(
            id="lemma_b2",
            statement=f"Lemma B.2 (eq. 44): Tr[Σ(θ)A]/λ* ≥ 2Tr[Σ(θ*)A±²] (A₊ if λ* > 0, A₋ if "
            f"λ* < 0) {over}: min ratio ≥ 1 − {EXACT_TOL:g}",
            value=lm["b2_min_ratio"],
            op=">=",
            threshold=1.0 - EXACT_TOL,
            note=f"as λ* → 0 the left side tends to 2Tr[Σ*A²] (both blocks): max relative "
            f"error {lm['limit_b2_max_error']:.2g} at |λ*| = 1e-3; with the corrected Ċ = "
            "2σ²Tr[ΣA] the bound holds with a factor 2 to spare",
            why=f"the smallest ratio is {lm['b2_min_ratio']:.6g}",
        ),
        Claim(
            id="lemma_b3_as_printed",
            statement=f"Lemma B.3 as printed (eq. 55): −(C − C*)/λ* ≤ 2θ*ᵀA±²θ* {over}: max "
            f"ratio ≤ 1 + {EXACT_TOL:g}",
            value=lm["b3_printed_max_ratio"],
            op="<=",
            threshold=1.0 + EXACT_TOL,
            kind=Kind.PRINTED,
            note=f"{lm['b3_printed_violations']} of {n} points violate it",
            why=f"the ratio reaches {lm['b3_printed_max_ratio']:.3g}: −(C − C*)/λ* tends to "
            "2θ*ᵀA²θ* with both blocks of A as λ* → 0, the printed bound keeps one (eq. 59's "
            "dropped term has the wrong sign)",
        ),
        Claim(
            id="lemma_b3_corrected",
            statement="Lemma B.3 corrected (mean value theorem): 2θ*ᵀA²e^{−2|λ*||A|}θ* ≤ "
            f"−(C − C*)/λ* ≤ 2θ*ᵀA²e^{{2|λ*||A|}}θ* {over}: max ratio ≤ 1 + {EXACT_TOL:g}",
            value=lm["b3_corrected_max_ratio"],
            op="<=",
            threshold=1.0 + EXACT_TOL,
            note=f"λ* → 0: −(C − C*)/λ* against 2θ*ᵀA²θ*, max relative error "
            f"{lm['limit_b3_max_error']:.2g} at |λ*| = 1e-3",
            why=f"the ratio reaches {lm['b3_corrected_max_ratio']:.6g}",
        ),
        Claim(
            id="corollary_b4_as_printed",
            statement="Corollary B.4 as printed (eq. 62): Tr[ΣA]/(C − C*) ≤ −Tr[Σ*A±²]/θ*ᵀA±²θ* "
            f"(the σ² of both sides cancels) {over}: min of left/right ≥ 1 − {EXACT_TOL:g}",
            value=lm["b4_printed_min_ratio"],
            op=">=",
            threshold=1.0 - EXACT_TOL,
            kind=Kind.PRINTED,
            note=f"{lm['b4_printed_violations']} of {n} points violate it",
            why=f"the rate reaches only {lm['b4_printed_min_ratio']:.3g} of the printed bound: "
            "near λ* = 0 the rate is Tr[Σ*A²]/θ*ᵀA²θ* (both blocks), below the one-block ratio "
            "whenever the other block's ratio is smaller",
        ),
        Claim(
            id="corollary_b4_corrected",
            statement="Corollary B.4 from Lemma B.2 and the corrected Lemma B.3: Tr[ΣA]/(C − C*) "
            f"≤ −Tr[Σ*A±²]/θ*ᵀA²e^{{2|λ*||A|}}θ* {over}: min of left/right ≥ 1 − {EXACT_TOL:g}",
            value=lm["b4_corrected_min_ratio"],
            op=">=",
            threshold=1.0 - EXACT_TOL,
            why=f"the ratio falls to {lm['b4_corrected_min_ratio']:.6g}",
        ),
        Claim(
            id="orbit_root_consistent",
            statement="Each point θ = e^{−λA}θ* has λ* = λ when re-solved from scratch (brentq "
            "on Tr[Σ(e^{λA}θ)A]): max |λ*_solved − λ| < 1e-9",
            value=lm["root_max_error"],
            op="<",
            threshold=1e-9,
            kind=Kind.BEYOND,
            note=f"|Tr[Σ(θ*)A]| ≤ {lm['max_trace_at_star']:.2g} at the equilibria",
            why=f"the root is off by {lm['root_max_error']:.2g}",
        ),
    ]


def _b5_b6_claims(results: dict[str, Any], cfg: Config) -> list[Claim]:
    b5, b6, s = results["b5"], results["b6"], results["series"]
    mse = np.asarray(s["b5_mse"])
    ratio_c = float(np.max(mse / np.asarray(s["b5_bound_corrected"])))
    ratio_p = float(np.max(mse / np.asarray(s["b5_bound_printed"])))
    rates = f"k ∈ {list(cfg.rates)}, s = {cfg.noise_s:g}, μ = 0"
    return [
        Claim(
            id="lemma_b5_noise_term_corrected",
            statement=f"Lemma B.5's noise term, corrected (E(C − C*)² ≤ s²/(2r₀) for μ = 0): "
            f"over {rates}, the log-log slope of E(C − C*)² against the rate is −1 ± "
            f"{cfg.slope_tol:g} (value = slope + 1)",
            value=b5["slope"] + 1.0,
            op="abs<",
            threshold=cfg.slope_tol,
            note=f"slope {b5['slope']:.4g}; measured/corrected bound ≤ {ratio_c:.3g}",
            why=f"the slope is {b5['slope']:.3g}",
        ),
        Claim(
            id="lemma_b5_noise_term_as_printed",
            statement=f"Lemma B.5's noise term as printed (s²/(2σ⁴c₀²)): over {rates}, the "
            f"log-log slope of E(C − C*)² against the rate is −2 ± {cfg.slope_tol:g} (value = "
            "slope + 2)",
            value=b5["slope"] + 2.0,
            op="abs<",
            threshold=cfg.slope_tol,
            kind=Kind.PRINTED,
            note=f"measured/printed bound up to {ratio_p:.3g}: the printed form still bounds "
            "these rates (k ≤ 4), but measured/printed grows ∝ k, so it fails at larger rates",
            why=f"the slope is {b5['slope']:.3g}, the Ornstein–Uhlenbeck −1 (variance s²/(2r)), "
            "not −2: eq. 72 writes s²/(2σ⁴c₀²) for eq. 71's s²/(2σ²c₀)",
        ),
        Claim(
            id="lemma_b5_bound_corrected",
            statement=f"Lemma B.5 corrected, E(C − C*)² ≤ μ²/r₀² + s²/(2r₀) with r₀ = (η/S)c₀: "
            f"max over {rates} of measured/bound < 1",
            value=ratio_c,
            op="<",
            threshold=1.0,
            why=f"the mean square reaches {ratio_c:.3g}× the bound",
        ),
        Claim(
            id="lemma_b5_drift_lag",
            statement=f"Lemma B.5's drift term (s = 0, μ = {cfg.drift_mu:g}, k = 1): the RMS lag "
            "|C − C*| over the second half is at most |μ|/r₀",
            value=b5["drift_lag_rms"] / b5["drift_bound"],
            op="<=",
            threshold=1.0,
            note=f"lag {b5['drift_lag_rms']:.4g}, bound {b5['drift_bound']:.4g}; μ/r with the "
            f"linear rate r ∈ [r₀, 2r₀]: {b5['drift_lag_linear']:.4g}",
            why=f"the lag is {b5['drift_lag_rms'] / b5['drift_bound']:.3g}× the bound",
        ),
        Claim(
            id="thm_b6_at_rest",
            statement="Thm B.6, s = μ = 0: E(C − C*)² → 0 (from C(0) = 1, C* = 3, k = 1, by "
            f"t = 20: final/initial < {cfg.rest_tol:g})",
            value=b6["rest_final_over_initial"],
            op="<",
            threshold=cfg.rest_tol,
            note=f"decay rate of (C − C*)² over t ∈ [4, 8] / 2r = {b6['rest_decay_over_2r']:.4g}",
            why=f"(C − C*)² only fell to {b6['rest_final_over_initial']:.3g} of its start",
        ),
        Claim(
            id="thm_b6_rest_rate",
            statement="Thm B.6 at rest, the rate (ours: the linear rate r of the corrected flow): "
            f"(C − C*)² decays as e^{{−2rt}}, |fitted/2r − 1| < {cfg.rate_tol:g}",
            value=b6["rest_decay_over_2r"] - 1.0,
            op="abs<",
            threshold=cfg.rate_tol,
            kind=Kind.BEYOND,
            why=f"the fitted rate is {b6['rest_decay_over_2r']:.4g}× 2r",
        ),
        Claim(
            id="thm_b6_relative_vanishes",
            statement=f"Thm B.6, μ = {cfg.drift_mu:g}, s = {cfg.noise_s:g}: the relative "
            f"distance E[(C − C*)²/(C*)²] vanishes as C* grows: at t = {cfg.b6_t_end:g} below "
            "0.1 of its value at t/10",
            value=b6["rel2_end"] / b6["rel2_at_tenth"],
            op="<",
            threshold=0.1,
            note=f"{b6['rel2_end']:.3g} at the end; E(C − C*)² stays bounded "
            f"({b6['mse_end']:.3g} at the end)",
            why=f"it fell only to {b6['rel2_end'] / b6['rel2_at_tenth']:.3g} of its value",
        ),
        Claim(
            id="thm_b6_relative_rate",
            statement="Thm B.6's rate (ours, from Lemma B.5: E(C − C*)² = O(1) so the relative "
            "distance falls as 1/(C*)²): log-log slope of E[(C − C*)²/(C*)²] against the mean "
            f"C* over the last 90% of the run is −2 ± {cfg.slope_tol:g} (value = slope + 2)",
            value=b6["rel2_slope_vs_cstar"] + 2.0,
            op="abs<",
            threshold=cfg.slope_tol,
            kind=Kind.BEYOND,
            why=f"the slope is {b6['rel2_slope_vs_cstar']:.3g}",
        ),
    ]


def plot(results: dict[str, Any], cfg: Config, out_dir: Path) -> list[Path]:
    from matplotlib.figure import Figure

    s = results["series"]
    recs = s["lemma_records"]
    fig = Figure(figsize=(16, 4.2))
    ax1, ax2, ax3, ax4 = fig.subplots(1, 4)
    lam = np.array([r["lam"] for r in recs])
    for key, rhs, lab, mk in (
        ("b2_lhs", "b2_rhs", "B.2: lhs/bound (≥ 1)", "o"),
        ("b3_lhs", "b3_rhs_printed", "B.3 printed: lhs/bound (≤ 1)", "x"),
        ("b3_lhs", "b3_hi_corrected", "B.3 corrected: lhs/bound (≤ 1)", "+"),
    ):
        ratio = np.array([r[key] / r[rhs] for r in recs])
        ax1.plot(np.sign(lam) * np.abs(lam) ** 0.5, ratio, mk, label=lab)
    b4p = np.array([r["b4_lhs"] / r["b4_rhs_printed"] for r in recs])
    b4c = np.array([r["b4_lhs"] / r["b4_rhs_corrected"] for r in recs])
    ax2.plot(np.sign(lam) * np.abs(lam) ** 0.5, b4p, "x", label="B.4 printed (≥ 1)")
    ax2.plot(np.sign(lam) * np.abs(lam) ** 0.5, b4c, "+", label="B.4 corrected (≥ 1)")
    for ax in (ax1, ax2):
        ax.axhline(1.0, color="0.4", ls="--", lw=0.8)
        ax.set_xlabel("sign(λ*)·|λ*|^½")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    ax1.set_title("Lemmas B.2, B.3 (3 problems)")
    ax2.set_title("Corollary B.4")
    rates = np.asarray(s["b5_rates"])
    ax3.loglog(rates, s["b5_mse"], "o", label="E(C − C*)², μ = 0")
    ax3.loglog(rates, s["b5_bound_corrected"], "--", label="corrected s²/(2r₀)")
    ax3.loglog(rates, s["b5_bound_printed"], ":", label="printed s²/(2σ⁴c₀²)")
    ax3.set_xlabel("k (rate)")
    ax3.set_title("Lemma B.5: the noise term")
    ax3.legend(fontsize=7)
    ax4.loglog(s["b6_drift_t"][1:], s["b6_drift_rel2"][1:], label="E[(C − C*)²/(C*)²]")
    ax4.set_xlabel("t")
    ax4.set_title("Thm B.6: the relative distance vanishes")
    ax4.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, out_dir / "appendix_b3.png")]
