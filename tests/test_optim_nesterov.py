"""Nesterov and dampened SGD momentum (issue #18): closed forms, exact steps, fast simulations.

Everything in float64. The simulations are Gaussian-noise toys with many independent chains
(one charge each) trained by a real ``torch.optim.SGD``, so a few thousand steps take about
a second; the 2% threshold (issue #18) and each run's size are fixed in the docstrings,
with the numbers a first probe gave.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import noetherflow as nf
from noetherflow.optim.decompose import bilinear_charge
from noetherflow.optim.momentum import (
    MomentumStep,
    momentum_noise,
    momentum_step_moments,
    stationary_closed_form,
    stationary_moments,
    update_charge,
)

DT = torch.float64

VARIANTS = {  # (nesterov, dampening)
    "heavy": (False, 0.0),
    "nesterov": (True, 0.0),
    "damped": (False, 0.4),
}


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_closed_forms_equal_the_linear_solve(beta: float, variant: str) -> None:
    """Eqs. (3)–(4) and (3N)–(4N) against the 3 × 3 solve, with ⟨H⟩ ≠ 0."""
    nesterov, damp = VARIANTS[variant]
    eta, gam = 0.07, 0.03
    st = MomentumStep.create(
        lr=eta, momentum=beta, weight_decay=gam, nesterov=nesterov, dampening=damp
    )
    g = torch.tensor([1.3, -0.2, 0.7], dtype=DT)
    h = torch.tensor([0.4, 0.1, -0.3], dtype=DT)
    for a, b in zip(stationary_closed_form(g, h, st), stationary_moments(g, h, st), strict=True):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-15)
    c, b, e = stationary_moments(g, h, st)
    upd = update_charge(c, b, e, g, h, st)
    if not nesterov:  # heavy ball: ⟨ΔθᵀAΔθ⟩ = E* = 4aC*/(1 + β) whatever ⟨H⟩, a = η(1 − d)γ
        a = eta * (1 - (damp if beta > 0 else 0.0)) * gam
        assert torch.allclose(upd, 4 * a * c / (1 + beta), rtol=1e-12, atol=0)
    else:  # Nesterov's update is not the buffer; at ⟨H⟩ = 0 it is (5N)
        a = eta * gam
        c0, b0, e0 = stationary_moments(g, 0 * h, st)
        num = 4 * a * (1 + 2 * beta - 2 * beta**3 + 2 * a * beta * (1 + beta) * (1 + 2 * beta))
        want = num / (1 + beta + 2 * a * beta + 4 * a * beta**2) * c0
        assert torch.allclose(update_charge(c0, b0, e0, g, 0 * h, st), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("beta", [0.3, 0.9])
def test_dampening_is_the_heavy_ball_with_scaled_lr(beta: float) -> None:
    eta, d, gam, s = 0.2, 0.35, 0.01, 8
    damped = MomentumStep.create(lr=eta, momentum=beta, weight_decay=gam, dampening=d)
    scaled = MomentumStep.create(lr=eta * (1 - d), momentum=beta, weight_decay=gam)
    got = (damped.p, damped.q, damped.r, damped.s, damped.t, damped.u)
    want = (scaled.p, scaled.q, scaled.r, scaled.s, scaled.t, scaled.u)
    assert got == pytest.approx(want, rel=1e-15)
    for time in ("discrete", "continuous"):
        a = momentum_noise(
            lr=eta, batch_size=s, weight_decay=gam, momentum=beta, dampening=d, time=time
        )
        b = momentum_noise(
            lr=eta * (1 - d), batch_size=s, weight_decay=gam, momentum=beta, time=time
        )
        assert (a.kappa, a.c_mean, a.c_second) == pytest.approx(
            (b.kappa, b.c_mean, b.c_second), rel=1e-14
        )
    # without momentum PyTorch ignores dampening (no buffer): so do we
    plain = MomentumStep.create(lr=eta, momentum=0.0, weight_decay=gam, dampening=d)
    assert (plain.r, plain.dampening) == (-eta, 0.0)


def test_nesterov_and_dampening_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"nesterov=True with dampening=0\.1: PyTorch's SGD"):
        MomentumStep.create(lr=0.1, momentum=0.9, nesterov=True, dampening=0.1)
    with pytest.raises(ValueError, match=r"nesterov=True with dampening=0\.1"):
        nf.NoiseModel.create(lr=0.1, batch_size=4, momentum=0.9, nesterov=True, dampening=0.1)
    with pytest.raises(ValueError, match=r"dampening=1\.0 must lie in \[0, 1\)"):
        momentum_noise(lr=0.1, batch_size=4, momentum=0.9, dampening=1.0)
    with pytest.raises(ValueError, match=r"weight_decay=0\.0: the closed forms"):
        stationary_closed_form(1.0, 0.0, MomentumStep.create(lr=0.1, momentum=0.5))


def _mlp(seed: int) -> tuple[nn.Sequential, dict[str, nf.Symmetry]]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 3)).to(DT)
    return m, {"resc": nf.Rescaling(m[0], m[2]), "rot": nf.DoubleRotation(m[2], m[3])}


def test_exact_map_with_dampening() -> None:
    """A real ``SGD(momentum=β, dampening=d)``: eq. (2) with the dampened coefficients is
    exact (1e-12) from the second step on; the first step (PyTorch's undamped buffer
    initialisation, v = 0 before it) is the d = 0 map, and the dampened map is wrong there."""
    m, syms = _mlp(3)
    eta, beta, lam, d = 0.05, 0.8, 0.02, 0.3
    opt = torch.optim.SGD(m.parameters(), lr=eta, momentum=beta, weight_decay=lam, dampening=d)
    damped = MomentumStep.create(lr=eta, momentum=beta, weight_decay=lam / 2, dampening=d)
    first = MomentumStep.create(lr=eta, momentum=beta, weight_decay=lam / 2)
    x, y = torch.randn(32, 5, dtype=DT), torch.randn(32, 3, dtype=DT)
    for step in range(6):
        idx = torch.randint(0, 32, (8,))
        opt.zero_grad()
        ((m(x[idx]) - y[idx]) ** 2).mean().backward()
        pred = {}
        for name, s in syms.items():
            th = {p: p.detach().clone() for p in s.params}
            g = {p: p.grad.detach().clone() for p in s.params}
            v = {
                p: -eta * opt.state[p]["momentum_buffer"] if step else torch.zeros_like(th[p])
                for p in s.params
            }
            moments = (s.charge_of(th), bilinear_charge(s, th, v), s.charge_of(v))
            gh = (s.charge_of(g), bilinear_charge(s, v, g))
            pred[name] = (
                momentum_step_moments(*moments, *gh, first if step == 0 else damped),
                momentum_step_moments(*moments, *gh, damped),
            )
        opt.step()
        for name, s in syms.items():
            th = {p: p.detach() for p in s.params}
            v = {p: -eta * opt.state[p]["momentum_buffer"] for p in s.params}
            got = (s.charge_of(th), bilinear_charge(s, th, v), s.charge_of(v))
            right, dampened = pred[name]
            scale = max(float(t.abs().max()) for t in got)
            for pr, gt in zip(right, got, strict=True):
                assert float((pr - gt).abs().max()) < 1e-12 * scale
            if step == 0:
                err = max(
                    float((pr - gt).abs().max()) for pr, gt in zip(dampened, got, strict=True)
                )
                assert err > 1e-4 * scale


def _lr(eta_eff: float, beta: float, dampening: float) -> float:
    """The lr with η_eff = η(1 − d)/(1 − β)."""
    return eta_eff * (1 - beta) / (1 - dampening)


SIM_CASES = [(0.5, True, 0.0), (0.9, True, 0.0), (0.9, False, 0.5)]  # (β, nesterov, d)


@pytest.mark.parametrize(("beta", "nesterov", "damp"), SIM_CASES)
def test_scale_invariance_toy_matches_the_stationary_point(
    beta: float, nesterov: bool, damp: float
) -> None:
    """K = 1024 chains ŵ_kᵀξ̄_k (ξ̄ the mean of S = 2 draws of N(0, I_6)): ∇L ≡ 0 (⟨H⟩ = 0) and
    E[G | θ] = (d − 1)/(S·C) exactly. η_eff = η(1 − d)/(1 − β) = 1, γ = 0.1 — a large ηγ on
    purpose: there Nesterov's stationary charge differs from the heavy ball's by 12% at
    β = 0.9, and its angular update by 34–75%. Burn-in 200 steps, window 800 (the charge
    relaxes in a few steps, the buffer in 1/(1 − β) = 10). Threshold 2% (issue #18), fixed
    before running; a probe (K = 512, window 600, seeds 0 and 1) gave |errors| ≤ 0.32% for
    the charge and ≤ 0.26% for the update.
    """
    torch.manual_seed(0)
    k, d, s, gam, burn, window = 1024, 6, 2, 0.1, 200, 800
    lr = _lr(1.0, beta, damp)
    w = nn.Parameter(torch.randn(k, d, dtype=DT))
    sym = nf.ScaleInvariance([w], per_channel=True)
    opt = torch.optim.SGD(
        [w], lr=lr, momentum=beta, nesterov=nesterov, dampening=damp, weight_decay=2 * gam
    )
    cs, gs, us = [], [], []
    for t in range(burn + window):
        xi = torch.randn(k, s, d, dtype=DT)
        opt.zero_grad()
        (w / w.norm(dim=1, keepdim=True) * xi.mean(1)).sum().backward()
        before = w.detach().clone()
        opt.step()
        if t >= burn:
            c = sym.charge_of({w: before})
            cs.append(c.mean())
            gs.append(((d - 1) / (s * c)).mean())
            us.append((w.detach() - before).square().sum(1).mean())
    c_meas, g_mean, u_meas = (float(torch.stack(z).mean()) for z in (cs, gs, us))
    st = MomentumStep.create(
        lr=lr, momentum=beta, weight_decay=gam, nesterov=nesterov, dampening=damp
    )
    c, b, e = stationary_moments(g_mean, 0.0, st)
    u_pred = float(update_charge(c, b, e, torch.tensor(g_mean, dtype=DT), 0.0 * c, st))
    print(
        f"scale β={beta} nesterov={nesterov} d={damp}: charge {c_meas / float(c) - 1:+.4f}, "
        f"update {u_meas / u_pred - 1:+.4f}"
    )
    assert abs(c_meas / float(c) - 1) < 0.02
    assert abs(u_meas / u_pred - 1) < 0.02
    # the test can tell the variants apart: the other models miss
    if nesterov:
        heavy = MomentumStep.create(lr=lr, momentum=beta, weight_decay=gam)
        ch, _, eh = stationary_moments(g_mean, 0.0, heavy)
        assert abs(u_meas / float(eh) - 1) > 0.2  # heavy ball's update is E*
        if beta == 0.9:
            assert abs(c_meas / float(ch) - 1) > 0.05
    else:  # ignoring the dampening doubles η_eff
        undamped = MomentumStep.create(lr=lr, momentum=beta, weight_decay=gam)
        assert abs(c_meas / float(stationary_moments(g_mean, 0.0, undamped)[0]) - 1) > 0.1


@pytest.mark.parametrize(("beta", "nesterov", "damp"), SIM_CASES)
def test_rescaling_toy_matches_the_stationary_point(
    beta: float, nesterov: bool, damp: float
) -> None:
    """K = 1024 chains of a linear neuron x ↦ u·wᵀx (w ∈ R⁴, ``nf.Rescaling``: one charge
    ‖w‖² − u² per chain) on y = w*ᵀx + ε, x ~ N(0, I), ε ~ N(0, 1), S = 2 fresh samples per
    step: ∇L ≠ 0 and the buffer correlates with it. With q = uw − w*, the conditional
    moments are closed forms (Isserlis): ḡ = (uq, qᵀw),
    E[g_iᵀAg_i] = u²((n + 2)‖q‖² + n) − (‖q‖²‖w‖² + 2(qᵀw)² + ‖w‖²),
    E[G | θ] = (1 − 1/S)ḡᵀAḡ + E[g_iᵀAg_i]/S and E[H | θ, v] = v_wᵀuq − v_u·qᵀw.
    η_eff = 0.1, γ = 0.05; burn-in 400 steps, window 1200. Threshold 2% (issue #18), fixed
    before running; a probe (seeds 0 and 1) gave +0.08% to +0.5% (standard error ≈ 0.15%),
    and dropping ⟨H⟩ −1.4% to −7.2% (−4.4% and −7.1% at β = 0.9).
    """
    torch.manual_seed(0)
    k, n, s, gam, burn, window = 1024, 4, 2, 0.05, 400, 1200
    lr = _lr(0.1, beta, damp)
    first = nn.Linear(n, k, bias=False).to(DT)
    second = nn.Linear(k, 1, bias=False).to(DT)
    with torch.no_grad():
        first.weight.copy_(0.5 * torch.randn(k, n, dtype=DT))
        second.weight.copy_(0.5 * torch.randn(1, k, dtype=DT))
    sym = nf.Rescaling(first, second)
    wstar = torch.zeros(n, dtype=DT)
    wstar[0] = 1.0
    opt = torch.optim.SGD(
        [first.weight, second.weight],
        lr=lr,
        momentum=beta,
        nesterov=nesterov,
        dampening=damp,
        weight_decay=2 * gam,
    )
    cs, gs, hs = [], [], []
    for t in range(burn + window):
        x = torch.randn(k, s, n, dtype=DT)
        y = x @ wstar + torch.randn(k, s, dtype=DT)
        w, u = first.weight, second.weight[0]
        opt.zero_grad()
        (0.5 * (u[:, None] * (x * w[:, None, :]).sum(-1) - y) ** 2).mean(1).sum().backward()
        if t >= burn:
            with torch.no_grad():
                q = u[:, None] * w - wstar
                qq, qw, ww = q.square().sum(1), (q * w).sum(1), w.square().sum(1)
                per = u**2 * ((n + 2) * qq + n) - (qq * ww + 2 * qw**2 + ww)
                gs.append(((1 - 1 / s) * (u**2 * qq - qw**2) + per / s).mean())
                vw = -lr * opt.state[first.weight]["momentum_buffer"]
                vu = -lr * opt.state[second.weight]["momentum_buffer"][0]
                hs.append(((vw * u[:, None] * q).sum(1) - vu * qw).mean())
                cs.append(sym.charge().mean())
        opt.step()
    c_meas, g_mean, h_mean = (float(torch.stack(z).mean()) for z in (cs, gs, hs))
    st = MomentumStep.create(
        lr=lr, momentum=beta, weight_decay=gam, nesterov=nesterov, dampening=damp
    )
    c_pred = float(stationary_moments(g_mean, h_mean, st)[0])
    c_no_h = float(stationary_moments(g_mean, 0.0, st)[0])
    print(
        f"rescaling β={beta} nesterov={nesterov} d={damp}: {c_meas / c_pred - 1:+.4f} "
        f"(without ⟨H⟩ {c_meas / c_no_h - 1:+.4f})"
    )
    assert abs(c_meas / c_pred - 1) < 0.02
    if beta == 0.9:  # the test sees the buffer's correlation with ∇L: dropping ⟨H⟩ misses
        assert abs(c_meas / c_no_h - 1) > 0.02


def test_flows_and_solver_take_nesterov_and_dampening() -> None:
    """The keyword forms pass nesterov and dampening through to NoiseModel.create."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(40, 5, dtype=DT), torch.randn(40, 3, dtype=DT)
    stats = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    kw = {"batch_size": 8, "weight_decay": 1e-2, "time": "discrete", "momentum": 0.9}
    nest = nf.NoiseModel.create(lr=0.05, nesterov=True, **kw)
    damp = nf.noether_flow(syms, stats, lr=0.05, dampening=0.5, **kw)
    scaled = nf.noether_flow(syms, stats, lr=0.025, **kw)
    for name, _ in syms.items():
        got = nf.noether_flow(syms, stats, lr=0.05, nesterov=True, **kw)[name]
        assert torch.equal(got, nf.noether_flow(syms, stats, nest)[name])
        assert torch.allclose(damp[name], scaled[name], rtol=1e-13, atol=0)
    sa = nf.solve_equilibrium(syms, stats, lr=0.05, dampening=0.5, **kw)
    sb = nf.solve_equilibrium(syms, stats, lr=0.025, **kw)
    sn = nf.solve_equilibrium(syms, stats, lr=0.05, nesterov=True, **kw)
    sm = nf.solve_equilibrium(syms, stats, nest)
    for name, _ in syms.items():
        assert torch.allclose(sa.distance[name], sb.distance[name], rtol=1e-10, atol=1e-14)
        assert torch.equal(sn.distance[name], sm.distance[name])
