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
collective.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from noetherflow._errors import StatisticsError
from noetherflow.stats.core import GradStats

__all__ = ["all_reduce_mean", "all_reduce_stats", "is_distributed", "unwrap_ddp"]


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


def _entries(stats: GradStats) -> list[tuple[str, Any, int]]:
    """(field, key, slot) of every reducible tensor, in the order every rank shares."""
    out: list[tuple[str, Any, int]] = []
    out += [("mean", k, 0) for k in stats.mean]
    out += [("sq", k, 0) for k in stats.sq]
    out += [("sq_axis", k, 0) for k in stats.sq_axis]
    for k in stats.side:
        out += [("side", k, 0), ("side", k, 1)]
    out += [("dense", k, 0) for k in stats.dense]
    return out


def _get(stats: GradStats, field: str, key: Any, slot: int) -> Tensor:
    if field == "side":
        return stats.side[key][slot]
    t: Tensor = getattr(stats, field)[key]
    return t


def _set(stats: GradStats, field: str, key: Any, slot: int, value: Tensor) -> None:
    if field == "side":
        pair = list(stats.side[key])
        pair[slot] = value
        stats.side[key] = (pair[0], pair[1])
    else:
        getattr(stats, field)[key] = value


def all_reduce_stats(stats: GradStats, *, group: Any = None) -> GradStats:
    """Turn each rank's statistics into those of the global batch, in place; returns ``stats``.

    Entries are combined as Σ_r (N_r/N)·stat_r (:mod:`module docstring <.distributed>`), so
    ranks may hold different batch sizes. Per-sample gradients are all-gathered in rank order.
    A no-op when ``torch.distributed`` is not initialised or the group has one rank. Every rank
    of ``group`` must call it with statistics of the same symmetry set.

    Raises:
        StatisticsError: the ranks hold statistics of different shapes (different symmetry
            sets or estimators), which would otherwise corrupt the reduction silently.
    """
    if not is_distributed() or dist.get_world_size(group) == 1:
        return stats
    entries = _entries(stats)
    tensors = [_get(stats, *e) for e in entries]
    if not tensors:
        raise StatisticsError("all_reduce_stats: the statistics are empty; nothing to reduce.")
    dev = _meta_device(tensors[0], group)
    numel = sum(t.numel() for t in tensors)
    s_numel = sum(t[0].numel() for t in stats.samples.values())
    meta = torch.tensor([stats.n, numel, len(tensors), s_numel], dtype=torch.int64, device=dev)
    world = dist.get_world_size(group)
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(metas, meta, group=group)
    table = torch.stack(metas).cpu()
    if (table[:, 1:] != table[0, 1:]).any():
        raise StatisticsError(
            "all_reduce_stats: ranks hold statistics of different shapes (per rank: "
            f"[numel, tensors, per-sample numel] = {table[:, 1:].tolist()}); expected the same "
            "symmetry set and estimator on every rank."
        )
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
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        off = 0
        for i in idx:
            t = tensors[i]
            part = flat[off : off + t.numel()].view(t.shape).to(t.device)
            off += t.numel()
            _set(stats, *entries[i], part)

    if stats.samples:
        stats.samples = _gather_samples(stats.samples, counts, dev, group)
    stats.n = total
    return stats


def _gather_samples(
    samples: dict[nn.Parameter, Tensor], counts: list[int], dev: torch.device, group: Any
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
        dist.all_gather(bufs, padded, group=group)
        full = torch.cat([b[:c] for b, c in zip(bufs, counts, strict=True)])
        off = 0
        for k in ks:
            shape = samples[k].shape[1:]
            size = samples[k][0].numel()
            out[k] = full[:, off : off + size].reshape(-1, *shape).to(samples[k].device)
            off += size
    return {k: out[k] for k in keys}


def all_reduce_mean(value: Tensor, n: int, *, group: Any = None) -> Tensor:
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
    dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
    return (buf[:-1] / buf[-1]).to(value.dtype).view(value.shape).to(value.device)
