"""Warm starts of :func:`noetherflow.solve_equilibrium` (issue #15)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

import noetherflow as nf


def _mlp(seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(
        nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 7), nn.ReLU(), nn.Linear(7, 3)
    ).double()
    return m, torch.randn(16, 6, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)


def test_warm_started_solve_matches_cold_solve() -> None:
    m, x, y = _mlp(0)
    syms = nf.find_symmetries(m, x)
    lf = nn.MSELoss()
    kw: dict[str, Any] = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2}
    st = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    cold = nf.solve_equilibrium(syms, st, **kw)
    assert cold.converged and cold.max_distance() > 1e-3
    # a slightly different problem (one SGD step later), cold and warm from the old solution
    with torch.no_grad():
        for p in m.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    st2 = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    ref = nf.solve_equilibrium(syms, st2, **kw)
    warm = nf.solve_equilibrium(syms, st2, init=cold, **kw)
    assert ref.converged and warm.converged
    assert warm.iterations <= ref.iterations
    for name, lam in ref.elements.items():
        scale = float(torch.as_tensor(lam).abs().max()) + 1e-12
        diff = float((torch.as_tensor(warm.elements[name]) - torch.as_tensor(lam)).abs().max())
        assert diff <= 1e-9 * scale, name
    # the exact solution as the start: nothing left to do
    again = nf.solve_equilibrium(syms, st2, init=ref, **kw)
    assert again.iterations == 1


def test_monitor_warm_started_distance_matches_cold() -> None:
    """The monitor warm-starts each solve from the last; the distances equal cold solves'."""
    from noetherflow.monitor import NoetherMonitor

    ce = nn.CrossEntropyLoss()
    hist = []
    for warm in (True, False):  # default (warm) and explicitly cold
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
        syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="r")])
        g = torch.Generator().manual_seed(1)
        x = torch.randn(24, 4, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (24,), generator=g)
        mon = NoetherMonitor(
            m,
            syms,
            every=1,
            lr=0.05,
            batch_size=24,
            weight_decay=1e-3,
            logging=nf.LogOptions(progress=False),
            distance=nf.DistanceOptions(every=1, mode="solve", warm_start=warm),
        )
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for _ in range(4):
            with mon.track():
                loss = ce(m(x), y)
                loss.backward()
            mon.step(loss)
            opt.step()
            opt.zero_grad()
        warm = mon._distance.warm
        assert warm is not None and warm.converged  # the next solve's start
        hist.append(np.stack([np.asarray(r) for r in mon.history["distance/r"]]))
    assert float(np.abs(hist[0]).max()) > 1e-3
    np.testing.assert_allclose(hist[0], hist[1], rtol=1e-9, atol=1e-12)


def test_bench_solver_tiny_runs() -> None:
    """benchmarks/bench_solver.py keeps working; warm and cold give the same λ*."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_solver.py"
    spec = importlib.util.spec_from_file_location("bench_solver", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.main(["--tiny", "--steps", "3"])
    assert res["warm_iterations"] <= res["cold_iterations"]
    assert res["max_abs_diff"] <= 1e-9


def test_bench_solver_workloads_tiny_run() -> None:
    """``bench_solver.py --mlp --gpt2 --tiny``: the solvers compared agree; the token model's
    coupled sweep converges."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_solver.py"
    spec = importlib.util.spec_from_file_location("bench_solver", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.main(["--mlp", "--gpt2", "--tiny", "--reps", "2"])
    mlp, gpt2 = res["mlp"], res["gpt2"]
    assert set(mlp["median_s"]) == {"cg", "dense"} and all(mlp["converged"].values())
    assert mlp["max_abs_diff"] <= 1e-9 and mlp["generators"] == 32
    assert list(gpt2["median_s"]) == ["auto"] and gpt2["converged"]["auto"]
    assert gpt2["kinds"] == ["DoubleRotation"] and gpt2["symmetries"] == 4
