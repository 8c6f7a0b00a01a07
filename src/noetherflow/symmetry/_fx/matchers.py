"""The four matchers behind :func:`noetherflow.find_symmetries`, one per symmetry family.

They read where the features of every parameterised layer arrive
(:func:`noetherflow.symmetry._fx.engine.propagate`) and propose symmetries:

* :class:`RescalingPattern` — all features reach one Linear/Conv through homogeneous maps;
* :class:`RotationPattern` — features reach a Linear through linear maps only (per head
  when they pass through ``att @ v``);
* :class:`AttentionPattern` — features of two layers meet in a contraction ``q @ kᵀ`` (or
  ``scaled_dot_product_attention``), and ``nn.MultiheadAttention`` modules;
* :class:`ScalePattern` — features reach a normalisation layer, and explicit
  ``w / w.norm()`` / ``F.normalize(w)`` on a parameter.

Proposals are only candidates: :mod:`noetherflow.symmetry.detect` checks each numerically.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from noetherflow.symmetry._fx.affine import (
    AffineRescalingPattern,
    LayerScalePattern,
    affine_params,
)
from noetherflow.symmetry._fx.engine import (
    APPROXIMATE,
    LINEAR,
    NORM_FUNCTIONS,
    Arrival,
    GraphInfo,
    Ledger,
    Proposal,
    _explicit_norm_users,
    _layer_params,
    _name_of,
    _rows_constant,
    is_mha,
    module_problem,
    propagate,
)
from noetherflow.symmetry._fx.layers import layer_spec, norm_spec
from noetherflow.symmetry.base import DiagonalTerm, Family, Symmetry
from noetherflow.symmetry.channel import ChannelRescaling
from noetherflow.symmetry.rescaling import Rescaling
from noetherflow.symmetry.rotation import Block, DoubleRotation
from noetherflow.symmetry.scaling import ScaleInvariance

__all__ = [
    "AttentionPattern",
    "RescalingPattern",
    "RotationPattern",
    "ScalePattern",
    "run_patterns",
]

# -- helpers for the matchers ---------------------------------------------------------------

_NN_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _feature_axis_of_input(m: nn.Module) -> int:
    lspec = layer_spec(m)
    if lspec is not None:
        return lspec.in_axis
    nspec = norm_spec(m)
    return nspec.axis if nspec is not None else -1


def _weight(m: nn.Module | None) -> nn.Parameter:
    w = getattr(m, "weight", None)
    assert isinstance(w, nn.Parameter), f"{type(m).__name__} has no weight parameter"
    return w


def _w_out(m: nn.Module) -> int:
    spec = layer_spec(m)
    return spec.w_out if spec is not None else 0


def _w_in(m: nn.Module) -> int:
    spec = layer_spec(m)
    return spec.w_in if spec is not None else 1


def _is_dense(m: nn.Module | None) -> bool:
    """A linear layer that is not a convolution (nn.Linear, HF Conv1D)."""
    spec = layer_spec(m)
    return spec is not None and not spec.conv


def _column_map(arr: Arrival, m: nn.Module) -> Tensor | None:
    """Feature of each input column/channel of consumer ``m``, if constant over other axes."""
    idx = arr.idx
    ax = _feature_axis_of_input(m)
    if idx.dim() == 1:
        idx = idx.unsqueeze(0)
    flat = idx.movedim(ax, -1).reshape(-1, idx.shape[ax])
    if not bool((flat == flat[:1]).all()):
        return None
    return flat[0].to(torch.long)


def _range_of(feats: list[int]) -> tuple[int, int] | None:
    """(start, stop) when ``feats`` is start, start+1, …, stop-1."""
    if not feats:
        return None
    s = feats[0]
    if feats != list(range(s, s + len(feats))):
        return None
    return s, s + len(feats)


def _runs(col: list[int], cols: Tensor, fw: list[int]) -> list[tuple[int, int]] | None:
    """Split the columns ``col`` reading features ``fw`` into contiguous copies of ``fw``."""
    n = len(fw)
    if not col or len(col) % n:
        return None
    out = []
    for r in range(0, len(col), n):
        run = col[r : r + n]
        rng = _range_of(run)
        if rng is None or [int(cols[c]) for c in run] != fw:
            return None
        out.append(rng)
    return out


def _param(t: Any) -> nn.Parameter:
    assert isinstance(t, nn.Parameter)
    return t


def _blocks(layer: nn.Module, start: int, stop: int) -> list[Block]:
    weight: Any = layer.weight
    bias: Any = getattr(layer, "bias", None)
    out = [Block(weight, _w_out(layer), start, stop)]
    if bias is not None:
        out.append(Block(bias, 0, start, stop))
    return out


@dataclass
class _Source:
    node: fx.Node
    module: nn.Module
    name: str
    arrivals: list[Arrival]

    @property
    def params(self) -> list[nn.Parameter]:
        return _layer_params(self.module)

    def reach(self) -> dict[int, set[int]]:
        """Feature → indices of the arrivals it reaches."""
        out: dict[int, set[int]] = {}
        for i, a in enumerate(self.arrivals):
            for f in a.features:
                out.setdefault(f, set()).add(i)
        return out


def _only(src: _Source, i: int, feats: set[int], reach: dict[int, set[int]]) -> bool:
    return all(reach.get(f, set()) == {i} for f in feats)


def _kinds(src: _Source) -> Iterator[tuple[int, Arrival]]:
    return enumerate(src.arrivals)


# -- the matchers ---------------------------------------------------------------------------


class RescalingPattern:
    """Linear/Conv → positively homogeneous maps → Linear/Conv (per neuron or channel)."""

    family = Family.RESCALING

    def match(self, info: GraphInfo, src: _Source, ledger: Ledger) -> list[Proposal]:
        arrs = src.arrivals
        if len(arrs) != 1 or arrs[0].kind != "consumer":
            return []
        arr = arrs[0]
        second = info.module(arr.node)
        if second is None or layer_spec(second) is None:
            return []
        first = src.module
        sname = info.qual(str(arr.node.target))
        both_linear = _is_dense(first) and _is_dense(second)
        if arr.mode == LINEAR and both_linear:
            return []  # a double rotation, which contains the rescaling
        for layer, nm in ((first, src.name), (second, sname)):
            if getattr(layer_spec(layer), "groups", 1) != 1:
                ledger.note(
                    [*src.params, _weight(second)],
                    f"{nm} is a grouped convolution (groups={getattr(layer, 'groups', 1)}); "
                    "its per-group "
                    "rescaling is not supported",
                )
                return []
        cols = _column_map(arr, second)
        n_out = int(_weight(first).shape[_w_out(first)])
        n_in = int(_weight(second).shape[_w_in(second)])
        if cols is None or n_in % n_out != 0:
            ledger.note(
                [*src.params, _weight(second)],
                f"{src.name} → {sname}: features do not land on fixed input columns",
            )
            return []
        block = n_in // n_out
        if not torch.equal(cols, torch.arange(n_in) // block):
            ledger.note(
                [*src.params, _weight(second)],
                f"{src.name} → {sname}: channel c does not map to the contiguous block of "
                f"{block} columns c·{block}…; the rescaling exists but this layout is not "
                "supported by Rescaling",
            )
            return []
        label = f"rescaling:{src.name}→{sname}"
        approx = arr.mode == APPROXIMATE
        note = ""
        if approx:
            bad = [v for v in arr.via if v not in ("ReLU", "LeakyReLU", "PReLU", "relu")]
            note = f"through {', '.join(bad) or 'a non-homogeneous map'} (not homogeneous)"
        elif both_linear and not arr.via:
            note = "dropout is active between them (training mode): no rotation, only rescaling"
        return [
            Proposal(
                Family.RESCALING,
                label,
                partial(_rescaling, first, second, block, label),
                [*src.params, _weight(second)],
                info.order[src.node],
                approximate=approx,
                note=note,
            )
        ]


def _rescaling(first: nn.Module, second: nn.Module, block: int, label: str) -> Symmetry:
    """Rescaling for Linear/Conv pairs; ChannelRescaling for other layouts (HF Conv1D)."""
    if isinstance(first, _NN_LAYERS) and isinstance(second, _NN_LAYERS):
        return Rescaling(first, second, block=block, label=label)
    up = [
        DiagonalTerm(p, _w_out(first) if p.dim() > 1 else 0, 1, 1.0) for p in _layer_params(first)
    ]
    down = [DiagonalTerm(_param(_weight(second)), _w_in(second), block, -1.0)]
    return ChannelRescaling(up, down, label=label)


class RotationPattern:
    """Linear → linear maps only → Linear: U·W = (U G)(G⁻¹ W), per head after ``att @ v``."""

    family = Family.ROTATION

    def match(self, info: GraphInfo, src: _Source, ledger: Ledger) -> list[Proposal]:
        first = src.module
        if not _is_dense(first):
            return []
        reach = src.reach()
        out: list[Proposal] = []
        for i, arr in _kinds(src):
            if arr.kind != "consumer":
                continue
            second = info.module(arr.node)
            if second is None or not _is_dense(second) or arr.mode != LINEAR:
                continue
            sname = info.qual(str(arr.node.target))
            feats = arr.features
            cmap = _column_map(arr, second)
            n_cols = int(_weight(second).shape[_w_in(second)])
            whole = cmap is not None and torch.equal(cmap, torch.arange(n_cols))
            both_nn = isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
            if len(src.arrivals) == 1 and arr.heads is None and both_nn:
                if whole and first.out_features == second.in_features:
                    label = f"rotation:{src.name}→{sname}"
                    out.append(
                        Proposal(
                            Family.ROTATION,
                            label,
                            partial(DoubleRotation, first, second, label=label),
                            [*src.params, _weight(second)],
                            info.order[src.node],
                        )
                    )
                    continue
            if not _only(src, i, feats, reach):
                ledger.note(
                    [*src.params, _weight(second)],
                    f"{src.name} → {sname}: some features are also read elsewhere",
                )
                continue
            cols = _column_map(arr, second)
            if cols is None:
                continue
            groups = arr.heads if arr.heads is not None else [frozenset(feats)]
            for h, g in enumerate(groups):
                fw = sorted(g)
                rw = _range_of(fw)
                col = [int(c) for c in torch.nonzero(torch.isin(cols, torch.tensor(fw)))]
                runs = _runs(col, cols, fw)
                if rw is None or runs is None:
                    ledger.note(
                        [*src.params, _weight(second)],
                        f"{src.name} → {sname}: head {h} is not a contiguous slice",
                    )
                    continue
                tag = f"[h{h}]" if len(groups) > 1 else f"[{rw[0]}:{rw[1]}]"
                label = f"rotation:{src.name}→{sname}{tag}"
                w_blocks = _blocks(first, *rw)
                # One block per reader of the head: several query heads share a value head
                # in grouped-query attention, and all of them turn with it.
                u_blocks = [Block(_param(_weight(second)), _w_in(second), *rc) for rc in runs]
                out.append(
                    Proposal(
                        Family.ROTATION,
                        label,
                        partial(DoubleRotation.from_blocks, w_blocks, u_blocks, label=label),
                        [*src.params, _weight(second)],
                        info.order[src.node],
                        sub=info.order[arr.node],
                    )
                )
        return out


class AttentionPattern:
    """Per head W_Q·W_Kᵀ in hand-written attention; W_Q·W_Kᵀ, W_O·W_V in nn.MultiheadAttention."""

    family = Family.ROTATION

    def match_contractions(
        self, info: GraphInfo, sources: list[_Source], ledger: Ledger
    ) -> list[Proposal]:
        by_node: dict[fx.Node, dict[str, list[tuple[_Source, int, Arrival]]]] = {}
        for src in sources:
            for i, arr in _kinds(src):
                if arr.kind in ("contract_a", "contract_b"):
                    by_node.setdefault(arr.node, {}).setdefault(arr.kind, []).append((src, i, arr))
        out: list[Proposal] = []
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
            ((sa, ia, aa),) = sides["contract_a"]
            (sb, ib, ab) = sides["contract_b"][0]
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
            if aa.rotary is not None or ab.rotary is not None:
                out.extend(self._rotary_head(info, node, sa, sb, aa, ab, h, k, qs, ledger))
                continue
            q_blocks = [blk for r in rqs if r is not None for blk in _blocks(sa.module, *r)]
            k_blocks = _blocks(sb.module, *rk)
            w, u = (q_blocks, k_blocks) if first_is_a else (k_blocks, q_blocks)
            label = f"rotation:{sa.name}·{sb.name}[h{h}]"
            out.append(
                Proposal(
                    Family.ROTATION,
                    label,
                    partial(DoubleRotation.from_blocks, w, u, label=label),
                    params,
                    min(info.order[sa.node], info.order[sb.node]),
                    sub=info.order[node],
                )
            )
        return out

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
        proportional to the position. With distinct frequencies, the invertible maps G with
        qᵀ R_Δ k = (Gᵀq)ᵀ R_Δ (G⁻¹k) for every Δ are those commuting with all R_Δ: per plane,
        a scaling times a rotation within the plane. Its symmetric generators (the ones with
        a Noether charge) are the per-plane scalings: one d = 1 double rotation per plane,
        acting on the two query rows against the two key rows of that plane.
        """
        params = list({id(p): p for p in [*sa.params, *sb.params]}.values())
        ra, rb = aa.rotary, ab.rotary
        if ra is None or rb is None:
            ledger.note(params, f"{sa.name}·{sb.name}: only one side has a rotary embedding")
            return []
        pos = {f: i for i, f in enumerate(k)}
        planes = sorted({tuple(sorted((i, pos.get(rb.get(f, -1), -1)))) for i, f in enumerate(k)})
        if any(i < 0 for i, _ in planes) or len(planes) * 2 != len(k):
            ledger.note(params, f"{sa.name}·{sb.name}: rotary planes of head {h} leave the head")
            return []
        if any(ra.get(q[i]) != q[j] for q in qs for i, j in planes):
            ledger.note(params, f"{sa.name}·{sb.name}: query and key rotary planes differ")
            return []
        first_is_a = info.order[sa.node] <= info.order[sb.node]
        out = []
        for p, (i, j) in enumerate(planes):
            q_blocks = [b for q in qs for f in (q[i], q[j]) for b in _blocks(sa.module, f, f + 1)]
            k_blocks = [b for f in (k[i], k[j]) for b in _blocks(sb.module, f, f + 1)]
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


