"""Cover classes from the symmetries' slabs equal those of their masks (issue 28).

:func:`noetherflow.symmetry.cover.cover_classes` reads the families' covered coordinates as
unions of slabs (no tensor of the parameter's size); :func:`mask_classes`, the reference,
gives every coordinate a code from the members' boolean masks. Hypothesis draws shapes and
members (more than one 31-member code word included); real models give the rest. A member
whose class overrides ``covered_mask``, and a group whose unions are too many, take the
mask path.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_solver_batched import _model

import noetherflow as nf
import noetherflow.symmetry.cover as C
from noetherflow.symmetry.base import Slab, Symmetry


class _Masked:
    """A stand-in member of known slabs: what :func:`mask_classes` reads of a symmetry."""

    def __init__(self, shape: tuple[int, ...], slabs: list[Slab]) -> None:
        self.mask = torch.zeros(shape, dtype=torch.bool)
        for axis, lo, hi in slabs:
            self.mask.narrow(axis, lo, hi - lo).fill_(True)

    def covered_mask(self, p: torch.Tensor) -> torch.Tensor:
        return self.mask


@st.composite
def _groups(draw: Any) -> tuple[tuple[int, ...], list[list[Slab]]]:
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    n = draw(st.sampled_from([1, 2, 3, 5, 12, 31, 32, 40]))

    def slab(axis: int) -> Slab:
        lo = draw(st.integers(0, shape[axis]))
        return (axis, lo, draw(st.integers(lo, shape[axis])))

    members = [
        [slab(draw(st.integers(0, len(shape) - 1))) for _ in range(draw(st.integers(0, 3)))]
        for _ in range(n)
    ]
    return shape, members


@settings(max_examples=200, deadline=None)
@given(_groups())
def test_slab_classes_equal_the_mask_codes(group: tuple[tuple[int, ...], list[list[Slab]]]) -> None:
    shape, slabs = group
    members = [_Masked(shape, s) for s in slabs]
    ref = C.mask_classes(torch.zeros(shape), members)  # type: ignore[arg-type]
    got = C.slab_classes(shape, len(slabs), slabs)
    assert got == [[members.index(m) for m in cls] for cls in ref]


@pytest.mark.parametrize("heads", [4, 33])  # 33: more members than one code word holds
def test_a_model_reads_its_slabs_only(heads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _, syms, _, _ = _model(heads=heads)
    users: dict[int, tuple[torch.Tensor, list[Symmetry]]] = {}
    for s in syms:
        for p in s.params:
            users.setdefault(id(p), (p, []))[1].append(s)
    shared = [(p, g) for p, g in users.values() if len(g) > 1]
    want = [C.mask_classes(p, g) for p, g in shared]
    monkeypatch.setattr(C, "mask_classes", lambda *a: pytest.fail("read the masks"))
    assert [C.cover_classes(p, g) for p, g in shared] == want
    assert any(len(w) == heads for w in want)  # the rescaling's rows with each head's columns


class _Slabbed:
    """A stand-in member that declares slabs and keeps the mask derived from them."""

    covered_mask = Symmetry.covered_mask

    def __init__(self, slabs: list[Slab]) -> None:
        self.slabs = slabs

    def covered_slabs(self, p: torch.Tensor) -> list[Slab]:
        return self.slabs


def test_an_own_mask_is_the_truth() -> None:
    m, syms, _, _ = _model(heads=2)
    w = m[1].weight  # [6, 12]: the heads' U sides are its columns 0–5 and 6–11

    class Nowhere(nf.DoubleRotation):
        def covered_mask(self, p: torch.Tensor) -> torch.Tensor:  # its slabs say otherwise
            return torch.zeros(p.shape, dtype=torch.bool)

    h1 = syms["head1"]
    odd = Nowhere.from_blocks(h1.w_blocks, h1.u_blocks, label="nowhere")
    assert C.slab_classes((6, 12), 2, [h1.covered_slabs(w), odd.covered_slabs(w)]) == [[0, 1]]
    assert C.cover_classes(w, [h1, odd]) == C.mask_classes(w, [h1, odd]) == []


def test_a_crowd_of_unions_reads_the_masks() -> None:
    # 70 rows and 70 columns covered one by one: 71 × 71 unions, past the cap
    rows = [_Slabbed([(0, i, i + 1)]) for i in range(70)]
    cols = [_Slabbed([(1, i, i + 1)]) for i in range(70)]
    group = [*rows, *cols]
    p = torch.zeros(70, 70)
    assert C.slab_classes((70, 70), 140, [g.slabs for g in group]) is None
    got = C.cover_classes(p, group)  # type: ignore[arg-type]
    assert got == C.mask_classes(p, group)  # type: ignore[arg-type]
    assert len(got) == 70 * 70 and all(len(cls) == 2 for cls in got)


def test_a_scalar_parameter_is_one_coordinate() -> None:
    # slabs need an axis: a 0-dim parameter is read by its masks (all of it, by default)
    both = [_Slabbed(None), _Slabbed(None)]  # type: ignore[arg-type]
    assert C.cover_classes(torch.zeros(()), both) == [both]  # type: ignore[arg-type]
    assert C.cover_classes(torch.zeros(()), [_Slabbed(None), _Slabbed([])]) == []  # type: ignore[arg-type]
