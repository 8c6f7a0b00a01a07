"""Per-thread scratch buffers for the products of a coupled block's sweeps.

Every sweep moves θ, ḡ and the per-sample factors of a fused projection by batched products
whose results are copied back in place (GPT-2's ``c_attn``: 14 MB in float64 per product). A
fresh result is a fresh allocation each time; on a worker thread's arena glibc's allocator
hands the freed memory back to the system and faults it in again on the next product
(measured on GPT-2 124M, 2 threads: about 60,000 page faults per solve in the moves alone).
Within :func:`reuse`, :func:`buffer` gives one buffer per (name, shape, dtype, device) per
thread instead, alive until the scope ends.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from noetherflow._blas import matmul

__all__ = ["bmm_", "buffer", "left_mm_", "reuse"]

# per scope, each thread's buffers by (name, shape, dtype, device); a ContextVar, so that the
# worker threads of a solve (noetherflow._threads.side_by_side copies the context) share it
_SCOPE: contextvars.ContextVar[dict[int, dict[tuple[Any, ...], Tensor]] | None] = (
    contextvars.ContextVar("noetherflow_scratch", default=None)
)


@contextmanager
def reuse() -> Iterator[None]:
    """Within (and in the threads it starts with this context), :func:`buffer` reuses buffers.

    They are freed on exit. Nested scopes use the outermost.
    """
    if _SCOPE.get() is not None:
        yield
        return
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def buffer(name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised tensor ``shape`` for a product's result, consumed before the next call.

    The same tensor for the same (``name``, shape, dtype, device) on this thread within
    :func:`reuse` (a caller copies the result out before asking again); a new one outside.
    """
    scope = _SCOPE.get()
    key = (name, tuple(shape), dtype, device)
    if scope is None:
        return torch.empty(key[1], dtype=dtype, device=device)
    pool = scope.setdefault(threading.get_ident(), {})
    out = pool.get(key)
    if out is None:
        out = pool[key] = torch.empty(key[1], dtype=dtype, device=device)
    return out


def bmm_(x: Tensor, mats: Tensor, name: str) -> None:
    """x[b] → x[b] · mats[b] in place, each product written into the buffer ``name`` first.

    ``x``: ``[B, n, d]`` (a strided view of the tensor to move); ``mats``: ``[B, d, d]``.
    One ``[n, d]`` product at a time: on GPT-2's ``c_attn`` (``x`` a [36, 768, 64] view of
    its [768, 2304] weight) 20–25% faster on one CPU thread than one ``bmm`` into a
    ``[B, n, d]`` buffer and one strided copy back, the same numbers bit for bit
    (benchmarks/README round 8), and the buffer 1/B of the size.
    """
    out = buffer(name, x.shape[1:], x.dtype, x.device)
    for xb, mb in zip(x.unbind(0), mats.unbind(0), strict=True):
        xb.copy_(matmul(xb, mb, out=out))


def left_mm_(mats: Tensor, y: Tensor, name: str) -> None:
    """y[b] → mats[b] · y[b] in place, each product written into the buffer ``name`` first.

    ``mats``: ``[B, d, d]``; ``y``: ``[B, d, m]`` (a strided view of the tensor to move).
    """
    out = buffer(name, y.shape[1:], y.dtype, y.device)
    for yb, mb in zip(y.unbind(0), mats.unbind(0), strict=True):
        yb.copy_(matmul(mb, yb, out=out))
