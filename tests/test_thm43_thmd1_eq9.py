"""Thm 4.3, Thm D.1 and eq. 9: the orbit machinery against closed forms in float64, the quick
runs of the three experiments, and the reproduction contract (setup rows, PAPER, NOTES) of
every experiment of this group."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import noetherflow as nf
from noetherflow.experiments import _orbit, eq9, remark44, teleport_cnn, teleport_mlp, thm43, thm_d1
from noetherflow.experiments._base import notes_of, run_experiment

SIZES = {"n": 64, "d_x": 4, "h": 3, "d_y": 2}


def _problem(family: str, seed: int = 0) -> _orbit.Problem:
    return _orbit.make_problem(family, seed, **SIZES)


def _full_batch_grad(prob: _orbit.Problem) -> torch.Tensor:
    """∇L(θ) by autograd on the whole batch, flattened over the parameters A acts on."""
    loss = _orbit.loss_fn(prob.model(prob.X), prob.Y)
    gs = torch.autograd.grad(loss, prob.params)
    return torch.cat([g.reshape(-1) for g in gs])


@pytest.mark.parametrize("family", _orbit.FAMILIES)
def test_generator_built_by_hand_is_the_library_symmetry(family: str) -> None:
    """θᵀAθ equals nf.charges, and e^{λA}θ equals sym.apply_ (both float64, exact)."""
    prob = _problem(family)
    th = _orbit.theta0(prob)
    c = float(nf.charges(prob.syms)[prob.syms.names[0]].reshape(-1)[0])
    assert c == pytest.approx(float(th @ prob.A @ th), rel=1e-13, abs=1e-14)
    mu, q = torch.linalg.eigh(prob.A)
    expected = (q * torch.exp(0.7 * mu)) @ q.T @ th
    moved = _orbit.at_orbit_point(prob, 0.7, lambda: _orbit.theta0(prob))
    torch.testing.assert_close(moved, expected, rtol=1e-12, atol=1e-13)
    assert torch.equal(_orbit.theta0(prob), th)  # restored exactly


@pytest.mark.parametrize("family", _orbit.FAMILIES)
@pytest.mark.parametrize(
    "case", [("continuous", 8, 0.01), ("discrete", 1, 0.0), ("discrete", 8, 1e-3)]
)
def test_library_flow_along_orbit_matches_transport(family: str, case: Any) -> None:
    """nf.noether_flow on statistics recollected at θ_λ = the oracle from statistics at θ."""
    prob = _problem(family, 1)
    time, bs, gam = case
    th = _orbit.theta0(prob)
    nz = _orbit.noise_coefficients(time, 0.05, bs, gam)
    for lam in (-1.3, 0.0, 0.9):
        st = _orbit.at_orbit_point(prob, lam, lambda: _orbit.library_stats(prob, gd=False))
        f, _ = _orbit.at_orbit_point(
            prob, lam, lambda st=st: _orbit.library_flow(prob, st, time, 0.05, bs, gam)
        )
        with torch.no_grad():
            fo = float(_orbit.oracle_flow(prob, th, lam, nz))
            g = _orbit.per_sample_flat(prob, th, prob.X, prob.Y)
        assert abs(f - fo) < 1e-11 * _orbit.oracle_gross(prob, th, lam, nz, g)


@pytest.mark.parametrize("family", _orbit.FAMILIES)
def test_gd_statistics_are_the_full_batch_gradient(family: str) -> None:
    """The micro-batch trick gives M = η²∇L∇Lᵀ: the library's GD flow (γ = 0) is η²∇LᵀA∇L."""
    prob = _problem(family, 2)
    st = _orbit.library_stats(prob, gd=True)
    f, _ = _orbit.library_flow(prob, st, "discrete", 0.05, _orbit.GD, 0.0)
    g = _full_batch_grad(prob).detach()
    expected = 0.05**2 * float(g @ prob.A @ g)
    assert f == pytest.approx(expected, rel=1e-11, abs=1e-16)


