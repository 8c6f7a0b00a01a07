"""The solver splits a symmetry set into independent blocks (issue 28).

Symmetries that share no parameter do not interact, so each coupled group (a rotation chained
to other symmetries) is swept on its own until its own flows vanish, and everything else is
solved once, jointly. Pinned here: the blocks give what solving each block alone gives, the
teleported model has zero flow everywhere (float64, fresh statistics), a diagonal symmetry
linked to a coupled group only through another diagonal one belongs to that group, and the
shortcuts inside a sweep (ḡ moved with the samples, Y's eigendecomposition reused, one
thread for d×d algebra) change no number.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow._threads import one_thread
from noetherflow.kernels.base import needs_samples
from noetherflow.kernels.rotation import _geometric_mean, geometric_mean
from noetherflow.symmetry.rotation import Block

DT = torch.float64
KW: dict[str, Any] = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2}


def _heads(first: nn.Linear, second: nn.Linear, tag: str) -> list[nf.DoubleRotation]:
    """Two heads of 6 between ``first`` (rows and bias) and ``second`` (columns)."""
    return [
        nf.DoubleRotation.from_blocks(
            [Block(first.weight, 0, 6 * h, 6 * h + 6), Block(first.bias, 0, 6 * h, 6 * h + 6)],
            [Block(second.weight, 1, 6 * h, 6 * h + 6)],
            label=f"{tag}head{h}",
        )
        for h in range(2)
    ]


class _Towers(nn.Module):
    """Two towers Linear(5, 12) → Linear(12, 6) → ReLU → Linear(6, 3) → ReLU → Linear(3, 2)
    and an MLP Linear(5, 7) → ReLU → Linear(7, 2), outputs concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList(
            nn.Sequential(
                nn.Linear(5, 12),
                nn.Linear(12, 6),
                nn.ReLU(),
                nn.Linear(6, 3),
                nn.ReLU(),
                nn.Linear(3, 2),
            )
            for _ in range(2)
        )
        self.mlp = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([*(t(x) for t in self.towers), self.mlp(x)], dim=1)


def _model(seed: int = 0) -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    """Per tower: two heads, a rescaling after them (sharing the head's second weight) and a
    rescaling after that one (sharing only a weight with the first rescaling); the MLP's
    rescaling shares nothing with the towers."""
    torch.manual_seed(seed)
    m = _Towers().double()
    syms: list[nf.Symmetry] = []
    for i, t in enumerate(m.towers):
        syms += _heads(t[0], t[1], f"t{i}")
        syms += [
            nf.Rescaling(t[1], t[3], label=f"t{i}r1"),
            nf.Rescaling(t[3], t[5], label=f"t{i}r2"),
        ]
    syms.append(nf.Rescaling(m.mlp[0], m.mlp[2], label="mlp"))
    x, y = torch.randn(40, 5, dtype=DT), torch.randn(40, 6, dtype=DT)
    return m, nf.SymmetrySet(syms), x, y


def _stats(m: nn.Module, syms: nf.SymmetrySet, x: Tensor, y: Tensor) -> nf.GradStats:
    return nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")


def test_coupled_groups_are_closed_under_shared_parameters() -> None:
    m, syms, _, _ = _model()
    groups = [[syms.names[i] for i in g] for g in syms.coupled_groups()]
    # r2 shares a weight only with r1 (both diagonal), yet r1's sweeps move it: same group
    assert groups == [[f"t{i}head0", f"t{i}head1", f"t{i}r1", f"t{i}r2"] for i in range(2)]
    kept = {id(p) for p in needs_samples(syms)}
    assert id(m.towers[0][5].weight) in kept and id(m.towers[1][0].bias) in kept
    assert id(m.mlp[0].weight) not in kept and id(m.mlp[2].weight) not in kept


