"""Concatenations: ``torch.cat`` of the followed features, with or without other tensors.

The parts of one layer's output put back together (a partial rotary embedding's halves) keep
their features; another layer's output concatenated with the followed one (two branches into
one reader) has no feature of the source, so its entries are blank (−1) and the reader sees
the source in a slice of its columns (:mod:`noetherflow.symmetry._fx.matchers`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, fx

from noetherflow.symmetry._fx.flows import _Flow
from noetherflow.symmetry._fx.probes import _integral, _is_index_tensor

__all__ = ["cat_of_flows", "cat_with_others"]


def cat_with_others(
    node: fx.Node,
    ins: list[fx.Node],
    flows: dict[fx.Node, _Flow],
    mode: int,
    heads: list[frozenset[int]] | None,
    via: tuple[str, ...],
    info: Any,
    stop: Callable[[str], None],
    name: str,
) -> _Flow | None:
    """``torch.cat([x, other, …])``: x's features move to their place, the others' are blank.

    Another layer's output concatenated with the followed one (an Inception/DenseNet-style
    concat, two branches into one layer): its entries are −1, no feature of this source, so
    a consumer reads the source's features in a slice of its columns.
    """
    seq = node.args[0] if node.args else node.kwargs.get("tensors")
    subst: dict[fx.Node, Any] = {a: flows[a].idx for a in ins}
    for a in seq if isinstance(seq, list | tuple) else []:
        v = info.values.get(a) if isinstance(a, fx.Node) else None
        if isinstance(a, fx.Node) and a not in subst and isinstance(v, Tensor):
            subst[a] = torch.full(v.shape, -1.0, dtype=torch.float64)
    try:
        out = info.execute(node, subst)
    except Exception as exc:  # not a list of tensors along one axis
        stop(f"read by {name} (could not follow it: {type(exc).__name__})")
        return None
    if not (_is_index_tensor(out) and _integral(out)):
        stop(f"read by {name}, which mixes features")
        return None
    return _Flow(out, mode, heads, via)


def cat_of_flows(node: fx.Node, ins: list[fx.Node]) -> bool:
    """``torch.cat([a, b, …])`` whose every part carries features of the source being followed."""
    seq = node.args[0] if node.args else node.kwargs.get("tensors")
    return isinstance(seq, list | tuple) and len(seq) > 1 and set(seq) == set(ins)