class ScalePattern:
    """Weights feeding a normalisation layer, and explicit ``w / w.norm()`` normalisation."""

    family = Family.SCALE

    def match(self, info: GraphInfo, src: _Source, ledger: Ledger) -> list[Proposal]:
        arrs = src.arrivals
        if len(arrs) != 1 or arrs[0].kind != "consumer":
            return []
        arr = arrs[0]
        norm = info.module(arr.node)
        nspec = norm_spec(norm)
        if arr.node.op == "call_function" and arr.node.target in NORM_FUNCTIONS:
            return self._functional(info, src, arr, ledger)
        if nspec is None or norm is None:
            return []
        nname = info.qual(str(arr.node.target))
        if arr.mode == APPROXIMATE:
            ledger.note(src.params, f"{src.name} → {nname} through a non-homogeneous map")
            return []
        params = src.params
        if nspec.batch:
            if _w_out(src.module) != 0:
                return []
            uses_batch = norm.training or not norm.track_running_stats
            if not uses_batch:
                ledger.note(
                    params,
                    f"{nname} is a BatchNorm in eval mode (running statistics): not scale "
                    "invariant; detect with model.train() to find the per-channel invariance",
                )
                return []
            cols = _column_map(arr, norm)
            n_feat = int(getattr(norm, "num_features", 0))
            if cols is None or not torch.equal(cols, torch.arange(n_feat)):
                return []
            label = f"scale:{src.name}→{nname}"
            return [
                Proposal(
                    Family.SCALE,
                    label,
                    lambda: ScaleInvariance(params, per_channel=True, label=label, norm=norm),
                    params,
                    info.order[src.node],
                    note="per channel; BatchNorm in training mode only; exact up to eps",
                    uses_norm_eps=True,
                )
            ]
        label = f"scale:{src.name}→{nname}"
        return [
            Proposal(
                Family.SCALE,
                label,
                lambda: ScaleInvariance(params, label=label),
                params,
                info.order[src.node],
                note=f"whole layer; exact up to {type(norm).__name__} eps",
                uses_norm_eps=True,
            )
        ]

    def _functional(
        self, info: GraphInfo, src: _Source, arr: Arrival, ledger: Ledger
    ) -> list[Proposal]:
        """``F.layer_norm`` / ``F.group_norm`` / ``F.rms_norm`` called in the forward."""
        fname = getattr(arr.node.target, "__name__", str(arr.node.target))
        if arr.mode == APPROXIMATE:
            ledger.note(src.params, f"{src.name} → {fname} through a non-homogeneous map")
            return []
        params = src.params
        label = f"scale:{src.name}→{fname}"
        return [
            Proposal(
                Family.SCALE,
                label,
                lambda: ScaleInvariance(params, label=label),
                params,
                info.order[src.node],
                note=f"whole layer; exact up to the eps of F.{fname}",
                uses_norm_eps=True,
            )
        ]

    def match_explicit(self, info: GraphInfo, node: fx.Node, ledger: Ledger) -> list[Proposal]:
        """``w / w.norm()`` (one group) or ``F.normalize(w, dim=1)`` (one group per row)."""
        p = info.values.get(node)
        if not isinstance(p, nn.Parameter):
            return []
        name = info.qual(str(node.target))
        users = list(node.users)
        per_channel: bool | None = None
        if len(users) == 1 and users[0].op == "call_function" and users[0].target is F.normalize:
            u = users[0]
            dim = u.kwargs.get("dim", u.args[2] if len(u.args) > 2 else 1)
            if p.dim() == 1 and dim in (0, -1):
                per_channel = False
            elif p.dim() == 2 and dim in (1, -1):
                per_channel = True
        elif (pair := _explicit_norm_users(node)) is not None:
            n = pair[0]
            dims = n.kwargs.get("dim", n.args[2] if len(n.args) > 2 else None)
            if dims is None:
                per_channel = False
            elif p.dim() == 2 and dims in (1, -1, (1,), (-1,)):
                per_channel = True
        if per_channel is None:
            ops = [_name_of(u, info.modules) for u in users]
            ledger.note([p], f"{name} is used directly by {ops}; no pattern matched")
            return []
        label = f"scale:{name}"
        return [
            Proposal(
                Family.SCALE,
                label,
                lambda: ScaleInvariance([p], per_channel=bool(per_channel), label=label),
                [p],
                info.order[node],
                note="explicit normalisation" + (" (per row)" if per_channel else ""),
            )
        ]


