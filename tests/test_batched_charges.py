"""Charges of many rotations at once (#28): an attention's heads as one batched product.

``nf.charges`` groups the symmetries by class (:meth:`Symmetry.charges_of`); rotations of one
layout on the same tensors (the heads of a fused projection) are one ``bmm`` per block. Pinned
against each symmetry's own :meth:`charge_of` / :meth:`bilinear_of` in float64, in set order,
for heads in order (a view of the fused tensor), out of order (gathered rows) and mixed with
other families and layouts.
"""

from __future__ import annotations

import torch
from torch import nn

import noetherflow as nf
from noetherflow.symmetry.base import bilinears_of_all, charges_of_all
from noetherflow.symmetry.rotation import Block

DT = torch.float64
D, H = 4, 3


def _attention_like() -> tuple[nn.Module, list[nf.DoubleRotation], nf.Rescaling]:
    """A fused q/k/v projection (H heads of width D), an output projection, an MLP pair."""
    torch.manual_seed(0)
    m = nn.ModuleDict(
        {
            "qkv": nn.Linear(6, 3 * H * D),
            "out": nn.Linear(H * D, 6),
            "fc": nn.Linear(6, 5),
            "proj": nn.Linear(5, 2),
        }
    ).to(DT)
    qkv, out = m["qkv"], m["out"]
    k0, v0 = H * D, 2 * H * D
    rots = []
    for h in range(H):
        sl = slice(h * D, (h + 1) * D)
        qk = nf.DoubleRotation.from_blocks(
            [
                Block(qkv.weight, 0, k0 + sl.start, k0 + sl.stop),
                Block(qkv.bias, 0, k0 + sl.start, k0 + sl.stop),
            ],
            [Block(qkv.weight, 0, sl.start, sl.stop), Block(qkv.bias, 0, sl.start, sl.stop)],
            label=f"qk{h}",
        )
        vo = nf.DoubleRotation.from_blocks(
            [
                Block(qkv.weight, 0, v0 + sl.start, v0 + sl.stop),
                Block(qkv.bias, 0, v0 + sl.start, v0 + sl.stop),
            ],
            [Block(out.weight, 1, sl.start, sl.stop)],
            label=f"vo{h}",
        )
        rots += [qk, vo]
    return m, rots, nf.Rescaling(m["fc"], m["proj"], label="mlp")


def _values(m: nn.Module, seed: int) -> dict[nn.Parameter, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {p: torch.randn(p.shape, generator=g, dtype=DT) for p in m.parameters()}


def test_batched_forms_equal_each_symmetry_own() -> None:
    m, rots, resc = _attention_like()
    x, y = _values(m, 1), _values(m, 2)
    for order in (rots, rots[::-1], [rots[2], rots[0], rots[4]]):  # in order, reversed, gaps
        syms = [order[0], resc, *order[1:]]
        got_c = charges_of_all(syms, x)
        got_b = bilinears_of_all(syms, x, y)
        for s, c, b in zip(syms, got_c, got_b, strict=True):
            torch.testing.assert_close(c, s.charge_of(x), rtol=1e-13, atol=1e-13)
            torch.testing.assert_close(b, s.bilinear_of(x, y), rtol=1e-13, atol=1e-13)
            assert c.shape == s.charge_of(x).shape


def test_charges_of_a_set_equal_each_charge() -> None:
    _, rots, resc = _attention_like()
    syms = nf.SymmetrySet([*rots, resc])
    got = nf.charges(syms)
    assert list(got) == syms.names
    for name, s in syms.items():
        torch.testing.assert_close(got[name], s.charge(), rtol=1e-13, atol=1e-13)
