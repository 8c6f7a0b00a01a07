"""Concatenations: ``torch.cat`` of the followed features, with or without other tensors.

The parts of one layer's output put back together (a partial rotary embedding's halves) keep
their features; another layer's output concatenated with the followed one (two branches into
one reader) has no feature of the source, so its entries are blank (−1) and the reader sees
the source in a slice of its columns (:mod:`noetherflow.symmetry._fx.matchers`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, fx

__all__ = ["blank_parts"]


def blank_parts(node: fx.Node, subst: dict[fx.Node, Any], info: Any) -> dict[fx.Node, Tensor]:
    """Blank index tensors (−1) for the parts of ``torch.cat([x, other, …])`` not followed.

    Another layer's output concatenated with the followed one (an Inception/DenseNet-style
    concat, two branches into one layer) carries no feature of this source: re-executing the
    cat with these in place moves x's features to their place, so a consumer reads them in a
    slice of its columns. ``subst``: the parts followed already.
    """
    seq = node.args[0] if node.args else node.kwargs.get("tensors")
    out: dict[fx.Node, Tensor] = {}
    for a in seq if isinstance(seq, list | tuple) else []:
        v = info.values.get(a) if isinstance(a, fx.Node) else None
        if isinstance(a, fx.Node) and a not in subst and isinstance(v, Tensor):
            out[a] = torch.full(v.shape, -1.0, dtype=torch.float64)
    return out
