"""Property-based tests (hypothesis) of the equilibrium solvers on random problems."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from noetherflow.equilibrium import _DiagProblem, _solve_diag, _solve_rotation, geometric_mean

DT = torch.float64


def _spd(seed: int, d: int, cond: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=DT))
    ev = torch.logspace(0, cond, d, dtype=DT)
    return (q * ev) @ q.T


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 8), st.floats(0.0, 4.0))
def test_geometric_mean_solves_pyp_equals_x(seed: int, d: int, cond: float) -> None:
    x, y = _spd(seed, d, cond), _spd(seed + 1, d, cond / 2)
    p = geometric_mean(x, y)
    assert torch.allclose(p, p.T, atol=1e-12 * float(p.abs().max()))
    assert float(torch.linalg.eigvalsh(p).min()) > 0
    assert float((p @ y @ p - x).norm() / x.norm()) < 1e-9


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(0, 2))
def test_rotation_singular_part_reported(seed: int, d: int, k: int) -> None:
    """With k null directions shared by X and Y the flow vanishes on the rest."""
    k = min(k, d - 1)
    x, y = _spd(seed, d, 2.0), _spd(seed + 7, d, 1.0)
    if k:
        g = torch.Generator().manual_seed(seed + 3)
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=DT))
        proj = q[:, k:] @ q[:, k:].T
        x, y = proj @ x @ proj, proj @ y @ proj
    _g, null, _, after = _solve_rotation(x, y, rtol=1e-10, ridge=None)
    assert (null is None) == (k == 0)
    if null is not None:
        assert null.shape[1] == k
    assert after < 1e-9


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 5))
def test_joint_diagonal_newton_zero_flow(seed: int, n1: int, n2: int) -> None:
    """Random two-layer rescaling structure: the Newton solve zeroes every generator's flow."""
    g = torch.Generator().manual_seed(seed)
    # coordinates of three layers: in-weights of layer 1 (+1 on gen i), the middle weights
    # (−1 on gen i of layer 1, +1 on gen j of layer 2), the out-weights (−1 on gen j)
    d_in, d_out = 3, 2
    w1 = torch.arange(n1).repeat_interleave(d_in)
    mid_i = torch.arange(n1).repeat(n2)
    mid_j = torch.arange(n2).repeat_interleave(n1) + n1
    w3 = (torch.arange(n2) + n1).repeat(d_out)
    terms = [
        [(w1, torch.ones(len(w1), dtype=DT))],
        [(mid_i, -torch.ones(len(mid_i), dtype=DT)), (mid_j, torch.ones(len(mid_j), dtype=DT))],
        [(w3, -torch.ones(len(w3), dtype=DT))],
    ]
    sizes = [len(w1), len(mid_i), len(w3)]
    m = [
        torch.rand(s, generator=g, dtype=DT) * 10 ** (2 * torch.rand(1, generator=g).item())
        for s in sizes
    ]
    c = [torch.rand(s, generator=g, dtype=DT) * 0.1 for s in sizes]
    prob = _DiagProblem(n1 + n2, {}, m, c, terms)
    lam, reports, rel, ok, _ = _solve_diag(prob, {}, tol=1e-12, max_iter=100)
    assert ok and not reports and rel <= 1e-12
    grad, scale, _ = prob.derivatives(lam, hessian=False)
    assert float((grad.abs() / scale).max()) <= 1e-10
    # F is minimal: any small move increases it
    f0 = prob.value(lam)
    for _ in range(5):
        d = torch.randn(n1 + n2, generator=g, dtype=DT) * 1e-3
        assert prob.value(lam + d) >= f0 - 1e-12 * abs(f0)
