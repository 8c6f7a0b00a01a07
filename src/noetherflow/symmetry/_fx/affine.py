"""Matcher: a normalisation's affine parameters rescale against the layers reading it.

A normalisation ends with ``y = γ ⊙ x̂ + β`` (per channel). When every use of ``y`` is an
input column (channel) of a linear layer, reached through linear or positively homogeneous
maps (identity, dropout, ReLU, max-pooling), then for every channel c

    γ_c, β_c → e^{λ_c} γ_c, e^{λ_c} β_c   and   W[:, c] → e^{-λ_c} W[:, c] (every reader)

leaves the function unchanged exactly: BatchNorm → ReLU → Conv (eval and train mode),
LayerNorm → the q/k/v projections of a pre-LN transformer, RMSNorm → q/k/v or gate/up of a
Llama block. The symmetry is a :class:`~noetherflow.symmetry.channel.ChannelRescaling`.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from noetherflow.symmetry._fx.engine import APPROXIMATE, Arrival, GraphInfo, Ledger, Proposal
from noetherflow.symmetry._fx.layers import layer_spec, norm_spec
from noetherflow.symmetry.base import DiagonalTerm, Family
from noetherflow.symmetry.channel import ChannelRescaling

__all__ = ["AffineRescalingPattern", "LayerScalePattern", "affine_params"]

_HOMOGENEOUS_NAMES = {"ReLU", "LeakyReLU", "PReLU", "relu", "relu_", "leaky_relu"}


def affine_params(m: nn.Module) -> list[nn.Parameter]:
    """γ and β of a normalisation (those present), each 1-D over the channels."""
    out = []
    for name in ("weight", "bias"):
        p = getattr(m, name, None)
        if isinstance(p, nn.Parameter):
            out.append(p)
    return out


def _columns(arr: Arrival, reader: nn.Module) -> Tensor | None:
    spec = layer_spec(reader)
    assert spec is not None
    idx = arr.idx if arr.idx.dim() > 1 else arr.idx.unsqueeze(0)
    ax = spec.in_axis
    flat = idx.movedim(ax, -1).reshape(-1, idx.shape[ax])
    if not bool((flat == flat[:1]).all()):
        return None
    return flat[0].to(torch.long)


class AffineRescalingPattern:
    """Norm affine (γ, β) → linear/homogeneous maps → every reading Linear/Conv/Conv1D."""

    family = Family.RESCALING

    def match(
        self, info: GraphInfo, name: str, norm: nn.Module, arrivals: list[Arrival], ledger: Ledger
    ) -> list[Proposal]:
        params = affine_params(norm)
        spec = norm_spec(norm)
        if not params or spec is None or any(p.dim() != 1 for p in params):
            return []
        n = int(params[0].shape[0])
        if not arrivals:
            return []
        breaks = [a for a in arrivals if a.kind != "consumer"]
        if breaks:
            ledger.note(params, f"output of {name} is {breaks[0].reason or 'contracted'}")
            return []
        down: list[DiagonalTerm] = []
        readers: list[str] = []
        approx = False
        for arr in arrivals:
            reader = info.module(arr.node)
            lspec = layer_spec(reader)
            rname = info.qual(str(arr.node.target))
            if lspec is None or reader is None:
                ledger.note(params, f"output of {name} is read by {rname}, not a linear layer")
                return []
            approx = approx or arr.mode == APPROXIMATE
            cols = _columns(arr, reader)
            weight = reader.weight
            assert isinstance(weight, nn.Parameter)
            # a grouped reader (G groups) reads channel γ·I_g + i in group γ's filters only
            per_group = int(weight.shape[lspec.w_in])
            n_in = per_group * lspec.groups
            if (
                cols is None
                or n_in % n != 0
                or per_group % (n_in // n) != 0
                or not torch.equal(cols, torch.arange(n_in) // (n_in // n))
            ):
                ledger.note(
                    params, f"{name} → {rname}: channels do not land on contiguous input columns"
                )
                return []
            down.append(DiagonalTerm(weight, lspec.w_in, n_in // n, -1.0, groups=lspec.groups))
            readers.append(rname)
        if len({id(t.param) for t in down}) != len(down):
            ledger.note(params, f"{name} is read twice by the same layer")
            return []
        up = [DiagonalTerm(p, 0, 1, 1.0) for p in params]
        label = f"rescaling:{name}→{'+'.join(readers)}"
        note = f"affine parameters of {type(norm).__name__} against the layers reading it"
        if approx:
            via = sorted({v for a in arrivals for v in a.via if v not in _HOMOGENEOUS_NAMES})
            note = f"through {', '.join(via) or 'a non-homogeneous map'} (not homogeneous)"
        return [
            Proposal(
                Family.RESCALING,
                label,
                partial(ChannelRescaling, up, down, label=label),
                [*params, *(t.param for t in down)],
                info.order[arrivals[0].node] - 1,
                approximate=approx,
                note=note,
            )
        ]


class LayerScalePattern:
    """Layer → linear/homogeneous maps → ``x ⊙ γ`` with a learned per-channel γ.

    ConvNeXt's layer scale, CaiT/DeiT-III's LayerScale: row c of the layer (and its bias)
    scales by e^{λ_c}, γ_c by e^{-λ_c}, exactly.
    """

    family = Family.RESCALING

    def match(
        self,
        info: GraphInfo,
        name: str,
        layer: nn.Module,
        arrivals: list[Arrival],
        ledger: Ledger,
    ) -> list[Proposal]:
        if len(arrivals) != 1 or arrivals[0].kind != "scale_param":
            return []
        arr = arrivals[0]
        gamma = info.values.get(arr.node)
        spec = layer_spec(layer)
        weight = getattr(layer, "weight", None)
        if not isinstance(gamma, nn.Parameter) or spec is None or not isinstance(weight, Tensor):
            return []
        params = [p for p in (weight, getattr(layer, "bias", None)) if isinstance(p, nn.Parameter)]
        n = int(weight.shape[spec.w_out])
        gname = info.qual(str(arr.node.target))
        idx = arr.idx
        flat = idx.reshape(-1, idx.shape[-1]) if idx.dim() > 1 else idx.unsqueeze(0)
        same = bool((flat == flat[:1]).all())
        if gamma.dim() != 1 or gamma.shape[0] != n or not same:
            ledger.note([*params, gamma], f"{name} → {gname}: γ does not scale one channel each")
            return []
        if not torch.equal(flat[0].to(torch.long), torch.arange(n)):
            return []
        up = [DiagonalTerm(p, spec.w_out if p.dim() > 1 else 0, 1, 1.0) for p in params]
        down = [DiagonalTerm(gamma, 0, 1, -1.0)]
        label = f"rescaling:{name}→{gname}"
        return [
            Proposal(
                Family.RESCALING,
                label,
                partial(ChannelRescaling, up, down, label=label),
                [*params, gamma],
                info.order[arr.node],
                approximate=arr.mode == APPROXIMATE,
                note="layer output against its learned per-channel scale",
            )
        ]
