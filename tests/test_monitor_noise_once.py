"""η and γ reach the flows and the distance tracker in one form (issue #27).

One ``NoiseModel.create`` per record (it ran three times per distance record), and a
schedule's change of η still triggers the full solve through the noise model alone.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.kernels.noise import NoiseModel


def _problem() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    return m, syms, torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 2).double()


@pytest.mark.parametrize("mode", ["solve", "track"])
def test_noise_model_is_created_once_per_record(monkeypatch, mode: str) -> None:
    m, syms, x, y = _problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5, weight_decay=1e-3)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=16,
        logging=nf.LogOptions(progress=False),
        distance=nf.DistanceOptions(every=1, mode=mode),
    )
    made: list[NoiseModel] = []
    create = NoiseModel.create.__func__  # type: ignore[attr-defined]

    def counting(cls, **kw):
        nm = create(cls, **kw)
        made.append(nm)
        return nm

    monkeypatch.setattr(NoiseModel, "create", classmethod(counting))
    rows = []
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        rows.append(mon.step(loss))
        opt.step()
    mon.close()
    assert all(r is not None and "distance/rescaling0" in r for r in rows)
    assert len(made) == 4, f"NoiseModel.create ran {len(made)} times for 4 records"
    assert {nm.lr for nm in made} == {0.05} and {nm.momentum for nm in made} == {0.5}


def test_a_schedule_change_of_lr_forces_a_full_solve() -> None:
    m, syms, x, y = _problem()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, weight_decay=1e-3)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=16,
        logging=nf.LogOptions(progress=False),
        distance=nf.DistanceOptions(every=1, mode="track", solve_every=100),
    )
    exact = []
    for t in range(5):
        if t == 3:
            opt.param_groups[0]["lr"] = 0.05 * 1.2  # > 5%: the tracker must solve in full
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        exact.append(bool(row["distance_exact"]))
    mon.close()
    assert exact[0] and exact[3], exact
    assert not any(exact[1:3]) and not exact[4], exact
