"""NoiseModel with momentum and NoiseModel.from_optimizer (issue #18)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.optim import MomentumStep, momentum_noise, stationary_moments

DT = torch.float64


def _setup() -> tuple[nf.SymmetrySet, nf.GradStats]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(40, 5, dtype=DT), torch.randn(40, 3, dtype=DT)
    return syms, nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")


def _coeffs(nm: nf.NoiseModel) -> tuple[float, float, float]:
    return (nm.kappa, nm.c_mean, nm.c_second)


@pytest.mark.parametrize("time", ["continuous", "discrete"])
def test_beta_zero_is_exactly_plain_sgd(time: str) -> None:
    kw = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2, "time": time}
    assert _coeffs(nf.NoiseModel.create(**kw, momentum=0.0)) == _coeffs(nf.NoiseModel.create(**kw))
    syms, st = _setup()
    a, b = nf.noether_flow(syms, st, **kw), nf.noether_flow(syms, st, **kw, momentum=0.0)
    for k in a:
        assert torch.equal(a[k], b[k])
    sa, sb = nf.solve_equilibrium(syms, st, **kw), nf.solve_equilibrium(syms, st, **kw, momentum=0)
    for k in sa.distance:
        assert torch.equal(sa.distance[k], sb.distance[k])


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("beta", [0.5, 0.9])
def test_momentum_coefficients_give_the_stationary_charge(beta: float, nesterov: bool) -> None:
    """Zero effective flow ⇔ the stationary C* of the exact (C, B, E) map when ⟨H⟩ = 0."""
    eta, s, gam = 0.05, 8, 1e-2
    nm = nf.NoiseModel.create(
        lr=eta, batch_size=s, weight_decay=gam, time="discrete", momentum=beta, nesterov=nesterov
    )
    eff = momentum_noise(lr=eta, batch_size=s, weight_decay=gam, momentum=beta, nesterov=nesterov)
    assert _coeffs(nm) == (eff.kappa, eff.c_mean, eff.c_second)
    assert (nm.momentum, nm.nesterov) == (beta, nesterov)
    # E[G] = Tr[A(∇L∇Lᵀ(1 − 1/S) + E[ggᵀ]/S)]: take mean² = 0.3, second = 2.0 on one axis
    mean_sq, second = 0.3, 2.0
    tr_am = nm.c_mean * mean_sq + nm.c_second * second
    c_flow = tr_am / nm.kappa
    g = (1 - 1 / s) * mean_sq + second / s
    step = MomentumStep.create(lr=eta, momentum=beta, weight_decay=gam, nesterov=nesterov)
    c_star = float(stationary_moments(g, 0.0, step)[0])
    assert abs(c_flow - c_star) / c_star < 1e-12


def test_momentum_keyword_matches_noise_model() -> None:
    syms, st = _setup()
    kw = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2, "time": "discrete"}
    nm = nf.NoiseModel.create(**kw, momentum=0.9)
    a, b = nf.noether_flow(syms, st, nm), nf.noether_flow(syms, st, **kw, momentum=0.9)
    for k in a:
        assert torch.equal(a[k], b[k])
    plain = nf.noether_flow(syms, st, **kw)
    assert all(not torch.equal(plain[k], a[k]) for k in a)
    with pytest.raises(ValueError, match="pass one of them"):
        nf.noether_flow(syms, st, nm, momentum=0.9)
    with pytest.raises(ValueError, match=r"momentum=1\.0 must lie in \[0, 1\)"):
        nf.NoiseModel.create(lr=0.1, batch_size=4, momentum=1.0)


def _params() -> list[Tensor]:
    return [nn.Parameter(torch.randn(3, dtype=DT)) for _ in range(2)]


def test_from_optimizer_sgd_groups() -> None:
    p, q = _params()
    opt = torch.optim.SGD(
        [{"params": [p]}, {"params": [q], "lr": 0.02, "momentum": 0.9, "nesterov": True}],
        lr=0.1,
        weight_decay=2e-3,
    )
    models = nf.NoiseModel.from_optimizer(opt, 16)
    assert len(models) == 2
    assert _coeffs(models[0]) == _coeffs(
        nf.NoiseModel.create(lr=0.1, batch_size=16, weight_decay=1e-3, time="discrete")
    )
    assert models[0].weight_decay == 1e-3 and models[0].momentum == 0.0
    want = nf.NoiseModel.create(
        lr=0.02, batch_size=16, weight_decay=1e-3, time="discrete", momentum=0.9, nesterov=True
    )
    assert _coeffs(models[1]) == _coeffs(want)
    cont = nf.NoiseModel.from_optimizer(opt, 16, time="continuous")
    assert cont[1].time is nf.TimeModel.CONTINUOUS
    assert _coeffs(cont[1]) == _coeffs(
        nf.NoiseModel.create(lr=0.02, batch_size=16, weight_decay=1e-3, momentum=0.9, nesterov=True)
    )


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_from_optimizer_refuses_adam(cls: type[torch.optim.Optimizer]) -> None:
    opt = cls(_params(), lr=1e-3)
    with pytest.raises(ValueError, match="not a gradient step"):
        nf.NoiseModel.from_optimizer(opt, 8)


def test_from_optimizer_dampening_is_the_heavy_ball_with_scaled_lr() -> None:
    """SGD(dampening=d) is the heavy ball with η(1 − d) (exact after the first step);
    dampening ≥ 1 is refused with the value; without momentum PyTorch ignores it."""
    opt = torch.optim.SGD(_params(), lr=0.1, momentum=0.9, dampening=0.25, weight_decay=2e-3)
    (got,) = nf.NoiseModel.from_optimizer(opt, 8)
    want = nf.NoiseModel.create(
        lr=0.075, batch_size=8, weight_decay=1e-3, time="discrete", momentum=0.9
    )
    assert _coeffs(got) == pytest.approx(_coeffs(want), rel=1e-14)
    assert (got.lr, got.dampening) == (0.1, 0.25)
    plain = torch.optim.SGD(_params(), lr=0.1, dampening=0.5)  # no momentum: ignored
    (nm,) = nf.NoiseModel.from_optimizer(plain, 8)
    assert _coeffs(nm) == _coeffs(nf.NoiseModel.create(lr=0.1, batch_size=8, time="discrete"))
    bad = torch.optim.SGD(_params(), lr=0.1, momentum=0.9, dampening=1.0)
    with pytest.raises(ValueError, match=r"param group 0: dampening=1\.0 must lie in \[0, 1\)"):
        nf.NoiseModel.from_optimizer(bad, 8)
