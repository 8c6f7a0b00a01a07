"""Shared modules used k times (ALBERT): a symmetry acting inside the shared module acts
identically at every use, so it is exact; it is now checked and claimed when verified (#26).
Weight tying across two modules stays refused. Independent float64 checks on unseen inputs.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


class _Shared(nn.Module):
    """One block (Linear → ReLU → Linear) applied three times, with a residual around it."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 7), nn.ReLU(), nn.Linear(7, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(3):
            x = x + self.block(x)
        return self.head(x)


class _Tied(nn.Module):
    """The same weight read by two modules: not a shared module, refused."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight
        self.c = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _change(model: nn.Module, sym: nf.Symmetry, x: Tensor) -> float:
    with torch.no_grad():
        before = model(x)
        saved = [p.detach().clone() for p in sym.params]
        sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(4)))
        after = model(x)
        for p, v in zip(sym.params, saved, strict=True):
            p.copy_(v)
    return float((after - before).norm() / before.norm())


def test_symmetry_of_a_module_used_three_times_is_claimed_and_exact() -> None:
    torch.manual_seed(0)
    model = _Shared().to(DT)
    syms = nf.find_symmetries(model, torch.randn(8, 4, dtype=DT))
    assert syms.names == ["rescaling:block.0→block.2"]
    assert "used 3 times" in syms.detection.sym_notes["rescaling:block.0→block.2"]
    resc = syms[0]
    assert _change(model, resc, torch.randn(5, 4, dtype=DT)) < 1e-12


def test_weight_tied_across_two_modules_is_still_refused() -> None:
    torch.manual_seed(1)
    model = _Tied().to(DT)
    syms = nf.find_symmetries(model, torch.randn(8, 4, dtype=DT))
    assert not any("a.weight" in n or "→b" in n for n in syms.names)
    cov = syms.coverage(model)
    why = " ".join(r for p in cov.params if p.name == "a.weight" for r in p.reasons)
    assert "used 2 times" in why


def test_albert_shared_layer_three_uses() -> None:
    T = pytest.importorskip("transformers")
    cfg = T.AlbertConfig(
        num_hidden_layers=3,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=32,
        max_position_embeddings=16,
        embedding_size=8,
    )
    torch.manual_seed(0)
    model = T.AlbertModel(cfg).to(DT).eval()
    ids = torch.randint(0, 32, (2, 5))
    syms = nf.find_symmetries(model, ids)
    inside = [n for n in syms.names if "albert_layers.0" in n]
    assert len(inside) == 4  # q·k and V/O per head, of the layer used three times
    unseen = torch.randint(0, 32, (3, 6))
    for sym in syms:
        with torch.no_grad():
            before = model(unseen).last_hidden_state
            saved = [p.detach().clone() for p in sym.params]
            sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(2)))
            after = model(unseen).last_hidden_state
            for p, v in zip(sym.params, saved, strict=True):
                p.copy_(v)
        assert float((after - before).norm() / before.norm()) < 1e-10, sym.label