def test_blocks_solve_as_each_block_alone() -> None:
    m, syms, x, y = _model()
    sol = nf.solve_equilibrium(syms, _stats(m, syms, x, y), **KW)
    assert sol.converged and sol.max_distance() > 1e-2
    parts = [[n for n in syms.names if n.startswith(f"t{i}")] for i in range(2)] + [["mlp"]]
    for names in parts:
        sub = syms.subset(syms.names.index(n) for n in names)
        alone = nf.solve_equilibrium(sub, _stats(m, sub, x, y), **KW)
        assert alone.converged
        for n in names:
            a, b = torch.as_tensor(sol.elements[n]), torch.as_tensor(alone.elements[n])
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), n


def test_blocks_land_at_zero_flow() -> None:
    m, syms, x, y = _model(seed=3)
    before = nf.noether_flow(syms, _stats(m, syms, x, y), **KW)
    sol = nf.solve_equilibrium(syms, _stats(m, syms, x, y), **KW)
    with torch.no_grad():
        out0 = m(x).clone()
    nf.teleport(m, sol)
    with torch.no_grad():
        assert float((m(x) - out0).abs().max()) < 1e-12 * float(out0.abs().max())
    after = nf.noether_flow(syms, _stats(m, syms, x, y), **KW)
    for k in before:
        assert float(before[k].norm()) > 0
        assert float(after[k].norm() / before[k].norm()) < 1e-8, k


def test_subset_keeps_names() -> None:
    _, syms, _, _ = _model()
    sub = syms.subset([3, 0])
    assert sub.names == ["t0r2", "t0head0"] and sub[0] is syms[3]


def test_geometric_mean_with_the_callers_eigh_is_the_same_number() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(7, 7, generator=g, dtype=DT) for _ in range(2))
    x, y = a @ a.T + 0.1 * torch.eye(7, dtype=DT), b @ b.T + 0.1 * torch.eye(7, dtype=DT)
    p = _geometric_mean(x, y, torch.linalg.eigh(y))  # the solver's unchecked path
    assert torch.equal(p, geometric_mean(x, y))
    assert torch.allclose(p @ y @ p, x, rtol=1e-10, atol=1e-12)


def test_one_thread_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        try:
            with one_thread():
                raise RuntimeError("inside")
        except RuntimeError:
            pass
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_warm_start_of_coupled_blocks_reaches_the_cold_solution() -> None:
    """``init`` moves each coupled block to the previous solution before its sweeps: after a
    few SGD steps the warm solve lands where the cold one does, in fewer sweeps.

    A rotation's equilibrium fixes P = GGᵀ (P Y P = X), not G: G·O for an orthogonal O is as
    good, and the warm total G_prev·G has such a factor. So P, the distances and the zero
    flow after the teleport are compared."""
    m, syms, x, y = _model(seed=5)
    first = nf.solve_equilibrium(syms, _stats(m, syms, x, y), **KW)
    opt = torch.optim.SGD(m.parameters(), lr=0.02)
    for _ in range(3):
        opt.zero_grad()
        nn.MSELoss()(m(x), y).backward()
        opt.step()
    st = _stats(m, syms, x, y)
    cold = nf.solve_equilibrium(syms, st, **KW)
    warm = nf.solve_equilibrium(syms, st, init=first, **KW)
    assert cold.converged and warm.converged
    assert warm.iterations < cold.iterations
    for n, s in syms.items():
        a, b = torch.as_tensor(warm.elements[n]), torch.as_tensor(cold.elements[n])
        if isinstance(s, nf.DoubleRotation):
            a, b = a @ a.T, b @ b.T
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11), n
        assert torch.allclose(warm.distance[n], cold.distance[n], rtol=1e-9, atol=1e-11), n
    before = nf.noether_flow(syms, st, **KW)
    nf.teleport(m, warm)
    after = nf.noether_flow(syms, _stats(m, syms, x, y), **KW)
    for k in before:
        assert float(after[k].norm() / before[k].norm()) < 1e-8, k
