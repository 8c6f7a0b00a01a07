"""The exact per-step decomposition C(θ') = C(θ) + decay + drift + noise for any optimizer,
and reading noise descriptions from torch.optim optimizers (issue #18). float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import noetherflow as nf
from noetherflow.flow import NoiseModel
from noetherflow.optim.decompose import StepRecorder, bilinear_charge, decompose_step
from noetherflow.optim.hyper import from_optimizer, group_for_params, optimizer_kind
from noetherflow.optim.momentum import momentum_noise

DT = torch.float64


def _setup(seed: int) -> tuple[nn.Sequential, dict[str, nf.Symmetry], torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 3)).to(DT)
    syms = {"resc": nf.Rescaling(m[0], m[2]), "rot": nf.DoubleRotation(m[2], m[3])}
    return m, syms, torch.randn(40, 5, dtype=DT), torch.randn(40, 3, dtype=DT)


def _scale(*ts: torch.Tensor) -> float:
    return max(float(t.abs().max()) for t in ts)


OPTS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, weight_decay=0.03),
    "sgdm": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.03),
    "nesterov": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.03
    ),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTS))
def test_decomposition_is_exact_for_every_optimizer(name: str) -> None:
    m, syms, x, y = _setup(0)
    opt = OPTS[name](m.parameters())
    rec = StepRecorder(syms, opt)
    drift_seen = 0.0
    for _ in range(5):
        idx = torch.randint(0, 40, (8,))
        opt.zero_grad()
        ((m(x[idx]) - y[idx]) ** 2).mean().backward()
        grads = {p: p.grad.detach().clone() for p in m.parameters()}
        rec.before_step()
        opt.step()
        parts = rec.after_step()
        for sname, s in syms.items():
            d = parts[sname]
            sc = _scale(d.before, d.after, d.noise, d.decay)
            assert float(d.residual.abs().max()) < 1e-12 * sc  # exact identity
            assert torch.equal(d.after, s.charge())
            lr, wd = opt.param_groups[0]["lr"], opt.param_groups[0]["weight_decay"]
            k = 1.0 if name == "adam" else 1 - lr * wd
            assert torch.allclose(d.decay, (k * k - 1) * d.before, rtol=1e-12, atol=1e-14 * sc)
            if name == "sgd":  # drift vanishes by symmetry; noise is η² gᵀAg
                assert float(d.drift.abs().max()) < 1e-12 * sc
                gq = s.charge_of({p: grads[p] for p in s.params})
                assert torch.allclose(d.noise, lr**2 * gq, rtol=1e-12, atol=1e-14 * sc)
            else:
                drift_seen = max(drift_seen, float(d.drift.abs().max()) / sc)
    if name != "sgd":  # momentum and Adam(W) do move charges by drift
        assert drift_seen > 1e-6


def test_sgdm_drift_is_two_k_beta_theta_a_v() -> None:
    m, syms, x, y = _setup(1)
    lr, beta, wd = 0.05, 0.9, 0.03
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=beta, weight_decay=wd)
    for step in range(4):
        idx = torch.randint(0, 40, (8,))
        opt.zero_grad()
        ((m(x[idx]) - y[idx]) ** 2).mean().backward()
        theta = {p: p.detach().clone() for p in m.parameters()}
        v_old = {
            p: -lr * opt.state[p]["momentum_buffer"] if p in opt.state else torch.zeros_like(p)
            for p in m.parameters()
        }
        opt.step()
        after = {p: p.detach() for p in m.parameters()}
        for s in syms.values():
            d = decompose_step(s, theta, after, 1 - lr * wd)
            want = 2 * (1 - lr * wd) * beta * bilinear_charge(s, theta, v_old)
            sc = _scale(d.before, d.noise)
            assert float((d.drift - want).abs().max()) < 1e-12 * sc
            if step > 0:
                assert float(want.abs().max()) > 1e-8


def test_bilinear_charge_matches_the_generator() -> None:
    m, syms, _, _ = _setup(2)
    gen = torch.Generator().manual_seed(0)
    x = {p: torch.randn(p.shape, generator=gen, dtype=DT) for p in m.parameters()}
    y = {p: torch.randn(p.shape, generator=gen, dtype=DT) for p in m.parameters()}
    r = syms["resc"]
    want = (x[m[0].weight] * y[m[0].weight]).sum(1) + x[m[0].bias] * y[m[0].bias]
    want = want - (x[m[2].weight] * y[m[2].weight]).sum(0)
    assert torch.allclose(bilinear_charge(r, x, y), want, rtol=1e-13, atol=1e-13)
    rot = syms["rot"]  # ½(U_xᵀU_y + U_yᵀU_x) − ½(W_xW_yᵀ + W_yW_xᵀ), W with its bias column
    wx = torch.cat([x[m[2].weight], x[m[2].bias][:, None]], 1)
    wy = torch.cat([y[m[2].weight], y[m[2].bias][:, None]], 1)
    ux, uy = x[m[3].weight], y[m[3].weight]
    want_m = 0.5 * (ux.T @ uy + uy.T @ ux) - 0.5 * (wx @ wy.T + wy @ wx.T)
    assert torch.allclose(bilinear_charge(rot, x, y), want_m, rtol=1e-13, atol=1e-13)


def test_recorder_errors() -> None:
    m, syms, _, _ = _setup(0)
    opt = torch.optim.SGD(m[0].parameters(), lr=0.1)
    rec = StepRecorder(syms, opt)
    with pytest.raises(RuntimeError, match="before_step"):
        rec.after_step()
    rec.before_step()
    with pytest.raises(ValueError, match="not in the optimizer"):
        rec.after_step()


# ---- from_optimizer -------------------------------------------------------------------


def test_from_optimizer_sgd_and_momentum_per_group() -> None:
    m, _, _, _ = _setup(0)
    opt = torch.optim.SGD(
        [
            {"params": m[0].parameters()},
            {"params": m[2].parameters(), "momentum": 0.9, "weight_decay": 0.02},
            {"params": m[3].parameters(), "momentum": 0.5, "nesterov": True, "lr": 0.01},
        ],
        lr=0.1,
        weight_decay=0.04,
    )
    g0, g1, g2 = from_optimizer(opt, batch_size=16)
    assert g0.kind == g1.kind == "sgd" and optimizer_kind(opt) == "sgd"
    assert (g0.lr, g0.momentum, g0.weight_decay) == (0.1, 0.0, 0.02)  # γ = λ/2
    nm = NoiseModel.create(lr=0.1, batch_size=16, weight_decay=0.02, time="discrete")
    assert g0.noise is not None and g0.noise.to_noise_model() == nm
    assert (g1.momentum, g1.weight_decay) == (0.9, 0.01)
    assert g1.noise == momentum_noise(lr=0.1, batch_size=16, weight_decay=0.01, momentum=0.9)
    assert g2.nesterov and g2.lr == 0.01 and g2.noise is not None
    assert g2.noise == momentum_noise(
        lr=0.01, batch_size=16, weight_decay=0.02, momentum=0.5, nesterov=True
    )
    assert group_for_params([g0, g1, g2], list(m[2].parameters())) is g1
    with pytest.raises(ValueError, match="span param groups 0 and 1"):
        group_for_params([g0, g1, g2], [m[0].weight, m[2].weight])
    with pytest.raises(ValueError, match="in no param group"):
        group_for_params([g0], [m[3].weight])


def test_from_optimizer_adam_and_adamw() -> None:
    m, _, _, _ = _setup(0)
    ga = from_optimizer(torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=0.1), 8)[0]
    assert ga.kind == "adam" and ga.coupled_l2 == 0.1 and ga.decoupled_decay == 0.0
    assert ga.noise is None and ga.betas == (0.9, 0.999) and ga.eps == 1e-8
    gw = from_optimizer(torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.05), 8)[0]
    assert gw.kind == "adamw" and gw.decoupled_decay == 0.05 and gw.coupled_l2 == 0.0
    assert gw.weight_decay == 0.0 and gw.momentum == 0.9 and gw.noise is None
    gd = from_optimizer(
        torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=0.05, decoupled_weight_decay=True), 8
    )[0]
    assert gd.kind == "adamw" and gd.decoupled_decay == 0.05


def test_from_optimizer_refuses_clearly() -> None:
    m, _, _, _ = _setup(0)
    with pytest.raises(ValueError, match=r"param group 0: dampening=1\.0 must lie in \[0, 1\)"):
        from_optimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=1.0), 4)
    g = from_optimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.5), 4)
    assert g[0].dampening == 0.5 and g[0].noise == momentum_noise(
        lr=0.1, batch_size=4, momentum=0.9, dampening=0.5
    )
    with pytest.raises(ValueError, match="maximize=True"):
        from_optimizer(torch.optim.SGD(m.parameters(), lr=0.1, maximize=True), 4)
    with pytest.raises(TypeError, match="RMSprop is not supported"):
        from_optimizer(torch.optim.RMSprop(m.parameters(), lr=0.1), 4)
    with pytest.raises(ValueError, match="batch_size=0"):
        from_optimizer(torch.optim.SGD(m.parameters(), lr=0.1), 0)
