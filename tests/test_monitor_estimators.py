"""NoetherMonitor(estimator=...) (issue #14): BatchNorm CNNs in training mode can be monitored."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf

DT = torch.float64


def bn_cnn() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 16, 3),
    ).to(DT)
    x, y = torch.randn(64, 1, 4, 4, dtype=DT), torch.randint(0, 3, (64,))
    syms = nf.find_symmetries(m, x[:8])
    return m.train(), syms, x, y


def test_batchnorm_cnn_in_training_mode_runs_50_steps_with_microbatch() -> None:
    m, syms, x, y = bn_cnn()
    assert len(syms) >= 2
    opt = torch.optim.SGD(m.parameters(), lr=0.05, weight_decay=1e-3)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=5,
        optimizer=opt,
        batch_size=16,
        estimator="microbatch",
        micro_batch_size=4,
        loss_fn=F.cross_entropy,
        logging=nf.LogOptions(progress=False),
        distance=nf.DistanceOptions(every=5),
    )
    bn = m[1]
    for step in range(50):
        xb, yb = x[step % 4 * 16 :][:16], y[step % 4 * 16 :][:16]
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.cross_entropy(m(xb), yb)
            loss.backward()
        if mon.due():  # the reference for this record, on the same batch and θ
            running = bn.running_mean.clone()
            grads = [p.grad.clone() for p in m.parameters()]
            stats = nf.collect_stats(
                m, syms, F.cross_entropy, xb, yb, estimator="microbatch", micro_batch_size=4
            )
            want = nf.noether_flow(syms, stats, lr=0.05, batch_size=16, weight_decay=5e-4)
            row = mon.step(loss, inputs=xb, targets=yb)
            assert row is not None
            for name in syms.names:
                got = torch.as_tensor(row[f"flow/{mon.keys[name]}"])
                w = want[name].reshape(-1) if got.dim() else want[name].norm()
                assert torch.allclose(got.reshape(-1) if got.dim() else got, w, rtol=1e-10, atol=0)
            # the monitor's extra passes leave the running statistics and .grad as they were
            assert torch.equal(bn.running_mean, running)
            assert all(torch.equal(p.grad, g) for p, g in zip(m.parameters(), grads, strict=True))
        else:
            assert mon.step(loss) is None
        opt.step()
    h = mon.history
    assert h["step"].tolist() == list(range(0, 50, 5))
    for name in syms.names:
        assert np.isfinite(h[f"flow/{mon.keys[name]}"]).all()
        assert not np.isnan(h[f"distance/{mon.keys[name]}"]).any()
    mon.close()


def test_hooks_estimator_on_a_training_batchnorm_says_how_to_choose_the_monitors_estimator() -> (
    None
):
    m, syms, _, _ = bn_cnn()  # with the BatchNorm-affine → conv rescaling find_symmetries finds
    assert any(isinstance(s, nf.ChannelRescaling) for s in syms)
    with pytest.raises(nf.StatisticsError, match="BatchNorm in training mode") as err:
        nf.NoetherMonitor(m, syms, lr=0.1, batch_size=16)
    msg = str(err.value)
    assert "NoetherMonitor: pass estimator='microbatch'" in msg
    assert "mon.step(loss, inputs=x, targets=y)" in msg
    # switched to training mode after construction: the same advice at the record step
    m.eval()
    mon = nf.NoetherMonitor(m, syms, lr=0.1, batch_size=16, logging=nf.LogOptions(progress=False))
    m.train()
    with pytest.raises(nf.StatisticsError, match=r"estimator='microbatch'.*loss_fn=loss_fn"):
        mon.track().__enter__()


def test_estimator_arguments_are_checked() -> None:
    m, syms, _, _ = bn_cnn()
    with pytest.raises(ValueError, match=r"estimator='exact' is not supported; expected one of"):
        nf.NoetherMonitor(m, syms, lr=0.1, batch_size=16, estimator="exact")
    with pytest.raises(ValueError, match="needs loss_fn"):
        nf.NoetherMonitor(m, syms, lr=0.1, batch_size=16, estimator="microbatch")
    mon = nf.NoetherMonitor(
        m,
        syms,
        lr=0.1,
        batch_size=16,
        estimator="microbatch",
        micro_batch_size=4,
        loss_fn=F.cross_entropy,
        logging=nf.LogOptions(progress=False),
    )
    with pytest.raises(ValueError, match=r"call mon.step\(loss, inputs=x, targets=y\)"):
        mon.step(torch.tensor(1.0))


def test_reference_estimator_equals_hooks_on_an_mlp() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.DoubleRotation(m[2], m[3])])
    x, y = torch.randn(20, 5, dtype=DT), torch.randint(0, 3, (20,))
    rows = []
    for est in ("hooks", "reference"):
        mon = nf.NoetherMonitor(
            m,
            syms,
            every=1,
            lr=0.1,
            batch_size=20,
            weight_decay=1e-3,
            estimator=est,
            loss_fn=F.cross_entropy,
            logging=nf.LogOptions(progress=False),
        )
        m.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.cross_entropy(m(x), y)
            loss.backward()
        rows.append(mon.step(loss, inputs=x, targets=y))
    a, b = rows
    assert a is not None and b is not None
    for k in a:
        if k.startswith(("flow/", "charge/", "distance/")):
            np.testing.assert_allclose(a[k], b[k], rtol=1e-9, atol=1e-13, err_msg=k)


def test_teleporter_estimator_is_checked_when_built() -> None:
    m, syms, x, y = bn_cnn()
    with pytest.raises(ValueError, match=r"EquilibriumTeleport: estimator='exact'.*'microbatch'"):
        nf.EquilibriumTeleport(m, syms, F.cross_entropy, lr=0.1, batch_size=16, estimator="exact")
    tp = nf.EquilibriumTeleport(
        m,
        syms,
        F.cross_entropy,
        lr=0.1,
        batch_size=16,
        weight_decay=5e-4,
        estimator="microbatch",
        micro_batch_size=4,
    )
    running = m[1].running_var.clone()
    with pytest.warns(nf.EpsWarning):  # no eps tolerance given
        sol = tp.teleport(x, y)
    assert tp.estimator == "microbatch" and len(tp.history) == 1 and sol.converged
    # the statistics' passes left the buffers; the teleport itself scales the running variance
    # with the weights feeding the BatchNorm (v + eps by e^{2λ} of the scale invariance before
    # it, which keeps the eval-mode function exactly)
    lam = sum(
        (el for i, el in sol.steps if getattr(sol.syms[i], "norm", None) is m[1]),
        torch.zeros(4, dtype=DT),
    )
    eps = m[1].eps
    want = (running + eps) * torch.exp(2 * lam) - eps
    assert torch.allclose(m[1].running_var, want, rtol=1e-12, atol=0)
