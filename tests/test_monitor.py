"""NoetherMonitor: records agree with the direct API, hooks only on record steps, CSV/JSONL
round-trip to the in-memory history, TensorBoard routing, plotting."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import noetherflow as nf
from noetherflow.monitor import NoetherMonitor, SharpnessOptions, load_history

DT = torch.float64
LR, WD = 0.05, 1e-3
CE = nn.CrossEntropyLoss()


def problem(
    rotation: bool = False,
) -> tuple[nn.Sequential, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.Linear(5, 3)).to(DT)
    syms = [nf.Rescaling(m[0], m[2], label="r")]
    if rotation:
        syms.append(nf.DoubleRotation(m[2], m[3], label="rot"))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, 4, generator=g, dtype=DT)
    y = torch.randint(0, 3, (24,), generator=g)
    return m, nf.SymmetrySet(syms), x, y


def train(mon: NoetherMonitor, m: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for i in range(steps):
        xb, yb = x[(i % 2) :: 2], y[(i % 2) :: 2]
        with mon.track():
            loss = CE(m(xb), yb)
            loss.backward()
        mon.step(loss, inputs=xb, targets=yb)
        opt.step()
        opt.zero_grad()


def test_record_matches_direct_api() -> None:
    m, syms, x, y = problem(rotation=True)
    mon = NoetherMonitor(
        m,
        syms,
        every=1,
        lr=LR,
        batch_size=24,
        weight_decay=WD,
        full_matrices=True,
        logging=nf.LogOptions(progress=False),
        distance=nf.DistanceOptions(sweeps=None),  # the coupled solve in full at the first record
    )
    with mon.track():
        loss = CE(m(x), y)
        loss.backward()
    row = mon.step(loss)
    assert row is not None
    st = nf.collect_stats(m, syms, CE, x, y)
    ch = nf.charges(syms)
    fl = nf.noether_flow(syms, st, lr=LR, batch_size=24, weight_decay=WD)
    sol = nf.solve_equilibrium(syms, st, lr=LR, batch_size=24, weight_decay=WD)
    np.testing.assert_allclose(row["loss"], float(loss.detach()), rtol=1e-14)
    np.testing.assert_allclose(row["charge/r"], ch["r"].numpy(), rtol=1e-12)
    np.testing.assert_allclose(row["flow/r"], fl["r"].numpy(), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(row["charge/rot"], float(ch["rot"].norm()), rtol=1e-12)
    np.testing.assert_allclose(row["charge_matrix/rot"], ch["rot"].numpy(), rtol=1e-12)
    np.testing.assert_allclose(row["flow_matrix/rot"], fl["rot"].numpy(), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(row["distance/r"], sol.distance["r"].numpy(), rtol=1e-6, atol=1e-9)
    assert row["distance_converged"] == 1 and row["distance_exact"] == 1
    assert row["step"] == 0 and row["monitor_time"] >= 0


def test_hooks_only_on_record_steps() -> None:
    m, syms, x, y = problem()
    mon = NoetherMonitor(
        m,
        syms,
        every=3,
        lr=LR,
        batch_size=24,
        logging=nf.LogOptions(progress=False),
        distance=False,
    )
    seen = []
    for _ in range(7):
        with mon.track():
            seen.append(len(m[0]._forward_hooks))
            CE(m(x), y).backward()
        assert len(m[0]._forward_hooks) == 0
        mon.step()
    assert seen == [1, 0, 0, 1, 0, 0, 1]
    assert mon.history["step"].tolist() == [0, 3, 6]
    assert np.isnan(mon.history["loss"]).all()  # no loss passed


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_files_round_trip(tmp_path: Path, fmt: str) -> None:
    m, syms, x, y = problem(rotation=True)
    mon = NoetherMonitor(
        m,
        syms,
        every=2,
        lr=LR,
        batch_size=12,
        weight_decay=WD,
        logging=nf.LogOptions(log_dir=tmp_path, formats=(fmt,), progress=False, tensorboard=False),
        full_matrices=True,
        distance=nf.DistanceOptions(every=4),
    )
    train(mon, m, x, y, steps=7)
    mon.close()
    h = mon.history
    assert h["step"].tolist() == [0, 2, 4, 6]
    assert np.isnan(h["distance/r"][1]).all() and np.isfinite(h["distance/r"][0]).all()
    back = load_history(tmp_path / f"history.{fmt}")
    assert back.keys() == h.keys()
    for k in h:
        assert back[k].dtype == h[k].dtype, k
        np.testing.assert_array_equal(back[k], h[k], err_msg=k)  # bit-exact, NaN included
    meta = json.loads((tmp_path / "monitor.json").read_text())
    assert meta["every"] == 2 and meta["symmetries"] == ["r", "rot"]
    assert not list(tmp_path.glob("*.tmp"))


def test_log_dir_prefers_jsonl_and_survives_nonfinite(tmp_path: Path) -> None:
    m, syms, x, y = problem()
    mon = NoetherMonitor(
        m,
        syms,
        every=1,
        lr=LR,
        batch_size=12,
        logging=nf.LogOptions(log_dir=tmp_path, progress=False),
        distance=False,
    )
    train(mon, m, x, y, steps=1)
    with pytest.warns(RuntimeWarning, match="mon.track"):
        mon.step(float("inf"))  # no capture: only loss and charges are recorded
    back = load_history(tmp_path)
    assert back["loss"][-1] == math.inf
    assert np.isnan(back["flow/r"][-1]).all()
    np.testing.assert_array_equal(back["charge/r"], mon.history["charge/r"])


def test_untracked_record_step_warns() -> None:
    m, syms, _, _ = problem()
    mon = NoetherMonitor(
        m, syms, every=1, lr=LR, batch_size=12, logging=nf.LogOptions(progress=False)
    )
    with pytest.warns(RuntimeWarning, match="mon.track"):
        mon.step(1.0)


def test_sharpness_and_tensorboard_writer() -> None:
    class Writer:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []
            self.hists: list[str] = []

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.scalars.append((tag, value, step))

        def add_histogram(self, tag: str, values: Any, step: int) -> None:
            self.hists.append(tag)

    m, syms, x, y = problem()
    w = Writer()
    mon = NoetherMonitor(
        m,
        syms,
        every=2,
        lr=LR,
        batch_size=12,
        loss_fn=CE,
        probe=(x, y),
        sharpness=SharpnessOptions(n_samples=3, max_iter=3, every=4),
        logging=nf.LogOptions(tensorboard=w, progress=False),
        distance=False,
    )
    train(mon, m, x, y, steps=5)
    h = mon.history
    assert np.isfinite(h["sharpness/trace"][[0, 2]]).all() and np.isnan(h["sharpness/trace"][1])
    assert {t for t, _, _ in w.scalars} >= {"loss", "sharpness/trace", "sharpness/top_eigenvalue"}
    assert "charge/r" in w.hists


def test_progress_bar_and_plot(tmp_path: Path) -> None:
    m, syms, x, y = problem(rotation=True)
    with NoetherMonitor(
        m,
        syms,
        every=1,
        lr=LR,
        batch_size=12,
        weight_decay=WD,
        logging=nf.LogOptions(progress=True, total=3),
    ) as mon:
        train(mon, m, x, y, steps=3)
    fig = mon.plot(tmp_path / "mon.png")
    assert (tmp_path / "mon.png").stat().st_size > 0
    assert len(fig.axes) == 4  # loss, charge, flow, distance


def test_validation_messages() -> None:
    m, syms, _, _ = problem()
    with pytest.raises(ValueError, match="every"):
        NoetherMonitor(m, syms, every=0, lr=LR, batch_size=12)
    with pytest.raises(ValueError, match="loss_fn"):
        NoetherMonitor(m, syms, lr=LR, batch_size=12, sharpness=True)
    with pytest.raises(ValueError, match="multiple of every"):
        NoetherMonitor(m, syms, every=3, lr=LR, batch_size=12, distance=nf.DistanceOptions(every=4))
    with pytest.raises(ValueError, match="formats"):
        NoetherMonitor(m, syms, lr=LR, batch_size=12, logging=nf.LogOptions(formats=("parquet",)))


def test_lightning_callback_hook_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drive NoetherCallback through Lightning's hook order with a stand-in Callback base."""
    import importlib
    import sys
    import types

    if importlib.util.find_spec("lightning") is None:
        fake = types.ModuleType("lightning.pytorch.callbacks")
        fake.Callback = type("Callback", (), {})  # type: ignore[attr-defined]
        for name in ("lightning", "lightning.pytorch"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "lightning.pytorch.callbacks", fake)
        monkeypatch.delitem(sys.modules, "noetherflow.integrations.lightning", raising=False)
    from noetherflow.integrations.lightning import NoetherCallback

    m, syms, x, y = problem()
    cb = NoetherCallback(
        syms, every=2, lr=LR, batch_size=24, logging=nf.LogOptions(progress=False), distance=False
    )
    trainer = types.SimpleNamespace(accumulate_grad_batches=1, estimated_stepping_batches=4)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    cb.on_train_start(trainer, m)
    for i in range(4):
        cb.on_train_batch_start(trainer, m, (x, y), i)
        loss = CE(m(x), y)
        cb.on_before_backward(trainer, m, loss)
        loss.backward()
        cb.on_after_backward(trainer, m)
        cb.on_before_optimizer_step(trainer, m, opt)
        opt.step()
        opt.zero_grad()
    cb.on_train_end(trainer, m)
    assert cb.monitor is not None
    h = cb.monitor.history
    assert h["step"].tolist() == [0, 2]
    assert np.isfinite(h["flow/r"]).all() and np.isfinite(h["loss"]).all()
    assert len(m[0]._forward_hooks) == 0


def test_monitor_reuses_fresh_grad_and_falls_back_when_accumulating() -> None:
    """Flows are the same whether .grad was empty (reused) or already held a gradient."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).double()
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(32, 5, dtype=torch.float64), torch.randn(32, 3, dtype=torch.float64)
    lf = nn.MSELoss()
    ref = nf.noether_flow(
        syms, nf.collect_stats(m, syms, lf, x, y, estimator="reference"), lr=0.1, batch_size=32
    )["rescaling0"]
    for stale in (False, True):
        mon = nf.NoetherMonitor(m, syms, every=1, lr=0.1, batch_size=32, distance=False)
        m.zero_grad(set_to_none=True)
        if stale:  # a gradient left from before: the capture must not take .grad as the mean
            lf(m(x[:4]), y[:4]).backward()
        with mon.track():
            loss = lf(m(x), y)
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        got = torch.as_tensor(np.asarray(row["flow/rescaling0"]))
        assert torch.allclose(got, ref, rtol=1e-10, atol=1e-14), stale
        mon.close()
