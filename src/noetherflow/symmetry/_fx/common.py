"""Helpers shared by the matchers: layer axes, column maps, contiguous slices, sources."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx, nn

from noetherflow.symmetry._fx.biases import bias_blocks, extra_params
from noetherflow.symmetry._fx.engine import Arrival, _layer_params
from noetherflow.symmetry._fx.layers import layer_spec, norm_spec
from noetherflow.symmetry.rotation import Block


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


def _blocks(layer: nn.Module, start: int, stop: int, arr: Arrival | None = None) -> list[Block]:
    """Output rows ``start:stop`` of ``layer`` (weight and bias) and of the biases ``arr`` met.

    A bias stored apart and added on the way to ``arr`` (``self.v(x) + self.v_bias``)
    transforms like the rows it is added to. Raises ``_NotASlice`` when its elements for
    these rows are not one slice.
    """
    weight: Any = layer.weight
    bias: Any = getattr(layer, "bias", None)
    out = [Block(weight, _w_out(layer), start, stop)]
    if bias is not None:
        out.append(Block(bias, 0, start, stop))
    if arr is not None and arr.biases:
        extra = bias_blocks(arr, start, stop)
        if extra is None:
            raise _NotASlice(f"rows {start}:{stop}")
        out.extend(extra)
    return out


class _NotASlice(ValueError):
    """A separately stored bias's elements for a slice of rows are not one slice."""


@dataclass
class _Source:
    node: fx.Node
    module: nn.Module
    name: str
    arrivals: list[Arrival]

    @property
    def params(self) -> list[nn.Parameter]:
        """The layer's weight and bias, and any bias stored apart added to its output."""
        return [*_layer_params(self.module), *extra_params(self.arrivals)]

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
