"""Hooks for a layer whose weight another module applies by a matmul (``W @ x``).

Hugging Face's Mamba mixer computes ``self.dt_proj.weight @ time_step`` instead of calling
``self.dt_proj``: the layer's forward hook never fires, and its weight's per-sample gradient
Σ_t g_t x_tᵀ is invisible to the module hooks. Detection records where such a weight is read
(:attr:`~noetherflow.symmetry.coverage.DetectionReport.matmul_reads`: the module whose
forward runs the matmul); while that module's forward runs, a ``TorchFunctionMode`` watches
for ``torch.matmul(W, x)`` / ``W @ x`` / ``W.matmul(x)`` with exactly that parameter on the
left, keeps ``x`` and hooks the product's gradient: the layer's factors, as if it had been
called on ``xᵀ`` (``a`` ``[N, …, T, I]`` = ``x`` with its last two axes swapped, ``g``
likewise), so the layer's own handler and formulas apply unchanged. Nothing else is watched,
and the mode exists only inside that forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from noetherflow.stats.factor_source import Record

__all__ = ["MatmulReads", "attach_matmul_reads"]

_MATMULS = (torch.matmul, Tensor.matmul, Tensor.__matmul__)


class MatmulReads(TorchFunctionMode):
    """Capture ``W @ x`` for the weights of ``records`` (keyed by ``id(weight)``)."""

    def __init__(self, records: Mapping[int, Record], begin: Callable[[Record], bool]) -> None:
        super().__init__()
        self.records = records
        self.begin = begin  # the capture's bookkeeping of a call; False: not captured

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in _MATMULS or len(args) != 2 or kwargs:
            return out
        rec = self.records.get(id(args[0]))
        x = args[1]
        if rec is None or not isinstance(x, Tensor) or not isinstance(out, Tensor):
            return out
        if x.dim() < 3 or not out.requires_grad or not self.begin(rec):
            return out  # unbatched (or no gradient): the layer is reported as never run
        rec.a = x.detach().transpose(-1, -2)

        def bwd(grad: Tensor, rec: Record = rec) -> None:
            rec.g = grad.detach().transpose(-1, -2)

        out.register_hook(bwd)
        return out


def attach_matmul_reads(
    model: nn.Module,
    reads: Mapping[int, str],
    records: Sequence[Record],
    begin: Callable[[Record], bool],
) -> list[RemovableHandle]:
    """Hooks on the modules named in ``reads`` that watch their forward for ``W @ x``.

    ``reads``: ``id(weight)`` → the qualified name of the module whose forward applies it;
    ``records``: the capture's records, of which those whose ``weight`` is in ``reads`` (and
    that a plain linear handler reads, with no bias in a symmetry) are watched.
    """
    by_reader: dict[str, dict[int, Record]] = {}
    for rec in records:
        w = getattr(rec.module, "weight", None)
        reader = reads.get(id(w)) if isinstance(w, nn.Parameter) else None
        if reader is None or rec.handler.call_factors is not None:
            continue
        try:
            model.get_submodule(reader)
        except AttributeError:
            continue
        by_reader.setdefault(reader, {})[id(w)] = rec
    handles: list[RemovableHandle] = []
    for reader, recs in by_reader.items():
        mod = model.get_submodule(reader)
        modes: list[MatmulReads] = []

        def pre(_m: nn.Module, _a: Any, recs: dict[int, Record] = recs, modes: Any = modes) -> None:
            mode = MatmulReads(recs, begin)
            mode.__enter__()
            modes.append(mode)

        def post(_m: nn.Module, _a: Any, _o: Any, modes: Any = modes) -> None:
            if modes:
                modes.pop().__exit__(None, None, None)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post, always_call=True))
    return handles
