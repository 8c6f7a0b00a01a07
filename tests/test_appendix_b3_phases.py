"""Issue 30 (round 3): appendix-b3 (Lemmas B.2–B.5, Thm B.6), phases (§4.2) and approx-signs
(§5.4): the independent computations against slow references, the quick runs through the CLI
(claims, kinds, why, figures) and the report."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from noetherflow import report
from noetherflow.experiments import _charge_sde, _lemmas_b, approx_signs, phases
from noetherflow.experiments.timescales import _Probe

# --------------------------------------------------------------------------------------------
# Lemmas B.2–B.4: the dense computation
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def problem() -> _lemmas_b.Problem:
    return _lemmas_b.make_problem(7, 24, 4, 3, 2, (1.0, 0.4, -0.7))


def test_sigma_matches_a_per_sample_autograd_loop(problem: _lemmas_b.Problem) -> None:
    """torch.func's Σ against one torch.autograd.grad per sample (float64)."""
    (h, d_x), (d_y, _) = problem.shapes
    th = torch.tensor(problem.theta0, dtype=torch.float64, requires_grad=True)
    rows = []
    for xi, yi in zip(problem.x, problem.y, strict=True):
        w, u = th[: h * d_x].reshape(h, d_x), th[h * d_x :].reshape(d_y, h)
        loss = ((u @ (w @ torch.as_tensor(xi)) - torch.as_tensor(yi)) ** 2).sum()
        rows.append(torch.autograd.grad(loss, th)[0].numpy())
    g = np.array(rows)
    ref = np.cov(g.T, bias=True)
    np.testing.assert_allclose(
        _lemmas_b.sigma(problem, problem.theta0), ref, rtol=1e-12, atol=1e-13
    )


def test_generator_is_a_symmetry_and_sigma_transports(problem: _lemmas_b.Problem) -> None:
    """e^{λA} leaves every per-sample loss unchanged; Σ(e^{−λA}θ) = e^{λA}Σ(θ)e^{λA} (Lemma B.1)."""
    lam = 0.37
    e_plus, e_minus = _lemmas_b._expm(problem.a, lam), _lemmas_b._expm(problem.a, -lam)
    (h, d_x), (d_y, _) = problem.shapes

    def outputs(th: np.ndarray) -> np.ndarray:
        w, u = th[: h * d_x].reshape(h, d_x), th[h * d_x :].reshape(d_y, h)
        return np.asarray(problem.x @ w.T @ u.T)

    np.testing.assert_allclose(
        outputs(e_plus @ problem.theta0), outputs(problem.theta0), atol=1e-12
    )
    s0 = _lemmas_b.sigma(problem, problem.theta0)
    np.testing.assert_allclose(
        _lemmas_b.sigma(problem, e_minus @ problem.theta0),
        e_plus @ s0 @ e_plus,
        rtol=1e-9,
        atol=1e-11,
    )


def test_lemma_b3_printed_fails_corrected_holds(problem: _lemmas_b.Problem) -> None:
    lam0 = _lemmas_b.solve_lambda_star(problem, problem.theta0)
    star = _lemmas_b._expm(problem.a, lam0) @ problem.theta0
    assert abs(_lemmas_b.trace_sigma_a(problem, star)) < 1e-10
    for lam in (-0.4, -1e-3, 1e-3, 0.4):
        r = _lemmas_b.case_record(problem, star, lam)
        assert r["lambda_root"] == pytest.approx(lam, abs=1e-10)
        assert r["b2_lhs"] >= r["b2_rhs"]  # Lemma B.2 as printed
        assert r["b3_lo_corrected"] <= r["b3_lhs"] <= r["b3_hi_corrected"]
        assert r["b4_lhs"] <= r["b4_rhs_corrected"]
        if abs(lam) <= 1e-3:  # the one-block bound is below the two-block limit
            assert r["b3_lhs"] == pytest.approx(r["b3_both_blocks"], rel=1e-2)
            assert r["b3_lhs"] > r["b3_rhs_printed"]


