"""Flows through dtype casts, sums of one source's features and additions of a zero.

What a state-space scan does to the features of its input projection (Mamba's
``ssm_state = Ā·ssm_state + B̄u``, then ``y = ssm_state @ C``): B's features are cast
(``B.float()``), multiplied element-wise by tensors that do not carry them (Δ, u, Ā), and
added to a state that carries the same features at the same positions (the earlier tokens'
terms), starting from a state of zeros. Each of these keeps a per-feature rescaling:

* a cast ``x.to(dtype)`` / ``x.float()`` / ``x.double()`` moves no feature (in a float64 model
  a cast to float32 rounds: the numerical check measures what that costs);
* ``a + b`` with both carrying the source's features, the same feature at every position of
  the sum, is linear in them: a per-feature map of both terms is that map of the sum;
* ``x + z`` with ``z`` zero by construction (a product with, or a cast or rearrangement of,
  a zero constant or ``zeros``/``new_zeros``/``zeros_like``) is ``x``: a zero that the example
  alone shows (``relu`` of negative values) is not one, since other inputs would change it.

Used by :func:`noetherflow.symmetry._fx.engine.propagate`.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import Tensor, fx

from noetherflow.symmetry._fx.flows import _Flow, _refine, _worse
from noetherflow.symmetry._fx.probes import _broadcasts
from noetherflow.symmetry._fx.tables import function_op, method_op

__all__ = ["cast_flow", "plus_zero", "sum_of_flows"]

_ADD = (operator.add, torch.add, "add", "__add__")
_MUL = (operator.mul, torch.mul, "mul", "__mul__")
_CASTS = ("to", "float", "double")
_ZEROS = (torch.zeros, torch.zeros_like, "new_zeros", "zero_")
_DEPTH = 16
# = capture.INPUT_FREE (capture imports the engine, which imports this module)
INPUT_FREE_KEY = "noetherflow_input_free_constants"


def cast_flow(info: Any, node: fx.Node, flow: _Flow) -> _Flow | None:
    """``x.to(dtype)``, ``x.float()``, ``x.double()`` of a flow: the same features, else None.

    Only a floating cast that keeps the shape (a dtype or device, not another tensor's
    layout) is followed.
    """
    if node.op != "call_method" or node.target not in _CASTS or not node.args:
        return None
    before, after = info.values.get(node.args[0]), info.values.get(node)
    if not isinstance(before, Tensor) or not isinstance(after, Tensor):
        return None
    if not after.is_floating_point() or after.shape != before.shape:
        return None
    if any(isinstance(a, fx.Node) for a in (*node.args[1:], *node.kwargs.values())):
        return None  # x.to(other): another tensor's dtype and device, read through a node
    return flow


def _is_add(node: fx.Node) -> bool:
    return node.target in _ADD and not node.kwargs and len(node.args) == 2


def sum_of_flows(
    info: Any, node: fx.Node, ins: list[fx.Node], flows: dict[fx.Node, _Flow]
) -> _Flow | None:
    """``a + b``, both carrying the source's features at the same positions: the sum's flow.

    None when the node is not such a sum (another op, a broadcast that moves features, a
    position whose two terms carry different features).
    """
    if not _is_add(node) or len(ins) != 2 or set(node.args) != set(ins):
        return None
    out = info.values.get(node)
    fa, fb = flows[ins[0]], flows[ins[1]]
    a, b = fa.idx, fb.idx
    if not (isinstance(out, Tensor) and isinstance(a, Tensor) and isinstance(b, Tensor)):
        return None
    if not (_broadcasts(a.shape, out.shape) and _broadcasts(b.shape, out.shape)):
        return None
    ea, eb = a.expand(out.shape), b.expand(out.shape)
    if not bool((ea == eb).all()):
        return None
    mode = _worse(fa.mode, fb.mode)
    return _Flow(ea.clone(), mode, _refine(fa.heads, fb.heads), fa.via or fb.via)


def plus_zero(info: Any, node: fx.Node, ins: list[fx.Node], flow: _Flow) -> _Flow | None:
    """``x + z`` with ``z`` zero by construction (module docstring): ``x``'s flow, else None."""
    if not _is_add(node) or len(ins) != 1:
        return None
    other = node.args[1] if node.args[0] is ins[0] else node.args[0]
    out = info.values.get(node)
    a = flow.idx
    if not isinstance(other, fx.Node) or not isinstance(a, Tensor) or not isinstance(out, Tensor):
        return None
    if not _broadcasts(a.shape, out.shape) or not _zero_by_construction(info, other, 0):
        return None
    return _Flow(
        a.expand(out.shape).clone(), flow.mode, flow.heads, flow.via, flow.rotary, flow.biases
    )


def _zero_by_construction(info: Any, node: fx.Node, depth: int) -> bool:
    """Whether ``node`` is zero for every input, by how it is computed (not by its value)."""
    if depth > _DEPTH:
        return False
    value = info.values.get(node)
    if not isinstance(value, Tensor) or bool(value.ne(0).any()):
        return False
    if node.op == "get_attr":  # a tensor the forward made without the inputs (not a buffer)
        return str(node.target) in info.gm.meta.get(INPUT_FREE_KEY, frozenset())
    if node.op not in ("call_function", "call_method"):
        return False
    if node.target in _ZEROS:
        return True
    inputs = [a for a in node.args if isinstance(a, fx.Node)]
    if node.target in _MUL and len(node.args) == 2:
        return any(_zero_by_construction(info, a, depth + 1) for a in inputs)
    rearranges = (
        node.op == "call_method"
        and (node.target in _CASTS or method_op(str(node.target)) == "move")
    ) or (node.op == "call_function" and function_op(node.target) == "move")
    if rearranges and node.args and isinstance(node.args[0], fx.Node):
        return _zero_by_construction(info, node.args[0], depth + 1)
    return False
