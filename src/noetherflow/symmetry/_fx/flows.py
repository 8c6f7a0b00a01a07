"""What the propagation engine carries along the graph: flows of features and arrivals.

A :class:`_Flow` is the index tensor of a source's features at one node (each entry the number
of the feature it comes from), how the features got there (linear, homogeneous or
approximate maps), the head groups seen in ``att @ v`` and the rotary pairs; an
:class:`Arrival` is where a set of features ends (a consumer layer, one side of a
contraction, a break with its reason). Used by :mod:`noetherflow.symmetry._fx.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx

__all__ = ["Arrival"]


@dataclass
class _Flow:
    idx: Any  # Tensor, or a tuple/list of Tensors after split
    mode: int
    heads: list[frozenset[int]] | None
    via: tuple[str, ...]
    rotary: dict[int, int] | None = None  # feature → the feature it is rotated with
    # biases stored apart from the layer, added on the way: (parameter, feature → element)
    biases: tuple[tuple[Any, dict[int, int]], ...] = ()


@dataclass
class Arrival:
    """Where a set of features of the source ends up."""

    node: fx.Node
    kind: str  # "consumer" | "contract_a" | "contract_b" | "break"
    idx: Tensor
    mode: int
    heads: list[frozenset[int]] | None
    via: tuple[str, ...]
    reason: str = ""
    rotary: dict[int, int] | None = None  # set after a rotary embedding (feature → partner)
    biases: tuple[tuple[Any, dict[int, int]], ...] = ()  # see _Flow.biases

    @property
    def features(self) -> set[int]:
        """The feature numbers present in ``idx`` (integral floats, −1 for a blank entry).

        A mask over the range instead of ``torch.unique``'s sort: the logits of a language
        model carry ``tokens × vocabulary`` entries (26M for GPT-2 at 4 × 128 tokens).
        """
        if self.idx.numel() == 0:
            return set()
        lo, hi = int(self.idx.min()), int(self.idx.max())
        seen = torch.zeros(hi - lo + 1, dtype=torch.bool)
        seen[(self.idx.reshape(-1) - lo).long()] = True
        return {int(v) + lo for v in torch.nonzero(seen).flatten().tolist()}


def _arrival(node: fx.Node, kind: str, idx: Tensor, f: _Flow) -> Arrival:
    return Arrival(node, kind, idx, f.mode, f.heads, f.via, rotary=f.rotary, biases=f.biases)


def _worse(a: int, b: int) -> int:
    return max(a, b)


def _refine(
    a: list[frozenset[int]] | None, b: list[frozenset[int]] | None
) -> list[frozenset[int]] | None:
    if a is None:
        return b
    if b is None:
        return a
    out = {x & y for x in a for y in b}
    return sorted((s for s in out if s), key=min)


def _rows_constant(t: Tensor, dim: int) -> bool:
    return bool((t == t.narrow(dim, 0, 1)).all())


def _merged_biases(flows: list[_Flow]) -> tuple[tuple[Any, dict[int, int]], ...]:
    """The separately stored biases every input met (once each)."""
    out: dict[int, tuple[Any, dict[int, int]]] = {}
    for f in flows:
        for p, beta in f.biases:
            out.setdefault(id(p), (p, beta))
    return tuple(out.values())


def _merged_rotary(maps: list[dict[int, int] | None]) -> dict[int, int] | None:
    """The rotary pairs of every input (a cat of a rotated and an unrotated part)."""
    got = [m for m in maps if m is not None]
    if not got:
        return None
    return {f: g for m in got for f, g in m.items()}
