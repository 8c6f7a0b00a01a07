"""``einsum`` attention (#26): ``"bhqd,bhkd->bhqk"`` scores and ``"bhqk,bhkd->bhqd"`` mixing
are read as ``q @ kᵀ`` and ``att @ v``: the per-head q·k and V/O rotations are found, and
each holds on unseen inputs (independent float64 check).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


class _EinsumAttention(nn.Module):
    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.h = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def _split(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        return x.reshape(b, t, self.h, c // self.h).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        att = torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)
        y = torch.einsum("bhqk,bhkd->bhqd", att, v)
        return self.o(y.transpose(1, 2).reshape(x.shape))


def test_einsum_attention_heads_are_found_and_exact() -> None:
    torch.manual_seed(0)
    model = _EinsumAttention().to(DT)
    syms = nf.find_symmetries(model, torch.randn(2, 5, 8, dtype=DT))
    assert sorted(syms.names) == [
        "rotation:q·k[h0]",
        "rotation:q·k[h1]",
        "rotation:v→o[h0]",
        "rotation:v→o[h1]",
    ]
    x = torch.randn(3, 7, 8, dtype=DT)
    for sym in syms:
        with torch.no_grad():
            before = model(x)
            saved = [p.detach().clone() for p in sym.params]
            sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(1)))
            after = model(x)
            for p, s in zip(sym.params, saved, strict=True):
                p.copy_(s)
        assert float((after - before).norm() / before.norm()) < 1e-12, sym.label