# --------------------------------------------------------------------------------------------
# Lemma B.5 / Thm B.6: the charge flow
# --------------------------------------------------------------------------------------------


def test_reduced_flow_is_the_neurons_trace_sigma_a() -> None:
    """k(a⁴/b² − b²) against (η/S)Tr[ΣA] from per-sample gradients (Monte Carlo, 4·10⁵ samples)."""
    rng = np.random.default_rng(0)
    d, p, s_x, sig, eta_s = 4, 1.0, 0.7, 1.3, 0.02
    b2 = 1.6
    w = np.zeros(d)
    w[0] = math.sqrt(b2)
    u = p / math.sqrt(b2)
    n = 400_000
    x = rng.standard_normal((n, d))
    x[:, 0] *= math.sqrt(s_x)
    r = u * (x @ w) - (p * x[:, 0] + sig * rng.standard_normal(n))
    g_w, g_u = 2 * r[:, None] * u * x, 2 * r * (x @ w)
    trace = np.var(g_w, axis=0).sum() - np.var(g_u)
    a4 = p**2 * (s_x + d - 1) / s_x
    k = eta_s * 4 * sig**2 * s_x
    assert eta_s * trace == pytest.approx(k * (a4 / b2 - b2), rel=2e-2)


def test_charge_sde_is_ornstein_uhlenbeck() -> None:
    """The linear rate by finite differences, the rest decay at 2r, and E X² ≈ s²/(2r)."""
    k, c_star, h = 0.8, 2.0, 1e-6
    a2 = float(_charge_sde.b_squared(c_star, 1.0))
    assert a2 - 1.0 / a2 == pytest.approx(c_star, rel=1e-14)

    def drift(c: float) -> float:
        b2 = float(_charge_sde.b_squared(c, 1.0))
        return k * (a2 * a2 / b2 - b2)

    fd = -(drift(c_star + h) - drift(c_star - h)) / (2 * h)
    r = float(_charge_sde.linear_rate(k, c_star))
    assert fd == pytest.approx(r, rel=1e-8)
    sim = _charge_sde.simulate_charge(
        k=k,
        mu=0.0,
        s=0.05,
        c_star0=c_star,
        c0=c_star,
        t_end=60 / k,
        n_paths=400,
        dt_rate=0.01,
        n_logs=61,
        seed=1,
    )
    win = sim["t"] >= 10 / k
    mse = np.mean((sim["C"][win] - sim["C_star"][win]) ** 2)
    assert mse == pytest.approx(0.05**2 / (2 * r), rel=0.15)
    with pytest.raises(ValueError, match="dt_rate"):
        _charge_sde.simulate_charge(
            k=1, mu=0, s=0, c_star0=1, c0=1, t_end=1, n_paths=1, dt_rate=0.5, n_logs=2, seed=0
        )


# --------------------------------------------------------------------------------------------
# phases: closed forms against the library
# --------------------------------------------------------------------------------------------


def test_phases_equilibrium_is_the_librarys() -> None:
    """θ* of the closed form is where nf.solve_equilibrium puts the neuron (large sample)."""
    cfg = phases.Config()
    eq = phases.equilibrium(cfg)
    rng = np.random.default_rng(3)
    n = 200_000
    x = rng.standard_normal((n, cfg.d_in))
    y = x[:, 0] * cfg.teacher_norm + cfg.noise_std * rng.standard_normal(n)
    w = np.zeros(cfg.d_in)
    w[0] = math.sqrt(eq["w_star_sq"])
    probe = _Probe(x, y)
    assert probe.distance(math.sqrt(eq["u_star_sq"]), w, cfg.lr, 1) < 0.01
    u0, w0 = phases.start_point(cfg)
    assert probe.distance(u0, w0, cfg.lr, 1) == pytest.approx(abs(cfg.lam0), abs=0.01)
    assert eq["t_equi_fast"] < eq["t_erm_gd"] < eq["t_equi_slow"]


