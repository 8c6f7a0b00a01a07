"""Several contractions sharing layers: DeBERTa's disentangled attention (issue 26).

DeBERTa's scores are q·kᵀ + q·pkᵀ + k·pqᵀ (content to content, content to position,
position to content), with pk, pq the relative embeddings through their own projections
(or through ``key_proj``/``query_proj`` again with ``share_att_key``). A layer then meets
two partners, and the pairwise q·k matcher refuses it. Per head, every term stays when the
layers split into two classes, X (q, pq) turned by Gᵀ and Y (k, pk) by G⁻¹: each
contraction joins an X layer with a Y layer, and (Gᵀa)ᵀ(G⁻¹b) = aᵀb. So the contractions
are a graph on the layers; a connected component that is two-coloured (bipartite) with
heads matched one to one across its contractions gives one rotation per head over all its
layers (a layer called twice, as with ``share_att_key``, is one vertex, its rows turned once).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import fx

from noetherflow.symmetry._fx.common import _blocks, _is_dense, _range_of, _Source
from noetherflow.symmetry._fx.engine import LINEAR, Arrival, GraphInfo, Ledger, Proposal
from noetherflow.symmetry._fx.flows import _rows_constant
from noetherflow.symmetry.base import Family
from noetherflow.symmetry.rotation import Block, DoubleRotation

__all__ = ["Contraction", "match_joint", "shared_sides"]

# one contraction: its node, then (source, arrival) of the a side and of the b side
Contraction = tuple[fx.Node, tuple[_Source, Arrival], tuple[_Source, Arrival]]
Head = tuple[int, ...]


def shared_sides(contractions: list[Contraction]) -> set[int]:
    """Ids of the layers that take part in more than one contraction."""
    count: dict[int, int] = {}
    for _, (sa, _), (sb, _) in contractions:
        for m in {id(sa.module), id(sb.module)}:
            count[m] = count.get(m, 0) + 1
    return {m for m, c in count.items() if c > 1}


def _head_pairs(aa: Arrival, ab: Arrival) -> list[tuple[Head, Head]] | None:
    """(a features, b features) per head of one contraction, or None if not per head."""
    a, b = aa.idx, ab.idx
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    if not (_rows_constant(a, 1) and _rows_constant(b, 2)):
        return None
    qa = [tuple(int(v) for v in r.tolist()) for r in a[:, 0, :]]
    kb = [tuple(int(v) for v in r.tolist()) for r in b[:, :, 0]]
    pairs = sorted(set(zip(qa, kb, strict=True)))
    if len({q for q, _ in pairs}) != len(pairs) or len({k for _, k in pairs}) != len(pairs):
        return None  # a head meets several heads (grouped-query): not handled jointly
    return pairs


class _Find:
    """Union-find over hashable vertices."""

    def __init__(self) -> None:
        self.up: dict[object, object] = {}

    def root(self, v: object) -> object:
        self.up.setdefault(v, v)
        while self.up[v] != v:
            self.up[v] = self.up[self.up[v]]
            v = self.up[v]
        return v

    def join(self, a: object, b: object) -> None:
        self.up[self.root(a)] = self.root(b)


def _colours(contractions: list[Contraction]) -> dict[int, int] | None:
    """Class 0 (X) or 1 (Y) per layer, each contraction joining the two; None if impossible."""
    edges: dict[int, set[int]] = {}
    for _, (sa, _), (sb, _) in contractions:
        a, b = id(sa.module), id(sb.module)
        if a == b:
            return None  # a layer contracted with itself (x·xᵀ): not a two-sided symmetry
        edges.setdefault(a, set()).add(b)
        edges.setdefault(b, set()).add(a)
    first = id(contractions[0][1][0].module)
    colour = {first: 0}
    todo = [first]
    while todo:
        v = todo.pop()
        for w in edges[v]:
            if w not in colour:
                colour[w] = 1 - colour[v]
                todo.append(w)
            elif colour[w] == colour[v]:
                return None
    return colour


def match_joint(info: GraphInfo, contractions: list[Contraction], ledger: Ledger) -> list[Proposal]:
    """One rotation per head over every layer of each connected group of contractions."""
    groups = _Find()
    for _, (sa, _), (sb, _) in contractions:
        groups.join(id(sa.module), id(sb.module))
    by_group: dict[object, list[Contraction]] = {}
    for c in contractions:
        by_group.setdefault(groups.root(id(c[1][0].module)), []).append(c)
    out: list[Proposal] = []
    for group in by_group.values():
        out.extend(_group(info, group, ledger))
    return out


def _group(info: GraphInfo, group: list[Contraction], ledger: Ledger) -> list[Proposal]:
    srcs = [s for _, (sa, _), (sb, _) in group for s in (sa, sb)]
    params = list({id(p): p for s in srcs for p in s.params}.values())
    names = list(dict.fromkeys(s.name for s in srcs))
    who = "·".join(names)
    arrs = [a for _, (_, aa), (_, ab) in group for a in (aa, ab)]
    if any(a.mode != LINEAR or a.rotary is not None for a in arrs) or not all(
        _is_dense(s.module) for s in srcs
    ):
        ledger.note(params, f"{who}: contractions sharing layers with a non-linear or rotary map")
        return []
    colour = _colours(group)
    if colour is None:
        ledger.note(params, f"{who}: its contractions do not split the layers into two sides")
        return []
    heads = _Find()
    for _, (sa, aa), (sb, ab) in group:
        pairs = _head_pairs(aa, ab)
        if pairs is None:
            ledger.note(params, f"{who}: {sa.name}·{sb.name} is not per head")
            return []
        for q, k in pairs:
            heads.join((id(sa.module), q), (id(sb.module), k))
    members: dict[object, dict[int, Head]] = {}
    for v in list(heads.up):
        assert isinstance(v, tuple)
        mod, feats = v
        got = members.setdefault(heads.root(v), {})
        if got.setdefault(mod, feats) != feats:
            ledger.note(params, f"{who}: a head of one layer meets two heads of another")
            return []
    module_of = {id(s.module): s for s in srcs}
    nodes = {node for node, _, _ in group}
    if not _clean(srcs, members, nodes):
        ledger.note(params, f"{who}: a head's features are also read outside these contractions")
        return []
    ordered = sorted(members.values(), key=lambda h: min(min(f) for f in h.values()))
    out = []
    for h, head in enumerate(ordered):
        sides: tuple[list[Block], list[Block]] = ([], [])
        for mod, feats in sorted(head.items(), key=lambda kv: names.index(module_of[kv[0]].name)):
            rng = _range_of(list(feats))
            if rng is None:
                ledger.note(params, f"{who}: head {h} is not a contiguous slice")
                return []
            src = module_of[mod]
            sides[colour[mod]].extend(_blocks(src.module, *rng, _arrival_of(group, mod)))
        x_side, y_side = sides
        label = f"rotation:{who}[h{h}]"
        out.append(
            Proposal(
                Family.ROTATION,
                label,
                partial(DoubleRotation.from_blocks, y_side, x_side, label=label),
                params,
                min(info.order[s.node] for s in srcs),
                sub=min(info.order[n] for n in nodes),
                note="contractions sharing layers (q·k, q·pk, k·pq): one side Gᵀ, the other G⁻¹",
            )
        )
    return out


def _arrival_of(group: list[Contraction], mod: int) -> Arrival:
    """An arrival of layer ``mod`` in these contractions (for the biases added on the way)."""
    return next(a for _, *sides in group for s, a in sides if id(s.module) == mod)


def _clean(
    srcs: list[_Source], members: dict[object, dict[int, Head]], nodes: set[fx.Node]
) -> bool:
    """Every feature of a head reaches only these contractions, in every call of its layer."""
    feats: dict[int, set[int]] = {}
    for head in members.values():
        for mod, f in head.items():
            feats.setdefault(mod, set()).update(f)
    for src in srcs:
        mine = feats.get(id(src.module), set())
        for arr in src.arrivals:
            if arr.features & mine and (
                arr.kind not in ("contract_a", "contract_b") or arr.node not in nodes
            ):
                return False
    return True
