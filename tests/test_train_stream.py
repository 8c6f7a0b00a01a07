"""noetherflow.train: data streams (``sampler``), per-update hooks (``on_update``) and the
GeometricDecay schedule, each against a hand-written float64 loop or a closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import noetherflow as nf
from noetherflow.train import (
    GeometricDecay,
    UpdateInfo,
    lr_sequence,
    make_schedule,
    run_gd,
    run_sgd,
)

DT = torch.float64
MSE = nn.MSELoss()


def _net(seed: int = 0, d_in: int = 4, d: int = 3, d_out: int = 2) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(d_in, d, bias=False), nn.Linear(d, d_out, bias=False)).to(DT)
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(d, d_in, generator=g, dtype=DT) / math.sqrt(d_in))
        model[1].weight.copy_(torch.randn(d_out, d, generator=g, dtype=DT) / math.sqrt(d))
    return model


def _stream(teacher: torch.Tensor, S: int):
    """Fresh Gaussian minibatches y = Tx + ε from the generator (online SGD)."""

    def sampler(step: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(S, teacher.shape[1], generator=gen, dtype=DT)
        y = x @ teacher.T + 0.5 * torch.randn(S, teacher.shape[0], generator=gen, dtype=DT)
        return x, y

    return sampler


def test_sampler_step_for_step_against_hand_loop() -> None:
    """run_sgd(sampler=...) with weight decay and a GeometricDecay schedule is, step for step,
    θ_{k+1} = (1 − 2η_kγ)θ_k − η_k ∇[(1/S)Σ‖UWx − y‖²] on the sampler's batches."""
    teacher = torch.randn(2, 4, generator=torch.Generator().manual_seed(1), dtype=DT)
    S, steps, lr, gamma = 5, 40, 0.05, 0.02
    sched = GeometricDecay(steps, decay_frac=0.5, final_lr=0.005)
    model = _net()
    W, U = (p.detach().clone() for p in (model[0].weight, model[1].weight))
    states: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(step: int, m: nn.Module) -> None:
        states.append((m[1].weight.detach().clone(), m[0].weight.detach().clone()))

    X_eval = torch.randn(64, 4, generator=torch.Generator().manual_seed(2), dtype=DT)
    res = run_sgd(
        model,
        MSE,
        X_eval,
        X_eval @ teacher.T,
        lr=lr,
        batch_size=S,
        steps=steps,
        weight_decay=gamma,
        schedule=sched,
        generator=torch.Generator().manual_seed(3),
        sampler=_stream(teacher, S),
        callback=record,
    )
    assert not res.diverged and res.config["sampling"] == "sampler (data stream)"
    etas = lr_sequence(sched, lr, steps)
    np.testing.assert_array_equal(res.history["lr"][:steps], etas)
    gen = torch.Generator().manual_seed(3)
    draw = _stream(teacher, S)
    for k in range(steps):
        torch.testing.assert_close(states[k][0], U, rtol=0, atol=1e-13)
        torch.testing.assert_close(states[k][1], W, rtol=0, atol=1e-13)
        x, y = draw(k, gen)
        r = x @ W.T @ U.T - y  # [S, d_out]; MSE averages over S·d_out entries
        c = 2.0 / r.numel()
        gU, gW = c * r.T @ (x @ W.T), c * U.T @ r.T @ x
        eta = float(etas[k])
        U, W = (1 - 2 * eta * gamma) * U - eta * gU, (1 - 2 * eta * gamma) * W - eta * gW
    torch.testing.assert_close(states[-1][0], U, rtol=0, atol=1e-13)
    torch.testing.assert_close(states[-1][1], W, rtol=0, atol=1e-13)
    # the logged loss is the evaluation set's
    assert res.history["loss"][0] == pytest.approx(
        float(MSE(_net()(X_eval), X_eval @ teacher.T).detach()), rel=1e-14
    )


