"""Parameters sharded by FSDP2 (``fully_shard``): DTensors split along one dim over the ranks.

A sharded parameter ``p`` (global shape ``[n, ...]``, placement ``Shard(dim)`` on a 1-D device
mesh of R ranks) holds on rank r the slice ``[r·c, min((r+1)·c, n))`` of ``dim``, with
c = ⌈n / R⌉ (``torch.chunk``'s split, which FSDP2 and DTensor both use). Every helper here
works on one parameter and is a no-op for a plain tensor, so the symmetry families can call
them unconditionally:

* :func:`full` gathers the whole tensor (an all-gather; every rank must call it);
* :func:`local_slice` is this rank's shard with its dim and offset, for actions that are
  restricted to a shard (a diagonal element's scaling, a rotation acting on the unsharded
  axis);
* :func:`sum_over_shards` all-reduces a quantity that is a sum of per-shard terms (a charge
  θᵀAθ with diagonal A, or the Gram matrix of the unsharded axis).

Only FSDP's own layout is supported: one ``Shard`` placement on a 1-D mesh. A 2-D mesh (HSDP,
or FSDP combined with tensor parallelism) would need every sum over shards to run over the
shard sub-group and a replica check over the other; :func:`check_layout` refuses it by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from noetherflow._errors import UnsupportedLayerError

__all__ = [
    "LocalSlice",
    "check_current",
    "check_layout",
    "full",
    "is_sharded",
    "local_slice",
    "refuse_sharded",
    "sum_over_shards",
    "write_local",
]


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return None
    return DTensor


def is_sharded(t: Any) -> bool:
    """Whether ``t`` (a parameter, a gradient, any tensor) is a DTensor."""
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def check_layout(t: Tensor, name: str = "a parameter") -> None:
    """Raise unless ``t`` is plain or FSDP2's layout: one ``Shard(dim)`` on a 1-D mesh.

    Raises:
        UnsupportedLayerError: naming the mesh and placements, and why they are refused.
    """
    if not is_sharded(t):
        return
    from torch.distributed.tensor import Shard

    mesh, places = t.device_mesh, t.placements  # type: ignore[attr-defined]
    if mesh.ndim != 1 or len(places) != 1 or type(places[0]) is not Shard:
        raise UnsupportedLayerError(
            f"{name} of shape {tuple(t.shape)} is a DTensor with placements {tuple(places)} on "
            f"a {mesh.ndim}-D device mesh {tuple(mesh.shape)}; noetherflow supports FSDP2's "
            "layout only: one Shard(dim) placement on a 1-D mesh (fully_shard without a 2-D "
            "mesh). A 2-D mesh (HSDP, FSDP with tensor parallelism) or a replicated / strided "
            "placement would need the sums over shards to run over the shard sub-group only, "
            "which is not implemented. Use fully_shard on a 1-D mesh, or DDP."
        )


@dataclass(frozen=True)
class LocalSlice:
    """This rank's shard ``local`` = ``full.narrow(dim, offset, local.shape[dim])``."""

    local: Tensor
    dim: int
    offset: int
    group: Any


