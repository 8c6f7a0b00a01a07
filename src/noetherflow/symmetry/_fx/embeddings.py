"""Embedding tables summed and projected: ``(Σ_k E_k[ids_k]) · Wᵀ`` (DeBERTa-v2's ``embed_proj``).

With ``embedding_size ≠ hidden_size`` DeBERTa-v2 adds its word, position (and token type)
embeddings and projects the sum with a Linear, nothing between: every table's rows e → Gᵀ… in
the d-front form of :class:`~noetherflow.symmetry.rotation.DoubleRotation`, each table
``E_k [V_k, d]`` → ``E_k G⁻ᵀ`` and ``W [h, d]`` → ``W G`` keep ``W·e`` for every invertible
G (GL(d), d the embedding size): one rotation whose first side is the tables' feature axis
and whose second side is the projection's input columns. Only a pure sum of ``nn.Embedding``
outputs, each read only there, feeding a dense layer directly is matched: a LayerNorm or
anything else between the sum and the projection (ALBERT, ELECTRA) breaks it, and a table
read elsewhere too is left alone, with the reason in the coverage. The matcher reads every
``nn.Embedding`` as a whole (stage ``"module"``); its proposal is checked numerically like
every other.
"""

from __future__ import annotations

import operator
from functools import partial

import torch
from torch import fx, nn

from noetherflow.symmetry._fx.common import _is_dense, _w_in, _weight
from noetherflow.symmetry._fx.engine import GraphInfo, Ledger, Proposal, _name_of
from noetherflow.symmetry.base import Family
from noetherflow.symmetry.rotation import Block, DoubleRotation

__all__ = ["EmbeddingProjectionPattern", "is_embedding"]

_ADDS = (operator.add, torch.add)


def _summands(info: GraphInfo, node: fx.Node) -> list[fx.Node] | None:
    """The ``nn.Embedding`` calls whose plain sum ``node`` is, each read once; else None."""
    if len(node.users) != 1:
        return None
    m = info.module(node)
    if isinstance(m, nn.Embedding):
        return [node]
    if not _is_add(node):
        return None
    out: list[fx.Node] = []
    for a in node.args:
        sub = _summands(info, a) if isinstance(a, fx.Node) else None
        if sub is None:
            return None
        out += sub
    return out


def _is_add(node: fx.Node) -> bool:
    plain = (node.op == "call_function" and node.target in _ADDS) or (
        node.op == "call_method" and node.target == "add"
    )
    return plain and len(node.args) == 2 and not node.kwargs


def is_embedding(m: nn.Module) -> bool:
    """An ``nn.Embedding`` (read as a whole by :class:`EmbeddingProjectionPattern`)."""
    return isinstance(m, nn.Embedding)


class EmbeddingProjectionPattern:
    """Σ of embedding tables → a dense layer: GL(embedding size) (module docstring).

    A module-stage matcher, called for every ``nn.Embedding`` call: the first table of a
    matched sum proposes the rotation, every table that is not in one gets the reason.
    """

    family = Family.ROTATION

    def match(self, info: GraphInfo, node: fx.Node, ledger: Ledger) -> list[Proposal]:
        table = info.module(node)
        name = info.qual(str(node.target))
        weight = getattr(table, "weight", None)
        if not isinstance(weight, nn.Parameter):
            return []
        top = node
        while len(top.users) == 1 and _is_add(next(iter(top.users))):
            top = next(iter(top.users))
        users = list(top.users)
        proj = info.module(users[0]) if len(users) == 1 else None
        leaves = _summands(info, top) if proj is not None and _is_dense(proj) else None
        if proj is None or leaves is None or users[0].args[:1] != (top,):
            what = ", ".join(_name_of(u, info.modules) for u in users) or "nothing"
            subject = f"output of {name}" if top is node else f"the sum of {name} and others"
            ledger.note(
                [weight],
                f"{subject} is read by {what}: only a sum of embedding tables read by a dense "
                "layer alone has a symmetry (GL(embedding size))",
            )
            return []
        if leaves[0] is not node:
            return []  # the sum's first table proposes
        tables = [info.module(n) for n in leaves]
        w = _weight(proj)
        d = int(w.shape[_w_in(proj)])
        weights = [getattr(t, "weight", None) for t in tables]
        if any(not isinstance(e, nn.Parameter) or e.shape[-1] != d for e in weights):
            return []
        if len({id(e) for e in weights}) != len(weights):
            ledger.note([weight], f"{name} is added to itself: not one linear map of its rows")
            return []
        names = [info.qual(str(n.target)) for n in leaves]
        pname = info.qual(str(users[0].target))
        label = f"rotation:{'+'.join(names)}→{pname}"
        w_blocks = [Block(e, 1, 0, d) for e in weights]  # type: ignore[arg-type]
        u_blocks = [Block(w, _w_in(proj), 0, d)]
        return [
            Proposal(
                Family.ROTATION,
                label,
                partial(DoubleRotation.from_blocks, w_blocks, u_blocks, label=label),
                [*weights, w],  # type: ignore[list-item]
                info.order[node],
                note="embedding tables summed and projected: GL(embedding size)",
            )
        ]