def test_phases_helpers() -> None:
    t = np.linspace(0, 10, 101)
    err = np.exp(-0.5 * t)
    level = math.exp(-2.0)
    assert phases.crossing_time(t, err, level) == pytest.approx(4.0, rel=1e-3)
    assert phases.fitted_erm_time(t, err, 10.0, level) == pytest.approx(4.0, rel=1e-10)
    assert math.isnan(phases.crossing_time(t, err, 1e-9))


# --------------------------------------------------------------------------------------------
# quick runs through the CLI, and the report
# --------------------------------------------------------------------------------------------

_IDS = {
    "appendix-b3": {
        "holds": {
            "lemma_b2",
            "lemma_b3_corrected",
            "corollary_b4_corrected",
            "orbit_root_consistent",
            "lemma_b5_noise_term_corrected",
            "lemma_b5_bound_corrected",
            "lemma_b5_drift_lag",
            "thm_b6_at_rest",
            "thm_b6_rest_rate",
            "thm_b6_relative_vanishes",
            "thm_b6_relative_rate",
        },
        "fails": {
            "lemma_b3_as_printed",
            "corollary_b4_as_printed",
            "lemma_b5_noise_term_as_printed",
        },
    },
    "phases": {
        "holds": {
            "t_erm_independent_of_noise",
            "fast_phase_equilibrates_during_erm",
            "slow_phase_frozen_until_minimum",
            "slow_phase_takes_off_at_minimum",
            "design_separates_timescales",
        },
        "fails": set(),
    },
    "approx-signs": {
        "holds": {
            "charge_above_minimum_pd",
            "charge_below_minimum_nd",
            "mixed_follows_noise_balance_neg",
            "mixed_follows_noise_balance_pos",
        },
        "fails": set(),
    },
}


@pytest.fixture(scope="module")
def quick_run(reproduce: Callable[..., Path]) -> Path:
    return reproduce("appendix-b3", "phases", "approx-signs")


@pytest.mark.parametrize("exp_id", sorted(_IDS))
def test_quick_claims(
    quick_run: Path, metrics: Callable[[Path, str], dict[str, Any]], exp_id: str
) -> None:
    data = metrics(quick_run, exp_id)
    claims = {c["id"]: c for c in data["claims"]}
    want = _IDS[exp_id]
    assert set(claims) == want["holds"] | want["fails"]
    for cid in want["holds"]:
        assert claims[cid]["holds"], claims[cid]
    for cid in want["fails"]:  # printed forms, expected to fail
        assert not claims[cid]["holds"] and claims[cid]["kind"] == "printed", claims[cid]
    for c in claims.values():
        assert isinstance(c["value"], float) and math.isfinite(c["value"]), c
        assert c["why"] and c["kind"] in ("paper", "printed", "beyond")
    assert data["setup"] and data["notes"]
    fig = data["figures"][0]
    assert (quick_run / exp_id / fig).read_bytes()[:4] == b"\x89PNG"


def test_quick_report_renders_the_new_experiments(quick_run: Path) -> None:
    recs = report.load_records(quick_run)
    md = report.render_markdown(recs)
    for exp_id in _IDS:
        assert exp_id in md
    assert "lemma-b5-noise-constant" in md or "Lemma B.5 (eqs. 63, 71–72)" in md


def test_approx_signs_deterministic(tmp_path: Path) -> None:
    import dataclasses

    cfg = dataclasses.replace(approx_signs.Config.quick(), n_chains=4, n_steps=300)
    a, b = approx_signs.run(cfg, 2, tmp_path), approx_signs.run(cfg, 2, tmp_path)
    assert a["cases"] == b["cases"]
    assert len(approx_signs.claims(a, cfg)) == 4
