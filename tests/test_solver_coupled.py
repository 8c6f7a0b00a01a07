"""Coupled sweeps rebuild only the statistics a move touched (issue #15).

Two per-head rotations on disjoint slices of the same weights and a rescaling over all of one
of them: :func:`overlaps` says which statistics a move makes stale, :func:`refresh_stats_`
rebuilds just those and must equal a full :func:`stats_from_samples`; the solve lands where
fresh statistics show zero flow.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import noetherflow as nf
from noetherflow.kernels.base import overlaps, refresh_stats_, stats_from_samples
from noetherflow.symmetry.rotation import Block

DT = torch.float64


def _model(seed: int = 0) -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    """Linear(5, 12) → Linear(12, 6) → ReLU → Linear(6, 3); heads of 6 between the first two
    (W1 rows and b1, W2 columns), a rescaling between the last two (W2 rows, W4 columns)."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 12), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    heads = [
        nf.DoubleRotation.from_blocks(
            [Block(m[0].weight, 0, 6 * h, 6 * h + 6), Block(m[0].bias, 0, 6 * h, 6 * h + 6)],
            [Block(m[1].weight, 1, 6 * h, 6 * h + 6)],
            label=f"head{h}",
        )
        for h in range(2)
    ]
    syms = nf.SymmetrySet([*heads, nf.Rescaling(m[1], m[3], label="r")])
    x, y = torch.randn(40, 5, dtype=DT), torch.randn(40, 3, dtype=DT)
    return m, syms, x, y


def _entries(stats: nf.GradStats) -> dict[Any, torch.Tensor]:
    out: dict[Any, torch.Tensor] = {("mean", id(p)): t for p, t in stats.mean.items()}
    for key, block in stats.blocks.items():
        for e in block.entries():
            out[(key, e[0], id(e[1]) if not isinstance(e[1], tuple) else e[1], e[2])] = (
                block.get_entry(e)
            )
    return out


def test_overlaps_by_covered_coordinates() -> None:
    _, syms, _, _ = _model()
    h0, h1, r = syms["head0"], syms["head1"], syms["r"]
    touch = overlaps(list(syms))
    assert set(touch[h0]) == {h0, r} and set(touch[h1]) == {h1, r}  # heads are disjoint
    assert set(touch[r]) == {h0, h1, r}


def test_refresh_after_a_move_equals_a_full_rebuild() -> None:
    m, syms, x, y = _model()
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    samples = {p: st.samples[p].to(DT).clone() for p in syms.params()}
    cur = stats_from_samples(samples, syms, estimator=st.estimator)
    before = {k: v.clone() for k, v in _entries(cur).items()}
    h0 = syms["head0"]
    g = h0.random_element(0.7, torch.Generator().manual_seed(1))
    h0.transport_grads_(g, samples)
    refresh_stats_(cur, samples, overlaps(list(syms))[h0])
    full = _entries(stats_from_samples(samples, syms, estimator=st.estimator))
    got = _entries(cur)
    assert got.keys() == full.keys()
    changed = 0
    for k, v in full.items():
        assert torch.allclose(got[k], v, rtol=1e-12, atol=1e-14 * float(v.abs().max())), k
        changed += not torch.allclose(before[k], v, rtol=1e-9, atol=0)
    assert changed >= 3  # the move did change statistics (the test can fail)
    # head1's moments were not recomputed, and did not need to be
    sw, su = cur.blocks["rotation"].side[syms["head1"]]  # type: ignore[attr-defined]
    assert torch.equal(sw, before[("rotation", "side", id(syms["head1"]), 0)])
    assert torch.equal(su, before[("rotation", "side", id(syms["head1"]), 1)])


def test_coupled_solve_lands_at_zero_flow() -> None:
    m, syms, x, y = _model()
    assert syms.coupled_groups()
    lf = nn.MSELoss()
    kw: dict[str, Any] = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2}
    st = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    before = nf.noether_flow(syms, st, **kw)
    sol = nf.solve_equilibrium(syms, st, **kw)
    assert sol.converged and sol.max_distance() > 1e-2
    with torch.no_grad():
        out0 = m(x).clone()
    nf.teleport(m, sol)
    with torch.no_grad():
        assert float((m(x) - out0).abs().max()) < 1e-12 * float(out0.abs().max())
    after = nf.noether_flow(syms, nf.collect_stats(m, syms, lf, x, y, estimator="reference"), **kw)
    for k in before:
        assert float(before[k].norm()) > 0
        assert float(after[k].norm() / before[k].norm()) < 1e-8, k
