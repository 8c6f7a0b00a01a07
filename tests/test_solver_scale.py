"""Warm starts of :func:`noetherflow.solve_equilibrium` (issue #15)."""

from __future__ import annotations

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
    kw = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2}
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
