"""Statistics of the global batch under ``torch.distributed`` (DDP): one all-reduce, no extra pass.

Every entry of :class:`~noetherflow.stats.core.GradStats` is an average over the N_r samples
of rank r, so the statistic of the global batch of N = Σ_r N_r samples is the weighted mean

    stat = Σ_r (N_r / N) · stat_r,

which one ``all_reduce(SUM)`` of the pre-weighted tensors gives exactly (uneven batches
included). Per-sample gradients (kept only for coupled symmetries) are gathered instead, in
rank order, so they equal those of the concatenated batch ``cat([x_0, x_1, …])``.

Multi-machine runs need nothing beyond ``torch.distributed``: start one process per device
with ``torchrun`` on every machine (see ``examples/ddp_torchrun.py``). Every rank must call
the reducing function the same number of times with the same symmetry set, as for any
collective: the set is compared across ranks first (names, families, shapes, order), and a
rank that does not join is reported after ``timeout`` (default :data:`DEFAULT_TIMEOUT`)
instead of hanging until the process group's own timeout.
"""

from __future__ import annotations

import hashlib
import math
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from noetherflow._checks import check_timeout
from noetherflow._errors import StatisticsError
from noetherflow.stats.core import GradStats, StatsBlock
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "DEFAULT_TIMEOUT",
    "all_reduce_mean",
    "all_reduce_stats",
    "is_distributed",
    "signature",
    "unwrap_ddp",
]

#: How long a rank waits for the others at one collective before raising (instead of the
#: process group's 30-minute default). Pass ``timeout=`` to override per call.
DEFAULT_TIMEOUT = timedelta(minutes=5)


def is_distributed() -> bool:
    """True when ``torch.distributed`` is available and a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def unwrap_ddp(model: nn.Module) -> nn.Module:
    """The module inside a ``DistributedDataParallel`` wrapper (the same Parameter objects)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _meta_device(t: Tensor, group: Any) -> torch.device:
    # NCCL reduces CUDA tensors only; gloo takes CPU (and CUDA via staging).
    if dist.get_backend(group) == "nccl" and t.device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


def _entries(stats: GradStats) -> list[tuple[StatsBlock | None, Any]]:
    """(block or None for the mean, entry) of every reducible tensor, in a shared order."""
    out: list[tuple[StatsBlock | None, Any]] = [(None, p) for p in stats.mean]
    for key in sorted(stats.blocks):
        b = stats.blocks[key]
        out += [(b, e) for e in b.entries()]
    return out


def _get(stats: GradStats, block: StatsBlock | None, entry: Any) -> Tensor:
    return stats.mean[entry] if block is None else block.get_entry(entry)


def _set(stats: GradStats, block: StatsBlock | None, entry: Any, value: Tensor) -> None:
    if block is None:
        stats.mean[entry] = value
    else:
        block.set_entry(entry, value)


def signature(stats: GradStats, syms: SymmetrySet | None = None) -> list[Any]:
    """What every rank must share.

    Symmetry names, families and parameter shapes in order, and the layout (blocks, shapes)
    of the statistics.
    """
    sig: list[Any] = []
    if syms is not None:
        sig += [(n, type(s).__name__, [tuple(p.shape) for p in s.params]) for n, s in syms.items()]
    sig.append(sorted(stats.blocks))
    sig += [tuple(_get(stats, b, e).shape) for b, e in _entries(stats)]
    sig.append(sorted(tuple(t.shape[1:]) for t in stats.samples.values()))
    return sig


def _digest(obj: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(obj).encode()).digest()[:7], "big")


def _wait(work: Any, timeout: timedelta, what: str) -> None:
    """Wait for an async collective, or raise a clear error after ``timeout``."""
    try:
        ok = work.wait(timeout=timeout)
    except RuntimeError as e:  # gloo raises on timeout
        raise StatisticsError(
            f"{what}: the other ranks did not join within {timeout.total_seconds():g} s ({e}). "
            "Every rank must call collect_stats / read Capture.stats (and mon.track()/step()) "
            "the same number of times with the same symmetry set; a rank that skips one (an "
            "early exit, a condition on the rank, an uneven number of batches) leaves the "
            "others waiting. Raise the limit with timeout=... if a rank is merely slow."
        ) from None
    if ok is False:
        raise StatisticsError(
            f"{what}: the other ranks did not join within {timeout.total_seconds():g} s; every "
            "rank must call it the same number of times with the same symmetry set."
        )


