"""Which elements of a parameter a node holds, through shape-only ops (issue 26).

A bias added apart from its layer (:mod:`._fx.biases`) or a weight read by a matmul
(:mod:`._fx.contractions`) reaches its use through views, transposes, reshapes and dtype
casts. :func:`param_elements` follows such a chain back to the parameter and runs it on the
parameter's element indices, so each entry of the result says which element of the parameter
the node holds there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, fx, nn

from noetherflow.symmetry._fx.tables import function_op, method_op

__all__ = ["param_elements"]

_CASTS = {"to", "float", "double", "type_as"}  # dtype casts: the same elements
_DEPTH = 12


def param_elements(
    info: Any, node: Any, ndim: int, depth: int = 0
) -> tuple[nn.Parameter, Tensor] | None:
    """(p, index) when ``node`` is an ``ndim``-D parameter moved by shape-only ops, else None.

    ``index`` (float64) has the node's shape; each entry is the flat element of ``p`` it
    holds. A step is followed when its only tensor input is its first argument (sizes read
    from other nodes may be further inputs) and it moves or casts entries without changing
    them; an op that does not run on the index tensor stops the chain.
    """
    if not isinstance(node, fx.Node) or depth > _DEPTH:
        return None
    if node.op == "get_attr":
        p = info.values.get(node)
        if isinstance(p, nn.Parameter) and p.dtype.is_floating_point and p.dim() == ndim:
            return p, torch.arange(p.numel(), dtype=torch.float64).view(p.shape)
        return None
    ins = node.all_input_nodes
    tensor_ins = [a for a in ins if isinstance(info.values.get(a), Tensor)]
    if len(tensor_ins) != 1 or not node.args or node.args[0] is not tensor_ins[0]:
        return None
    moves = (node.op == "call_function" and function_op(node.target) == "move") or (
        node.op == "call_method" and method_op(str(node.target)) == "move"
    )
    cast = node.op == "call_method" and node.target in _CASTS
    if not (moves or cast):
        return None
    up = param_elements(info, tensor_ins[0], ndim, depth + 1)
    if up is None or cast:
        return up
    p, idx = up
    try:
        out = info.execute(node, {tensor_ins[0]: idx})
    except Exception:  # an op that does not take the index tensor: not followed
        return None
    if not isinstance(out, Tensor) or out.dtype != torch.float64:
        return None
    return p, out
