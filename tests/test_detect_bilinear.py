"""Several contractions sharing layers (issue #26): DeBERTa's q·kᵀ + q·pkᵀ + k·pqᵀ.

Per head, q, pq → Gᵀq, Gᵀpq and k, pk → G⁻¹k, G⁻¹pk keeps every term: one rotation over
the four layers. Three layers contracted pairwise in a cycle (a·b, b·c, c·a) cannot be split
into two sides: refused with the reason. Checked apart from the library's checker in float64.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


def _heads(t: Tensor, h: int = 2) -> Tensor:
    return t.view(*t.shape[:-1], h, -1).transpose(-2, -3)  # [.., h, n, d]


class _Disentangled(nn.Module):
    def __init__(self, d: int = 8, cycle: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.pk, self.pq = nn.Linear(d, d), nn.Linear(d, d)
        self.rel = nn.Parameter(torch.randn(6, d))
        self.cycle = cycle

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = _heads(self.q(x)), _heads(self.k(x)), _heads(self.v(x))
        pk, pq = _heads(self.pk(self.rel)), _heads(self.pq(self.rel))
        s = q @ k.transpose(-1, -2)
        if self.cycle:  # q·k, k·pk, pk·q: an odd cycle
            s = s + (k @ pk.transpose(-1, -2))[..., :5] + (pk @ q.transpose(-1, -2))[..., :5, :]
        else:
            s = s + (q @ pk.transpose(-1, -2))[..., :5] + (k @ pq.transpose(-1, -2))[..., :5]
        y = (torch.softmax(s, -1) @ v).transpose(-2, -3).flatten(-2)
        return self.o(y)


def _change(model: nn.Module, sym: nf.Symmetry, x: Tensor) -> float:
    moved = copy.deepcopy(model)
    msym = nf.find_symmetries(moved, x)[sym.label]  # the same symmetry on the copy
    msym.apply_(msym.random_element(1.0, torch.Generator().manual_seed(3)))
    with torch.no_grad():
        a, b = model(x), moved(x)
    return float((b - a).norm() / a.norm())


def test_one_rotation_over_the_four_layers_per_head() -> None:
    torch.manual_seed(0)
    model = _Disentangled().to(DT)
    x = torch.randn(3, 5, 8, dtype=DT)
    syms = nf.find_symmetries(model, x)
    joint = [s for s in syms if s.label.startswith("rotation:q·k·pk·pq[")]
    assert len(joint) == 2, syms.names
    unseen = torch.randn(4, 5, 8, dtype=DT, generator=torch.Generator().manual_seed(7))
    for s in joint:
        assert {id(p) for p in s.params} >= {
            id(m.weight) for m in (model.q, model.k, model.pk, model.pq)
        }
        assert _change(model, s, unseen) <= 1e-12


def test_an_odd_cycle_of_contractions_is_refused_with_the_reason() -> None:
    torch.manual_seed(0)
    model = _Disentangled(cycle=True).to(DT)
    syms = nf.find_symmetries(model, torch.randn(3, 5, 8, dtype=DT))
    assert not [n for n in syms.names if "·" in n], syms.names
    why = " ".join(syms.coverage(model)["pk.weight"].reasons)
    assert "do not split the layers into two sides" in why, why
