"""Layers recognised by what they compute, not by class name (#26).

``nn.Linear`` subclasses with their own forward (Falcon's ``FalconLinear``), norms computing
a LayerNorm or RMSNorm under any name (T5's ``T5LayerNorm``, Gemma's ``(1 + w)`` RMSNorm,
ConvNeXtV2's LayerNorm subclass), with the right eps. Every claimed symmetry is checked
independently in float64, eval and train mode, on inputs detection did not see.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.symmetry._fx.layers import layer_spec, norm_spec
from noetherflow.symmetry._fx.numeric import numeric_layer, numeric_norm

DT = torch.float64


class _OwnLinear(nn.Linear):
    """FalconLinear-style: an nn.Linear subclass with its own forward."""

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class _NotLinear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).tanh()


class _T5Norm(nn.Module):
    """T5LayerNorm-style RMSNorm under another name, eps in ``variance_epsilon``."""

    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, x: Tensor) -> Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


class _GemmaNorm(_T5Norm):
    def forward(self, x: Tensor) -> Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return (1 + self.weight) * (x * torch.rsqrt(var + self.variance_epsilon))


class _WrongEps(_T5Norm):
    """Claims variance_epsilon but uses another eps: must not be recognised with it."""

    def forward(self, x: Tensor) -> Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + 10 * self.variance_epsilon))


class _ChannelsFirstLN(nn.LayerNorm):
    """ConvNeXtV2-style: a LayerNorm subclass normalising dim 1 of NCHW inputs."""

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(
            x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps
        ).permute(0, 3, 1, 2)


def test_numeric_recognition_of_layers_and_norms() -> None:
    assert numeric_layer(_OwnLinear(3, 4)) == (0, 1)
    assert numeric_layer(_NotLinear(3, 4)) is None
    assert layer_spec(_NotLinear(3, 4)) is None
    assert numeric_norm(_T5Norm(5)) == (-1, "variance_epsilon", "rms")
    assert numeric_norm(_GemmaNorm(5)) == (-1, "variance_epsilon", "rms(1+w)")
    assert numeric_norm(_WrongEps(5, eps=1e-2)) is None
    ln = _ChannelsFirstLN(6, eps=1e-3)
    assert numeric_norm(ln) == (1, "eps", "layer")
    spec = norm_spec(ln)
    assert spec is not None and spec.axis == 1 and not spec.rms
    g = norm_spec(_GemmaNorm(5))
    assert g is not None and g.rms and not g.linear_affine


class _Net(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.a = _OwnLinear(4, 6)
        self.norm = norm
        self.b = _OwnLinear(6, 8)
        self.c = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.relu(self.b(self.norm(self.a(x)))))


def _independent(model: nn.Module, sym: nf.Symmetry, x: Tensor, zero_eps: bool) -> float:
    """Worst relative output change (train and eval) under a random element, float64."""
    worst = 0.0
    saved_eps = {}
    if zero_eps:
        for m in model.modules():
            for attr in ("eps", "variance_epsilon"):
                if isinstance(getattr(m, attr, None), float):
                    saved_eps[(m, attr)] = getattr(m, attr)
                    setattr(m, attr, 0.0)
    try:
        for train in (True, False):
            model.train(train)
            with torch.no_grad():
                before = model(x)
                saved = [p.detach().clone() for p in sym.params]
                sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(5)))
                after = model(x)
                for p, v in zip(sym.params, saved, strict=True):
                    p.copy_(v)
            worst = max(worst, float((after - before).norm() / before.norm()))
    finally:
        for (m, attr), v in saved_eps.items():
            setattr(m, attr, v)
    return worst


@pytest.mark.parametrize("norm", ["t5", "gemma"])
def test_subclassed_linear_and_renamed_norms_are_found_and_exact(norm: str) -> None:
    torch.manual_seed(0)
    model = _Net(_T5Norm(6) if norm == "t5" else _GemmaNorm(6)).to(DT)
    x = torch.randn(16, 4, dtype=DT)
    syms = nf.find_symmetries(model, x)
    names = set(syms.names)
    assert "scale:a→norm" in names  # the norm is seen as a norm: the weights feeding it
    assert "rescaling:b→c" in names  # _OwnLinear is a linear layer
    assert ("rescaling:norm→b" in names) == (norm == "t5")  # (1 + w): no affine rescaling
    unseen = torch.randn(9, 4, dtype=DT)
    for sym in syms:
        assert _independent(model, sym, unseen, zero_eps="scale" in sym.label) < 1e-10, sym.label
    scale = syms["scale:a→norm"]
    assert getattr(scale, "norm", None) is model.norm  # eps visible to clip_to_eps


def test_unregistered_layernorm_subclass_eps_is_kept_within_tolerance() -> None:
    """ConvNeXtV2's trap: the subclass's eps is now seen, so solve_within_eps keeps it."""
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), _ChannelsFirstLN(6, eps=1e-2), nn.Conv2d(6, 2, 1)
    ).to(DT)
    x, y = torch.randn(8, 3, 5, 5, dtype=DT), torch.randn(8, 2, 5, 5, dtype=DT)
    syms = nf.find_symmetries(model, x)
    assert "scale:0→1" in syms.names
    stats = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="reference")
    sol, report = nf.solve_within_eps(
        model, syms, stats, x, lr=0.5, batch_size=2, weight_decay=1e-3, tolerance=1e-6
    )
    assert max(report.change_train, report.change_eval) <= 1e-6
    before = model(x).detach()
    nf.teleport(sol)  # checks itself too
    after = model(x).detach()
    assert float((after - before).norm() / before.norm()) <= 1e-6


class _InlineReLU(nn.Module):
    """DistilBERT-style: an activation module built inside forward (outside the tree)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(nn.ReLU()(self.a(x)))


def test_module_built_inside_forward_traces_the_whole_model() -> None:
    torch.manual_seed(3)
    model = _InlineReLU().to(DT)
    syms = nf.find_symmetries(model, torch.randn(8, 4, dtype=DT))
    assert syms.detection is not None and syms.detection.traced
    assert syms.names == ["rescaling:a→b"]
    assert _independent(model, syms[0], torch.randn(5, 4, dtype=DT), zero_eps=False) < 1e-12