@pytest.mark.parametrize("family", _orbit.FAMILIES)
def test_solver_finds_the_oracle_zero(family: str) -> None:
    prob = _problem(family, 3)
    for time, bs, gam in (("continuous", 8, 0.01), ("discrete", _orbit.GD, 1e-3)):
        nz = _orbit.noise_coefficients(time, 0.05, bs, gam)
        root = _orbit.oracle_root(prob, _orbit.theta0(prob), nz)
        st = _orbit.library_stats(prob, gd=bs == _orbit.GD)
        lam, ok = _orbit.library_solve(prob, st, time, 0.05, bs, gam)
        assert ok and math.isfinite(root)
        assert lam == pytest.approx(root, abs=1e-10)


def test_scale_invariance_without_decay_is_at_infinity() -> None:
    prob = _problem("scale")
    nz = _orbit.noise_coefficients("continuous", 0.05, 8, 0.0)
    assert _orbit.oracle_root(prob, _orbit.theta0(prob), nz) == math.inf
    lam, _ = _orbit.library_solve(
        prob, _orbit.library_stats(prob, gd=False), "continuous", 0.05, 8, 0.0
    )
    assert lam == math.inf


def test_ift_derivative_matches_finite_differences_of_the_oracle_root() -> None:
    prob = _problem("rescaling", 4)
    th = _orbit.theta0(prob)
    nz = _orbit.noise_coefficients("discrete", 0.05, 8, 1e-3)
    delta = torch.randn(th.shape, generator=torch.Generator().manual_seed(0), dtype=th.dtype)
    delta /= delta.norm()
    h = 1e-5 * float(th.norm())
    roots = [_orbit.oracle_root(prob, th + s * h * delta, nz) for s in (1, -1)]
    fd = (roots[0] - roots[1]) / (2 * h)
    ift = _orbit.ift_derivative(prob, th, _orbit.oracle_root(prob, th, nz), nz, delta)
    assert fd == pytest.approx(ift, rel=1e-6)


def test_negative_gamma_criterion_on_a_hand_made_two_rate_flow() -> None:
    """Scale invariance (A = I) with κ < 0: both terms of G are positive, no zero, and the
    criterion says "not decreasing"; a tiny |γ| on a rescaling keeps it decreasing."""
    scale = _problem("scale")
    th = _orbit.theta0(scale)
    with torch.no_grad():
        g = _orbit.per_sample_flat(scale, th, scale.X, scale.Y)
    nz = _orbit.noise_coefficients("discrete", 0.05, 8, -1e-4)
    assert _orbit.negative_gamma_criterion(scale, th, nz, g) == "not decreasing"
    vals = [float(_orbit.oracle_flow(scale, th, x, nz, grads=g)) for x in np.linspace(-3, 3, 13)]
    assert min(vals) > 0  # no zero at all
    resc = _problem("rescaling")
    th = _orbit.theta0(resc)
    with torch.no_grad():
        g = _orbit.per_sample_flat(resc, th, resc.X, resc.Y)
    assert _orbit.negative_gamma_criterion(resc, th, nz, g) == "decreasing"
    big = _orbit.noise_coefficients("discrete", 0.05, 8, -10.0)
    assert _orbit.negative_gamma_criterion(resc, th, big, g) == "not decreasing"
    # the criterion's κ ≥ 0 limit is the paper's case: always decreasing
    pos = _orbit.noise_coefficients("discrete", 0.05, 8, 1e-3)
    assert _orbit.negative_gamma_criterion(resc, th, pos, g) == "decreasing"


@pytest.fixture(scope="module")
def quick_records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("thm")
    recs = {}
    for exp_id, target in (
        ("thm43", "noetherflow.experiments.thm43"),
        ("thm-d1", "noetherflow.experiments.thm_d1"),
    ):
        recs[exp_id] = run_experiment(exp_id, target, quick=True, seed=0, out_dir=out)
    return recs


