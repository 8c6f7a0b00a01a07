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
They are registered like layers (:func:`noetherflow.symmetry._fx.patterns.register_matcher`),
and :func:`run_patterns` runs whatever is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from noetherflow.symmetry._fx.affine import (
    AffineRescalingPattern,
    LayerScalePattern,
    affine_params,
)
from noetherflow.symmetry._fx.attention import AttentionPattern
from noetherflow.symmetry._fx.biases import refuse_extra_biases
from noetherflow.symmetry._fx.common import (
    _blocks,
    _column_map,
    _is_dense,
    _kinds,
    _NotASlice,
    _only,
    _param,
    _range_of,
    _runs,
    _Source,
    _w_in,
    _w_out,
    _weight,
)
from noetherflow.symmetry._fx.contractions import ContractionPattern
from noetherflow.symmetry._fx.embeddings import EmbeddingProjectionPattern, is_embedding
from noetherflow.symmetry._fx.engine import (
    APPROXIMATE,
    LINEAR,
    Arrival,
    GraphInfo,
    Ledger,
    Proposal,
    _explicit_norm_users,
    _name_of,
    is_mha,
    module_problem,
    propagate,
)
from noetherflow.symmetry._fx.layers import NormSpec, layer_spec, norm_spec
from noetherflow.symmetry._fx.patterns import claimed, matchers_at, register_matcher, run
from noetherflow.symmetry._fx.tables import function_op
from noetherflow.symmetry.base import Family, Symmetry
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
        # a grouped consumer (G groups) reads channel γ·I_g + i in group γ's filters only
        groups = getattr(layer_spec(second), "groups", 1)
        n_out = int(_weight(first).shape[_w_out(first)])
        per_group = int(_weight(second).shape[_w_in(second)])
        n_in = per_group * groups
        cols = _column_map(arr, second)
        start, cols = _own_columns(cols)
        if start is not None and cols is not None and groups > 1:
            cols = None  # another layer's channels in a grouped consumer: not supported
        if start is not None and cols is not None:
            n_in = per_group = len(cols)  # the slice of second's columns first's neurons reach
        if cols is None or n_in % n_out != 0 or per_group % (n_in // n_out) != 0:
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
                partial(_rescaling, first, second, block, label, start),
                [*src.params, _weight(second)],
                info.order[src.node],
                approximate=approx,
                note=note,
            )
        ]


def _rescaling(
    first: nn.Module, second: nn.Module, block: int, label: str, start: int | None = None
) -> Symmetry:
    """The :class:`Rescaling` of two layers of the layer registry (Linear, Conv, HF Conv1D).

    It reads each weight's feature axes from the registry (``w_out`` of ``first``, ``w_in`` of
    ``second``), so a layer stored ``[in, out]`` (HF ``Conv1D``, a layer registered with
    ``transposed=True``) needs no other class. ``start``: first's neurons reach the columns
    from ``start`` on (a concatenation with another layer's output), None: all columns.
    """
    return Rescaling(first, second, block=block, start=start, label=label)


def _with_others(arr: Arrival, ledger: Ledger, src: _Source, nname: str) -> bool:
    """Whether a norm reads the source's features with another layer's (noted if so).

    A ``torch.cat`` of two layers into one LayerNorm/RMSNorm: the norm divides by one
    statistic of all its features, so only the joint scaling of both layers is invariant.
    """
    if not bool((arr.idx < 0).any()):
        return False
    ledger.note(
        src.params,
        f"{src.name} → {nname}: normalised together with another layer's features "
        "(a concatenation): only their joint scaling is invariant, not claimed",
    )
    return True


