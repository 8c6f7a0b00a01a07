"""Embedding tables summed and projected: ``(Σ_k E_k[ids_k]) · Wᵀ`` (DeBERTa-v2's ``embed_proj``).

With ``embedding_size ≠ hidden_size`` DeBERTa-v2 adds its word, position (and token type)
embeddings and projects the sum with a Linear, nothing between: every table's rows e → Gᵀ… in
the d-front form of :class:`~noetherflow.symmetry.rotation.DoubleRotation`, each table
``E_k [V_k, d]`` → ``E_k G⁻ᵀ`` and ``W [h, d]`` → ``W G`` keep ``W·e`` for every invertible
G (GL(d), d the embedding size): one rotation whose first side is the tables' feature axis
and whose second side is the projection's input columns. Only a pure sum of ``nn.Embedding``
outputs, each read only there, feeding a dense layer directly is matched: a LayerNorm or
anything else between the sum and the projection (ALBERT, ELECTRA) breaks it, and a table
read elsewhere too is left alone. The proposal is checked numerically like every other.
"""

from __future__ import annotations

import operator
from functools import partial

import torch
from torch import fx, nn

from noetherflow.symmetry._fx.common import _is_dense, _w_in, _weight
from noetherflow.symmetry._fx.engine import GraphInfo, Ledger, Proposal
from noetherflow.symmetry.base import Family
from noetherflow.symmetry.rotation import Block, DoubleRotation

__all__ = ["EmbeddingProjectionPattern"]

_ADDS = (operator.add, torch.add)


def _summands(info: GraphInfo, node: fx.Node) -> list[fx.Node] | None:
    """The ``nn.Embedding`` calls whose plain sum ``node`` is, each read once; else None."""
    if len(node.users) != 1:
        return None
    m = info.module(node)
    if isinstance(m, nn.Embedding):
        return [node]
    plain_add = (node.op == "call_function" and node.target in _ADDS) or (
        node.op == "call_method" and node.target == "add"
    )
    if not plain_add or len(node.args) != 2 or node.kwargs:
        return None
    out: list[fx.Node] = []
    for a in node.args:
        sub = _summands(info, a) if isinstance(a, fx.Node) else None
        if sub is None:
            return None
        out += sub
    return out


class EmbeddingProjectionPattern:
    """Σ of embedding tables → a dense layer: GL(embedding size) (module docstring)."""

    family = Family.ROTATION

    def match(self, info: GraphInfo, sources: object, ledger: Ledger) -> list[Proposal]:
        out: list[Proposal] = []
        for node in info.gm.graph.nodes:
            proj = info.module(node)
            if proj is None or not _is_dense(proj) or not node.args:
                continue
            x = node.args[0]
            if not isinstance(x, fx.Node):
                continue
            leaves = _summands(info, x)
            if not leaves:
                continue
            tables = [info.module(n) for n in leaves]
            w = _weight(proj)
            d = int(w.shape[_w_in(proj)])
            weights = [getattr(t, "weight", None) for t in tables]
            if any(not isinstance(e, nn.Parameter) or e.shape[-1] != d for e in weights):
                continue
            if len({id(e) for e in weights}) != len(weights):
                continue  # one table added twice: not one linear map of its rows
            names = [info.qual(str(n.target)) for n in leaves]
            pname = info.qual(str(node.target))
            label = f"rotation:{'+'.join(names)}→{pname}"
            w_blocks = [Block(e, 1, 0, d) for e in weights]  # type: ignore[arg-type]
            u_blocks = [Block(w, _w_in(proj), 0, d)]
            out.append(
                Proposal(
                    Family.ROTATION,
                    label,
                    partial(DoubleRotation.from_blocks, w_blocks, u_blocks, label=label),
                    [*weights, w],  # type: ignore[list-item]
                    info.order[leaves[0]],
                    note="embedding tables summed and projected: GL(embedding size)",
                )
            )
        return out
