"""Matcher: attention heads, q·kᵀ contractions (with rotary embeddings) and MultiheadAttention.

Per head, W_Q·W_Kᵀ is invariant under W_Q → GᵀW_Q, W_K → G⁻¹W_K, and W_O·W_V under
W_V → G⁻¹W_V, W_O → W_O G (paper §5.1). A key/value head read by several query heads
(grouped-query attention) turns all of them. After a rotary embedding only the maps that
commute with every position's rotation survive (one per rotation plane, see
:meth:`AttentionPattern._rotary_head`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import fx, nn

from noetherflow.symmetry._fx.bilinear import match_joint, shared_sides
from noetherflow.symmetry._fx.common import (
    _blocks,
    _is_dense,
    _kinds,
    _NotASlice,
    _only,
    _param,
    _range_of,
    _Source,
)
from noetherflow.symmetry._fx.contractions import self_contraction_nodes
from noetherflow.symmetry._fx.engine import (
    LINEAR,
    Arrival,
    GraphInfo,
    Ledger,
    Proposal,
    _name_of,
    _rows_constant,
)
from noetherflow.symmetry.base import Family
from noetherflow.symmetry.rotation import Block, DoubleRotation

__all__ = ["AttentionPattern"]


class AttentionPattern:
    """Per head W_Q·W_Kᵀ in hand-written attention; W_Q·W_Kᵀ, W_O·W_V in nn.MultiheadAttention."""

    family = Family.ROTATION

    def match_contractions(
        self, info: GraphInfo, sources: list[_Source], ledger: Ledger
    ) -> list[Proposal]:
        by_node: dict[fx.Node, dict[str, list[tuple[_Source, int, Arrival]]]] = {}
        # a layer's features meeting its own through element-wise maps: contractions.py's
        skip = {n for src in sources for n in self_contraction_nodes(src)}
        for src in sources:
            for i, arr in _kinds(src):
                if arr.kind in ("contract_a", "contract_b") and arr.node not in skip:
                    by_node.setdefault(arr.node, {}).setdefault(arr.kind, []).append((src, i, arr))
        out: list[Proposal] = []
        pairs: list[tuple[fx.Node, tuple[_Source, int, Arrival], tuple[_Source, int, Arrival]]] = []
        for node, sides in by_node.items():
            if len(sides.get("contract_a", [])) != 1 or len(sides.get("contract_b", [])) != 1:
                for lst in sides.values():
                    for src, _, _ in lst:
                        ledger.note(
                            src.params,
                            f"{src.name}: its contraction partner in "
                            f"{_name_of(node, info.modules)} is not the output of one Linear layer",
                        )
                continue
            pairs.append((node, sides["contract_a"][0], sides["contract_b"][0]))
        # a layer in several contractions (DeBERTa's q·k + q·pk + k·pq): one joint rotation
        joint = shared_sides([(n, (a[0], a[2]), (b[0], b[2])) for n, a, b in pairs])
        together = [
            (n, (a[0], a[2]), (b[0], b[2]))
            for n, a, b in pairs
            if id(a[0].module) in joint or id(b[0].module) in joint
        ]
        out.extend(match_joint(info, together, ledger) if together else [])
        for node, (sa, ia, aa), (sb, ib, ab) in pairs:
            if id(sa.module) not in joint and id(sb.module) not in joint:
                out.extend(self._heads(info, node, sa, ia, aa, sb, ib, ab, ledger))
        return out

    def _heads(
        self,
        info: GraphInfo,
        node: fx.Node,
        sa: _Source,
        ia: int,
        aa: Arrival,
        sb: _Source,
        ib: int,
        ab: Arrival,
        ledger: Ledger,
    ) -> list[Proposal]:
        params = list({id(p): p for p in [*sa.params, *sb.params]}.values())
        if aa.mode != LINEAR or ab.mode != LINEAR:
            ledger.note(params, f"{sa.name}·{sb.name}: a non-linear map before q·kᵀ")
            return []
        if not _is_dense(sa.module) or not _is_dense(sb.module):
            return []
        a, b = aa.idx, ab.idx
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
        b = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
        if not (_rows_constant(a, 1) and _rows_constant(b, 2)):
            return []
        qa = [tuple(int(v) for v in r.tolist()) for r in a[:, 0, :]]
        kb = [tuple(int(v) for v in r.tolist()) for r in b[:, :, 0]]
        pairs = sorted(set(zip(qa, kb, strict=True)), key=lambda p: (p[1][0], p[0][0]))
        by_k: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for q, k in pairs:
            by_k.setdefault(k, []).append(q)
        q_all = [q for q, _ in pairs]
        if len(set(q_all)) != len(q_all):
            ledger.note(params, f"{sa.name}·{sb.name}: a query head meets several key heads")
            return []
        reach_a, reach_b = sa.reach(), sb.reach()
        ordered = sorted(by_k.items(), key=lambda kv: min(q[0] for q in kv[1]))
        first_is_a = info.order[sa.node] <= info.order[sb.node]
        out: list[Proposal] = []
        for h, (k, qs) in enumerate(ordered):
            rk = _range_of(list(k))
            rqs = [_range_of(list(q)) for q in qs]
            clean = _only(sb, ib, set(k), reach_b) and all(
                _only(sa, ia, set(q), reach_a) for q in qs
            )
            if rk is None or any(r is None for r in rqs) or not clean:
                ledger.note(
                    params, f"{sa.name}·{sb.name}: head {h} is not a clean contiguous slice"
                )
                continue
            try:
                out.extend(self._head(info, node, sa, sb, aa, ab, h, k, qs, ledger, first_is_a))
            except _NotASlice as exc:
                ledger.note(
                    params,
                    f"{sa.name}·{sb.name}: head {h}: a bias stored apart is not one slice "
                    f"for its {exc}",
                )
        return out

    def _head(
        self,
        info: GraphInfo,
        node: fx.Node,
        sa: _Source,
        sb: _Source,
        aa: Arrival,
        ab: Arrival,
        h: int,
        k: tuple[int, ...],
        qs: list[tuple[int, ...]],
        ledger: Ledger,
        first_is_a: bool,
    ) -> list[Proposal]:
        """Head h's rotation (or its rotary-commuting part); ``k``, ``qs``: its features."""
        params = list({id(p): p for p in [*sa.params, *sb.params]}.values())
        if aa.rotary is not None or ab.rotary is not None:
            return self._rotary_head(info, node, sa, sb, aa, ab, h, k, qs, ledger)
        rk = _range_of(list(k))
        rqs = [_range_of(list(q)) for q in qs]
        assert rk is not None
        q_blocks = [blk for r in rqs if r is not None for blk in _blocks(sa.module, *r, aa)]
        k_blocks = _blocks(sb.module, *rk, ab)
        w, u = (q_blocks, k_blocks) if first_is_a else (k_blocks, q_blocks)
        label = f"rotation:{sa.name}·{sb.name}[h{h}]"
        return [
            Proposal(
                Family.ROTATION,
                label,
                partial(DoubleRotation.from_blocks, w, u, label=label),
                params,
                min(info.order[sa.node], info.order[sb.node]),
                sub=info.order[node],
            )
        ]

    def _rotary_head(
        self,
        info: GraphInfo,
        node: fx.Node,
        sa: _Source,
        sb: _Source,
        aa: Arrival,
        ab: Arrival,
        h: int,
        k: tuple[int, ...],
        qs: list[tuple[int, ...]],
        ledger: Ledger,
    ) -> list[Proposal]:
        """Rotary embeddings: only maps commuting with every position's rotation survive.

        A rotary embedding turns each plane (pair of coordinates) of a head by an angle
        proportional to the position; a partial one (GPT-NeoX, Phi) leaves the other
        coordinates alone, and any invertible map of those alone commutes with it: the full
        group on them, one double rotation (:meth:`_unrotated`). With distinct
        frequencies, the invertible maps G with qᵀ R_Δ k = (Gᵀq)ᵀ R_Δ (G⁻¹k) for every Δ
        are those commuting with all R_Δ: per plane, a scaling times a rotation within the
        plane. Its symmetric generators (the ones with
        a Noether charge) are the per-plane scalings: one d = 1 double rotation per plane,
        acting on the two query rows against the two key rows of that plane.
        """
        params = list({id(p): p for p in [*sa.params, *sb.params]}.values())
        ra, rb = aa.rotary, ab.rotary
        if ra is None or rb is None:
            ledger.note(params, f"{sa.name}·{sb.name}: only one side has a rotary embedding")
            return []
        pos = {f: i for i, f in enumerate(k)}
        # a feature the embedding never saw (sliced off and concatenated back, Phi and GPT-J)
        # is not rotated: its own partner, like one the embedding leaves in place
        ra = {**{f: f for q in qs for f in q}, **ra}
        rb = {**{f: f for f in k}, **rb}
        pairs = sorted({tuple(sorted((i, pos.get(rb[f], -1)))) for i, f in enumerate(k)})
        planes = [(i, j) for i, j in pairs if i != j]
        fixed = [i for i, j in pairs if i == j]  # not rotated (partial rotary)
        if any(i < 0 for i, _ in pairs) or len(planes) * 2 + len(fixed) != len(k):
            ledger.note(params, f"{sa.name}·{sb.name}: rotary planes of head {h} leave the head")
            return []
        if any(ra.get(q[i]) != q[j] for q in qs for i, j in pairs):
            ledger.note(params, f"{sa.name}·{sb.name}: query and key rotary planes differ")
            return []
        first_is_a = info.order[sa.node] <= info.order[sb.node]
        sides = (sa, aa), (sb, ab)
        out = self._unrotated(info, node, *sides, h, k, qs, fixed, first_is_a, params, ledger)
        for p, (i, j) in enumerate(planes):
            q_rows = [f for q in qs for f in (q[i], q[j])]
            q_blocks = [b for f in q_rows for b in _blocks(sa.module, f, f + 1, aa)]
            k_blocks = [b for f in (k[i], k[j]) for b in _blocks(sb.module, f, f + 1, ab)]
            w, u = (q_blocks, k_blocks) if first_is_a else (k_blocks, q_blocks)
            label = f"rotation:{sa.name}·{sb.name}[h{h},plane{p}]"
            out.append(
                Proposal(
                    Family.ROTATION,
                    label,
                    partial(DoubleRotation.from_blocks, w, u, label=label),
                    params,
                    min(info.order[sa.node], info.order[sb.node]),
                    sub=info.order[node],
                    note="rotary: per-plane scaling of query against key (commutes with RoPE)",
                )
            )
        return out

    def _unrotated(
        self,
        info: GraphInfo,
        node: fx.Node,
        side_a: tuple[_Source, Arrival],
        side_b: tuple[_Source, Arrival],
        h: int,
        k: tuple[int, ...],
        qs: list[tuple[int, ...]],
        fixed: list[int],
        first_is_a: bool,
        params: list[Any],
        ledger: Ledger,
    ) -> list[Proposal]:
        """The coordinates a partial rotary leaves alone: the full group, query against key."""
        (sa, aa), (sb, ab) = side_a, side_b
        if len(fixed) < 2:
            return []  # one coordinate: its scaling is a plane-free d = 1 rotation, skipped
        rk = _range_of([k[i] for i in fixed])
        rqs = [_range_of([q[i] for i in fixed]) for q in qs]
        if rk is None or any(r is None for r in rqs):
            ledger.note(
                params, f"{sa.name}·{sb.name}: head {h}'s unrotated part is not a contiguous slice"
            )
            return []
        q_blocks = [blk for r in rqs if r is not None for blk in _blocks(sa.module, *r, aa)]
        k_blocks = _blocks(sb.module, *rk, ab)
        w, u = (q_blocks, k_blocks) if first_is_a else (k_blocks, q_blocks)
        label = f"rotation:{sa.name}·{sb.name}[h{h},pass]"
        return [
            Proposal(
                Family.ROTATION,
                label,
                partial(DoubleRotation.from_blocks, w, u, label=label),
                params,
                min(info.order[sa.node], info.order[sb.node]),
                sub=info.order[node],
                note="partial rotary: the coordinates it does not rotate, the full group",
            )
        ]

    def match_mha(self, info: GraphInfo, node: fx.Node, ledger: Ledger) -> list[Proposal]:
        m = info.module(node)
        assert isinstance(m, nn.MultiheadAttention)
        name = info.qual(str(node.target))
        e, h = m.embed_dim, m.num_heads
        if m.out_proj.bias is not None:
            ledger.note(
                [m.out_proj.bias],
                f"{name}.out_proj.bias is added after the heads are summed: the per-head "
                "rotations do not act on it, and the attention output is not followed further",
            )
        kd = e // h
        vd = kd  # value heads have embed_dim // num_heads rows too
        if m._qkv_same_embed_dim:
            assert m.in_proj_weight is not None
            wq = wk = wv = m.in_proj_weight
            off = (0, e, 2 * e)
        else:
            wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
            off = (0, 0, 0)
        bias = m.in_proj_bias
        wo = m.out_proj.weight
        qk: list[Proposal] = []
        vo: list[Proposal] = []
        for i in range(h):
            qb = self._proj(wq, bias, off[0], 0, i, kd)
            kb = self._proj(wk, bias, off[1], e, i, kd)
            if m.bias_k is not None:
                kb.append(Block(_param(m.bias_k), 2, i * kd, (i + 1) * kd))
            vb = self._proj(wv, bias, off[2], 2 * e, i, vd)
            if m.bias_v is not None:
                vb.append(Block(_param(m.bias_v), 2, i * vd, (i + 1) * vd))
            ob = [Block(_param(wo), 1, i * vd, (i + 1) * vd)]
            lq = f"rotation:{name}.q·k[h{i}]"
            lv = f"rotation:{name}.v·out[h{i}]"
            ps = [p for p in m.parameters() if p is not m.out_proj.bias]
            qk.append(
                Proposal(
                    Family.ROTATION,
                    lq,
                    partial(DoubleRotation.from_blocks, qb, kb, label=lq),
                    ps,
                    info.order[node],
                )
            )
            vo.append(
                Proposal(
                    Family.ROTATION,
                    lv,
                    partial(DoubleRotation.from_blocks, vb, ob, label=lv),
                    ps,
                    info.order[node],
                )
            )
        return qk + vo

    @staticmethod
    def _proj(w: Any, bias: Any, woff: int, boff: int, i: int, k: int) -> list[Block]:
        s = i * k
        out = [Block(w, 0, woff + s, woff + s + k)]
        if bias is not None:
            out.append(Block(bias, 0, boff + s, boff + s + k))
        return out
