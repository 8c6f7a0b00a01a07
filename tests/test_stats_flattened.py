"""Layers after batch × tokens flattened into one axis (#26). The hook estimator read each
row as a sample (E[g²] off by ×2.7 here, silently); now the rows are regrouped by sample
when a perturbation of sample 0 shows which rows are its own (batch- or token-major), and
refused otherwise. Checked against a loop of autograd per sample in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


class _Flattened(nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)
        self.layout = layout

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        if self.layout == "batch-major":
            h = x.reshape(b * t, c)
        elif self.layout == "token-major":
            h = x.transpose(0, 1).reshape(t * b, c)
        else:  # rows of two samples mixed: no grouping by sample exists
            h = (x + x.roll(1, 0)).reshape(b * t, c)
        out = self.b(torch.relu(self.a(h)))
        if self.layout == "token-major":
            return out.reshape(t, b, 3).mean(0)
        return out.reshape(b, t, 3).mean(1)


def _per_sample_sq(model: nn.Module, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
    per = []
    for i in range(x.shape[0]):  # slow reference: one autograd call per sample
        (g,) = torch.autograd.grad(F.mse_loss(model(x[i : i + 1]), y[i : i + 1]), [w])
        per.append(g)
    return torch.stack(per).pow(2).mean(0)


@pytest.mark.parametrize("layout", ["batch-major", "token-major"])
def test_hooks_regroup_flattened_tokens_exactly(layout: str) -> None:
    torch.manual_seed(0)
    model = _Flattened(layout).to(DT)
    x, y = torch.randn(4, 5, 4, dtype=DT), torch.randn(4, 3, dtype=DT)
    syms = nf.find_symmetries(model, x)
    assert syms.names == ["rescaling:a→b"]
    st = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="hooks")
    assert st.n == 4
    for w in (model.a.weight, model.b.weight):
        ref = _per_sample_sq(model, x, y, w)
        assert torch.allclose(st.sq[w], ref, rtol=1e-12, atol=0)


def test_rows_mixing_samples_are_refused() -> None:
    torch.manual_seed(1)
    model = _Flattened("mixed").to(DT)
    x, y = torch.randn(4, 5, 4, dtype=DT), torch.randn(4, 3, dtype=DT)
    syms = nf.find_symmetries(model, x)
    with pytest.raises(nf.UnsupportedLayerError, match=r"batch of 4 samples.*read 20 rows"):
        nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="hooks")
    st = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="reference")
    w = model.a.weight
    assert torch.allclose(st.sq[w], _per_sample_sq(model, x, y, w), rtol=1e-12, atol=0)