def _own_columns(cols: Tensor | None) -> tuple[int | None, Tensor | None]:
    """The slice of the columns carrying the source's features: ``(start, cols[start:stop])``.

    When the other columns are blank (−1: a ``torch.cat`` with another layer's output).
    ``(None, cols)`` when every column carries them; ``(None, None)`` when the source's
    columns are not one contiguous run.
    """
    if cols is None or bool((cols >= 0).all()):
        return None, cols
    own = torch.nonzero(cols >= 0).flatten()
    if own.numel() == 0:
        return None, None
    lo, hi = int(own[0]), int(own[-1]) + 1
    if hi - lo != own.numel():
        return None, None
    return lo, cols[lo:hi]


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
            feats = {f for f in arr.features if f >= 0}  # −1: another layer's (a cat)
            cmap = _column_map(arr, second)
            n_cols = int(_weight(second).shape[_w_in(second)])
            whole = cmap is not None and torch.equal(cmap, torch.arange(n_cols))
            both_nn = isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
            if len(src.arrivals) == 1 and arr.heads is None and both_nn and not arr.biases:
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
                try:
                    w_blocks = _blocks(first, *rw, arr)
                except _NotASlice as exc:
                    ledger.note(
                        [*src.params, _weight(second)],
                        f"{src.name} → {sname}: a bias stored apart is not one slice for {exc}",
                    )
                    continue
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
        if arr.node.op == "call_function" and function_op(arr.node.target) == "normalisation":
            return self._functional(info, src, arr, ledger)
        if nspec is None or norm is None:
            return []
        nname = info.qual(str(arr.node.target))
        if arr.mode == APPROXIMATE:
            ledger.note(src.params, f"{src.name} → {nname} through a non-homogeneous map")
            return []
        params = src.params
        if nspec.low_precision:
            ledger.note(
                params,
                f"{nname} normalises in float32 inside a float64 model: the scale invariance "
                f"of {src.name} holds to float32 round-off only",
            )
            return []
        if nspec.per_channel or nspec.groups > 1:
            return self._per_group(info, src, arr, norm, nspec, nname, ledger)
        if _with_others(arr, ledger, src, nname):
            return []
        label = f"scale:{src.name}→{nname}"
        return [
            Proposal(
                Family.SCALE,
                label,
                # the norm rides along so that clip_to_eps / solve_within_eps read its eps
                lambda: ScaleInvariance(params, label=label, norm=norm),
                params,
                info.order[src.node],
                note=f"whole layer; exact up to {type(norm).__name__} eps",
                uses_norm_eps=True,
            )
        ]

    def _per_group(
        self,
        info: GraphInfo,
        src: _Source,
        arr: Arrival,
        norm: nn.Module,
        nspec: NormSpec,
        nname: str,
        ledger: Ledger,
    ) -> list[Proposal]:
        """Per-channel (BatchNorm, InstanceNorm) or per-group (GroupNorm) scale invariance.

        Each channel (group of channels) of the source's rows is scaled on its own.
        """
        params = src.params
        kind = type(norm).__name__
        if nspec.running(norm):
            ledger.note(
                params,
                f"{nname} is a {kind} in eval mode (running statistics): not scale invariant; "
                "detect with model.train() to find the per-channel invariance",
            )
            return []
        n_feat = int(getattr(norm, "num_features", getattr(norm, "num_channels", 0)))
        start, cols = _own_columns(_column_map(arr, norm))
        n_src = n_feat if cols is None else len(cols)
        size = n_feat // nspec.groups if not nspec.per_channel else 1  # channels per generator
        off = start or 0
        if (
            _w_out(src.module) != 0
            or cols is None
            or not torch.equal(cols, torch.arange(n_src))
            or off % size
            or n_src % size
        ):
            ledger.note(
                params,
                f"{src.name} → {nname}: its output channels do not arrive as {kind}'s channels "
                "in order (the per-channel invariance needs channel c → channel c"
                + (", whole groups" if size > 1 else "")
                + ")",
            )
            return []
        label = f"scale:{src.name}→{nname}"
        n_groups = n_src if nspec.per_channel else n_src // size
        build = partial(
            ScaleInvariance,
            params,
            per_channel=nspec.per_channel,
            groups=None if nspec.per_channel else n_groups,
            label=label,
            norm=norm,
            norm_start=off,
        )
        what = (
            "per channel"
            if nspec.per_channel
            else f"per group ({n_groups} group{'s' if n_groups > 1 else ''})"
        )
        when = "; BatchNorm in training mode only" if nspec.batch else ""
        return [
            Proposal(
                Family.SCALE,
                label,
                build,
                params,
                info.order[src.node],
                note=f"{what}{when}; exact up to eps",
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
        if _with_others(arr, ledger, src, fname):
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
    """Propagate from every parameterised layer and run every registered matcher.

    The matchers come from :data:`noetherflow.symmetry._fx.patterns.MATCHERS`, by stage and
    in registration order (the built-in ones are registered at the end of this module).
    """
    props: list[Proposal] = []
    sources: list[_Source] = []
    for node in info.gm.graph.nodes:
        m = info.module(node)
        if node.op == "get_attr":
            if not node.users:
                continue  # only an attribute such as .dtype was read
            for matcher in matchers_at("attribute"):
                props.extend(run(matcher, info, node, ledger))
            continue
        if m is None or module_problem(m) is not None:
            continue
        whole = claimed(m)
        if whole:
            for matcher in whole:
                props.extend(run(matcher, info, node, ledger))
            continue
        nspec = norm_spec(m)
        if nspec is not None and not nspec.linear_affine:
            ledger.note(
                affine_params(m),
                f"{info.qual(str(node.target))} multiplies by (1 + weight): its affine weight "
                "has no rescaling symmetry",
            )
            continue
        if nspec is not None and affine_params(m):
            value = info.values.get(node)
            if isinstance(value, Tensor) and value.dim() >= 1:
                arrs = propagate(info, node, nspec.axis if value.dim() > 1 else 0)
                norm = _Source(node, m, info.qual(str(node.target)), arrs)
                for matcher in matchers_at("norm"):
                    props.extend(run(matcher, info, norm, ledger))
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
        for matcher in matchers_at("layer"):
            props.extend(run(matcher, info, src, ledger))
    for matcher in matchers_at("graph"):
        props.extend(run(matcher, info, sources, ledger))
    return props


def _diagonal(family: str, fn: Callable[..., list[Proposal]]) -> Callable[..., list[Proposal]]:
    """``fn``, refusing a source whose features met a bias stored apart from the layer.

    The rotations turn such a bias with the rows (:mod:`noetherflow.symmetry._fx.biases`);
    a diagonal family would have to scale it too, which it does not.
    """

    def match(info: GraphInfo, src: _Source, ledger: Ledger) -> list[Proposal]:
        if refuse_extra_biases(src.arrivals, src.params, ledger, src.name, family):
            return []
        return fn(info, src, ledger)

    return match


def _register_builtins() -> None:
    """The built-in matchers, in the order their proposals are listed."""
    rescale, rotate, scale = RescalingPattern(), RotationPattern(), ScalePattern()
    attend, affine, layer_scale = AttentionPattern(), AffineRescalingPattern(), LayerScalePattern()
    register_matcher("scale-explicit", scale.match_explicit, stage="attribute")
    register_matcher("attention-mha", attend.match_mha, stage="module", claims=is_mha)
    register_matcher(
        "embedding-projection",
        EmbeddingProjectionPattern().match,
        stage="module",
        claims=is_embedding,
    )
    register_matcher(
        "affine-rescaling",
        _diagonal(
            "rescaling",
            lambda info, src, ledger: affine.match(
                info, src.name, src.module, src.arrivals, ledger
            ),
        ),
        stage="norm",
    )
    register_matcher("rescaling", _diagonal("rescaling", rescale.match))
    register_matcher("rotation", rotate.match)
    register_matcher("scale", _diagonal("scale invariance", scale.match))
    register_matcher(
        "layer-scale",
        _diagonal(
            "rescaling",
            lambda info, src, ledger: layer_scale.match(
                info, src.name, src.module, src.arrivals, ledger
            ),
        ),
    )
    contract = ContractionPattern()
    register_matcher("contraction-rescaling", _diagonal("rescaling", contract.match_self))
    register_matcher("parameter-rotation", contract.match_param)
    register_matcher("attention-contractions", attend.match_contractions, stage="graph")


_register_builtins()
