"""Biases stored apart from their layer: ``self.v(x) + self.v_bias`` (issue 26).

DeBERTa (``in_proj`` without bias, then ``q_bias``/``v_bias`` added per head), BEiT-style
``q_bias``/``v_bias`` and hand-written attention add a learned vector to a layer's output
after the fact. The sum is still an affine map of the layer's input, y_f = (W x)_f + b_β(f),
so a map acting on the layer's output rows (a head rotation, W → G⁻¹W) keeps the function
exactly when it acts on the bias the same way (b → G⁻¹b): the bias transforms like the
layer's output rows. The engine follows the features through such an add and records, per
bias, which bias element β(f) joins feature f; the rotation matchers then add the bias rows
to the blocks they turn (:func:`bias_blocks`). Families that do not handle such a bias yet
refuse the candidate with a reason (:func:`refuse_extra_biases`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import Tensor, fx, nn

from noetherflow.symmetry._fx.elements import param_elements
from noetherflow.symmetry._fx.flows import Arrival, _Flow
from noetherflow.symmetry.rotation import Block

__all__ = ["bias_add", "bias_blocks", "refuse_extra_biases"]

_ADD = (operator.add, torch.add, "add", "__add__")


def bias_add(
    info: Any, node: fx.Node, ins: list[fx.Node], flow: _Flow, stop: Any
) -> tuple[bool, _Flow | None]:
    """``(handled, flow)``: the flow after ``x + b``, ``b`` a parameter vector (None: stopped).

    ``handled`` is False when the node is not such a sum (the caller goes on).

    Each position's feature f of ``x`` must meet the same element β(f) of ``b`` everywhere
    (a one-to-one map), and ``x`` must not be broadcast by the sum.
    """
    if node.target not in _ADD or node.kwargs or len(ins) != 1 or len(node.args) != 2:
        return False, None
    other = node.args[1] if node.args[0] is ins[0] else node.args[0]
    found = param_elements(info, other, 1)
    if found is None:
        return False, None
    p, b = found
    a = flow.idx
    out = info.values.get(node)
    if not isinstance(a, Tensor) or not isinstance(out, Tensor) or a.shape != out.shape:
        stop("read by add with a parameter, broadcasting the features")
        return True, None
    try:
        b = b.expand(out.shape)
    except RuntimeError:
        stop("read by add with a parameter of another shape")
        return True, None
    pairs = torch.unique(torch.stack([a.reshape(-1), b.reshape(-1)], 1), dim=0)
    feats, elems = pairs[:, 0].long().tolist(), pairs[:, 1].long().tolist()
    if len(set(feats)) != len(feats) or len(set(elems)) != len(elems):
        stop("read by add with a parameter whose elements do not follow one feature each")
        return True, None
    added = dict(zip(feats, elems, strict=True))
    return True, _Flow(a, flow.mode, flow.heads, flow.via, flow.rotary, (*flow.biases, (p, added)))


def bias_blocks(arr: Arrival, start: int, stop: int) -> list[Block] | None:
    """Blocks of the separately stored biases for the source's features ``start:stop``.

    None when a bias's elements for these features are not one contiguous, increasing slice
    (a Block is a slice).
    """
    out = []
    for p, beta in arr.biases:
        elems = [beta.get(f) for f in range(start, stop)]
        if any(e is None for e in elems):
            return None
        first = elems[0]
        assert first is not None
        if elems != list(range(first, first + len(elems))):
            return None
        out.append(Block(p, 0, first, first + len(elems)))
    return out


def extra_params(arrivals: list[Arrival]) -> list[nn.Parameter]:
    """Every separately stored bias met by these arrivals (once each)."""
    seen: dict[int, nn.Parameter] = {}
    for arr in arrivals:
        for p, _ in arr.biases:
            seen.setdefault(id(p), p)
    return list(seen.values())


def refuse_extra_biases(
    arrivals: list[Arrival], params: list[Any], ledger: Any, who: str, family: str
) -> bool:
    """True (and a reason noted) when a separately stored bias joins features of ``who``."""
    extra = extra_params(arrivals)
    if not extra:
        return False
    ledger.note(
        [*params, *extra],
        f"{who}: a bias stored apart from the layer is added to its output; the {family} "
        "would have to act on it too, which is not supported",
    )
    return True