# -- driver ---------------------------------------------------------------------------------


def run_patterns(info: GraphInfo, ledger: Ledger) -> list[Proposal]:
    """Propagate from every parameterised layer and run every matcher on the arrivals."""
    rescale, rotate, attend, scale = (
        RescalingPattern(),
        RotationPattern(),
        AttentionPattern(),
        ScalePattern(),
    )
    affine, layer_scale = AffineRescalingPattern(), LayerScalePattern()
    props: list[Proposal] = []
    sources: list[_Source] = []
    for node in info.gm.graph.nodes:
        m = info.module(node)
        if node.op == "get_attr":
            if not node.users:
                continue  # only an attribute such as .dtype was read
            props.extend(scale.match_explicit(info, node, ledger))
            continue
        if m is None or module_problem(m) is not None:
            continue
        if is_mha(m):
            props.extend(attend.match_mha(info, node, ledger))
            continue
        nspec = norm_spec(m)
        if nspec is not None and affine_params(m):
            value = info.values.get(node)
            if isinstance(value, Tensor) and value.dim() >= 1:
                arrs = propagate(info, node, nspec.axis if value.dim() > 1 else 0)
                qual = info.qual(str(node.target))
                props.extend(affine.match(info, qual, m, arrs, ledger))
            continue
        spec = layer_spec(m)
        if spec is None:
            continue
        value = info.values.get(node)
        if not isinstance(value, Tensor):
            continue
        axis = spec.out_axis
        if spec.conv and value.dim() == _weight(m).dim() - 1:
            axis = 0  # unbatched conv input
        src = _Source(node, m, info.qual(str(node.target)), propagate(info, node, axis))
        sources.append(src)
        for arr in src.arrivals:
            if arr.kind == "break":
                ledger.note(src.params, f"output of {src.name} is {arr.reason}")
        for matcher in (rescale, rotate, scale):
            props.extend(matcher.match(info, src, ledger))
        props.extend(layer_scale.match(info, src.name, m, src.arrivals, ledger))
    props.extend(attend.match_contractions(info, sources, ledger))
    return props
