"""η and γ read from the optimizer (issue #19): monitor, teleporter, schedules, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf


@pytest.fixture(autouse=True)
def _float64_default() -> object:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def problem(seed: int = 0) -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    return m, syms, torch.randn(24, 5), torch.randn(24, 3)


def run(
    mon: nf.NoetherMonitor, m: nn.Module, x: torch.Tensor, y: torch.Tensor, opt, steps, sched=None
):
    rows = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        row = mon.step(loss)
        if row is not None:
            rows.append(row)
        opt.step()
        if sched is not None:
            sched.step()
    return rows


def test_monitor_reads_lr_and_half_weight_decay_and_follows_a_schedule() -> None:
    m, syms, x, y = problem()
    w = 0.02
    opt = torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=w)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=24,
        logging=nf.LogOptions(progress=False),
        distance=nf.DistanceOptions(every=1, mode="solve"),
    )
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
        want = nf.noether_flow(syms, stats, lr=lrs[-1], batch_size=24, weight_decay=w / 2)
        want_d = nf.solve_equilibrium(syms, stats, lr=lrs[-1], batch_size=24, weight_decay=w / 2)
        row = mon.step(loss)
        assert row is not None
        got = torch.as_tensor(row["flow/rescaling0"])
        assert torch.allclose(got, want["rescaling0"], rtol=1e-10, atol=1e-14)
        got_d = torch.as_tensor(row["distance/rescaling0"])
        assert torch.allclose(got_d, want_d.distance["rescaling0"].double(), rtol=1e-8, atol=1e-12)
        assert float(row["lr"]) == lrs[-1]
        assert float(row["weight_decay"]) == w / 2
        opt.step()
        sched.step()
    mon.close()
    assert mon.history["lr"].tolist() == [0.1, 0.1, 0.05, 0.05, 0.025]
    assert mon.lr == 0.025 and mon.weight_decay == w / 2
    with pytest.raises(AttributeError, match="read from the optimizer"):
        mon.lr = 0.3


def test_monitor_explicit_lr_still_settable_and_recorded() -> None:
    m, syms, x, y = problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    mon = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=24, logging=nf.LogOptions(progress=False)
    )
    run(mon, m, x, y, opt, 1)
    mon.lr = 0.2
    run(mon, m, x, y, opt, 1)
    assert mon.history["lr"].tolist() == [0.1, 0.2]
    with pytest.raises(ValueError, match="lr=-1"):
        mon.lr = -1.0
    assert mon.lr == 0.2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": 0.1}, r"both optimizer= and lr=0\.1"),
        ({"weight_decay": 0.01}, r"both optimizer= and weight_decay=0\.01"),
    ],
)
def test_optimizer_and_explicit_values_conflict(kwargs: dict, match: str) -> None:
    m, syms, _, _ = problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=match):
        nf.NoetherMonitor(m, syms, optimizer=opt, batch_size=8, **kwargs)


def test_missing_lr_is_an_early_error() -> None:
    m, syms, _, _ = problem()
    with pytest.raises(ValueError, match="learning rate is missing; pass optimizer=opt"):
        nf.NoetherMonitor(m, syms, batch_size=8)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=1.0), r"dampening=1\.0"),
        (lambda ps: torch.optim.SGD(ps, lr=0.1, maximize=True), "maximize"),
    ],
)
def test_unsupported_optimizers_are_refused(make, match: str) -> None:
    m, syms, _, _ = problem()
    with pytest.raises(ValueError, match=match):
        nf.NoetherMonitor(m, syms, optimizer=make(m.parameters()), batch_size=8)
    with pytest.raises(ValueError, match=match):
        nf.EquilibriumTeleport(m, syms, F.mse_loss, optimizer=make(m.parameters()), batch_size=8)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda ps: torch.optim.Adam(ps, lr=1e-3), r"Adam.*#18"),
        (lambda ps: torch.optim.AdamW(ps, lr=1e-3), r"AdamW.*#18"),
    ],
)
def test_adam_monitor_is_accepted_teleport_refused(make, match: str) -> None:
    """The monitor takes Adam(W) (charges and step decomposition, said once); the teleport,
    whose equilibrium is SGD's, refuses it."""
    m, syms, _, _ = problem()
    with pytest.warns(UserWarning, match="no flows and distances"):
        mon = nf.NoetherMonitor(m, syms, optimizer=make(m.parameters()), batch_size=8)
    assert not any(k.startswith(("flow/", "distance/")) for k in mon.schema)
    mon.close()
    with pytest.raises(ValueError, match=match):
        nf.EquilibriumTeleport(m, syms, F.mse_loss, optimizer=make(m.parameters()), batch_size=8)


def test_momentum_zero_is_accepted() -> None:
    m, syms, _, _ = problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.0)
    assert nf.NoetherMonitor(m, syms, optimizer=opt, batch_size=8).lr == 0.1


