"""Matchers: a layer's features contracted with each other, or with a parameter.

Two patterns of a selective state-space layer (Mamba's ``x_proj``, whose output is split into
Δ, B and C), recognised by what the graph computes, not by class names:

* **Self-contraction, per feature.** Features A of one layer meet features B of the same
  layer in a contraction Σ_k a_k b_k (``matmul``), with only element-wise products by
  tensors that do not carry them, sums of the same features and casts on the way (the scan
  ``h_t = Ā_t h_{t−1} + Δ_t B_t u_t``, ``y_t = h_t · C_t``). When each feature of A meets
  exactly one feature of B, always the same, and goes nowhere else, scaling a's rows by
  e^{λ} and its partner's by e^{−λ} keeps every contraction: one
  :class:`~noetherflow.symmetry.channel.ChannelRescaling` over two row slices of one weight
  (``DiagonalTerm(start=…, length=…)``), the rest of the rows untouched. A rotation does not
  survive the element-wise products (and the scan's per-state decay), so only this diagonal
  subgroup is proposed.
* **Contraction with a parameter.** Features of a layer contracted, with linear maps only on
  the way, with a parameter read directly (``dt_proj.weight @ Δᵀ``: a linear layer applied
  by a matmul, not by calling its module): W_slice → G⁻¹W_slice, P → P·G along P's
  contracted axis keeps the product, a :class:`~noetherflow.symmetry.rotation.DoubleRotation`
  between a row slice of the layer and that axis of P.

Every proposal is checked numerically like the others (``find_symmetries``).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, fx, nn

from noetherflow.symmetry._fx.common import _blocks, _is_dense, _range_of, _Source, _w_out, _weight
from noetherflow.symmetry._fx.elements import param_elements
from noetherflow.symmetry._fx.engine import (
    APPROXIMATE,
    LINEAR,
    Arrival,
    GraphInfo,
    Ledger,
    Proposal,
    _name_of,
)
from noetherflow.symmetry._fx.flows import _rows_constant
from noetherflow.symmetry._fx.tables import function_op, method_op
from noetherflow.symmetry.base import DiagonalTerm, Family, Symmetry
from noetherflow.symmetry.channel import ChannelRescaling
from noetherflow.symmetry.rotation import Block, DoubleRotation

__all__ = ["ContractionPattern", "self_contraction_nodes"]


def self_contraction_nodes(src: _Source) -> set[fx.Node]:
    """Contraction nodes where ``src``'s features meet its own on both sides, not linearly.

    Those are this module's (a per-feature rescaling); the attention matcher, which pairs
    linear q·kᵀ sides into rotations, leaves them alone.
    """
    sides: dict[fx.Node, list[Arrival]] = {}
    for a in src.arrivals:
        if a.kind in ("contract_a", "contract_b"):
            sides.setdefault(a.node, []).append(a)
    return {
        n
        for n, arrs in sides.items()
        if {a.kind for a in arrs} == {"contract_a", "contract_b"}
        and any(a.mode != LINEAR for a in arrs)
    }


def _pairs(aa: Arrival, ab: Arrival) -> set[tuple[int, int]] | None:
    """(a feature, b feature) met along the contracted axis, or None if not feature to feature."""
    a, b = aa.idx, ab.idx
    if a.dim() < 2 or b.dim() < 2:
        return None
    try:
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        return None
    a = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    if a.shape[-1] != b.shape[-2] or not (_rows_constant(a, 1) and _rows_constant(b, 2)):
        return None
    fa, fb = a[:, 0, :].reshape(-1), b[:, :, 0].reshape(-1)
    if bool((fa < 0).any()) or bool((fb < 0).any()):
        return None  # a blank entry: part of the axis carries no feature
    return set(zip(fa.long().tolist(), fb.long().tolist(), strict=True))


def _is_matmul(node: fx.Node) -> bool:
    if node.op == "call_function":
        return function_op(node.target) == "matmul"
    return node.op == "call_method" and method_op(str(node.target)) == "matmul"


class ContractionPattern:
    """The two matchers of the module docstring, at the layer stage."""

    def match_self(self, info: GraphInfo, src: _Source, ledger: Ledger) -> list[Proposal]:
        """Features of ``src`` contracted with its own features, per feature: a rescaling."""
        nodes = self_contraction_nodes(src)
        if not nodes:
            return []
        params = src.params
        if not _is_dense(src.module):
            ledger.note(
                params,
                f"{src.name}: its features meet each other in a contraction, but it is not a "
                "dense layer",
            )
            return []
        met: set[tuple[int, int]] = set()
        at: set[int] = set()
        for node in sorted(nodes, key=info.order.__getitem__):
            sides = [(i, a) for i, a in enumerate(src.arrivals) if a.node is node]
            if len(sides) != 2:
                ledger.note(
                    params,
                    f"{src.name}: meets itself several times in {_name_of(node, info.modules)}",
                )
                return []
            (ia, aa), (ib, ab) = sorted(sides, key=lambda s: s[1].kind)
            if APPROXIMATE in (aa.mode, ab.mode):
                ledger.note(
                    params,
                    f"{src.name}: a non-homogeneous map ({', '.join(aa.via + ab.via)}) before "
                    f"its features meet in {_name_of(node, info.modules)}",
                )
                return []
            got = _pairs(aa, ab)
            if got is None:
                ledger.note(
                    params,
                    f"{src.name}: its features do not meet one to one along the contracted axis "
                    f"of {_name_of(node, info.modules)}",
                )
                return []
            met |= got
            at |= {ia, ib}
        a_side = sorted({f for f, _ in met})
        partner = dict(met)
        if (
            len(partner) != len(met)
            or len({g for _, g in met}) != len(met)
            or set(partner) & set(partner.values())
        ):
            ledger.note(
                params,
                f"{src.name}: a feature meets several features (or itself) in its contractions",
            )
            return []
        reach = src.reach()
        if any(not reach.get(f, set()) <= at for f in (*partner, *partner.values())):
            ledger.note(
                params, f"{src.name}: features contracted with each other are also read elsewhere"
            )
            return []
        ra = _range_of(a_side)
        rb = _range_of([partner[f] for f in a_side])
        if ra is None or rb is None:
            ledger.note(
                params,
                f"{src.name}: the features contracted with each other are not two slices in "
                "the same order; the rescaling exists but DiagonalTerm takes slices",
            )
            return []
        label = f"rescaling:{src.name}[{ra[0]}:{ra[1]}]↔[{rb[0]}:{rb[1]}]"
        return [
            Proposal(
                Family.RESCALING,
                label,
                partial(_paired_rescaling, src.module, ra, rb, label),
                params,
                info.order[src.node],
                note="features contracted with each other (a state-space scan's B against C)",
            )
        ]

    def match_param(self, info: GraphInfo, src: _Source, ledger: Ledger) -> list[Proposal]:
        """A slice of ``src``'s features contracted with a parameter read directly: a rotation."""
        out: list[Proposal] = []
        if not _is_dense(src.module):
            return out
        reach = src.reach()
        for i, arr in enumerate(src.arrivals):
            if arr.kind not in ("contract_a", "contract_b") or not _is_matmul(arr.node):
                continue
            node = arr.node
            other = node.args[1] if arr.kind == "contract_a" else node.args[0]
            found = param_elements(info, other, 2)
            if found is None:
                continue
            p, pidx = found
            feats = sorted(arr.features)
            rng = _range_of(feats)
            where = _name_of(node, info.modules)
            if (
                arr.mode != LINEAR
                or rng is None
                or not all(reach.get(f, set()) == {i} for f in feats)
            ):
                ledger.note(
                    [*src.params, p],
                    f"{src.name} → {where} with a parameter: not a slice of features reaching it "
                    "through linear maps only",
                )
                continue
            axis = _param_axis(arr, pidx, p, rng)
            if axis is None:
                ledger.note(
                    [*src.params, p],
                    f"{src.name} → {where}: the parameter's contracted axis does not follow the "
                    "features one to one",
                )
                continue
            label = f"rotation:{src.name}[{rng[0]}:{rng[1]}]→{ledger.names.get(id(p), where)}"
            reader = _reader(info, node)
            direct = isinstance(other, fx.Node) and other.op == "get_attr"
            if arr.kind == "contract_b" and axis == 1 and direct and reader is not None:
                ledger.matmul_reads[id(p)] = reader  # W @ x, read in that module's forward
            out.append(
                Proposal(
                    Family.ROTATION,
                    label,
                    partial(_param_rotation, src.module, rng, p, axis, label),
                    [*src.params, p],
                    info.order[src.node],
                    note="a parameter read by a matmul (a linear map not called as a module)",
                    sub=info.order[node],
                )
            )
        return out


