"""Grouped and depthwise convolutions: rescaling detected, hooked, solved and teleported (#26).

A grouped convolution with G groups reads input channel γ·I/G + i only in the filters of
group γ, at weight column i: the per-channel rescaling of the layer feeding it (through
ReLU, or from an eval-mode BatchNorm's affine) scales ``W[γ·O/G : (γ+1)·O/G, i]`` down, a
term whose generators span rows and columns (``DiagonalTerm(..., groups=G)``). As a
producer, its output channels are its weight rows, whatever its groups. Checked here: the
term's reductions against masks, the hooks' statistics against per-sample gradients from
``torch.func`` in float64 (groups 2, 4 and depthwise), every claim against an independent
float64 check on inputs detection has not seen (eval and train mode), the teleport of the
noise equilibrium (exact, flows ~0 afterwards), and the traps (channel shuffle, ReLU6, a
grouped convolution feeding a residual sum) where nothing may be claimed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.kernels.noise import NoiseModel
from noetherflow.symmetry.base import DiagonalTerm

sys.path.insert(0, str(Path(__file__).parent))
import hf_zoo as Z

DT = torch.float64
LOSS = nn.MSELoss()


class _ResNeXtish(nn.Module):
    """stem → ReLU → grouped 3×3 (G groups) → ReLU → grouped 1×1 (G2 groups) → ReLU → head."""

    def __init__(self, groups: int, groups2: int, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.grouped = nn.Conv2d(width, width, 3, padding=1, groups=groups)
        self.pw = nn.Conv2d(width, 6, 1, groups=groups2)
        self.head = nn.Linear(6 * 16, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.grouped(F.relu(self.stem(x))))
        return self.head(F.relu(self.pw(h)).flatten(1))  # type: ignore[no-any-return]


class _DepthwiseSeparable(nn.Module):
    """conv → BN → ReLU → depthwise 3×3 → BN → ReLU → 1×1 → mean → head (MobileNetV1 block)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.dw, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 6, 1)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn0(self.stem(x)))
        h = F.relu(self.bn1(self.dw(h)))
        return self.head(F.relu(self.pw(h)).mean((2, 3)))  # type: ignore[no-any-return]


def _inputs(seed: int, n: int = 6) -> Tensor:
    return torch.randn(n, 3, 4, 4, dtype=DT, generator=torch.Generator().manual_seed(seed))


def _resnext(groups: int, groups2: int) -> nn.Module:
    torch.manual_seed(0)
    return _ResNeXtish(groups, groups2).to(DT)


def _separable() -> nn.Module:
    torch.manual_seed(0)
    m = _DepthwiseSeparable().to(DT)
    with torch.no_grad():
        for bn in (m.bn0, m.bn1):  # running statistics and affines away from (0, 1)
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
    return m


def _holds(model: nn.Module, syms: nf.SymmetrySet, train: bool) -> None:
    """Every claim exact on unseen batches (independent check); no parameter without a reason."""
    cov = syms.coverage(model)
    assert [p.name for p in cov.params if not p.symmetries and not p.reasons] == []
    assert all(r.verified for r in syms.verification.values())
    for s in syms:
        zero = s.family.value == "scale"
        for seed in (1, 2):
            rel = Z.independent_change(model, s, _inputs(seed), train, zero)
            assert rel <= 1e-10, (s.label, rel)


def _rescalings(syms: nf.SymmetrySet) -> list[str]:
    return [n for n in syms.names if n.startswith("rescaling:")]


# -- the grouped term ---------------------------------------------------------------------