@pytest.mark.parametrize(("nesterov", "dampening"), [(False, 0.0), (True, 0.0), (False, 0.3)])
def test_momentum_sgd_uses_the_momentum_noise_model(nesterov: bool, dampening: float) -> None:
    """SGD(momentum=β, nesterov, dampening): flows, distances and teleports use
    NoiseModel.create(momentum=β, nesterov=..., dampening=d) and the optimizer's momentum
    buffers for the cross term (displacement=opt)."""
    m, syms, x, y = problem()
    m.double()
    x, y = x.double(), y.double()
    w, beta = 0.02, 0.9
    opt = torch.optim.SGD(
        m.parameters(),
        lr=0.05,
        weight_decay=w,
        momentum=beta,
        nesterov=nesterov,
        dampening=dampening,
    )
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=24,
        logging=nf.LogOptions(progress=False),
        time="discrete",
        distance=nf.DistanceOptions(every=1, mode="solve"),
    )
    kw = {"lr": 0.05, "batch_size": 24, "weight_decay": w / 2, "time": "discrete"}
    mkw = {"momentum": beta, "nesterov": nesterov, "dampening": dampening}
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
        want = nf.noether_flow(syms, stats, **kw, **mkw, displacement=opt)["rescaling0"]
        plain = nf.noether_flow(syms, stats, **kw)["rescaling0"]
        sol = nf.solve_equilibrium(
            syms, stats, **kw, **mkw, options=nf.SolveOptions(displacement=opt)
        )
        want_d = sol.distance["rescaling0"]
        row = mon.step(loss)
        assert row is not None
        got = torch.as_tensor(row["flow/rescaling0"])
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-14)
        assert not torch.allclose(got, plain, rtol=1e-3, atol=0)
        got_d = torch.as_tensor(row["distance/rescaling0"])
        assert torch.allclose(got_d, want_d.double(), rtol=1e-8, atol=1e-12)
        opt.step()
    mon.close()
    tp = nf.EquilibriumTeleport(m, syms, F.mse_loss, optimizer=opt, batch_size=24)
    read = tp.solve(x, y)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    ref = nf.solve_equilibrium(syms, stats, **kw, **mkw, options=nf.SolveOptions(displacement=opt))
    assert torch.allclose(read.distance["rescaling0"], ref.distance["rescaling0"], rtol=1e-12)
    no_buffer = nf.solve_equilibrium(syms, stats, **kw, **mkw)  # the cross term matters here
    assert not torch.allclose(read.distance["rescaling0"], no_buffer.distance["rescaling0"])


def test_param_groups() -> None:
    m, syms, _, _ = problem()
    # the watched parameters split over groups with different lr: refused, groups named
    split = torch.optim.SGD(
        [{"params": m[0].parameters(), "lr": 0.1}, {"params": m[2].parameters(), "lr": 0.2}]
    )
    with pytest.raises(ValueError, match=r"group 0: lr=0\.1.*group 1: lr=0\.2"):
        nf.NoetherMonitor(m, syms, optimizer=split, batch_size=8)
    # all watched parameters in one group: that group's values, other groups ignored
    m2 = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 4), nn.ReLU(), nn.Linear(4, 3))
    syms2 = nf.SymmetrySet([nf.Rescaling(m2[0], m2[2])])
    opt = torch.optim.SGD(
        [
            {"params": [*m2[0].parameters(), *m2[2].parameters()], "lr": 0.05, "weight_decay": 0.1},
            {"params": m2[4].parameters(), "lr": 0.5},
        ]
    )
    mon = nf.NoetherMonitor(m2, syms2, optimizer=opt, batch_size=8)
    assert (mon.lr, mon.weight_decay) == (0.05, 0.05)
    # parameters missing from the optimizer
    only_last = torch.optim.SGD(m[2].parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not in the optimizer"):
        nf.NoetherMonitor(m, syms, optimizer=only_last, batch_size=8)


def test_teleport_reads_the_optimizer() -> None:
    m, syms, x, y = problem()
    w = 0.02
    by_hand = nf.EquilibriumTeleport(
        m, syms, F.mse_loss, lr=0.1, weight_decay=w / 2, batch_size=8
    ).solve(x, y)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=w)
    tp = nf.EquilibriumTeleport(m, syms, F.mse_loss, optimizer=opt, batch_size=8)
    read = tp.solve(x, y)
    assert (tp.lr, tp.weight_decay) == (0.1, w / 2)
    for name in syms.names:
        assert torch.allclose(read.distance[name], by_hand.distance[name], rtol=1e-12, atol=0)
    opt.param_groups[0]["lr"] = 0.3  # a schedule: the next teleport uses the new value
    assert tp.lr == 0.3
    # wrap() attaches the optimizer that gives η and γ
    tp2 = nf.EquilibriumTeleport(m, syms, F.mse_loss, batch_size=8)
    with pytest.raises(ValueError, match="no learning rate"):
        tp2.solve(x, y)
    wrapped = tp2.wrap(torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=w))
    wrapped.step(batch=(x, y))
    assert len(tp2.history) == 1 and tp2.weight_decay == w / 2
    with pytest.raises(ValueError, match=r"weight_decay=0\.01 was given without lr"):
        nf.EquilibriumTeleport(m, syms, F.mse_loss, weight_decay=0.01, optimizer=opt, batch_size=8)


def test_history_files_keep_lr(tmp_path) -> None:
    m, syms, x, y = problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (k + 1))
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=24,
        logging=nf.LogOptions(log_dir=tmp_path, tensorboard=False),
    )
    run(mon, m, x, y, opt, 3, sched)
    mon.close()
    for fmt in ("csv", "jsonl"):
        back = nf.load_history(tmp_path / f"history.{fmt}")
        assert np.allclose(back["lr"], [0.1, 0.05, 0.1 / 3], rtol=1e-15, atol=0)


def test_wrapped_optimizers_are_unwrapped() -> None:
    m, syms, _, _ = problem()
    tp = nf.EquilibriumTeleport(m, syms, F.mse_loss, lr=0.1, batch_size=8)
    wrapped = tp.wrap(torch.optim.SGD(m.parameters(), lr=0.2, weight_decay=0.04))
    mon = nf.NoetherMonitor(m, syms, optimizer=wrapped, batch_size=8)  # type: ignore[arg-type]
    assert (mon.lr, mon.weight_decay) == (0.2, 0.02)
