"""Property-based tests (hypothesis) of the equilibrium solvers on random problems."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from noetherflow.kernels import _diag_newton as eq
from noetherflow.kernels._diag_newton import _spd_solve
from noetherflow.kernels._diag_newton import solve_diag as _solve_diag
from noetherflow.kernels._diag_problem import _DiagProblem, _Grid
from noetherflow.kernels.rotation import _solve_rotation, geometric_mean

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


def _three_layer_problem(seed: int, n1: int, n2: int, block: int) -> _DiagProblem:
    """Rescaling of two hidden layers: W1 (+ bias) rows, W2 rows/columns, W3 columns.

    W3 reads each layer-2 neuron through ``block`` columns (a Flatten after a conv).
    """
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        scale = 10 ** (3 * torch.rand(1, generator=g).item() - 1)
        return torch.rand(*shape, generator=g, dtype=DT) * scale

    grids = [
        _Grid(rnd(n1, 3), rnd(n1, 3) * 0.1, [(0, n1, 1, 1.0)], []),
        _Grid(rnd(n1, 1), rnd(n1, 1) * 0.1, [(0, n1, 1, 1.0)], []),
        _Grid(rnd(n2, n1), rnd(n2, n1) * 0.1, [(n1, n2, 1, 1.0)], [(0, n1, 1, -1.0)]),
        _Grid(rnd(2, n2 * block), rnd(2, n2 * block) * 0.1, [], [(n1, n2, block, -1.0)]),
    ]
    return _DiagProblem(n1 + n2, {}, grids)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
def test_diagonal_derivatives_match_autograd(seed: int, n1: int, n2: int, block: int) -> None:
    prob = _three_layer_problem(seed, n1, n2, block)
    lam = torch.randn(n1 + n2, generator=torch.Generator().manual_seed(seed), dtype=DT) * 0.3

    def f(v: torch.Tensor) -> torch.Tensor:
        return sum(0.5 * (lo + hi).sum() for _, lo, hi in prob.terms(v))  # type: ignore[return-value]

    grad, _, hess = prob.derivatives(lam)
    ref_g = torch.autograd.functional.jacobian(f, lam)
    ref_h = torch.autograd.functional.hessian(f, lam)
    assert torch.allclose(grad, ref_g, rtol=1e-10, atol=1e-12 * float(ref_g.abs().max()))
    assert torch.allclose(hess, ref_h, rtol=1e-10, atol=1e-12 * float(ref_h.abs().max()))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 5), st.integers(1, 3))
def test_joint_diagonal_newton_zero_flow(seed: int, n1: int, n2: int, block: int) -> None:
    """The Newton solve zeroes every generator's flow and F is minimal there."""
    g = torch.Generator().manual_seed(seed + 1)
    prob = _three_layer_problem(seed, n1, n2, block)
    lam, reports, rel, ok, _ = _solve_diag(prob, {}, tol=1e-12, max_iter=100)
    assert ok and not reports and rel <= 1e-10
    grad, scale, _ = prob.derivatives(lam, hessian=False)
    assert float((grad.abs() / scale).max()) <= 1e-10
    f0 = prob.value(lam)
    for _ in range(5):
        d = torch.randn(n1 + n2, generator=g, dtype=DT) * 1e-3
        assert prob.value(lam + d) >= f0 - 1e-12 * abs(f0)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 14.0))
@example(seed=0, cond=5.75)  # a loose backward-error stop once left a 2.9e-9 forward error
def test_spd_solve_reaches_float64_backward_error(seed: int, cond: float) -> None:
    """The float32 factor with float64 refinement (or its fallback) solves to float64 round-off."""
    n = 300  # above the size where the float32 factor is tried
    h = _spd(seed, n, cond)
    b = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=DT)
    x = _spd_solve(h, b)
    backward = float((h @ x - b).abs().max()) / (
        float(h.abs().sum(1).max()) * float(x.abs().max()) + float(b.abs().max())
    )
    assert backward < 1e-13
    if cond <= 6:  # well conditioned: the forward error is small too
        ref = torch.linalg.solve(h, b)
        assert float((x - ref).norm() / ref.norm()) < 1e-9


def test_spd_solve_singular_falls_back_to_least_squares() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(300, 5, generator=g, dtype=DT)
    h = a @ a.T  # rank 5
    b = h @ torch.randn(300, generator=g, dtype=DT)
    x = _spd_solve(h, b)
    assert float((h @ x - b).norm() / b.norm()) < 1e-8


