"""The solver's scratch buffers (noetherflow._scratch) and what the solve does with them."""

from __future__ import annotations

import contextlib
import threading

import torch
from test_solver_batched import KW, _model, _stats

import noetherflow as nf
from noetherflow import _scratch
from noetherflow._checks import fingerprint
from noetherflow._threads import side_by_side

CPU = torch.device("cpu")


def test_one_buffer_per_key_within_a_scope_and_fresh_outside() -> None:
    with _scratch.reuse():
        a = _scratch.buffer("x", (3, 4), torch.float64, CPU)
        assert _scratch.buffer("x", (3, 4), torch.float64, CPU) is a
        assert _scratch.buffer("x", (4, 3), torch.float64, CPU) is not a
        assert _scratch.buffer("x", (3, 4), torch.float32, CPU) is not a
        assert _scratch.buffer("y", (3, 4), torch.float64, CPU) is not a
        with _scratch.reuse():  # nested: the outer scope serves
            assert _scratch.buffer("x", (3, 4), torch.float64, CPU) is a
    with _scratch.reuse():  # a new scope: the old buffers are gone
        assert _scratch.buffer("x", (3, 4), torch.float64, CPU) is not a
    outside = _scratch.buffer("x", (3, 4), torch.float64, CPU)
    assert _scratch.buffer("x", (3, 4), torch.float64, CPU) is not outside


def test_each_thread_of_a_scope_gets_its_own_buffer() -> None:
    barrier = threading.Barrier(2)

    def grab() -> tuple[int, int]:
        first = _scratch.buffer("x", (5,), torch.float64, CPU)
        barrier.wait()  # both threads hold their buffer at once
        again = _scratch.buffer("x", (5,), torch.float64, CPU)
        assert again is first
        return threading.get_ident(), first.data_ptr()

    with _scratch.reuse():
        got = side_by_side([grab, grab], workers=2)
    assert got[0][0] != got[1][0] and got[0][1] != got[1][1]


def test_the_solution_is_stamped_with_the_parameters_fingerprint() -> None:
    # the stamp reuses the statistics check's fingerprints: the same numbers as computing it
    model, syms, x, y = _model()
    st = _stats(model, syms, x, y)
    sol = nf.solve_equilibrium(syms, st, **KW)
    assert sol.fingerprint == fingerprint(syms.params())
    st.fingerprint = {}  # statistics that recorded none: every entry computed here
    assert nf.solve_equilibrium(syms, st, **KW).fingerprint == sol.fingerprint


def test_bmm_moves_in_place_inside_and_outside_a_scope() -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(8, 3, 5, generator=g, dtype=torch.float64)
    mats = torch.randn(3, 4, 4, generator=g, dtype=torch.float64) + 3 * torch.eye(4)
    want = base.clone()
    want[:, :, 1:] = (base[:, :, 1:].transpose(0, 1) @ mats).transpose(0, 1)
    for scoped in (False, True):
        y = base.clone()
        with _scratch.reuse() if scoped else contextlib.nullcontext():
            _scratch.bmm_(y[:, :, 1:].transpose(0, 1), mats, "t")  # a strided view, moved in place
            _scratch.bmm_(
                y[:, :, 1:].transpose(0, 1), torch.linalg.inv(mats), "t"
            )  # the buffer again
        assert torch.allclose(y, base, rtol=0, atol=1e-12)
        _scratch.bmm_(y[:, :, 1:].transpose(0, 1), mats, "t")
        assert torch.allclose(y, want, rtol=0, atol=1e-13)


def test_left_mm_moves_in_place_as_one_broadcast_product() -> None:
    # the rows of an output projection: y[b] → M_b y[b], a strided view moved slice by slice
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 4, 7, generator=g, dtype=torch.float64)
    mats = torch.randn(3, 4, 4, generator=g, dtype=torch.float64) + 3 * torch.eye(4)
    want = base.clone()
    want[:, :, 2:] = torch.matmul(mats, base[:, :, 2:])
    for scoped in (False, True):
        y = base.clone()
        with _scratch.reuse() if scoped else contextlib.nullcontext():
            _scratch.left_mm_(mats, y[:, :, 2:], "t")
            assert torch.allclose(y, want, rtol=0, atol=1e-13)
            _scratch.left_mm_(torch.linalg.inv(mats), y[:, :, 2:], "t")  # the buffer again
        assert torch.allclose(y, base, rtol=0, atol=1e-12)
