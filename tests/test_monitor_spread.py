"""The monitor's coupled solve spread over records (#28): provisional rows, then the solve."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf

DT = torch.float64
LR, S, GAMMA = 0.05, 48, 0.02  # S: the 48 samples of each step


def _chain(seed: int = 3) -> tuple[nn.Sequential, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    """Two rotations sharing the middle layer and a rescaling sharing the third: one coupled
    group, solved by block Gauss–Seidel sweeps."""
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
    x = torch.randn(48, 3, generator=g, dtype=DT)
    return m, syms, x, torch.randn(48, 2, generator=g, dtype=DT)


def _rows(sweeps: int | None, records: int) -> tuple[list[dict[str, np.ndarray]], dict[str, str]]:
    """Records on a fixed model and batch (no optimizer step): the same problem each time."""
    m, syms, x, y = _chain()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        distance=nf.DistanceOptions(every=1, sweeps=sweeps, solver=nf.SolveOptions(tol=1e-13)),
        lr=LR,
        batch_size=S,
        weight_decay=GAMMA,
        logging=nf.LogOptions(progress=False),
    )
    rows = []
    for _ in range(records):
        with mon.track():
            F.mse_loss(m(x), y).backward()
        row = mon.step()
        assert row is not None
        rows.append(row)
        m.zero_grad()
    mon.close()
    return rows, mon.keys


def test_spread_solve_converges_to_the_full_solve() -> None:
    """One sweep per record on an unchanging problem: the first estimate, then provisional
    rows (distance_converged = 0, distance_exact = 0, the sweeps counted up, a residual above
    tol) until the sweeps converge, then the distances of one full solve (float64) and
    converged rows after."""
    m, syms, x, y = _chain()
    sol = nf.solve_equilibrium(
        syms,
        nf.collect_stats(m, syms, F.mse_loss, x, y),
        lr=LR,
        batch_size=S,
        weight_decay=GAMMA,
        options=nf.SolveOptions(tol=1e-13, max_sweeps=500),
    )
    assert sol.converged and sol.iterations >= 4  # a problem that takes several sweeps
    rows, keys = _rows(1, sol.iterations + 3)
    conv = np.array([float(r["distance_converged"]) for r in rows])
    first = int(np.argmax(conv))
    assert conv[first] == 1 and (conv[:first] == 0).all() and (conv[first:] == 1).all()
    assert first >= 3  # the first estimate and provisional rows came first
    assert float(rows[0]["distance_sweeps"]) == 0 and np.isnan(rows[0]["distance_residual"])
    for k, r in enumerate(rows[:first]):
        assert float(r["distance_exact"]) == 0
        assert float(r["distance_sweeps"]) == k  # counted over the records
        assert k == 0 or float(r["distance_residual"]) > 1e-13
    for r in rows[first:]:
        assert float(r["distance_exact"]) == 1 and float(r["distance_residual"]) <= 1e-10
        for name, key in keys.items():
            ref = sol.distance[name].numpy()
            assert np.abs(r[f"distance/{key}"] - ref).max() <= 1e-9 * max(1.0, np.abs(ref).max())


def test_first_estimate_solves_each_symmetry_given_the_others() -> None:
    """The first row: each symmetry's own equilibrium with the others held (one Jacobi step),
    as solve_equilibrium gives for that symmetry alone (float64)."""
    m, syms, x, y = _chain()
    st = nf.collect_stats(m, syms, F.mse_loss, x, y)
    rows, keys = _rows(1, 1)
    for i, name in enumerate(syms.names):
        alone = nf.solve_equilibrium(
            syms.subset([i]),
            st,
            lr=LR,
            batch_size=S,
            weight_decay=GAMMA,
            options=nf.SolveOptions(tol=1e-13),
        )
        ref = alone.distance[name].numpy()
        assert np.abs(rows[0][f"distance/{keys[name]}"] - ref).max() <= 1e-10 * max(
            1.0, np.abs(ref).max()
        )
    assert float(rows[0]["distance_converged"]) == 0


def test_unlimited_sweeps_solve_at_the_first_record() -> None:
    rows, _ = _rows(None, 1)
    assert float(rows[0]["distance_converged"]) == 1 and float(rows[0]["distance_exact"]) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_sweeps_are_refused(bad: object) -> None:
    m, syms, _, _ = _chain()
    with pytest.raises(ValueError, match="distance_sweeps"):
        nf.NoetherMonitor(m, syms, lr=LR, batch_size=S, distance=nf.DistanceOptions(sweeps=bad))  # type: ignore[arg-type]


def test_first_estimate_batches_the_rotations_as_one_at_a_time() -> None:
    """The first estimate solves a batchable kernel's symmetries in one batched call: the
    distances equal those of one ``solve`` per symmetry (float64), overlapping heads too."""
    from noetherflow.kernels import kernel_for
    from noetherflow.kernels.base import StepOptions
    from noetherflow.monitor.estimate import jacobi_estimate
    from noetherflow.solve_options import kernel_settings
    from noetherflow.symmetry.rotation import Block

    m, syms, x, y = _chain()
    heads = [  # two disjoint heads on m[2] → m[4], beside r1, r2 sharing m[1]
        nf.DoubleRotation.from_blocks(
            [Block(m[2].weight, 0, 2 * h, 2 * h + 2), Block(m[2].bias, 0, 2 * h, 2 * h + 2)],
            [Block(m[4].weight, 1, 2 * h, 2 * h + 2)],
            label=f"h{h}",
        )
        for h in range(2)
    ]
    syms = nf.SymmetrySet([*syms, *heads])
    st = nf.collect_stats(m, syms, F.mse_loss, x, y)
    nm = nf.NoiseModel.create(lr=LR, batch_size=S, weight_decay=GAMMA)
    opts = nf.SolveOptions(tol=1e-13)
    got, _ = jacobi_estimate(syms, st, nm, opts)
    values = {p: p.detach() for p in syms.params()}
    names = {s: n for n, s in syms.items()}
    step = StepOptions(settings=kernel_settings(opts, [kernel_for(s) for s in syms]))
    for name, s in syms.items():
        k = kernel_for(s)
        if k.joint:
            continue
        (_, element), *_ = k.solve([s], values, st, nm, names, step).steps
        want = k.distance(s, k.compose(s.identity_element(), element))
        torch.testing.assert_close(got[name], want, rtol=1e-11, atol=1e-13, msg=name)