def _timeout(timeout: float | timedelta | None) -> timedelta:
    return check_timeout(timeout) or DEFAULT_TIMEOUT


# -- what every rank must share before the reduction (DDP checks) ----------------------------
# One all_gather of a fixed-size float64 row per rank, so that a mismatch is reported before
# a collective whose sizes or dtypes differ across ranks (gloo aborts the process on those):
# [N_r, layout digest (2 × 28 bits), dtype digest, parameter checksum (3)].
_META = 7


def _split(d: int) -> tuple[float, float]:
    return float(d >> 28), float(d & (2**28 - 1))  # exact in float64


def _checksum(stats: GradStats) -> list[float]:
    """Σ_i c_i·(Σθ, Σθ², Σwθ)_i over the parameters' fingerprints (NaN: none recorded)."""
    fps = list(stats.fingerprint.values())
    if not fps:
        return [math.nan] * 3
    c = [1.0 + i / len(fps) for i in range(len(fps))]  # weights: a swap of two params shows
    return [sum(ci * f[k] for ci, f in zip(c, fps, strict=True)) for k in range(3)]


def _rank_meta(stats: GradStats, sig: list[Any], dev: torch.device) -> Tensor:
    """This rank's row of the check table (see :data:`_META`)."""
    dtypes = [str(t.dtype) for _, t in stats.tensors()] + [
        str(t.dtype) for t in stats.samples.values()
    ]
    row = [float(stats.n), *_split(_digest(sig)), float(_digest(dtypes) >> 28)]
    return torch.tensor(row + _checksum(stats), dtype=torch.float64, device=dev)


def _check_ranks_agree(table: Tensor, sig: list[Any], tensors: list[Tensor]) -> None:
    """Raise if the ranks' rows differ: layout, dtype, or parameter values (no DDP wrapper)."""
    world = table.shape[0]
    diff = lambda cols: [  # noqa: E731
        r for r in range(world) if not torch.equal(table[r, cols], table[0, cols])
    ]
    bad = diff(slice(1, 3))
    if bad:
        raise StatisticsError(
            f"all_reduce_stats: ranks {bad} hold a different symmetry set or statistics layout "
            f"than rank 0 (names, families, parameter shapes or order; this rank: {sig[:4]}…); "
            "expected the same symmetry set, in the same order, and the same estimator and "
            "level on every rank. Build the set the same way on every rank (e.g. from the "
            "same model before wrapping it in DDP)."
        )
    bad = diff(slice(3, 4))
    if bad:
        mine = sorted({str(t.dtype).removeprefix("torch.") for t in tensors})
        raise StatisticsError(
            f"all_reduce_stats: ranks {bad} hold statistics in another dtype than rank 0 (this "
            f"rank: {mine}); expected the same dtype on every rank, or the reduction would mix "
            "precisions (gloo aborts the process). Convert the model the same way on every "
            "rank (e.g. model.to(torch.float32) before wrapping it in DDP)."
        )
    sums = table[:, 4:]
    if not bool(torch.isfinite(sums).all()):
        return  # a rank without a fingerprint (statistics built by hand): not checked
    scale = sums[:, 1:2].abs() + sums.abs()  # Σθ² bounds the other two sums' rounding
    off = ((sums - sums[0]).abs() > 1e-9 * scale.amax(0)).any(1)
    bad = [r for r in range(world) if bool(off[r])]
    if bad:
        raise StatisticsError(
            f"all_reduce_stats: ranks {bad} hold other parameter values than rank 0 (a "
            "checksum of the symmetry set's parameters differs), so their statistics are those "
            "of different models and averaging them would be meaningless; expected the same "
            "parameters on every rank. Wrap the model in DistributedDataParallel (it keeps the "
            "ranks equal), or broadcast the parameters from rank 0 "
            "(torch.distributed.broadcast) after initialising them."
        )