def test_on_update_gives_the_applied_gradient_and_the_exact_identity() -> None:
    """on_update sees g_k before the step; with it nf.exact_step_charges predicts
    nf.charges after the step to round-off (paper eqs. 96–97), and a wrong η does not."""
    teacher = torch.randn(2, 4, generator=torch.Generator().manual_seed(4), dtype=DT)
    model = _net(seed=5)
    syms = nf.SymmetrySet([nf.DoubleRotation(model[0], model[1], label="rot")])
    gamma = 0.03
    preds: list[torch.Tensor] = []
    wrong: list[torch.Tensor] = []
    after: list[torch.Tensor] = []
    infos: list[UpdateInfo] = []

    def on_update(info: UpdateInfo) -> None:
        infos.append(info)
        preds.append(nf.exact_step_charges(syms, info.grads, lr=info.lr, weight_decay=gamma)["rot"])
        wrong.append(
            nf.exact_step_charges(syms, info.grads, lr=1.01 * info.lr, weight_decay=gamma)["rot"]
        )

    def callback(step: int, m: nn.Module) -> None:
        if step > 0:
            after.append(nf.charges(syms)["rot"])

    X_eval = torch.randn(16, 4, generator=torch.Generator().manual_seed(6), dtype=DT)
    run_sgd(
        model,
        MSE,
        X_eval,
        X_eval @ teacher.T,
        lr=0.1,
        batch_size=3,
        steps=25,
        weight_decay=gamma,
        generator=torch.Generator().manual_seed(7),
        sampler=_stream(teacher, 3),
        on_update=on_update,
        callback=callback,
    )
    assert len(infos) == 25 and [i.step for i in infos] == list(range(25))
    assert all(i.weight_decay == gamma and i.loss.ndim == 0 for i in infos)
    assert set(infos[0].grads) == set(model.parameters())
    err = max(float((a - p).abs().max() / a.abs().max()) for a, p in zip(after, preds, strict=True))
    bad = max(float((a - p).abs().max() / a.abs().max()) for a, p in zip(after, wrong, strict=True))
    assert err < 1e-12, err
    assert bad > 1e-6, bad


def test_on_update_gd_gradient_is_full_batch() -> None:
    model = _net(seed=8)
    X = torch.randn(10, 4, generator=torch.Generator().manual_seed(9), dtype=DT)
    Y = torch.randn(10, 2, generator=torch.Generator().manual_seed(10), dtype=DT)
    seen: list[UpdateInfo] = []
    ref = _net(seed=8)
    gW, gU = torch.autograd.grad(MSE(ref(X), Y), [ref[0].weight, ref[1].weight])
    run_gd(model, MSE, X, Y, lr=0.1, steps=1, on_update=seen.append)
    (info,) = seen
    torch.testing.assert_close(info.grads[model[0].weight], gW, rtol=0, atol=1e-15)
    torch.testing.assert_close(info.grads[model[1].weight], gU, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (lambda k, g: torch.zeros(3, 4, dtype=DT), "expected a tuple"),
        (lambda k, g: (torch.zeros(3, 4, dtype=DT), torch.zeros(2, 2, dtype=DT)), "same S"),
    ],
)
def test_sampler_errors_name_the_step(batch, match: str) -> None:
    X = torch.zeros(4, 4, dtype=DT)
    with pytest.raises(ValueError, match=match):
        run_sgd(_net(), MSE, X, X[:, :2], lr=0.1, batch_size=3, steps=2, sampler=batch)
    with pytest.raises(ValueError, match="not callable"):
        run_sgd(_net(), MSE, X, X[:, :2], lr=0.1, batch_size=3, steps=2, sampler=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("steps", "frac"), [(10, 0.5), (7, 1.0), (9, 0.0), (1000, 0.7)])
def test_geometric_decay_equals_constant_then_geomspace(steps: int, frac: float) -> None:
    lr, final = 0.05, 5e-4
    expected = np.full(steps, lr)
    m = round(frac * steps)
    if m > 0:
        expected[steps - m :] = np.geomspace(lr, final, m)
    got = lr_sequence(GeometricDecay(steps, decay_frac=frac, final_lr=final), lr, steps)
    np.testing.assert_array_equal(got, expected)
    built = make_schedule("geometric", steps=steps, decay_frac=frac, final_lr=final)
    np.testing.assert_array_equal(lr_sequence(built, lr, steps), expected)
    if m > 1:
        assert got[-1] == pytest.approx(final, rel=1e-12)
        assert np.all(np.diff(got) <= 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": 0, "decay_frac": 0.5, "final_lr": 0.1},
        {"steps": 5, "decay_frac": 1.5, "final_lr": 0.1},
        {"steps": 5, "decay_frac": 0.5, "final_lr": 0.0},
    ],
)
def test_geometric_decay_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="GeometricDecay"):
        GeometricDecay(**kwargs)  # type: ignore[arg-type]
