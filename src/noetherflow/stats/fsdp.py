"""FSDP guard: the statistics refuse sharded parameters instead of returning local numbers.

Under ``torch.distributed.fsdp.fully_shard`` every parameter is a ``DTensor`` sharded on
dim 0: each rank holds a slice of the weight and of its gradient, so per-coordinate moments,
moments of row/column blocks and the charges would be computed on shards and be silently
wrong. Until the statistics gather shards, they raise a clear error instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from noetherflow._errors import UnsupportedLayerError

__all__ = ["check_not_sharded"]


def _is_dtensor(p: nn.Parameter) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(p, DTensor) or isinstance(getattr(p, "data", None), DTensor)


def check_not_sharded(params: Iterable[nn.Parameter], names: dict[int, str], where: str) -> None:
    """Raise if any of ``params`` is a sharded ``DTensor`` (FSDP2 ``fully_shard``).

    Raises:
        UnsupportedLayerError: naming the sharded parameters and the supported alternatives.
    """
    bad = [names.get(id(p), str(tuple(p.shape))) for p in params if _is_dtensor(p)]
    if bad:
        raise UnsupportedLayerError(
            f"{where}: parameters {bad[:4]}{' ...' if len(bad) > 4 else ''} are DTensors "
            "(FSDP fully_shard), which noetherflow's statistics do not support yet: each rank "
            "holds only a shard, so the statistics would be wrong. Collect statistics on an "
            "unsharded copy of the model (or under DistributedDataParallel, which is supported)."
        )
