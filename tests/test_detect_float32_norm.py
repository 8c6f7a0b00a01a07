"""Norms that normalise in float32 inside a float64 model (DeBERTa's ``DebertaLayerNorm``, #26).

``x̂ = LN(x.float()).to(x.dtype)``, then ``w ⊙ x̂ + b`` in float64: the affine → next layer
rescaling is exact whatever the normalisation's precision (x̂ does not depend on w, b), so it
is claimed; the scale invariance of the layer feeding the norm holds only to float32
round-off, so it is not. The norm is recognised by what it computes (a class of any name),
and the hooks read x̂ as the module computes it. An affine followed by a non-homogeneous op
gets no claim.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.kernels.noise import NoiseModel
from noetherflow.symmetry._fx.layers import norm_spec

sys.path.insert(0, str(Path(__file__).parent))
import hf_zoo as Z

DT = torch.float64


class _Float32Norm(nn.Module):
    """DebertaLayerNorm's arithmetic under another name: float32 statistics, float64 affine."""

    def __init__(self, size: int, eps: float = 1e-7, rms: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))
        self.variance_epsilon = eps
        self.rms = rms

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        if not self.rms:
            h = h - h.mean(-1, keepdim=True)
        h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype) + self.bias


def _norm(kind: str) -> nn.Module:
    if kind == "deberta":
        pytest.importorskip("transformers")
        from transformers.models.deberta.modeling_deberta import DebertaLayerNorm

        return DebertaLayerNorm(8, eps=1e-7)  # type: ignore[no-any-return]
    return _Float32Norm(8, rms=kind == "rms")


class _Net(nn.Module):
    """fc1 → float32 norm → act → fc2 → ReLU → fc3."""

    def __init__(self, kind: str, act: str = "identity") -> None:
        super().__init__()
        self.fc1, self.norm = nn.Linear(5, 8), _norm(kind)
        self.fc2, self.fc3 = nn.Linear(8, 6), nn.Linear(6, 3)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(self.fc1(x))
        h = F.gelu(h) if self.act == "gelu" else h
        return self.fc3(F.relu(self.fc2(h)))  # type: ignore[no-any-return]


def _model(kind: str, act: str = "identity") -> nn.Module:
    torch.manual_seed(0)
    m = _Net(kind, act).to(DT)
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
        m.norm.bias.normal_()
    return m


def _x(seed: int) -> Tensor:
    return torch.randn(6, 4, 5, dtype=DT, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["deberta", "layer", "rms"])
def test_float32_norm_is_recognised_by_what_it_computes(kind: str) -> None:
    spec = norm_spec(_norm(kind).to(DT))
    assert spec is not None and spec.low_precision and spec.rms == (kind == "rms")
    assert spec.eps_attr == "variance_epsilon"
    exact = nn.LayerNorm(8).to(DT)  # the float64 LayerNorm is not a low-precision one
    assert not norm_spec(exact).low_precision  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["deberta", "layer", "rms"])
def test_affine_rescaling_claimed_exact_and_scale_invariance_refused(kind: str) -> None:
    model = _model(kind)
    for train in (False, True):
        syms = nf.find_symmetries(model.train(train), _x(0))
        assert "rescaling:norm→fc2" in syms.names and "rescaling:fc2→fc3" in syms.names
        assert not any(n.startswith("scale:") for n in syms.names), syms.names
        assert all(r.verified for r in syms.verification.values())
        for s in syms:
            for seed in (1, 2):
                assert Z.independent_change(model, s, _x(seed), train, False) <= 1e-12, s.label
        why = " ".join(syms.coverage(model)["fc1.weight"].reasons)
        assert "float32" in why, why
    # refused for a reason: the scale invariance does move the outputs beyond 1e-8... at
    # float32 round-off (a float64 LayerNorm keeps them to 1e-15)
    inv = nf.ScaleInvariance([model.fc1.weight, model.fc1.bias])
    assert Z.independent_change(model, inv, _x(1), False, True) > 1e-9


@pytest.mark.parametrize("kind", ["deberta", "layer"])
def test_hook_statistics_of_the_float32_affine_match_the_reference(kind: str) -> None:
    model = _model(kind).eval()
    x, y = _x(0), torch.randn(6, 4, 3, dtype=DT, generator=torch.Generator().manual_seed(9))
    syms = nf.find_symmetries(model, x)
    loss = nn.MSELoss()
    ref = nf.collect_stats(model, syms, loss, x, y, estimator="reference")
    nm = NoiseModel.create(batch_size=6, lr=0.1, weight_decay=1e-3)
    want = nf.noether_flow(syms, ref, nm)
    for level in ("diag", "solve", "neuron"):
        stats = nf.collect_stats(model, syms, loss, x, y, level=level)
        for p in (model.norm.weight, model.norm.bias):
            assert torch.allclose(stats.mean[p], ref.mean[p], rtol=1e-12, atol=1e-15)
        got = nf.noether_flow(syms, stats, nm)
        for k in want:
            assert float((got[k] - want[k]).abs().max()) <= 1e-10 * float(want[k].abs().max())
    sol = nf.solve_equilibrium(syms, ref, nm)
    with torch.no_grad():
        before = model(_x(3))
    nf.teleport(model, sol)
    with torch.no_grad():
        assert float((model(_x(3)) - before).norm() / before.norm()) <= 1e-12


def test_affine_followed_by_a_non_homogeneous_op_is_not_claimed() -> None:
    model = _model("deberta", act="gelu")
    syms = nf.find_symmetries(model.eval(), _x(0))
    assert not any(n.startswith("rescaling:norm") for n in syms.names), syms.names
    why = " ".join(syms.coverage(model)["norm.weight"].reasons)
    assert "not homogeneous" in why or "approximate" in why, why


class _ChannelsFirstLN(nn.LayerNorm):
    """ConvNeXtV2-style: a LayerNorm subclass over dim 1 of NCHW inputs (its own forward)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(
            x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps
        ).permute(0, 3, 1, 2)


def test_hooks_read_a_channels_first_norm_recognised_by_what_it_computes() -> None:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1), _ChannelsFirstLN(8), nn.Conv2d(8, 4, 1), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(4 * 16, 3)).to(DT)
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.normal_()
    x = torch.randn(6, 3, 4, 4, dtype=DT)
    y = torch.randn(6, 3, dtype=DT)
    syms = nf.find_symmetries(model.eval(), x)
    assert "rescaling:1→2" in syms.names, syms.names
    loss = nn.MSELoss()
    nm = NoiseModel.create(batch_size=6, lr=0.1, weight_decay=1e-3)
    want = nf.noether_flow(
        syms, nf.collect_stats(model, syms, loss, x, y, estimator="reference"), nm
    )
    got = nf.noether_flow(syms, nf.collect_stats(model, syms, loss, x, y), nm)
    for k in want:
        assert float((got[k] - want[k]).abs().max()) <= 1e-10 * float(want[k].abs().max()), k
