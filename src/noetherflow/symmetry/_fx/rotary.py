"""Rotary position embeddings in the propagation engine (see :func:`_rotary`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, fx

from noetherflow.symmetry._fx.flows import _Flow
from noetherflow.symmetry._fx.probes import _rotary_pairs

if TYPE_CHECKING:
    from noetherflow.symmetry._fx.engine import GraphInfo

__all__: list[str] = []


def _rotary(
    node: fx.Node,
    ins: list[fx.Node],
    flows: dict[fx.Node, _Flow],
    mode: int,
    heads: list[frozenset[int]] | None,
    via: tuple[str, ...],
    info: GraphInfo,
    stop: Callable[[str], None],
) -> _Flow | None:
    """A rotary embedding ``f(q, k, cos, sin, …) → (q', k')``, linear in q and in k.

    Which coordinates of the last axis it mixes is measured by applying it to unit vectors;
    each must be paired with exactly one other (a rotation plane: halves as in Llama, or
    interleaved pairs as in GPT-J) or left alone (partial rotary, GPT-NeoX and Phi: it is
    its own partner). The features pass through unchanged in place, and the flow remembers
    the pairs so that only the rotations that commute with every position's rotation are
    proposed. ``f(x, sin, cos) → x'`` (one tensor, GPT-J) is followed like ``f(q, k, …)``.
    """
    args = list(node.args)
    out: list[Tensor] = []
    partner: dict[int, int] = {}
    single = isinstance(info.values.get(node), Tensor)  # GPT-J: f(x, sin, cos) → x'
    for pos in (0,) if single else (0, 1):
        a = args[pos] if pos < len(args) else None
        value = info.values.get(a) if isinstance(a, fx.Node) else None
        if not isinstance(value, Tensor) or (single and a not in ins) or (single and len(ins) > 1):
            fname = getattr(node.target, "__name__", node.target)
            stop(f"read by {fname} in an unsupported position")
            return None
        if not isinstance(a, fx.Node) or a not in ins:
            out.append(torch.full(value.shape, -1.0, dtype=torch.float64))
            continue
        idx = flows[a].idx
        pairs = _rotary_pairs(info, node, pos, value)
        if pairs is None or not isinstance(idx, Tensor):
            stop(f"read by {getattr(node.target, '__name__', node.target)}, which mixes features")
            return None
        flat = idx.reshape(-1, idx.shape[-1])
        for i, j in pairs.items():
            for fi, fj in set(zip(flat[:, i].tolist(), flat[:, j].tolist(), strict=True)):
                if partner.setdefault(int(fi), int(fj)) != int(fj):
                    stop("read by a rotary embedding with features not on the last axis")
                    return None
        out.append(idx)
    prev = next((flows[a].rotary for a in ins if flows[a].rotary is not None), None)
    if prev is not None:
        stop("read by a second rotary embedding")
        return None
    return _Flow(out[0] if single else tuple(out), mode, heads, via, rotary=partner)
