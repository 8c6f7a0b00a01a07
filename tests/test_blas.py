"""The solver's products through NumPy's BLAS (noetherflow._blas) against torch.matmul."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from test_solver_batched import KW, _model
from torch import Tensor, nn

import noetherflow as nf
from noetherflow import _blas
from noetherflow._scratch import bmm_, left_mm_
from noetherflow._sweep_plan import sweep_options


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls that reach NumPy's matmul."""
    calls: list[int] = []
    real = np.matmul

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(_blas.np, "matmul", counted)
    return calls


def _pairs() -> list[tuple[str, Tensor, Tensor]]:
    """Operand layouts the solver multiplies: strided slices, transposes, batches, factors."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    w = r(48, 36)  # a fused projection: its [48, 6] head slices are strided views
    heads = w.view(48, 6, 6).permute(1, 2, 0)  # [B, d, rows]: a slice Gram's operand
    fortran = torch.linalg.qr(r(3, 8, 20).mT, mode="r")[1]  # column-major R factors
    assert fortran.stride()[-2] == 1
    return [
        ("slice gram", heads, heads.mT),
        ("slice move", w[:, 6:12], r(6, 6)),
        ("row move", r(6, 6), r(18, 30)[6:12]),
        ("fortran factor", fortran, r(3, 8, 36)),
        ("batched", r(24, 6, 6), r(24, 6, 6).mT),
        ("broadcast", r(5, 4, 3), r(3, 2)),
    ]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matmul_is_torch_matmul_through_numpy(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting(monkeypatch)
    for name, a, b in _pairs():
        a, b = a.to(dtype), b.to(dtype)
        got = _blas.matmul(a, b)
        want = torch.matmul(a, b)
        assert got.dtype == dtype and got.shape == want.shape, name
        tol = 1e-13 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=name)
    assert len(calls) == len(_pairs())  # every one of them went through NumPy


def test_matmul_writes_into_out_and_returns_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    a, b = torch.randn(7, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    out = torch.full((7, 3), float("nan"), dtype=torch.float64)
    assert _blas.matmul(a, b, out=out) is out
    torch.testing.assert_close(out, a @ b, rtol=1e-14, atol=1e-14)
    # a strided out cannot take NumPy's result in place: torch writes it
    wide = torch.zeros(7, 6, dtype=torch.float64)
    assert _blas.matmul(a, b, out=wide[:, :3]).data_ptr() == wide.data_ptr()
    torch.testing.assert_close(wide[:, :3], a @ b, rtol=1e-14, atol=1e-14)
    assert len(calls) == 1


def test_matmul_leaves_autograd_mixed_and_integer_operands_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting(monkeypatch)
    a = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 2, dtype=torch.float64)
    out = _blas.matmul(a, b)
    assert out.grad_fn is not None  # the product stays differentiable
    out.sum().backward()
    torch.testing.assert_close(a.grad, b.sum(1).expand(4, 3))
    ints = torch.arange(6).reshape(2, 3)
    assert torch.equal(_blas.matmul(ints, ints.mT), ints @ ints.mT)
    with pytest.raises(RuntimeError):  # torch's own error for mixed dtypes
        _blas.matmul(b.float().T, b)
    with _blas.use_numpy(False):
        _blas.matmul(b.T, b)
    assert calls == []


def test_scratch_moves_go_through_numpy_and_match_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(20, 12, generator=g, dtype=torch.float64)
    mats = torch.randn(3, 4, 4, generator=g, dtype=torch.float64)
    want = w.clone()
    for b in range(3):
        want[:, 4 * b : 4 * b + 4] = want[:, 4 * b : 4 * b + 4] @ mats[b]
    calls = _counting(monkeypatch)
    bmm_(w.view(20, 3, 4).transpose(0, 1), mats, "t")
    torch.testing.assert_close(w, want, rtol=1e-14, atol=1e-14)
    rows = torch.randn(12, 5, generator=g, dtype=torch.float64)
    want = torch.cat([mats[b] @ rows[4 * b : 4 * b + 4] for b in range(3)])
    left_mm_(mats, rows.view(3, 4, 5), "r")
    torch.testing.assert_close(rows, want, rtol=1e-14, atol=1e-14)
    assert len(calls) == 6


def _blas_threads() -> list[int]:
    """The threads of the BLAS libraries the limit covers (NumPy's: loaded with _blas)."""
    with _blas.one_thread():  # makes the controller, if no scope has yet
        pass
    return [i["num_threads"] for i in _blas._CONTROLLER.select(user_api="blas").info()]


def test_one_thread_limits_numpys_blas_and_restores_it() -> None:
    before = _blas_threads()
    assert before  # NumPy's OpenBLAS is loaded
    with _blas.one_thread():
        assert set(_blas_threads()) == {1}
    assert _blas_threads() == before
    with _blas.use_numpy(False), _blas.one_thread():  # off: nothing limited
        assert _blas_threads() == before


def test_a_scope_on_another_thread_leaves_the_setting_to_the_first() -> None:
    before = _blas_threads()
    entered, leave = threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def second() -> None:  # overlaps the first scope, leaves first
        with _blas.one_thread():
            entered.set()
            leave.wait(5)
        seen.append(set(_blas_threads()))  # the first scope is still open: still limited

    with _blas.one_thread():
        t = threading.Thread(target=second)
        t.start()
        assert entered.wait(5)
        leave.set()
        t.join(5)
        assert set(_blas_threads()) == {1}
    assert seen == [{1}]
    assert _blas_threads() == before  # restored once, by the first
    t = threading.Thread(target=lambda: seen.append(_scope_threads()))
    t.start()
    t.join(5)
    assert seen[-1] == {1}  # another thread may take control once the first let go
    assert _blas_threads() == before


def _scope_threads() -> set[int]:
    with _blas.one_thread():
        return set(_blas_threads())


def test_a_solve_is_the_same_through_either_library(monkeypatch: pytest.MonkeyPatch) -> None:
    m, syms, x, y = _model(heads=4, inputs=20)
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)  # the hooks: factored samples
    calls = _counting(monkeypatch)
    fast = nf.solve_equilibrium(syms, st, **KW)
    assert calls  # the sweeps' products went through NumPy
    with sweep_options(numpy_blas=False):
        ref = nf.solve_equilibrium(syms, st, **KW)
    assert fast.iterations == ref.iterations > 2
    for k, d in ref.distance.items():
        torch.testing.assert_close(fast.distance[k], d, rtol=1e-11, atol=1e-13 * ref.max_distance())