@pytest.mark.parametrize("groups,block", [(2, 1), (4, 1), (2, 2), (8, 1)])
def test_grouped_term_reduce_and_expand_match_its_masks(groups: int, block: int) -> None:
    w = nn.Parameter(torch.randn(8, 8 // groups * block, 3, dtype=DT))
    t = DiagonalTerm(w, 1, block, -1.0, groups=groups)
    per_group = w.shape[1] // block
    assert t.num_generators == groups * per_group
    lam = torch.randn(t.num_generators, dtype=DT)
    v = torch.randn_like(w)
    rows = w.shape[0] // groups
    want_reduce = torch.zeros(t.num_generators, dtype=DT)
    want_expand = torch.zeros_like(w)
    for j in range(t.num_generators):
        g, c = divmod(j, per_group)
        mask = torch.zeros(w.shape, dtype=torch.bool)
        mask[g * rows : (g + 1) * rows, c * block : (c + 1) * block] = True
        want_reduce[j] = -v[mask].sum()
        want_expand[mask] = -lam[j]
    assert torch.allclose(t.reduce(v), want_reduce, rtol=1e-13, atol=1e-13)
    assert torch.equal(t.expand(lam).expand_as(w), want_expand)


def test_grouped_term_refuses_groups_along_axis_0_and_uneven_rows() -> None:
    w = nn.Parameter(torch.randn(6, 2, dtype=DT))
    with pytest.raises(nf.SymmetryDefinitionError, match="axis 0"):
        DiagonalTerm(w, 0, 1, 1.0, groups=2)
    with pytest.raises(nf.SymmetryDefinitionError, match="do not divide"):
        DiagonalTerm(w, 1, 1, 1.0, groups=4)


# -- detection and the statistics ---------------------------------------------------------

_GROUPS = [(2, 2), (4, 2), (8, 1)]  # (3×3 groups, 1×1 groups): groups 2, 4, depthwise


@pytest.mark.parametrize("groups,groups2", _GROUPS)
def test_grouped_rescalings_are_claimed_and_exact(groups: int, groups2: int) -> None:
    model = _resnext(groups, groups2)
    for train in (False, True):
        syms = nf.find_symmetries(model.train(train), _inputs(0))
        # the grouped convolution as consumer (stem → grouped), as producer and consumer
        # (grouped → pw), and the grouped 1×1 as producer (pw → head, 16 columns each)
        assert sorted(_rescalings(syms)) == [
            "rescaling:grouped→pw",
            "rescaling:pw→head",
            "rescaling:stem→grouped",
        ], syms.names
        _holds(model, syms, train)


def _per_sample(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Per-sample gradients of ℓ_n = MSE(model(x_n), y_n) by torch.func. ``[N, *shape]``."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, Tensor], xn: Tensor, yn: Tensor) -> Tensor:
        out = torch.func.functional_call(model, p, (xn.unsqueeze(0),))
        return LOSS(out, yn.unsqueeze(0))

    return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)  # type: ignore[no-any-return]


@pytest.mark.parametrize("groups,groups2", _GROUPS)
def test_hook_statistics_match_torch_func_per_sample_gradients(groups: int, groups2: int) -> None:
    model = _resnext(groups, groups2).eval()
    x, y = _inputs(0), torch.randn(6, 3, dtype=DT, generator=torch.Generator().manual_seed(9))
    syms = nf.find_symmetries(model, x)
    ps = _per_sample(model, x, y)
    names = {id(p): n for n, p in model.named_parameters()}
    nm = NoiseModel.create(batch_size=6, lr=0.1, weight_decay=1e-3)
    ref = nf.collect_stats(model, syms, LOSS, x, y, estimator="reference")
    want_flow = nf.noether_flow(syms, ref, nm)
    for level in ("diag", "solve", "neuron"):
        stats = nf.collect_stats(model, syms, LOSS, x, y, level=level)
        for p in syms.params():
            g = ps[names[id(p)]]
            assert torch.allclose(stats.mean[p], g.mean(0), rtol=1e-12, atol=1e-14)
        sq = stats.blocks["diagonal"].sq  # type: ignore[attr-defined]
        grouped = [c.weight for c in (model.grouped, model.pw) if c.groups > 1]
        for p in grouped:  # grouped consumers: per-coordinate squares at every level
            want = ps[names[id(p)]].square().mean(0)
            assert torch.allclose(sq[p], want, rtol=1e-12, atol=1e-16), (level, names[id(p)])
        flow = nf.noether_flow(syms, stats, nm)
        for k in want_flow:
            scale = want_flow[k].abs().max()
            assert float((flow[k] - want_flow[k]).abs().max()) <= 1e-10 * float(scale), (level, k)
        # the noise term Tr[A_j M] from the per-sample gradients by brute force (masks)
        for s in syms:
            if not s.label.startswith("rescaling:stem→grouped"):  # type: ignore[union-attr]
                continue
            noise = torch.zeros(s.num_generators, dtype=DT)  # type: ignore[attr-defined]
            for t in s.terms():  # type: ignore[attr-defined]
                g = ps[names[id(t.param)]]
                m = nm.c_mean * g.mean(0).square() + nm.c_second * g.square().mean(0)
                for j in range(s.num_generators):  # type: ignore[attr-defined]
                    e = torch.zeros(s.num_generators, dtype=DT)  # type: ignore[attr-defined]
                    e[j] = 1.0
                    noise[j] += (t.expand(e).expand_as(m) * m).sum()
            kappa_c = nm.kappa * s.charge()
            assert torch.allclose(flow[s.label], noise - kappa_c, rtol=1e-10, atol=1e-18)


@pytest.mark.parametrize("groups,groups2", _GROUPS)
def test_teleport_to_the_equilibrium_is_exact_and_zeroes_the_flows(
    groups: int, groups2: int
) -> None:
    model = _resnext(groups, groups2).eval()
    x, y = _inputs(0, 12), torch.randn(12, 3, dtype=DT, generator=torch.Generator().manual_seed(9))
    syms = nf.find_symmetries(model, x)
    nm = NoiseModel.create(batch_size=4, lr=0.1, weight_decay=1e-3)
    hooks = nf.collect_stats(model, syms, LOSS, x, y)
    ref = nf.collect_stats(model, syms, LOSS, x, y, estimator="reference")
    sol, sol_ref = nf.solve_equilibrium(syms, hooks, nm), nf.solve_equilibrium(syms, ref, nm)
    for k, v in sol_ref.elements.items():
        assert torch.allclose(torch.as_tensor(sol.elements[k]), torch.as_tensor(v), atol=1e-9)
    before = {k: float(v.abs().max()) for k, v in nf.noether_flow(syms, hooks, nm).items()}
    unseen = _inputs(5)
    with torch.no_grad():
        out = model(unseen)
    nf.teleport(model, sol)
    assert max(float(torch.as_tensor(v).abs().max()) for v in sol.elements.values()) > 1e-2
    with torch.no_grad():
        assert float((model(unseen) - out).norm() / out.norm()) <= 1e-12
    after = nf.noether_flow(syms, nf.collect_stats(model, syms, LOSS, x, y), nm)
    for k, v in after.items():
        assert float(v.abs().max()) <= 1e-8 * before[k], k


def test_depthwise_separable_block_bn_affine_rescales_the_depthwise_filters() -> None:
    model = _separable()
    syms = nf.find_symmetries(model.eval(), _inputs(0))
    assert "rescaling:bn0→dw" in syms.names and "rescaling:bn1→pw" in syms.names, syms.names
    _holds(model, syms, train=False)
    y = torch.randn(6, 3, dtype=DT)
    ref = nf.collect_stats(model, syms, LOSS, _inputs(0), y, estimator="reference")
    nm = NoiseModel.create(batch_size=6, lr=0.1, weight_decay=1e-3)
    want = nf.noether_flow(syms, ref, nm)
    for level in ("diag", "solve", "neuron"):
        got = nf.noether_flow(
            syms, nf.collect_stats(model, syms, LOSS, _inputs(0), y, level=level), nm
        )
        for k in want:
            assert float((got[k] - want[k]).abs().max()) <= 1e-10 * float(want[k].abs().max())
    train = nf.find_symmetries(model.train(), _inputs(0))
    assert "scale:dw→bn1" in train.names, train.names  # batch statistics: scale invariance
    _holds(model, train, train=True)


# -- the traps ----------------------------------------------------------------------------


class _Shuffle(nn.Module):
    """ShuffleNet's channel shuffle between two grouped convolutions: channels permuted."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 1)
        self.b = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.a(x))
        n, c, hh, ww = h.shape
        h = h.reshape(n, 2, c // 2, hh, ww).transpose(1, 2).reshape(n, c, hh, ww)
        return self.head(F.relu(self.b(h)).mean((2, 3)))  # type: ignore[no-any-return]


class _ReLU6Depthwise(nn.Module):
    """conv → ReLU6 → depthwise → ReLU → grouped conv into a residual sum → head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.g = nn.Conv2d(8, 8, 1, groups=4)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu6(3.0 * self.a(x))  # saturates on part of the batch
        z = F.relu(self.dw(h))
        return self.head((z + self.g(z)).mean((2, 3)))  # type: ignore[no-any-return]


@pytest.mark.parametrize("cls", [_Shuffle, _ReLU6Depthwise])
def test_traps_claim_nothing_false(cls: Any) -> None:
    torch.manual_seed(0)
    model = cls().to(DT)
    for train in (False, True):
        syms = nf.find_symmetries(model.train(train), _inputs(0))
        _holds(model, syms, train)
        cov = syms.coverage(model)
        if cls is _Shuffle:  # the permuted channels: a rescaling exists, not in this layout
            assert not any(n.startswith("rescaling:a→") for n in syms.names), syms.names
            assert "contiguous" in " ".join(cov["a.weight"].reasons), cov["a.weight"].reasons
        else:  # ReLU6 is not homogeneous; the residual sum reads dw's channels twice
            assert not any(n.startswith(("rescaling:a→", "rescaling:dw→")) for n in syms.names)
            assert "rescaling:g→head" not in syms.names