def local_slice(t: Tensor) -> LocalSlice:
    """The local shard of a sharded ``t`` (a view: writing to it writes the parameter).

    For a plain tensor: the tensor itself, ``dim`` −1 (no axis is split), offset 0.
    """
    if not is_sharded(t):
        return LocalSlice(t, -1, 0, None)
    check_layout(t)
    mesh = t.device_mesh  # type: ignore[attr-defined]
    dim = t.placements[0].dim % t.dim()  # type: ignore[attr-defined]
    n, world, rank = int(t.shape[dim]), mesh.size(0), mesh.get_local_rank(0)
    chunk = -(-n // world)
    local = t.to_local()  # type: ignore[attr-defined]
    return LocalSlice(local, dim, min(rank * chunk, n), mesh.get_group(0))


def full(t: Tensor) -> Tensor:
    """``t`` as a plain tensor of its global shape (an all-gather when sharded)."""
    if not is_sharded(t):
        return t
    check_layout(t)
    return t.full_tensor()  # type: ignore[attr-defined]


def sum_over_shards(partial: Tensor, group: Any) -> Tensor:
    """Σ over the ranks of ``group`` of ``partial`` (a new tensor); the identity for None."""
    if group is None:
        return partial
    import torch.distributed as dist

    out = partial.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def shard_group(tensors: list[Tensor]) -> Any:
    """The process group of the first sharded tensor in ``tensors`` (None if none is)."""
    for t in tensors:
        if is_sharded(t):
            return local_slice(t).group
    return None


def axis_sums(ls: LocalSlice, axis: int, size: int) -> Tensor:
    """This shard's Σ over all dims but ``axis`` of ``ls.local``, placed in a ``[size]`` vector.

    When ``axis`` is the sharded dim the local entries sit at ``ls.offset``; otherwise they
    are partial sums of every entry. Summed over the shards this is the full tensor's
    per-index sum along ``axis``.
    """
    v = ls.local.movedim(axis, 0)
    if v.numel() == 0:  # an empty shard (fewer rows than ranks) adds nothing
        return v.new_zeros(size)
    part = v.reshape(v.shape[0], -1).sum(1)
    if axis != ls.dim:
        return part
    out = part.new_zeros(size)
    out[ls.offset : ls.offset + part.shape[0]] = part
    return out


_DETECTION = (
    "detection perturbs whole parameters and traces the model, so it runs before sharding: "
    "syms = nf.find_symmetries(model, x), then fully_shard(...). collect_stats, the solver, "
    "teleport and NoetherMonitor then point the set at the sharded parameters themselves."
)


def refuse_sharded(model: Any, who: str = "find_symmetries", why: str = _DETECTION) -> None:
    """Raise if ``model`` holds sharded parameters, for a tool that needs whole ones.

    Raises:
        UnsupportedLayerError: naming the sharded parameters, why ``who`` needs whole ones
            and what works instead (``why``).
    """
    bad = [n for n, p in model.named_parameters() if is_sharded(p)]
    if bad:
        raise UnsupportedLayerError(
            f"{who}: parameters {bad[:3]}{' ...' if len(bad) > 3 else ''} are sharded by FSDP "
            f"(fully_shard); {why}"
        )


def fingerprint_sums(t: Tensor) -> tuple[float, float, float]:
    """(Σθ, Σθ², Σ w_k θ_k) with w_k = k mod 13 + 1 over the flat global index k, shard-wise.

    The sums of :func:`noetherflow.equilibrium.fingerprint`, formed on each shard and
    all-reduced (a ``Shard(0)`` shard is a contiguous range of k); another sharded dim is
    gathered.
    """
    ls = local_slice(t)
    if ls.group is None or ls.dim != 0:
        x = full(t).reshape(-1).to(torch.float64)
        start, group = 0, None
    else:
        x = ls.local.reshape(-1).to(torch.float64)
        start, group = ls.offset * (t.numel() // max(int(t.shape[0]), 1)), ls.group
    k = torch.arange(start, start + x.numel(), dtype=torch.int64, device=x.device)
    w = (k % 13 + 1).to(torch.float64)
    sums = sum_over_shards(torch.stack([x.sum(), x @ x, x @ w]), group)
    a, b, c = sums.tolist()
    return (float(a), float(b), float(c))


def all_finite(t: Tensor, is_finite: Any) -> bool:
    """``is_finite`` of every shard, agreed over the ranks (one all-reduce when sharded)."""
    ls = local_slice(t)
    if ls.group is None:
        return bool(is_finite(t))
    bad = torch.tensor([0.0 if is_finite(ls.local) else 1.0], dtype=torch.float64, device=t.device)
    return float(sum_over_shards(bad, ls.group)) == 0.0


def write_local(t: Tensor, whole: Tensor) -> None:
    """Write into ``t`` (plain or sharded) the part of ``whole`` (``t``'s global shape) it holds."""
    ls = local_slice(t)
    if ls.group is None:
        ls.local.copy_(whole)
    else:
        ls.local.copy_(whole.narrow(ls.dim, ls.offset, ls.local.shape[ls.dim]))


def check_current(params: Any, who: str) -> None:
    """Raise if a parameter was replaced by ``fully_shard`` (the set still holds the old one).

    FSDP2 marks each original parameter it replaces (``_fsdp_orig_uid``); its values stay
    those from before sharding, so a charge or a move computed on it would be silently stale.

    Raises:
        StatisticsError: naming the fix (bind the set to the sharded model).
    """
    stale = [tuple(p.shape) for p in params if hasattr(p, "_fsdp_orig_uid")]
    if stale:
        from noetherflow._errors import StatisticsError

        raise StatisticsError(
            f"{who}: parameters of shapes {stale[:3]} were replaced by fully_shard after this "
            "symmetry set was built; the set still holds the old (unsharded, no longer "
            "trained) tensors. Point it at the sharded model first: any of nf.collect_stats, "
            "nf.capture, nf.NoetherMonitor or nf.teleport(model, ...) does so, or call "
            "noetherflow.stats.fsdp.bind_sharded(model, syms)."
        )
