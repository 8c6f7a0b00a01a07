"""The solver's large CPU products through NumPy's BLAS (issue 28).

A coupled block's sweeps spend most of their time in products of tall, thin operands: the
Grams ``[64, 768] · [768, 64]`` of a fused projection's head slices, the moves
``[768, 64] · [64, 64]`` of those slices, the samples' ``[128, 128] · [128, 2304]`` factor
products. On the CPUs this project is measured on (AMD EPYC), PyTorch's MKL runs these
shapes at about half the speed of the OpenBLAS that NumPy ships (single thread, float64:
the slice Grams 9.1 → 4.8 ms, the moves 8.1 → 6.4 ms, the factor products 10.0 → 6.4 ms;
square products alike, 48 and 52 GFLOP/s; benchmarks/README round 9). :func:`matmul` hands
such a product to NumPy when both operands are plain CPU tensors of one floating dtype that
autograd does not track (a zero-copy view: :meth:`torch.Tensor.numpy`), and to PyTorch
otherwise (CUDA, autograd, mixed dtypes) or when the switch is off
(:func:`noetherflow._sweep_plan.sweep_options` ``numpy_blas=False``). The numbers are a
product's to rounding; which library computes them does not depend on the data.

:func:`one_thread` runs NumPy's BLAS on one thread for its scope (threadpoolctl): a solve's
blocks run side by side on the cores (:mod:`noetherflow._threads`), each of its products on
the thread that asks, and the same numbers whether the blocks run side by side or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["matmul", "one_thread", "use_numpy"]

_NUMPY: ContextVar[bool] = ContextVar("noetherflow_numpy_blas", default=True)
_FLOATS = (torch.float32, torch.float64)
_CONTROLLER: Any = None  # threadpoolctl's view of the loaded BLAS libraries, made once


@contextmanager
def use_numpy(on: bool) -> Iterator[None]:
    """Within: :func:`matmul` through NumPy where it can (``on``), or always PyTorch."""
    token = _NUMPY.set(on)
    try:
        yield
    finally:
        _NUMPY.reset(token)


def _plain(t: Tensor, dtype: torch.dtype) -> bool:
    return (
        t.device.type == "cpu"
        and t.dtype == dtype
        and not t.requires_grad
        and t.layout == torch.strided
    )


def matmul(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """``a @ b`` (``torch.matmul``'s broadcasting), into ``out`` if given. Returns the product.

    ``out``: a tensor of the product's shape and dtype, written and returned (the result of
    a reused buffer, :mod:`noetherflow._scratch`). NumPy computes it where every operand is
    a plain CPU tensor of one dtype (float32 or float64), unless :func:`use_numpy` is off.
    """
    dt = a.dtype
    if (
        _NUMPY.get()
        and dt in _FLOATS
        and _plain(a, dt)
        and _plain(b, dt)
        and (out is None or (_plain(out, dt) and out.is_contiguous()))
    ):
        an, bn = a.detach().numpy(), b.detach().numpy()
        if out is None:
            return torch.from_numpy(np.matmul(an, bn))
        np.matmul(an, bn, out=out.numpy())
        return out
    if out is None:
        return torch.matmul(a, b)
    return torch.matmul(a, b, out=out)


@contextmanager
def one_thread() -> Iterator[None]:
    """Within, NumPy's BLAS runs on one thread (restored on exit); a no-op when switched off.

    Entered and left on the calling thread (threadpoolctl's context manager). NumPy's
    OpenBLAS has one process-wide setting, which threadpoolctl (≥ 3.8) lets one thread
    control at a time: a second solve overlapping the first on another thread leaves the
    setting to the first (its products may then run on NumPy's threads), and the first's
    exit restores it.
    """
    global _CONTROLLER
    if not _NUMPY.get():
        yield
        return
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    with _CONTROLLER.limit(limits=1, user_api="blas"):
        yield
