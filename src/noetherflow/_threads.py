"""One intra-op thread for small dense linear algebra.

PyTorch's CPU kernels split even a 64×64 ``eigh``, ``matrix_exp`` or ``inv`` across its
OpenMP threads. At that size the split costs more than the arithmetic, and on a machine
whose cores are busy with other work the threads wait for one another: on 2 shared cores a
64×64 ``matrix_exp`` took 0.26 s on 2 threads and 3 ms on one. The per-head rotations of a
transformer (24 per block) solve, act and draw group elements with such matrices, hundreds of
times per detection or solve, so those paths run on one thread. Results are the same
numbers: LAPACK/BLAS on matrices this small do not split the reductions.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

import torch

__all__ = ["one_thread", "side_by_side"]

T = TypeVar("T")


@contextmanager
def one_thread() -> Iterator[None]:
    """Within, torch runs its CPU operations on one intra-op thread (restored on exit)."""
    before = torch.get_num_threads()
    if before <= 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def side_by_side(tasks: Sequence[Callable[[], T]], workers: int) -> list[T]:
    """Run independent ``tasks`` on up to ``workers`` threads, each on one intra-op thread.

    For pieces of work made of many small operations (the coupled blocks of one solve): each
    task runs on its own core, with no OpenMP team to wait for after every small operation,
    and computes what it computes alone on one thread (the same numbers). Each runs in a copy
    of the caller's context (its ContextVars, e.g. the solver's sweep options). The calling
    thread is one of the workers: each thread takes the next task in order when it is free.
    (A new thread's memory arena starts empty, so its first task page-faults in its whole
    working set: on GPT-2 124M ~30k faults of ~9 µs per worker, and the caller's arena is
    the one a training step just freed.) Results in the order of ``tasks``; the first task's
    error, in that order, is raised once all have run. ``workers`` ≤ 1 (or one task): the
    tasks run here, one after the other, on the caller's threads.
    """
    if workers <= 1 or len(tasks) <= 1:
        return [t() for t in tasks]
    caller = contextvars.copy_context()
    queue = iter(enumerate(tasks))
    lock = threading.Lock()
    stop = threading.Event()  # the caller was interrupted: take no further task
    results: dict[int, T] = {}
    errors: dict[int, Exception] = {}

    def drain() -> None:
        torch.set_num_threads(1)  # this thread's own setting (the caller's is restored)
        while not stop.is_set():
            with lock:
                item = next(queue, None)
            if item is None:
                return
            i, task = item
            try:
                results[i] = caller.copy().run(task)
            except Exception as e:  # kept, raised in the tasks' order after all have run
                errors[i] = e

    before = torch.get_num_threads()
    others = min(workers, len(tasks)) - 1
    try:
        with ThreadPoolExecutor(max_workers=others) as pool:
            helpers = [pool.submit(drain) for _ in range(others)]
            try:
                drain()
            except BaseException:
                stop.set()  # e.g. KeyboardInterrupt: the helpers finish their task, then stop
                raise
            for f in helpers:
                f.result()
    finally:
        torch.set_num_threads(before)
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(tasks))]
