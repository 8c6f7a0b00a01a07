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

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["one_thread"]


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