def _reader(info: GraphInfo, node: fx.Node) -> str | None:
    """The qualified name of the innermost module whose forward runs ``node``, or None."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return info.prefix  # the traced module's own forward ("": the model's)
    key, value = list(stack.items())[-1]
    if "@" in str(key):  # a module called more than once: no single reader
        return None
    return info.qual(str(value[0] if isinstance(value, tuple) and value else key))


def _param_axis(arr: Arrival, pidx: Tensor, p: nn.Parameter, rng: tuple[int, int]) -> int | None:
    """The axis of ``p`` whose index j meets feature ``rng[0] + j`` in the contraction, or None.

    ``arr.idx`` carries the features along the contracted axis (the last of ``a``, the
    second-to-last of ``b``); ``pidx`` holds p's flat element numbers in the other operand.
    """
    f = arr.idx
    k = -1 if arr.kind == "contract_a" else -2
    pk = -2 if arr.kind == "contract_a" else -1  # the other operand's contracted axis
    fk = f.movedim(k, -1).reshape(-1, f.shape[k])[0]  # features along the contracted axis
    if pidx.dim() < 2 or pidx.shape[pk] != fk.numel():
        return None
    el = pidx.movedim(pk, -1).reshape(-1, pidx.shape[pk]).long()  # [rest, K]
    rows, cols = el // p.shape[1], el % p.shape[1]
    for axis, along, across in ((1, cols, rows), (0, rows, cols)):
        # along the contracted axis: p's index along `axis` is the feature's offset, every row
        if not bool((along == (fk.long() - rng[0])).all()):
            continue
        if int(p.shape[axis]) != rng[1] - rng[0]:
            continue
        others = across[:, 0]
        if (
            bool((across == others[:, None]).all())
            and len(set(others.tolist())) == p.shape[1 - axis]
        ):
            return axis
    return None


def _paired_rescaling(
    layer: nn.Module, ra: tuple[int, int], rb: tuple[int, int], label: str
) -> Symmetry:
    """Rows ``ra`` of ``layer`` (weight and bias) × e^{λ}, rows ``rb`` × e^{−λ}, pair by pair."""
    weight = _weight(layer)
    ax = _w_out(layer)
    n = ra[1] - ra[0]
    up = [DiagonalTerm(weight, ax, 1, 1.0, start=ra[0], length=n)]
    down = [DiagonalTerm(weight, ax, 1, -1.0, start=rb[0], length=n)]
    bias = getattr(layer, "bias", None)
    if isinstance(bias, nn.Parameter):
        up.append(DiagonalTerm(bias, 0, 1, 1.0, start=ra[0], length=n))
        down.append(DiagonalTerm(bias, 0, 1, -1.0, start=rb[0], length=n))
    return ChannelRescaling(up, down, label=label)


def _param_rotation(
    layer: nn.Module, rng: tuple[int, int], p: nn.Parameter, axis: int, label: str
) -> Symmetry:
    """Rows ``rng`` of ``layer`` (weight, bias) → G⁻¹·, ``p`` along ``axis`` → ·G."""
    w_blocks: list[Block] = _blocks(layer, rng[0], rng[1])
    return DoubleRotation.from_blocks(w_blocks, [Block(p, axis, 0, rng[1] - rng[0])], label=label)
