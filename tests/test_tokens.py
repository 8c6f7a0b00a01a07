"""Token models: hook statistics through Hugging Face ``Conv1D``, LayerNorm affines and
fused projections (per-head slices of GPT-2's ``c_attn``, timm-style ``qkv``), against the
torch.func reference in float64, at every statistics level."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


def rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


class Head(nn.Module):
    """A model and a linear read-out of its last hidden state (a regression on every token)."""

    def __init__(self, body: nn.Module, width: int, *, hf: bool) -> None:
        super().__init__()
        self.body, self.hf = body, hf
        self.out = nn.Linear(width, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.body(x)
        if self.hf:
            h = h.last_hidden_state
        return self.out(h)


def gpt2() -> tuple[nn.Module, Tensor]:
    T = pytest.importorskip("transformers")
    cfg = T.GPT2Config(
        n_layer=2,
        n_embd=16,
        n_head=2,
        vocab_size=32,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return Head(T.GPT2Model(cfg), 16, hf=True), torch.randint(0, 32, (6, 5))


def fused_qkv() -> tuple[nn.Module, Tensor]:
    from real_models import FusedQKVAttention

    torch.manual_seed(0)
    return Head(FusedQKVAttention(), 16, hf=False), torch.randn(6, 5, 16)


class Conv1DMLP(nn.Module):
    """Conv1D → ReLU → Conv1D → Conv1D: a rescaling across the ReLU, a rotation after it."""

    def __init__(self) -> None:
        super().__init__()
        T = pytest.importorskip("transformers")
        self.a, self.b, self.c = (T.pytorch_utils.Conv1D(o, i) for i, o in ((4, 6), (6, 5), (5, 3)))

    def forward(self, x: Tensor) -> Tensor:
        return self.c(self.b(torch.relu(self.a(x))))


def conv1d_mlp() -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    return Conv1DMLP(), torch.randn(6, 5, 4)


def _setup(factory: Any) -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    m, x = factory()
    m = m.to(DT).eval()
    if x.is_floating_point():
        x = x.to(DT)
    syms = nf.find_symmetries(m, x)
    assert len(syms) > 0
    y = torch.randn(x.shape[0], x.shape[1], 3, dtype=DT)
    kinds = {type(s).__name__ for s in syms}
    assert "DoubleRotation" in kinds  # per-head slices of fused projections / Conv1D pairs
    return m, syms, x, y


def _compare(h: nf.GradStats, r: nf.GradStats) -> int:
    checked = 0
    for p in h.mean:
        assert rel(h.mean[p], r.mean[p]) < 1e-11
        checked += 1
    for p in h.sq:
        assert rel(h.sq[p], r.sq[p]) < 1e-11
        checked += 1
    for k, v in h.sq_axis.items():
        p, ax = k
        dims = [d for d in range(r.sq[p].dim()) if d != ax]
        ref = r.sq[p].sum(dims) if dims else r.sq[p]
        assert rel(v, ref) < 1e-11
        checked += 1
    for s, (w, u) in h.side.items():
        assert rel(w, r.side[s][0]) < 1e-11 and rel(u, r.side[s][1]) < 1e-11
        checked += 1
    for s, d in h.dense.items():
        assert rel(d, r.dense[s]) < 1e-11
        checked += 1
    for p, v in h.samples.items():  # coupled sets keep per-sample gradients for the solver
        assert rel(v, r.samples[p]) < 1e-11
        checked += 1
    return checked


# torch.func's vmap has no batching rule for CPU flash attention (the reference estimator)
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize(
    "factory", [gpt2, fused_qkv, conv1d_mlp], ids=["gpt2", "fused_qkv", "conv1d_mlp"]
)
@pytest.mark.parametrize("level", ["diag", "solve", "neuron"])
def test_hooks_match_reference_on_token_models(factory: Any, level: str) -> None:
    m, syms, x, y = _setup(factory)
    lf = nn.MSELoss()
    h = nf.collect_stats(m, syms, lf, x, y, level=level)
    r = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    assert _compare(h, r) > 0 and h.side
    kw = {"lr": 0.1, "batch_size": 6, "weight_decay": 1e-3}
    fh, fr = nf.noether_flow(syms, h, **kw), nf.noether_flow(syms, r, **kw)
    assert set(fh) == set(fr) and fh
    for k in fr:
        assert rel(fh[k], fr[k]) < 1e-10


def test_conv1d_is_registered_transposed() -> None:
    T = pytest.importorskip("transformers")
    conv = T.pytorch_utils.Conv1D(4, 3)
    h = nf.stats.registry.handler_for(conv)
    assert h is not None and h.transposed and h.matrix
    assert T.pytorch_utils.Conv1D in nf.stats.registry.registered_layers()


def test_a_conv1d_pair_is_a_rescaling_on_the_registry_axes() -> None:
    """HF Conv1D (weight [in, out]) → ReLU → Conv1D: detection gives the same ``Rescaling`` as
    built by hand, acting on the layer registry's axes (rows of ``a`` along axis 1, columns of
    ``b`` along axis 0) with the terms the channel form had, and the same flow (issue #27)."""
    from noetherflow.symmetry.base import DiagonalTerm
    from noetherflow.symmetry.channel import ChannelRescaling

    m, x = conv1d_mlp()
    m = m.to(DT).eval()
    x = x.to(DT)
    found = [s for s in nf.find_symmetries(m, x) if s.family == "rescaling"]
    assert len(found) == 1 and type(found[0]) is nf.Rescaling
    (s,) = found
    hand = nf.Rescaling(m.a, m.b)
    names = {id(p): n for n, p in m.named_parameters()}
    assert s.signature(names) == hand.signature(names) == ("rescaling", "a.weight", "b.weight", 1)
    got = [(names[id(t.param)], t.axis, t.block, t.sign) for t in s.terms()]
    assert got == [("a.weight", 1, 1, 1.0), ("a.bias", 0, 1, 1.0), ("b.weight", 0, 1, -1.0)]
    old = ChannelRescaling(
        [DiagonalTerm(m.a.weight, 1, 1, 1.0), DiagonalTerm(m.a.bias, 0, 1, 1.0)],
        [DiagonalTerm(m.b.weight, 0, 1, -1.0)],
    )
    y = torch.randn(x.shape[0], x.shape[1], 3, dtype=DT)
    kw = {"lr": 0.1, "batch_size": 6, "weight_decay": 1e-3}
    flows = []
    for sym in (s, old):
        syms = nf.SymmetrySet([sym])
        st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
        flows.extend(nf.noether_flow(syms, st, **kw).values())
    assert len(flows) == 2 and torch.equal(flows[0], flows[1])


@pytest.mark.parametrize("t,i,o", [(3, 16, 12), (20, 4, 5)])
def test_neuron_sums_gram_form_matches_per_sample_gradients(t: int, i: int, o: int) -> None:
    """Per-neuron sums with a token axis: the Gram form (T small) and the chunked form agree
    with sums of materialised per-sample gradients (float64)."""
    from noetherflow.stats import layers as L

    torch.manual_seed(3)
    a, g = torch.randn(7, t, i, dtype=DT), torch.randn(7, t, o, dtype=DT)
    assert L.gram_cheaper(t, i, o) == (t == 3)
    ps = L.per_sample_weight(a, g, scale=2.0)  # [N, O, I]
    full = ps.square().mean(0)
    sums, b = L.neuron_sums(a, g, (0, 1), bias=True, scale=2.0)
    assert rel(sums[0], full.sum(1)) < 1e-13 and rel(sums[1], full.sum(0)) < 1e-13
    assert b is not None and rel(b, (2.0 * g.sum(1)).square().mean(0)) < 1e-13


def test_neuron_level_gram_form_matches_reference() -> None:
    torch.manual_seed(4)
    m = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 12)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(5, 3, 12, dtype=DT), torch.randn(5, 3, 12, dtype=DT)
    h = nf.collect_stats(m, syms, nn.MSELoss(), x, y, level="neuron")
    r = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    assert h.sq_axis and _compare(h, r) > 0
