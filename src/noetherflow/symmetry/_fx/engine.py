"""The propagation engine behind :func:`noetherflow.find_symmetries` (torch.fx).

The engine follows the *features* (output neurons / channels) of one parameterised layer
through the traced graph. It replaces the layer's output by an index tensor (each entry holds
the number of the feature it comes from) and re-executes the shape-only operations on it
(view, transpose, split, flatten, pooling, …), so where every feature lands is read off
concrete tensors instead of being reasoned about symbolically. Element-wise maps are
classified as

* linear (identity, inactive dropout, multiplication by a constant scalar, ``att @ v``),
* positively homogeneous (ReLU, LeakyReLU of any slope, active dropout, max-pooling), or
* not homogeneous (tanh, GELU, SiLU, …: the symmetry is only approximate).

Every other use of a feature ends the path with a reason ("read by add", "returned as a
model output"). The matchers (:mod:`noetherflow.symmetry._fx.matchers`) then propose
symmetries from where the features arrive.

This module holds the op tables, :class:`GraphInfo` (a traced graph with the value of every
node), the :class:`Ledger` of parameter uses and reasons, :class:`Proposal` and
:func:`propagate`.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from noetherflow.symmetry._fx.biases import bias_add
from noetherflow.symmetry._fx.concat import blank_parts
from noetherflow.symmetry._fx.flows import (
    Arrival,
    _arrival,
    _Flow,
    _merged_biases,
    _merged_rotary,
    _refine,
    _rows_constant,
    _worse,
)
from noetherflow.symmetry._fx.layers import (
    is_known_module,
    is_zoo_activation,
    layer_spec,
    norm_spec,
)
from noetherflow.symmetry._fx.probes import (
    _RDIV,
    _broadcasts,
    _cat_with_empty,
    _constant_over_reduced,
    _integral,
    _is_blank,
    _is_index_tensor,
    _shape_only,
)
from noetherflow.symmetry._fx.rotary import _rotary
from noetherflow.symmetry._fx.sums import cast_flow, plus_zero, sum_of_flows
from noetherflow.symmetry._fx.tables import (
    APPROXIMATE,
    HOMOGENEOUS,
    LINEAR,
    function_op,
    method_op,
    module_op,
)
from noetherflow.symmetry.base import Family, Symmetry

__all__ = [
    "APPROXIMATE",
    "HOMOGENEOUS",
    "LINEAR",
    "Arrival",
    "GraphInfo",
    "Ledger",
    "Proposal",
    "count_uses",
    "module_problem",
    "propagate",
    "source_index",
]


def is_mha(m: nn.Module | None) -> bool:
    return isinstance(m, nn.MultiheadAttention)


def _name_of(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    if node.op == "call_module":
        return f"{type(modules[str(node.target)]).__name__} {node.target}"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method":
        return f".{node.target}()"
    return f"{node.op} {node.target}"


# -- graph info -----------------------------------------------------------------------------


@dataclass
class GraphInfo:
    """A traced graph with the concrete value of every node on the example inputs.

    ``prefix`` is the qualified name of the traced module inside the whole model ("" for the
    model itself, a Sequential's name in the fallback).
    """

    gm: fx.GraphModule
    values: dict[fx.Node, Any]
    prefix: str = ""
    modules: dict[str, nn.Module] = field(init=False)
    order: dict[fx.Node, int] = field(init=False)

    def __post_init__(self) -> None:
        self.modules = dict(self.gm.named_modules())
        self.order = {n: i for i, n in enumerate(self.gm.graph.nodes)}

    def qual(self, target: str) -> str:
        return f"{self.prefix}.{target}" if self.prefix else target

    def module(self, node: fx.Node) -> nn.Module | None:
        if node.op != "call_module":
            return None
        return self.modules[str(node.target)]

    def execute(self, node: fx.Node, subst: dict[fx.Node, Any]) -> Any:
        """Re-run ``node`` with some inputs replaced (index tensors), others from the record."""

        def load(a: fx.Node) -> Any:
            return subst[a] if a in subst else self.values[a]

        args = fx.node.map_arg(node.args, load)
        kwargs = fx.node.map_arg(node.kwargs, load)
        if node.op == "call_function":
            return node.target(*args, **kwargs)  # type: ignore[operator]
        if node.op == "call_method":
            obj, *rest = args
            return getattr(obj, str(node.target))(*rest, **kwargs)
        if node.op == "call_module":
            return self.modules[str(node.target)](*args, **kwargs)
        raise TypeError(f"cannot execute node {node.op}")


# -- ledger of parameter uses and reasons ---------------------------------------------------


@dataclass
class Ledger:
    """How often each parameter is used, and why a parameter has no symmetry."""

    names: dict[int, str]
    uses: dict[int, int] = field(default_factory=dict)
    owners: dict[int, set[str]] = field(default_factory=dict)  # who reads it, per use
    reasons: dict[int, list[str]] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    # a layer's weight applied by a matmul in another module's forward: id → that module
    matmul_reads: dict[int, str] = field(default_factory=dict)

    def note(self, params: list[nn.Parameter] | list[Tensor], reason: str) -> None:
        for p in params:
            lst = self.reasons.setdefault(id(p), [])
            if reason not in lst:
                lst.append(reason)

    def eligible(self, p: Tensor) -> bool:
        return p.requires_grad and self.uses.get(id(p), 0) == 1

    def shared_uses(self, params: Sequence[Tensor]) -> int:
        """The k uses when every parameter is read only by one module, called k > 1 times.

        ALBERT's shared layer: a symmetry acting inside that module acts identically at every
        use. 0 otherwise: a parameter read by two modules (weight tying) or twice in one call.
        """
        ks = {self.uses.get(id(p), 0) for p in params}
        if len(ks) != 1 or not all(p.requires_grad for p in params):
            return 0
        k = ks.pop()
        one_owner = all(len(self.owners.get(id(p), set())) == 1 for p in params)
        return k if k > 1 and one_owner else 0


def _layer_params(m: nn.Module) -> list[nn.Parameter]:
    return [p for p in (getattr(m, "weight", None), getattr(m, "bias", None)) if p is not None]


def module_problem(m: nn.Module) -> str | None:
    """Why a parameterised module cannot be analysed, or None."""
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(m):
        return "parametrised (torch.nn.utils.parametrize): its weight is computed, not a parameter"
    if m._forward_hooks or m._forward_pre_hooks:
        return "has forward hooks (e.g. old-style weight_norm/spectral_norm) that may change it"
    if layer_spec(m) is not None or norm_spec(m) is not None:
        own = {n for n, _ in m.named_parameters(recurse=False)}
        if not own <= {"weight", "bias"}:
            return f"unexpected parameters {sorted(own)}"
    return None


def count_uses(info: GraphInfo, ledger: Ledger) -> None:
    """Count every use of every parameter in the graph; note unsupported modules."""
    for node in info.gm.graph.nodes:
        if node.op == "call_module":
            m = info.modules[str(node.target)]
            seen: set[int] = set()
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    ledger.uses[id(p)] = ledger.uses.get(id(p), 0) + 1
                    ledger.owners.setdefault(id(p), set()).add(info.qual(str(node.target)))
            if any(True for _ in m.parameters()):
                qual = info.qual(str(node.target))
                problem = module_problem(m)
                if problem is None and not is_known_module(m):
                    problem = f"no symmetry pattern for {type(m).__name__}"
                if problem is not None:
                    ledger.unsupported[qual] = f"{type(m).__name__}: {problem}"
                    ledger.note(list(m.parameters()), f"{qual} is unsupported: {problem}")
        elif node.op == "get_attr" and node.users:
            v = info.values.get(node)
            if isinstance(v, nn.Parameter):
                n_uses = len(node.users)
                if _explicit_norm_users(node) is not None:
                    n_uses = 1  # w / w.norm(): one use
                ledger.uses[id(v)] = ledger.uses.get(id(v), 0) + max(1, n_uses)
                # read directly by the graph: never a shared module's use
                ledger.owners.setdefault(id(v), set()).add(f"{node.name}@{len(ledger.owners)}")


# -- proposals ------------------------------------------------------------------------------


@dataclass
class Proposal:
    """A candidate symmetry found in the graph, not yet checked numerically.

    ``approximate`` marks a candidate broken by a non-homogeneous map (e.g. tanh): it is
    measured and reported in the coverage, never returned as a symmetry.
    """

    family: Family
    label: str
    build: Callable[[], Symmetry]
    params: Sequence[Tensor]
    order: int
    approximate: bool = False
    note: str = ""
    uses_norm_eps: bool = False
    sub: int = 0  # tie-break within one source: graph position of where the features arrive


# -- the propagation engine -----------------------------------------------------------------


def source_index(value: Tensor, axis: int) -> Tensor:
    """The index tensor of a layer output: entry = feature number along ``axis``."""
    n = value.shape[axis]
    view = [1] * value.dim()
    view[axis] = n
    return torch.arange(n, dtype=torch.float64).view(view).expand(value.shape).clone()


def propagate(info: GraphInfo, source: fx.Node, axis: int) -> list[Arrival]:
    """Follow the features of ``source`` (along ``axis`` of its output) through the graph."""
    value = info.values[source]
    flows: dict[fx.Node, _Flow] = {source: _Flow(source_index(value, axis), LINEAR, None, ())}
    arrivals: list[Arrival] = []
    pending = sorted(source.users, key=info.order.__getitem__)
    done: set[fx.Node] = set()
    while pending:
        node = pending.pop(0)
        if node in done:
            continue
        done.add(node)
        ins = [a for a in node.all_input_nodes if a in flows]
        flow_in = flows[ins[0]]
        mode = flow_in.mode
        heads = flow_in.heads
        via = flow_in.via
        for a in ins[1:]:
            mode = _worse(mode, flows[a].mode)
            heads = _refine(heads, flows[a].heads)

        def stop(reason: str, node: fx.Node = node, ins: list[fx.Node] = ins) -> None:
            for a in ins:
                f = flows[a]
                for t in f.idx if isinstance(f.idx, tuple | list) else [f.idx]:
                    arrivals.append(
                        Arrival(node, "break", t, f.mode, f.heads, f.via, reason, biases=f.biases)
                    )

        n_before = len(arrivals)
        out = _step(info, node, ins, flows, mode, heads, via, arrivals, stop)
        met = _merged_biases([flows[a] for a in ins])
        if len(ins) == 1:  # where the features end, the biases they met (else per flow)
            for arr in arrivals[n_before:]:
                arr.biases = arr.biases or met
        if out is not None and out.rotary is None:
            out.rotary = _merged_rotary([flows[a].rotary for a in ins])
        if out is not None and not out.biases:
            out.biases = met
        if out is not None and _is_blank(out.idx):
            continue  # e.g. the key half of a rotary output when following the query
        if out is not None:
            flows[node] = out
            pending.extend(u for u in node.users if u not in done)
            pending.sort(key=info.order.__getitem__)
    return arrivals


def _step(
    info: GraphInfo,
    node: fx.Node,
    ins: list[fx.Node],
    flows: dict[fx.Node, _Flow],
    mode: int,
    heads: list[frozenset[int]] | None,
    via: tuple[str, ...],
    arrivals: list[Arrival],
    stop: Callable[[str], None],
) -> _Flow | None:
    """One node of the propagation: a new flow, an arrival, or a stop (returns None)."""
    name = _name_of(node, info.modules)
    if node.op == "output":
        stop("returned as a model output")
        return None
    if _shape_only(node):
        return None  # x.shape, x.size(), x.dtype: no feature is read
    idx0 = flows[ins[0]].idx
    m = info.module(node)
    subst = {a: flows[a].idx for a in ins}

    def moved(new_mode: int = mode) -> _Flow | None:
        try:
            out = info.execute(node, subst)
        except Exception as exc:  # the op does not accept index tensors: give up here
            stop(f"read by {name} (could not follow it: {type(exc).__name__})")
            return None
        items = out if isinstance(out, tuple | list) else [out]
        if not all(_is_index_tensor(t) and _integral(t) for t in items):
            stop(f"read by {name}, which mixes features")
            return None
        return _Flow(out, new_mode, heads, via)

    through = sum_of_flows(info, node, ins, flows) if len(ins) == 2 else None
    if len(ins) == 1:  # a cast, or x + (a zero by construction): the same features
        through = cast_flow(info, node, flows[ins[0]]) or plus_zero(info, node, ins, flows[ins[0]])
    if through is not None:
        return dataclasses.replace(through)
    if node.target is torch.einsum:
        return _einsum(node, ins, flows, mode, heads, via, info, arrivals, stop, name)
    if node.target in (torch.baddbmm, "baddbmm"):
        return _baddbmm(node, ins, flows, mode, heads, via, info, arrivals, stop, name)
    multi_ok = node.op == "call_function" and (
        function_op(node.target) in ("matmul", "rotary")  # rotary: q and k of a fused qkv
        or node.target is F.scaled_dot_product_attention
        or node.target is torch.einsum
        or node.target is torch.cat
    )
    if len(ins) > 1 and not multi_ok:
        stop(f"read by {name} together with other features of the same layer")
        return None
    if m is not None:
        if layer_spec(m) is not None or norm_spec(m) is not None or is_mha(m):
            if node.args and node.args[0] is ins[0] and isinstance(idx0, Tensor):
                arrivals.append(Arrival(node, "consumer", idx0, mode, heads, via))
            else:
                stop(f"read by {name} in an unsupported position")
            return None
        if isinstance(m, nn.Identity):
            return _Flow(idx0, mode, heads, via)
        op = module_op(m)
        if op == "dropout":
            active = m.training and float(getattr(m, "p", 0.0)) > 0
            return _Flow(idx0, _worse(mode, HOMOGENEOUS if active else LINEAR), heads, via)
        if op == "homogeneous":
            return _Flow(idx0, _worse(mode, HOMOGENEOUS), heads, (*via, type(m).__name__))
        if op == "move":
            return moved()
        if op == "pool":
            if getattr(m, "return_indices", False):
                stop(f"read by {name} with return_indices=True")
                return None
            return moved(_worse(mode, HOMOGENEOUS))
        if op == "approximate" or is_zoo_activation(m):
            return _Flow(idx0, APPROXIMATE, heads, (*via, type(m).__name__))
        stop(f"read by {name}")
        return None
    if node.op == "call_function":
        t = node.target
        kind = function_op(t)
        if kind == "normalisation":
            if node.args and node.args[0] is ins[0] and isinstance(idx0, Tensor):
                arrivals.append(Arrival(node, "consumer", idx0, mode, heads, via))
            else:
                stop(f"read by {name} in an unsupported position")
            return None
        if t is torch.cat and _cat_with_empty(node, ins, info):
            return _Flow(idx0, mode, heads, via)
        if t is torch.cat:
            # the parts of one layer's output put back together (partial rotary) keep their
            # features; another layer's parts are blank
            subst.update(blank_parts(node, subst, info))
            return moved()
        if kind == "rotary":
            return _rotary(node, ins, flows, mode, heads, via, info, stop)
        if kind == "homogeneous":
            return _Flow(idx0, _worse(mode, HOMOGENEOUS), heads, (*via, str(name)))
        if kind == "dropout":
            active = bool(node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True))
            return _Flow(idx0, _worse(mode, HOMOGENEOUS if active else LINEAR), heads, via)
        if kind == "approximate":
            return _Flow(idx0, APPROXIMATE, heads, (*via, str(name)))
        if kind == "pool":
            return moved(_worse(mode, HOMOGENEOUS))
        if kind == "move":
            return moved()
        if kind == "scalar":
            return _scalar(node, ins[0], idx0, mode, heads, via, info, stop, name, arrivals)
        if t is torch.mean and _constant_over_reduced(node, ins[0], idx0, info):
            return moved()
        if kind == "matmul":
            return _matmul(node, ins, flows, mode, heads, via, info, arrivals, stop, name)
        if t is F.scaled_dot_product_attention:
            return _sdpa(node, ins, flows, info, arrivals, stop)
    if node.op == "call_method":
        t = str(node.target)
        kind = method_op(t)
        if kind == "homogeneous":
            return _Flow(idx0, _worse(mode, HOMOGENEOUS), heads, (*via, t))
        if kind == "approximate":
            return _Flow(idx0, APPROXIMATE, heads, (*via, t))
        if kind == "move":
            return moved()
        if kind == "scalar":
            return _scalar(node, ins[0], idx0, mode, heads, via, info, stop, name, arrivals)
        if t == "mean" and _constant_over_reduced(node, ins[0], idx0, info):
            return moved()
        if kind == "matmul":
            return _matmul(node, ins, flows, mode, heads, via, info, arrivals, stop, name)
    handled, added = bias_add(info, node, ins, flows[ins[0]], stop)
    if handled:
        return added  # x + b, b a parameter vector: the bias joins the features
    what = name
    if node.target in (operator.add, torch.add, operator.iadd, "add", "add_"):
        what = f"{name} (a residual connection or other sum)"
    stop(f"read by {what}")
    return None


def _scalar(
    node: fx.Node,
    src: fx.Node,
    idx0: Any,
    mode: int,
    heads: list[frozenset[int]] | None,
    via: tuple[str, ...],
    info: GraphInfo,
    stop: Callable[[str], None],
    name: str,
    arrivals: list[Arrival],
) -> _Flow | None:
    args = list(node.args)
    if len(args) != 2 or (args[0] is not src and node.target in (operator.truediv, torch.div)):
        stop(f"read by {name} (not a division by a constant)")
        return None
    other = args[1] if args[0] is src else args[0]
    val = info.values[other] if isinstance(other, fx.Node) else other
    if isinstance(val, int | float) or (isinstance(val, Tensor) and val.numel() == 1):
        if isinstance(other, fx.Node) and isinstance(val, Tensor) and val.requires_grad:
            stop(f"read by {name} with a learned scale")
            return None
        return _Flow(idx0, mode, heads, via)
    if isinstance(val, nn.Parameter) and isinstance(idx0, Tensor) and isinstance(other, fx.Node):
        # x ⊙ γ with a learned per-channel γ (a layer scale): γ rescales against the layer
        # producing x; the path ends here (AffineRescalingPattern.match_layer_scale).
        out = info.values.get(node)
        if node.target not in _RDIV and isinstance(out, Tensor):
            if _broadcasts(idx0.shape, out.shape):
                arrivals.append(
                    Arrival(other, "scale_param", idx0.expand(out.shape), mode, heads, via)
                )
                return None
    if isinstance(val, Tensor) and isinstance(idx0, Tensor) and node.target not in _RDIV:
        # x ⊙ a or x / a with a tensor a computed without these features (a SwiGLU gate, a
        # layer scale, a mask): diagonal, so per-feature rescaling passes, rotations do not.
        out = info.values.get(node)
        if isinstance(out, Tensor) and _broadcasts(idx0.shape, out.shape):
            return _Flow(idx0.expand(out.shape).clone(), _worse(mode, HOMOGENEOUS), heads, via)
    stop(f"read by {name} (element-wise product with another tensor)")
    return None


def _einsum(
    node: fx.Node,
    ins: list[fx.Node],
    flows: dict[fx.Node, _Flow],
    mode: int,
    heads: list[frozenset[int]] | None,
    via: tuple[str, ...],
    info: GraphInfo,
    arrivals: list[Arrival],
    stop: Callable[[str], None],
    name: str,
) -> _Flow | None:
    """``einsum`` of two operands that is a batched ``q @ kᵀ`` or ``att @ v``.

    ``"…id,…jd->…ij"`` (the same batch letters, the last contracted): q·kᵀ, read like
    ``scaled_dot_product_attention``'s q and k; ``"…ij,…jd->…id"``: a matmul.
    """
    eq, *ops = node.args
    if len(ops) == 1 and isinstance(ops[0], list | tuple):
        ops = list(ops[0])
    if not isinstance(eq, str) or len(ops) != 2 or "->" not in eq or "." in eq:
        stop(f"read by {name} (an einsum that is not a batched matmul)")
        return None
    lhs_rhs, out = eq.replace(" ", "").split("->")
    lhs, rhs = lhs_rhs.split(",")
    same_batch = len(lhs) == len(rhs) == len(out) >= 2 and lhs[:-2] == rhs[:-2] == out[:-2]
    if same_batch and lhs[-1] == rhs[-1] and out[-2:] == lhs[-2] + rhs[-2]:  # q·kᵀ
        for src in ins:
            f = flows[src]
            if not isinstance(f.idx, Tensor) or not _rows_constant(f.idx, -2):
                stop(f"read by {name} with features not on the contracted axis")
                return None
            if src is ops[0]:
                arrivals.append(_arrival(node, "contract_a", f.idx, f))
            if src is ops[1]:
                arrivals.append(_arrival(node, "contract_b", f.idx.transpose(-1, -2), f))
        return None
    if same_batch and lhs[-1] == rhs[-2] and out[-2:] == lhs[-2] + rhs[-1]:  # a @ b
        return _matmul(node, ins, flows, mode, heads, via, info, arrivals, stop, name, a=ops[0])
    stop(f"read by {name} (an einsum that is not a batched matmul)")
    return None


def _baddbmm(
    node: fx.Node,
    ins: list[fx.Node],
    flows: dict[fx.Node, _Flow],
    mode: int,
    heads: list[frozenset[int]] | None,
    via: tuple[str, ...],
    info: GraphInfo,
    arrivals: list[Arrival],
    stop: Callable[[str], None],
    name: str,
) -> _Flow | None:
    """``β·input + α·(batch1 @ batch2)`` (BLOOM's attention scores with ALiBi): q·kᵀ."""
    args = list(node.args)
    kw = node.kwargs
    names = ("input", "batch1", "batch2")
    role = {n: kw.get(n, args[i] if i < len(args) else None) for i, n in enumerate(names)}
    if role["input"] in ins or role["batch1"] is None or role["batch2"] is None:
        stop(f"read by {name} as the added term")
        return None
    if role["batch1"] not in ins and role["batch2"] not in ins:
        stop(f"read by {name} in an unsupported position")
        return None
    out = _matmul(node, ins, flows, mode, heads, via, info, arrivals, stop, name, a=role["batch1"])
    if out is not None:  # att @ v through baddbmm: the added term mixes in
        stop(f"read by {name} (added to another tensor)")
        return None
    return None


def _matmul(
    node: fx.Node,
    ins: list[fx.Node],
    flows: dict[fx.Node, _Flow],
    mode: int,
    heads: list[frozenset[int]] | None,
    via: tuple[str, ...],
    info: GraphInfo,
    arrivals: list[Arrival],
    stop: Callable[[str], None],
    name: str,
    a: Any = None,
) -> _Flow | None:
    """``a @ b``: features of ``a`` (``node.args[0]`` unless given) along the contracted axis."""
    a = node.args[0] if a is None else a
    result: _Flow | None = None
    for src in ins:
        f = flows[src]
        idx = f.idx
        if not isinstance(idx, Tensor) or idx.dim() < 2:
            stop(f"read by {name} (a vector product)")
            return None
        if src is a:
            # Features along the contracted last axis: one half of q @ kᵀ.
            if _rows_constant(idx, -2):
                arrivals.append(_arrival(node, "contract_a", idx, f))
                continue
            stop(f"read by {name} as the left factor with features along rows")
            return None
        if _rows_constant(idx, -1):
            arrivals.append(_arrival(node, "contract_b", idx, f))
            continue
        if _rows_constant(idx, -2) and len(ins) == 1:
            # att @ v: tokens are mixed, features (last axis) pass through; per head.
            result = _mix(idx, info.values[node], f)
            continue
        stop(f"read by {name}, which mixes features")
        return None
    return result


def _mix(idx: Tensor, out: Tensor, f: _Flow) -> _Flow:
    """Flow through ``att @ v``: the features of v on the last axis, grouped per head."""
    lead = idx.narrow(-2, 0, 1)
    new = lead.expand(*out.shape[:-2], 1, idx.shape[-1]).expand(out.shape).clone()
    rows = lead.reshape(-1, idx.shape[-1])
    groups = sorted({frozenset(int(v) for v in row.tolist()) for row in rows}, key=min)
    return _Flow(new, f.mode, _refine(f.heads, groups), f.via)


def _sdpa(
    node: fx.Node,
    ins: list[fx.Node],
    flows: dict[fx.Node, _Flow],
    info: GraphInfo,
    arrivals: list[Arrival],
    stop: Callable[[str], None],
) -> _Flow | None:
    args = list(node.args)[:3]
    if any(args.count(a) > 1 for a in ins) or any(a not in args for a in ins):
        stop("read by scaled_dot_product_attention in several roles or as a keyword")
        return None
    result: _Flow | None = None
    q_val = info.values.get(args[0]) if isinstance(args[0], fx.Node) else None
    for src in ins:
        f = flows[src]
        idx = f.idx
        if not isinstance(idx, Tensor) or not _rows_constant(idx, -2):
            stop("read by scaled_dot_product_attention with features not on the last axis")
            return None
        pos = args.index(src)
        if pos > 0 and isinstance(q_val, Tensor) and idx.dim() >= 3 and q_val.dim() >= 3:
            # grouped-query attention (enable_gqa=True): each key/value head serves
            # n_q // n_kv consecutive query heads.
            n_q, n_kv = q_val.shape[-3], idx.shape[-3]
            if n_q != n_kv and n_kv > 0 and n_q % n_kv == 0:
                idx = idx.repeat_interleave(n_q // n_kv, dim=-3)
        if pos == 0:
            arrivals.append(_arrival(node, "contract_a", idx, f))
        elif pos == 1:
            t = idx.transpose(-1, -2)
            arrivals.append(_arrival(node, "contract_b", t, f))
        else:
            result = _mix(idx, info.values[node], f)
    return result


def _explicit_norm_users(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(norm, div) when ``node``'s users are exactly ``norm(node)`` and ``node / norm``."""
    users = list(node.users)
    if len(users) != 2:
        return None
    norms = [u for u in users if _is_norm_call(u)]
    divs = [u for u in users if u.target in (operator.truediv, torch.div, "div")]
    if len(norms) != 1 or len(divs) != 1:
        return None
    n, d = norms[0], divs[0]
    if d.args[0] is node and d.args[1] is n and len(n.users) == 1:
        return n, d
    return None


def _is_norm_call(u: fx.Node) -> bool:
    if u.op == "call_method":
        return method_op(u.target) == "vector_norm"
    return u.op == "call_function" and function_op(u.target) == "vector_norm"
