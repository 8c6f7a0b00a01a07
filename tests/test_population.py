"""noetherflow.train.population: online SGD on fresh samples and GD on a population loss,
step for step against hand-written float64 loops and against run_sgd / run_gd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from noetherflow.train import (
    StepDecay,
    run_gd,
    run_online_sgd,
    run_population_gd,
    run_sgd,
    sample_batch,
)


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 2, bias=False), nn.Linear(2, 2, bias=False)).double()


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).sum(1).mean()


def _stream(seed: int, batch: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(batch, 3, generator=g, dtype=torch.float64) for _ in range(40)]
    ys = [torch.randn(batch, 2, generator=g, dtype=torch.float64) for _ in range(40)]
    return xs, ys


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_online_sgd_matches_hand_loop_every_step() -> None:
    xs, ys = _stream(1, 3)
    eta, gamma = 0.05, 0.01
    model = _net()
    w1, w2 = (p.detach().clone() for p in model.parameters())
    traj: list[torch.Tensor] = []
    calls: list[int] = []

    def sample(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(k)
        return xs[k], ys[k]

    res = run_online_sgd(
        model,
        _mse,
        sample,
        lr=eta,
        steps=30,
        weight_decay=gamma,
        callback=lambda k, m: traj.append(_flat(m)) or None,
    )
    assert calls == list(range(30))
    assert not res.diverged and res.steps_completed == 30
    assert res.final_time == pytest.approx(30 * eta, rel=1e-15)
    for k in range(31):
        expect = torch.cat([w1.reshape(-1), w2.reshape(-1)])
        torch.testing.assert_close(traj[k], expect, rtol=1e-13, atol=1e-15)
        if k == 30:
            break
        # hand-written: ℓ = mean_b ‖W2 W1 x − y‖², ∇ by hand, penalty γ‖θ‖²
        r = xs[k] @ w1.T @ w2.T - ys[k]  # [B, 2]
        h = xs[k] @ w1.T  # [B, 2]
        g2 = 2.0 * r.T @ h / len(r)
        g1 = 2.0 * (r @ w2).T @ xs[k] / len(r)
        loss = float((r * r).sum(1).mean())
        assert res.history["loss"][k] == pytest.approx(loss, rel=1e-13)
        w1 = (1 - 2 * eta * gamma) * w1 - eta * g1
        w2 = (1 - 2 * eta * gamma) * w2 - eta * g2
    assert math.isnan(res.history["loss"][-1])


def test_online_sgd_replaying_minibatches_equals_run_sgd() -> None:
    g = torch.Generator().manual_seed(4)
    X = torch.randn(20, 3, generator=g, dtype=torch.float64)
    Y = torch.randn(20, 2, generator=g, dtype=torch.float64)
    a, b = _net(2), _net(2)
    sched = StepDecay([10], gamma=0.5)
    ra = run_sgd(
        a,
        _mse,
        X,
        Y,
        lr=0.04,
        batch_size=5,
        steps=25,
        weight_decay=0.02,
        schedule=sched,
        generator=torch.Generator().manual_seed(9),
    )
    replay = torch.Generator().manual_seed(9)

    def sample(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = sample_batch(20, 5, generator=replay)
        return X[idx], Y[idx]

    rb = run_online_sgd(b, _mse, sample, lr=0.04, steps=25, weight_decay=0.02, schedule=sched)
    for key in ra.final_state:
        torch.testing.assert_close(ra.final_state[key], rb.final_state[key], rtol=0, atol=0)
    np.testing.assert_array_equal(ra.history["lr"], rb.history["lr"])


def test_population_gd_equals_run_gd_on_the_data_loss() -> None:
    g = torch.Generator().manual_seed(5)
    X = torch.randn(15, 3, generator=g, dtype=torch.float64)
    Y = torch.randn(15, 2, generator=g, dtype=torch.float64)
    a, b = _net(3), _net(3)
    ra = run_gd(a, _mse, X, Y, lr=0.03, steps=20, weight_decay=0.05, log_every=5)
    rb = run_population_gd(
        b, lambda m: _mse(m(X), Y), lr=0.03, steps=20, weight_decay=0.05, log_every=5
    )
    for key in ra.final_state:
        torch.testing.assert_close(ra.final_state[key], rb.final_state[key], rtol=0, atol=0)
    np.testing.assert_array_equal(ra.history["step"], rb.history["step"])
    # logged losses at θ_k (k < steps) agree; the final state has none in population_gd
    np.testing.assert_allclose(ra.history["loss"][:-1], rb.history["loss"][:-1], rtol=1e-14)


def test_online_sgd_records_divergence_and_callback_keys() -> None:
    xs, ys = _stream(2, 2)
    model = _net()
    res = run_online_sgd(
        model,
        _mse,
        lambda k: (xs[k % 40] * 30.0, ys[k % 40]),
        lr=5.0,
        steps=40,
        callback=lambda k, m: {"norm": float(_flat(m).norm())},
    )
    assert res.diverged and res.diverged_at_step is not None and res.diverged_at_step < 40
    assert res.last_finite_loss is not None and math.isfinite(res.last_finite_loss)
    assert res.steps_completed == res.diverged_at_step
    assert "norm" in res.history


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"lr": 0.0}, "lr="), ({"steps": -1}, "steps="), ({"log_every": 0}, "log_every=")],
)
def test_online_sgd_rejects_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    base = {"lr": 0.1, "steps": 2, "log_every": 1}
    base.update(kwargs)
    xs, ys = _stream(0, 1)
    with pytest.raises(ValueError, match=match):
        run_online_sgd(_net(), _mse, lambda k: (xs[k], ys[k]), **base)  # type: ignore[arg-type]


def test_online_sgd_rejects_non_scalar_loss() -> None:
    xs, ys = _stream(0, 2)
    with pytest.raises(ValueError, match="0-dim"):
        run_online_sgd(_net(), lambda o, y: (o - y) ** 2, lambda k: (xs[k], ys[k]), lr=0.1, steps=1)
