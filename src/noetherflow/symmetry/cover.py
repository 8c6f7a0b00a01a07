"""Which symmetries of a group cover one coordinate of a parameter together (issue 28).

Moving a symmetry makes stale the statistics of every symmetry that acts on one of the
coordinates it moves (:func:`noetherflow.kernels.base.overlaps_by_param`), so a coupled
solve needs, per shared parameter, the sets of members that cover some coordinate together:
its *cover classes*. :func:`cover_classes` finds them.

The families' covered coordinates are unions of *slabs* (every coordinate whose index along
one axis lies in a range: a rescaling's neurons, a rotation's head slices), which they
declare by :meth:`~noetherflow.symmetry.base.Symmetry.covered_slabs`. Then which members
cover a coordinate depends on its index along each axis alone (the union of one set per
axis), and the classes are the distinct unions of one per-axis set per axis, found from the
slabs' boundaries: linear in the number of slabs, with no tensor of the parameter's size.
(A code per coordinate of GPT-2's ``c_attn``, [768, 2304], took ≈ 17 ms and 20 MB of fresh
memory per block at a first solve, a page-faulted 65 ms on a new thread.) A member whose
class overrides ``covered_mask`` is read by its mask instead, and then so is the whole group
(:func:`mask_classes`), as is a group whose unions would outnumber a few thousand.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import Tensor

from noetherflow.symmetry.base import Slab, Symmetry

__all__ = ["cover_classes", "mask_classes", "slab_classes"]

_WORD = 31  # members per int32 code word of the mask path (bit 31 left clear: sorts as int32)
_MAX_UNIONS = 1 << 12  # more distinct unions than this: the mask path (a pathological group)


def cover_classes(p: Tensor, group: Sequence[Symmetry]) -> list[list[Symmetry]]:
    """The sets of ``group``'s members that cover one coordinate of ``p`` together.

    Each set in ``group``'s order, with two members or more; the sets ordered by their
    members' bits (member j of ``group`` is bit j), as :func:`mask_classes` gives them.
    """
    slabs = [_slabs_of(s, p) for s in group]
    if p.dim() > 0 and all(sl is not None for sl in slabs):
        found = slab_classes(tuple(p.shape), len(group), [sl for sl in slabs if sl is not None])
        if found is not None:
            return [[group[j] for j in members] for members in found]
    return mask_classes(p, group)


def _slabs_of(s: Symmetry, p: Tensor) -> list[Slab] | None:
    """``s``'s slabs on ``p`` where its mask is theirs (None: read its mask)."""
    if type(s).covered_mask is not Symmetry.covered_mask:  # a mask of its own: the truth
        return None
    slabs = s.covered_slabs(p)
    return [(0, 0, p.shape[0])] if slabs is None and p.dim() > 0 else slabs


def slab_classes(
    shape: tuple[int, ...], n: int, slabs: Sequence[Sequence[Slab]]
) -> list[list[int]] | None:
    """The cover classes of ``n`` members with ``slabs[j]`` the slabs of member j, as indices.

    ``shape``: the parameter's. A coordinate x is covered by member j iff one of j's slabs
    ``(axis, start, stop)`` holds x[axis]. Returns the classes with two members or more, each
    ascending, ordered as :func:`mask_classes` orders them; None where the per-axis sets
    would combine into more than a few thousand unions (the caller reads the masks).
    """
    flat = [(a, lo, hi, j) for j, sl in enumerate(slabs) for a, lo, hi in sl]
    unions = {0}
    for axis, size in enumerate(shape):
        codes = _axis_codes(size, flat, axis)  # once per axis, not once per union so far
        unions = {u | c for u in unions for c in codes}
        if len(unions) > _MAX_UNIONS:
            return None
    words = max(1, -(-n // _WORD))
    key = [tuple(u >> (_WORD * w) & ((1 << _WORD) - 1) for w in range(words)) for u in unions]
    out = []
    for _, u in sorted(zip(key, unions, strict=True)):
        members = [j for j in range(n) if u >> j & 1]
        if len(members) > 1:
            out.append(members)
    return out


def _axis_codes(size: int, slabs: Sequence[tuple[int, int, int, int]], axis: int) -> set[int]:
    """The distinct sets (bit j: member j) of members whose slabs on ``axis`` hold an index.

    ``slabs``: ``(axis, start, stop, member)``; ranges clipped to ``[0, size)``. Empty where
    the axis has no index (a zero-sized parameter: no coordinate, no class).
    """
    spans = [(max(lo, 0), min(hi, size), j) for a, lo, hi, j in slabs if a == axis]
    spans = [(lo, hi, j) for lo, hi, j in spans if lo < hi]
    cuts = sorted({0, size, *(lo for lo, _, _ in spans), *(hi for _, hi, _ in spans)})
    codes = set()
    for lo, hi in pairwise(cuts):  # the members' slabs cover each piece whole or not at all
        if lo < hi:
            codes.add(sum({1 << j for a, b, j in spans if a <= lo and hi <= b}))
    return codes


def mask_classes(p: Tensor, group: Sequence[Symmetry]) -> list[list[Symmetry]]:
    """:func:`cover_classes` from the members' masks: a code per coordinate.

    Each coordinate gets a code, bit j set where member j covers it (31 members per int32
    word); the distinct codes are the sets: two members touch iff some code holds both.
    Linear in ``p.numel()`` per member, where a Gram matrix of the masks is quadratic.
    """
    if p.numel() == 0:  # no coordinate, no class
        return []
    words = []
    for w0 in range(0, len(group), _WORD):
        code = torch.zeros(p.numel(), dtype=torch.int32)
        for j, s in enumerate(group[w0 : w0 + _WORD]):
            code.add_(s.covered_mask(p).reshape(-1).to(torch.int32), alpha=1 << j)  # + is |
        words.append(code)
    if len(words) > 1:
        codes = torch.unique(torch.stack(words, 1), dim=0)
    else:  # runs first (linear), then the few distinct runs sorted
        codes = torch.unique_consecutive(words[0]).unique()
    codes = codes.reshape(codes.shape[0], -1)
    out = []
    for row in codes.tolist():
        members = [
            group[_WORD * w + j] for w, c in enumerate(row) for j in range(_WORD) if c >> j & 1
        ]
        if len(members) > 1:
            out.append(members)
    return out