def test_mixed_precision_newton_matches_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """A joint solve over 2·200 coupled generators gives the same λ* with either factorisation."""
    g = torch.Generator().manual_seed(3)
    n = 200
    # one weight between two rescaled layers (rows: generators 0..n-1, columns: n..2n-1),
    # plus each layer's own terms along one axis
    grids = [
        _Grid(
            torch.rand(n, n, generator=g, dtype=DT),
            torch.rand(n, n, generator=g, dtype=DT),
            [(0, n, 1, 1.0)],
            [(n, n, 1, -1.0)],
        ),
        _Grid(
            torch.rand(n, 1, generator=g, dtype=DT) * 50,
            torch.rand(n, 1, generator=g, dtype=DT) * 50,
            [(0, n, 1, -1.0)],
            [],
        ),
        _Grid(
            torch.rand(1, n, generator=g, dtype=DT) * 50,
            torch.rand(1, n, generator=g, dtype=DT) * 50,
            [],
            [(n, n, 1, 1.0)],
        ),
    ]
    prob = _DiagProblem(2 * n, {}, grids)
    lam_mixed, _, rel_mixed, ok_mixed, _ = _solve_diag(prob, {}, tol=1e-12, max_iter=50)
    monkeypatch.setattr(eq, "_MIXED_MIN", 10**9)
    lam64, _, rel64, ok64, _ = _solve_diag(prob, {}, tol=1e-12, max_iter=50)
    assert ok_mixed and ok64 and rel_mixed <= 1e-12 and rel64 <= 1e-12
    assert float(lam64.abs().max()) > 0.1
    assert float((lam_mixed - lam64).abs().max()) < 1e-9


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(4, 9), st.integers(1, 2))
def test_rotation_partly_overlapping_ranges(seed: int, d: int, c: int) -> None:
    """X and Y share a c-dimensional range and each has a private direction: the geometric
    mean is taken on the shared part, the other d − c directions are reported and unmoved."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(d, c, generator=g, dtype=DT)
    a, b = torch.randn(d, 1, generator=g, dtype=DT), torch.randn(d, 1, generator=g, dtype=DT)
    x = shared @ shared.T + a @ a.T
    y = 0.3 * shared @ shared.T + b @ b.T
    gm, null, before, after = _solve_rotation(x, y, rtol=1e-10, ridge=None)
    assert null is not None and null.shape == (d, d - c)
    q, _ = torch.linalg.qr(shared)
    assert float((null.T @ q).abs().max()) < 1e-8  # reported directions ⟂ the common range
    assert torch.allclose(gm @ null, null, atol=1e-10)  # identity on what is reported
    assert before > 1e-3 and after < 1e-9


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 5), st.integers(1, 3))
def test_joint_diagonal_newton_warm_start(seed: int, n1: int, n2: int, block: int) -> None:
    """From a perturbed previous λ* the solve reaches the same λ* in no more iterations."""
    prob = _three_layer_problem(seed, n1, n2, block)
    cold, _, _, ok, its_cold = _solve_diag(prob, {}, tol=1e-12, max_iter=100)
    assert ok
    g = torch.Generator().manual_seed(seed + 7)
    init = cold + 1e-3 * torch.randn(prob.n, generator=g, dtype=DT)
    warm, reports, rel, ok, its_warm = _solve_diag(prob, {}, tol=1e-12, max_iter=100, init=init)
    assert ok and not reports and rel <= 1e-12
    assert torch.allclose(warm, cold, rtol=1e-9, atol=1e-9 * float(cold.abs().max()) + 1e-12)
    assert its_warm <= its_cold
    # the exact solution as the start: converged at the first check
    _, _, _, ok, its = _solve_diag(prob, {}, tol=1e-12, max_iter=100, init=cold)
    assert ok and its == 1


def test_joint_diagonal_newton_warm_start_rejects_bad_init() -> None:
    prob = _three_layer_problem(0, 2, 3, 1)
    with pytest.raises(ValueError, match="expected a finite vector of shape"):
        _solve_diag(prob, {}, tol=1e-12, max_iter=100, init=torch.zeros(prob.n + 1, dtype=DT))
    with pytest.raises(ValueError, match="expected a finite vector of shape"):
        _solve_diag(prob, {}, tol=1e-12, max_iter=100, init=torch.full((prob.n,), float("nan")))
