"""Layers after batch × tokens flattened into one axis (#26): the hook estimator would read
each row as a sample (per-sample statistics per row, E[g²] off by ×2.7 here, silently); it
now refuses with the fix, and the reference estimator is right (loop of autograd, float64).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


class _Flattened(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        h = self.b(torch.relu(self.a(x.reshape(b * t, c))))
        return h.reshape(b, t, 3).mean(1)


def test_hooks_refuse_flattened_tokens_and_reference_is_exact() -> None:
    torch.manual_seed(0)
    model = _Flattened().to(DT)
    x, y = torch.randn(4, 5, 4, dtype=DT), torch.randn(4, 3, dtype=DT)
    syms = nf.find_symmetries(model, x)
    assert syms.names == ["rescaling:a→b"]
    with pytest.raises(nf.UnsupportedLayerError, match=r"batch of 4 samples.*read 20 rows"):
        nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="hooks")
    st = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="reference")
    assert st.n == 4
    w = model.a.weight
    per = []
    for i in range(4):  # slow reference: one autograd call per sample
        (g,) = torch.autograd.grad(F.mse_loss(model(x[i : i + 1]), y[i : i + 1]), [w])
        per.append(g)
    sq = torch.stack(per).pow(2).mean(0)
    assert torch.allclose(st.blocks["diagonal"].sq[w], sq, rtol=1e-12, atol=0)
