"""EquilibriumTeleport: function preserved, flows removed, gradients and optimizer state
transported exactly, the optimizer wrapper, the Lightning hook, the grad-norm baseline."""

from __future__ import annotations

import doctest
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
import noetherflow.teleportation.tool as tt
from noetherflow import (
    EquilibriumTeleport,
    gradient_norm_teleport,
    transform_optimizer_state,
)


@pytest.fixture(autouse=True)
def _float64_default() -> object:
    """float64 inside this module only: the default dtype is global to the test session."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def mlp_problem(seed: int = 0) -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 12), nn.ReLU(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(48, 5), torch.randint(0, 3, (48,))
    return m, nf.find_symmetries(m, x[:8]), x, y


def rotation_problem() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(4, 3, bias=False), nn.Linear(3, 5, bias=False))
    x = torch.randn(40, 4)
    y = x @ torch.randn(4, 5) + 0.3 * torch.randn(40, 5)
    return m, nf.find_symmetries(m, x[:8]), x, y


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).sum(1).mean()


def grads_at(m: nn.Module, loss_fn, x, y) -> list[torch.Tensor]:
    m.zero_grad()
    loss_fn(m(x), y).backward()
    return [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]


def test_docstring_example_runs() -> None:
    finder = doctest.DocTestFinder()
    tests = [t for t in finder.find(tt) if t.examples]
    assert tests
    runner = doctest.DocTestRunner()
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


@pytest.mark.parametrize("problem", [mlp_problem, rotation_problem])
def test_teleport_preserves_function_and_removes_flow(problem) -> None:
    m, syms, x, y = problem()
    loss_fn = F.cross_entropy if problem is mlp_problem else mse
    before = m(x).detach()
    tp = EquilibriumTeleport(m, syms, loss_fn, lr=0.1, batch_size=8)
    sol = tp.teleport(x, y)
    assert sol.max_distance() > 1e-3
    assert torch.allclose(m(x), before, rtol=0, atol=1e-10)
    # a second solve on the same batch finds the model already at equilibrium
    assert tp.solve(x, y).max_distance() < 1e-6
    assert tp.history[0].step == 0 and tp.history[0].seconds > 0


@pytest.mark.parametrize("problem", [mlp_problem, rotation_problem])
def test_grad_transport_is_the_gradient_at_the_new_point(problem) -> None:
    m, syms, x, y = problem()
    loss_fn = F.cross_entropy if problem is mlp_problem else mse
    grads_at(m, loss_fn, x, y)  # .grad at θ
    tp = EquilibriumTeleport(m, syms, loss_fn, lr=0.1, batch_size=8)
    tp.teleport(x, y)
    transported = [p.grad.clone() for p in m.parameters()]
    fresh = grads_at(m, loss_fn, x, y)  # ∇L at Tθ
    for a, b in zip(transported, fresh, strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_sgd_momentum_transformed_as_cotangent() -> None:
    m, syms, x, y = mlp_problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    for _ in range(3):
        grads_at(m, F.cross_entropy, x, y)
        opt.step()
    bufs = {p: opt.state[p]["momentum_buffer"].clone() for p in m.parameters()}
    tp = EquilibriumTeleport(m, syms, F.cross_entropy, lr=0.5, batch_size=8, optimizer=opt)
    sol = tp.teleport(x, y)
    for i, lam in sol.steps:
        for t in syms[i].terms():  # type: ignore[attr-defined]
            bufs[t.param] = bufs[t.param] * torch.exp(-t.expand(lam))
    for p in m.parameters():
        assert torch.allclose(opt.state[p]["momentum_buffer"], bufs[p], rtol=1e-12, atol=1e-14)
    assert tp.history[-1].reset == ()


def test_adam_diagonal_exact_rotation_reset() -> None:
    m, syms, x, y = mlp_problem()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    grads_at(m, F.cross_entropy, x, y)
    opt.step()
    sq = {p: opt.state[p]["exp_avg_sq"].clone() for p in m.parameters()}
    sol = EquilibriumTeleport(m, syms, F.cross_entropy, lr=0.1, batch_size=8).solve(x, y)
    nf.teleport(m, sol)
    assert transform_optimizer_state(opt, sol) == []
    for i, lam in sol.steps:
        for t in syms[i].terms():  # type: ignore[attr-defined]
            sq[t.param] = sq[t.param] * torch.exp(-2 * t.expand(lam))
    for p in m.parameters():
        assert torch.allclose(opt.state[p]["exp_avg_sq"], sq[p], rtol=1e-12, atol=1e-16)

    m2, syms2, x2, y2 = rotation_problem()
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-3)
    grads_at(m2, mse, x2, y2)
    opt2.step()
    tp = EquilibriumTeleport(m2, syms2, mse, lr=0.1, batch_size=8, optimizer=opt2)
    tp.teleport(x2, y2)
    assert set(tp.history[-1].reset) == {"0.weight", "1.weight"}
    assert all(p not in opt2.state for p in m2.parameters())
    opt2.step()  # re-initialises cleanly


def test_reset_mode_drops_state() -> None:
    m, syms, x, y = mlp_problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    grads_at(m, F.cross_entropy, x, y)
    opt.step()
    tp = EquilibriumTeleport(
        m, syms, F.cross_entropy, lr=0.5, batch_size=8, optimizer=opt, optimizer_state="reset"
    )
    tp.teleport(x, y)
    covered = {id(p) for p in syms.params()}
    assert all(p not in opt.state for p in m.parameters() if id(p) in covered)


def test_schedule_and_wrapper() -> None:
    m, syms, x, y = mlp_problem()
    tp = EquilibriumTeleport(m, syms, F.cross_entropy, lr=0.1, batch_size=8, every=3)
    assert [tp.due(k) for k in range(7)] == [True, False, False, True, False, False, True]
    opt = tp.wrap(torch.optim.SGD(m.parameters(), lr=0.1), batches=[(x[:16], y[:16])])
    for _ in range(7):
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    assert [r.step for r in tp.history] == [0, 3, 6]
    assert opt.param_groups[0]["lr"] == 0.1  # attribute access goes to the wrapped optimizer

    tp2 = EquilibriumTeleport(m, syms, F.cross_entropy, lr=0.1, batch_size=8)
    opt2 = tp2.wrap(torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="no batch"):
        opt2.step()
    opt2.step(batch=(x, y))
    assert len(tp2.history) == 1
    with pytest.raises(ValueError, match="every"):
        EquilibriumTeleport(m, syms, F.cross_entropy, lr=0.1, batch_size=8, every=0)


def test_lightning_callback_with_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    import noetherflow.integrations as integrations

    # The integration module imported under the stand-in subclasses the fake Callback: keep it
    # out of sys.modules (and off the package) after this test, or a later real Lightning run
    # would get a callback without Lightning's methods.
    mod = "noetherflow.integrations.lightning"
    monkeypatch.setitem(sys.modules, mod, sys.modules.get(mod))  # restored afterwards
    del sys.modules[mod]
    monkeypatch.setattr(integrations, "lightning", None, raising=False)
    monkeypatch.delattr(integrations, "lightning")
    fake = types.ModuleType("lightning.pytorch.callbacks")
    fake.Callback = type("Callback", (), {})  # type: ignore[attr-defined]
    for name in ("lightning", "lightning.pytorch"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "lightning.pytorch.callbacks", fake)
    m, syms, x, y = mlp_problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    tp = EquilibriumTeleport(m, syms, F.cross_entropy, lr=1.0, batch_size=48, every=2)
    cb = tp.lightning_callback()
    assert isinstance(cb, fake.Callback)
    trainer = types.SimpleNamespace(optimizers=[opt])
    for i in range(5):
        cb.on_train_batch_start(trainer, m, (x, y), i)
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    assert tp.optimizer is opt
    assert [r.step for r in tp.history] == [0, 2, 4]


def test_gradient_norm_teleport_increases_grad_norm_and_preserves_function() -> None:
    m, syms, x, y = mlp_problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    grads_at(m, F.cross_entropy, x, y)
    opt.step()
    before = m(x).detach()
    res = gradient_norm_teleport(
        m, syms, F.cross_entropy, x, y, steps=5, step_size=0.05, optimizer=opt
    )
    assert res.grad_norm_sq_after > res.grad_norm_sq_before
    assert torch.allclose(m(x), before, rtol=0, atol=1e-10)
    assert all(float(v.abs().max()) <= 5 * 0.05 + 1e-12 for v in res.elements.values())


def test_batchnorm_model_microbatch_estimator() -> None:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    m = nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1, bias=False),
        bn,
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 16, 4),
    )
    x, y = torch.randn(32, 1, 4, 4), torch.randint(0, 4, (32,))
    syms = nf.find_symmetries(m, x[:8])
    assert any(s.family is nf.Family.SCALE for s in syms)
    assert bn.running_mean is not None
    running = bn.running_mean.clone()
    before = m(x).detach()
    bn.running_mean.copy_(running)
    tp = EquilibriumTeleport(
        m,
        syms,
        F.cross_entropy,
        lr=0.1,
        batch_size=8,
        weight_decay=5e-4,
        estimator="microbatch",
        micro_batch_size=4,
    )
    with pytest.warns(nf.EpsWarning):  # no eps tolerance: the function changes through eps
        sol = tp.teleport(x, y)
    assert not sol.at_infinity  # weight decay: finite equilibrium norm
    assert sol.max_distance() > 1e-3
    assert torch.equal(bn.running_mean, running)
    assert torch.allclose(m(x), before, rtol=0, atol=1e-4)  # BatchNorm eps: approximate


def test_benchmark_smoke() -> None:
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_teleport.py"
    spec = importlib.util.spec_from_file_location("bench_teleport", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_teleport"] = mod
    spec.loader.exec_module(mod)
    res = mod.main(["--tiny", "--reps", "1"])
    assert {r["workload"] for r in res["rows"]} == {"mlp", "cnn_bn", "linear_rotation"}
    for r in res["rows"]:
        assert r["teleport_s"] > 0 and r["step_s"] > 0