def test_thm43_quick_every_claim_holds(quick_records: dict[str, Any]) -> None:
    rec = quick_records["thm43"]
    assert rec["status"] == "ok", rec["error"]
    claims = {c["id"]: c for c in rec["claims"]}
    assert set(claims) == {
        "flow_decreasing",
        "charge_increasing",
        "unique_zero",
        "library_vs_oracle",
        "solver_agrees",
        "lambda_star_differentiable",
    }
    # exact statements in float64: the margins are orders of magnitude
    assert all(c["holds"] for c in claims.values()), claims
    assert claims["library_vs_oracle"]["value"] < 1e-11
    assert claims["solver_agrees"]["value"] < 1e-10


def test_thmd1_quick(quick_records: dict[str, Any]) -> None:
    rec = quick_records["thm-d1"]
    assert rec["status"] == "ok", rec["error"]
    claims = {c["id"]: c for c in rec["claims"]}
    assert {"negative_gamma_as_printed", "negative_gamma_criterion"} <= set(claims)
    for cid, c in claims.items():
        if cid == "negative_gamma_as_printed":
            # scale invariance with κ < 0 has no zero at all: the printed statement fails
            assert not c["holds"] and c["value"] >= rec["config"]["n_seeds"]
        else:
            assert c["holds"], c
    recs = rec["results"]["records"]
    assert {r["batch_size"] for r in recs} == {1, 8, "GD"}
    assert any(r["weight_decay"] < 0 for r in recs)


def test_eq9_tiny_run_library_equals_theory() -> None:
    cfg = dataclasses.replace(
        eq9.Config.quick(), burn_in=40, window=60, n_seeds=1, weight_decays=(0.1,)
    )
    r = eq9.run_one((0.1, 0), cfg)
    assert not r["diverged"]
    assert r["theory_vs_solver"] < 1e-9  # theory.scale_invariant_equilibrium_norm_sq
    assert r["solver_vs_flow"] < 1e-9  # C* = sqrt(C·T/κ) for scale invariance
    assert r["C_mean"] > 0 and r["T_disc_mean"] > 0


def test_eq9_claims_on_a_short_run(tmp_path: Path) -> None:
    cfg = dataclasses.replace(
        eq9.Config.quick(), burn_in=40, window=60, n_seeds=1, weight_decays=(0.03, 0.1)
    )
    res = eq9.run(cfg, 0, tmp_path)
    ids = [c.id for c in eq9.claims(res, cfg)]
    assert ids == [
        "corrected_discrete_across_noise",
        "corrected_discrete_constant",
        "corrected_sgf_constant",
        "printed_eq9_constant",
        "solver_vs_time_average",
        "library_vs_theory",
        "charge_decreases_with_gamma",
    ]
    assert eq9.plot(res, cfg, tmp_path)[0].exists()
    # the noise sweep: γ = 0.1 at S = 2, 8 (the γ runs) and 32, each its own runs
    assert sorted(res["per_noise"], key=int) == ["2", "8", "32"]
    assert res["per_noise"]["8"]["C_mean"] == res["per_gamma"]["0.1"]["C_mean"]


@pytest.mark.parametrize("mod", [thm43, thm_d1, eq9, remark44, teleport_mlp, teleport_cnn])
def test_reproduction_contract(mod: Any) -> None:
    """setup rows with the four fields (a quick-mode row in quick mode), PAPER, NOTES."""
    assert isinstance(mod.PAPER, str) and mod.PAPER
    assert isinstance(notes_of(mod), str) and notes_of(mod)
    assert isinstance(mod.PAPER_ORDER, float)
    for cfg, quick in ((mod.Config(), False), (mod.Config.quick(), True)):
        rows = mod.setup(cfg)
        assert rows and all(set(r) == {"quantity", "paper", "ours", "why"} for r in rows)
        assert all(isinstance(v, str) and v for r in rows for v in r.values())
        assert any(r["quantity"] == "quick mode" for r in rows) == quick
