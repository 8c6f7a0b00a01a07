"""Independent coupled blocks solved side by side, each on one intra-op thread (issue 28).

The coupled groups of a solve share no parameter, so each block's sweeps are the same
computation wherever they run: side by side (the default with several intra-op threads,
:func:`noetherflow._threads.side_by_side`) gives the numbers of one block after the other on
one thread, bit for bit, in the same order of steps; the helper keeps the caller's
context, the order of the results, the first error and the thread setting.
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar

import pytest
import torch
from test_sample_factors import _gpt2

import noetherflow as nf
from noetherflow._sweep_plan import sequential_sweeps, sweep_options
from noetherflow._threads import one_thread, side_by_side

_VAR: ContextVar[str] = ContextVar("test_side_by_side", default="unset")


def test_side_by_side_keeps_order_context_errors_and_threads() -> None:
    before = torch.get_num_threads()
    token = _VAR.set("caller")
    try:
        seen = side_by_side(
            [lambda i=i: (i, _VAR.get(), torch.get_num_threads()) for i in range(5)], 2
        )
    finally:
        _VAR.reset(token)
    assert seen == [(i, "caller", 1) for i in range(5)]
    assert torch.get_num_threads() == before

    def boom(msg: str) -> int:
        raise ValueError(msg)

    with pytest.raises(ValueError, match="first"):
        side_by_side([lambda: 1, lambda: boom("first"), lambda: boom("second")], 2)
    assert torch.get_num_threads() == before
    assert side_by_side([lambda: 3], 4) == [3]  # one task: run here


def test_side_by_side_runs_on_the_caller_too_each_task_in_its_own_context() -> None:
    caller = threading.get_ident()
    gate = threading.Barrier(2)

    def task(i: int) -> tuple[int, str]:
        if i < 2:
            gate.wait(timeout=10)  # the first two run at once: two threads
        seen = _VAR.get()
        _VAR.set(f"task {i}")  # stays in this task's context copy
        return threading.get_ident(), seen

    got = side_by_side([lambda i=i: task(i) for i in range(6)], 2)
    threads = {t for t, _ in got}
    assert caller in threads and len(threads) == 2
    assert [seen for _, seen in got] == ["unset"] * 6
    assert _VAR.get() == "unset"


def test_side_by_side_stops_taking_tasks_when_the_caller_is_interrupted() -> None:
    ran: list[int] = []
    caller = threading.get_ident()

    def task(i: int) -> int:
        ran.append(i)
        if threading.get_ident() == caller:
            raise KeyboardInterrupt
        time.sleep(0.05)
        return i

    with pytest.raises(KeyboardInterrupt):
        side_by_side([lambda i=i: task(i) for i in range(50)], 2)
    assert len(ran) < 50  # the helper finished its task and took no further one


def test_blocks_side_by_side_give_the_one_thread_numbers() -> None:
    syms, st, kw = _gpt2(ignore=False, layers=2)
    assert len(syms.coupled_groups()) == 2
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        together = nf.solve_equilibrium(syms, st, **kw)
        with one_thread(), sweep_options(parallel=False):
            alone = nf.solve_equilibrium(syms, st, **kw)
    finally:
        torch.set_num_threads(before)
    assert [i for i, _ in together.steps] == [i for i, _ in alone.steps]
    for (_, a), (_, b) in zip(together.steps, alone.steps, strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    assert together.iterations == alone.iterations and together.converged
    # the uncoupled part runs last but is merged first: its steps lead, in either mode
    coupled = {i for g in syms.coupled_groups() for i in g}
    kinds = [i in coupled for i, _ in together.steps]
    assert not kinds[0] and kinds == sorted(kinds)
    # each block's distances are computed in its task: the same as one after the other
    for name, d in together.distance.items():
        assert torch.equal(d, alone.distance[name]), name
    with sequential_sweeps():
        ref = nf.solve_equilibrium(syms, st, **kw)
    for name, d in together.distance.items():
        assert torch.allclose(d, ref.distance[name], rtol=1e-8, atol=1e-10), name
