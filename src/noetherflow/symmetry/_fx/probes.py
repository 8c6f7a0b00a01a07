"""Small probes of the engine.

Shape-only reads, reductions over constant axes, empty concatenations, broadcasting, and the
rotation planes of a rotary embedding.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, fx

if TYPE_CHECKING:
    from noetherflow.symmetry._fx.engine import GraphInfo

_SHAPE_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad"}
_SHAPE_METHODS = {"size", "dim", "numel", "nelement", "get_device", "is_floating_point"}


def _shape_only(node: fx.Node) -> bool:
    if node.op == "call_function" and node.target is getattr:
        return len(node.args) > 1 and node.args[1] in _SHAPE_ATTRS
    return node.op == "call_method" and node.target in _SHAPE_METHODS


def _constant_over_reduced(node: fx.Node, src: fx.Node, idx: Any, info: GraphInfo) -> bool:
    """``x.mean(dims)`` over axes along which every feature index is constant (pooling)."""
    if not isinstance(idx, Tensor) or node.args[0] is not src:
        return False
    try:
        m1 = info.execute(node, {src: idx})
        m2 = info.execute(node, {src: idx.square()})
    except Exception:
        return False
    return isinstance(m1, Tensor) and bool((m2 == m1.square()).all())


def _cat_with_empty(node: fx.Node, ins: list[fx.Node], info: GraphInfo) -> bool:
    """``torch.cat([empty, x])`` (e.g. an empty key/value cache): x passes through unchanged."""
    seq = node.args[0] if node.args else node.kwargs.get("tensors")
    if len(ins) != 1 or not isinstance(seq, list | tuple):
        return False
    others = [a for a in seq if a is not ins[0]]
    if len(others) != len(seq) - 1:
        return False
    vals = [info.values.get(a) if isinstance(a, fx.Node) else a for a in others]
    return all(isinstance(v, Tensor) and v.numel() == 0 for v in vals)


_RDIV: set[Any] = {operator.truediv, torch.div, "div", "__truediv__"}


def _broadcasts(small: Any, big: Any) -> bool:
    try:
        return tuple(torch.broadcast_shapes(small, big)) == tuple(big)
    except RuntimeError:
        return False


def _is_blank(idx: Any) -> bool:
    items = idx if isinstance(idx, tuple | list) else [idx]
    return all(isinstance(t, Tensor) and bool((t < 0).all()) for t in items)


def _rotary_pairs(info: GraphInfo, node: fx.Node, pos: int, value: Tensor) -> dict[int, int] | None:
    """Position → partner along the last axis, measured with unit vectors (None if not pairs).

    A coordinate the embedding leaves in place (partial rotary) is its own partner.
    """
    d = value.shape[-1]
    args = [info.values.get(a) if isinstance(a, fx.Node) else a for a in node.args]
    kwargs = {
        k: info.values.get(v) if isinstance(v, fx.Node) else v for k, v in node.kwargs.items()
    }
    out: dict[int, int] = {}
    with torch.no_grad():
        for i in range(d):
            e = torch.zeros_like(value)
            e[..., i] = 1.0
            probe = list(args)
            probe[pos] = e
            res = node.target(*probe, **kwargs)  # type: ignore[operator]
            got = res if isinstance(res, Tensor) else res[pos]
            hit = got.reshape(-1, d).abs().amax(0) > 0
            others = [int(j) for j in torch.nonzero(hit).flatten() if int(j) != i]
            if not others and bool(hit[i]):
                out[i] = i  # not rotated (partial rotary): its own partner
                continue
            if len(others) != 1:
                return None
            out[i] = others[0]
    if any(out[out[i]] != i for i in out):
        return None
    return out


def _is_index_tensor(v: Any) -> bool:
    return isinstance(v, Tensor) and v.dtype == torch.float64


def _integral(t: Tensor) -> bool:
    return bool(torch.isfinite(t).all()) and bool((t == t.round()).all())
