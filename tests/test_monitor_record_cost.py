"""What a record computes (#28): per-sample gradients only where the coupled solver reads them.

The hooks' statistics keep the per-sample gradients of a coupled group (rotations sharing a
layer with other symmetries) for :func:`noetherflow.solve_equilibrium`'s sweeps. The
monitor's flow-only records and its first estimate read none, so they are not formed there;
the flows and distances stay those of the exact torch.func reference (float64).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.monitor.accumulation import StepCapture

DT = torch.float64
LR, S, GAMMA = 0.05, 32, 0.02  # S: the 32 samples of each step


def _chain(seed: int = 5) -> tuple[nn.Sequential, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    """Two rotations sharing the middle layer and a rescaling sharing the third: coupled."""
    torch.manual_seed(seed)
    m = nn.Sequential(
        nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)
    ).to(DT)
    syms = nf.SymmetrySet(
        [
            nf.DoubleRotation(m[0], m[1], label="r1"),
            nf.DoubleRotation(m[1], m[2], label="r2"),
            nf.Rescaling(m[2], m[4], label="s"),
        ]
    )
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(32, 3, generator=g, dtype=DT)
    return m, syms, x, torch.randn(32, 2, generator=g, dtype=DT)


def test_samples_only_at_records_that_sweep(monkeypatch: object) -> None:
    """every=1, distances every 2 records: record 0 the first estimate, 1 and 3 flows only,
    2 and 4 a sweep each. Per-sample gradients are kept at 2 and 4 only; every record's
    flows and the first estimate's distances equal the reference's (float64, ≤ 1e-10)."""
    m, syms, x, y = _chain()
    kept: list[int] = []
    merged = StepCapture.merged

    def spy(self: StepCapture) -> nf.GradStats:
        st = merged(self)
        kept.append(len(st.samples))
        return st

    monkeypatch.setattr(StepCapture, "merged", spy)  # type: ignore[attr-defined]
    opt = torch.optim.SGD(m.parameters(), lr=LR, weight_decay=2 * GAMMA)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        distance=nf.DistanceOptions(every=2, sweeps=1, solver=nf.SolveOptions(tol=1e-13)),
        batch_size=S,
        full_matrices=True,
        logging=nf.LogOptions(progress=False),
    )
    for i in range(5):
        ref = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
        flows = nf.noether_flow(syms, ref, lr=LR, batch_size=S, weight_decay=GAMMA)
        with mon.track():
            F.mse_loss(m(x), y).backward()
        row = mon.step()
        assert row is not None
        for name, key in mon.keys.items():
            want = flows[name].numpy()
            got = row[f"flow_matrix/{key}" if want.ndim == 2 else f"flow/{key}"]
            got = got.reshape(want.shape)
            assert np.abs(got - want).max() <= 1e-10 * max(1.0, np.abs(want).max()), (i, name)
        if i == 0:  # the first estimate: each symmetry's equilibrium with the others held
            for j, name in enumerate(syms.names):
                alone = nf.solve_equilibrium(
                    syms.subset([j]),
                    ref,
                    lr=LR,
                    batch_size=S,
                    weight_decay=GAMMA,
                    options=nf.SolveOptions(tol=1e-13),
                )
                want = alone.distance[name].numpy()
                got = row[f"distance/{mon.keys[name]}"].reshape(want.shape)
                assert np.abs(got - want).max() <= 1e-10 * max(1.0, np.abs(want).max())
        opt.step()
        opt.zero_grad(set_to_none=True)
    mon.close()
    assert [k > 0 for k in kept] == [False, False, True, False, True]