def all_reduce_stats(
    stats: GradStats,
    *,
    group: Any = None,
    syms: SymmetrySet | None = None,
    timeout: float | timedelta | None = None,
) -> GradStats:
    """Turn each rank's statistics into those of the global batch, in place; returns ``stats``.

    Entries are combined as Σ_r (N_r/N)·stat_r (:mod:`module docstring <.distributed>`), so
    ranks may hold different batch sizes. Per-sample gradients are all-gathered in rank order.
    A no-op when ``torch.distributed`` is not initialised or the group has one rank. Every rank
    of ``group`` must call it with statistics of the same symmetry set (``syms``, when given,
    is compared by names, families, parameter shapes and order before anything is reduced).

    Args:
        stats: this rank's statistics, overwritten with those of the global batch.
        group: the ``torch.distributed`` process group; default the world.
        syms: the symmetry set the statistics belong to, checked to be the same on every rank.
        timeout: seconds (or a timedelta) to wait for the other ranks at each collective
            before raising; default :data:`DEFAULT_TIMEOUT`.

    Raises:
        StatisticsError: the ranks hold different symmetry sets, statistics of different
            shapes or dtypes, or statistics at different parameter values (which would
            otherwise corrupt the reduction silently or abort gloo), or a rank did not join
            within ``timeout``.
    """
    if not is_distributed() or dist.get_world_size(group) == 1:
        return stats
    limit = _timeout(timeout)
    entries = _entries(stats)
    tensors = [_get(stats, *e) for e in entries]
    if not tensors:
        raise StatisticsError("all_reduce_stats: the statistics are empty; nothing to reduce.")
    dev = _meta_device(tensors[0], group)
    sig = signature(stats, syms)
    meta = _rank_meta(stats, sig, dev)
    world = dist.get_world_size(group)
    metas = [torch.empty_like(meta) for _ in range(world)]
    _wait(
        dist.all_gather(metas, meta, group=group, async_op=True),
        limit,
        "all_reduce_stats (symmetry-set check)",
    )
    table = torch.stack(metas).cpu()
    _check_ranks_agree(table, sig, tensors)
    counts = [int(c) for c in table[:, 0]]
    total = sum(counts)
    weight = stats.n / total

    # one flat all-reduce per dtype
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for dtype in sorted(by_dtype, key=str):
        idx = by_dtype[dtype]
        flat = torch.cat([tensors[i].reshape(-1).to(dev) for i in idx]) * weight
        _wait(
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True),
            limit,
            "all_reduce_stats",
        )
        off = 0
        for i in idx:
            t = tensors[i]
            part = flat[off : off + t.numel()].view(t.shape).to(t.device)
            off += t.numel()
            _set(stats, *entries[i], part)

    if stats.samples:
        stats.samples = _gather_samples(stats.samples, counts, dev, group, limit)
    stats.n = total
    return stats


def _gather_samples(
    samples: dict[nn.Parameter, Tensor],
    counts: list[int],
    dev: torch.device,
    group: Any,
    limit: timedelta,
) -> dict[nn.Parameter, Tensor]:
    """Concatenate per-sample gradients ``[N_r, *shape]`` of all ranks in rank order."""
    keys = list(samples)
    n_max = max(counts)
    out: dict[nn.Parameter, Tensor] = {}
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for k in keys:
        by_dtype.setdefault(samples[k].dtype, []).append(k)
    for dtype in sorted(by_dtype, key=str):
        ks = by_dtype[dtype]
        local = torch.cat([samples[k].reshape(samples[k].shape[0], -1).to(dev) for k in ks], 1)
        padded = local.new_zeros(n_max, local.shape[1])
        padded[: local.shape[0]] = local
        bufs = [torch.empty_like(padded) for _ in counts]
        _wait(
            dist.all_gather(bufs, padded, group=group, async_op=True),
            limit,
            "all_reduce_stats (per-sample gradients)",
        )
        full = torch.cat([b[:c] for b, c in zip(bufs, counts, strict=True)])
        off = 0
        for k in ks:
            shape = samples[k].shape[1:]
            size = samples[k][0].numel()
            out[k] = full[:, off : off + size].reshape(-1, *shape).to(samples[k].device)
            off += size
    return {k: out[k] for k in keys}


def all_reduce_mean(
    value: Tensor, n: int, *, group: Any = None, timeout: float | timedelta | None = None
) -> Tensor:
    """The sample-weighted mean Σ_r N_r·value_r / Σ_r N_r over ranks (e.g. a mean loss).

    Returns ``value`` unchanged (detached) when not distributed. ``value`` may have any shape.
    """
    value = value.detach()
    if not is_distributed() or dist.get_world_size(group) == 1:
        return value
    dev = _meta_device(value, group)
    buf = torch.cat(
        [
            value.reshape(-1).to(dev, torch.float64) * n,
            torch.tensor([float(n)], dtype=torch.float64, device=dev),
        ]
    )
    _wait(
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group, async_op=True),
        _timeout(timeout),
        "all_reduce_mean",
    )
    return (buf[:-1] / buf[-1]).to(value.dtype).view(value.shape).to(value.device)
