"""Hook statistics through norms and grouped convolutions (issue 14), against the torch.func
reference in float64 at every statistics level: ``nn.RMSNorm`` and Hugging Face's RMSNorms
(Llama and its copies, T5), eval-mode BatchNorm (tokens = spatial positions), grouped and
depthwise convolutions (ConvNeXt-style block, HF ConvNeXt), and the refusals (BatchNorm in
training mode)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.stats.registry import _HF_RMS_MODELS, handler_for
from noetherflow.symmetry.base import DiagonalTerm
from noetherflow.symmetry.channel import ChannelRescaling

sys.path.insert(0, str(Path(__file__).parent))
from test_tokens import _compare, rel

DT = torch.float64
LEVELS = ["diag", "solve", "neuron"]


def _hooks_vs_reference(m: nn.Module, syms: nf.SymmetrySet, x: Any, y: Tensor) -> None:
    lf = nn.MSELoss()
    r = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    for level in LEVELS:
        h = nf.collect_stats(m, syms, lf, x, y, level=level)
        assert _compare(h, r) > 0
        kw = {"lr": 0.1, "batch_size": 6, "weight_decay": 1e-3}
        fh, fr = nf.noether_flow(syms, h, **kw), nf.noether_flow(syms, r, **kw)
        assert set(fh) == set(fr) and fh
        for k in fr:
            assert rel(fh[k], fr[k]) < 1e-10, (level, k)


def _hf_norm(qualname: str) -> type[nn.Module]:
    pytest.importorskip("transformers")
    mod, cls = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(mod), cls)  # type: ignore[no-any-return]


_NORMS = [
    "torch.nn.RMSNorm",
    "transformers.models.llama.modeling_llama.LlamaRMSNorm",
    "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm",
    "transformers.models.mistral.modeling_mistral.MistralRMSNorm",
    "transformers.models.olmo2.modeling_olmo2.Olmo2RMSNorm",
    "transformers.models.t5.modeling_t5.T5LayerNorm",
]


@pytest.mark.parametrize("qualname", _NORMS, ids=lambda q: q.rsplit(".", 1)[1])
def test_rmsnorm_affines_match_reference(qualname: str) -> None:
    """Norm → Linear on a token axis: the norm's weight and the Linear exactly (float64)."""
    cls = nn.RMSNorm if qualname == "torch.nn.RMSNorm" else _hf_norm(qualname)
    torch.manual_seed(0)
    m = nn.Sequential(cls(6), nn.Linear(6, 3)).to(DT)
    with torch.no_grad():
        m[0].weight.uniform_(0.5, 1.5)
    x, y = torch.randn(6, 5, 6, dtype=DT), torch.randn(6, 5, 3, dtype=DT)
    # declared (detection does not trace T5LayerNorm's casts), then verified
    up, down = DiagonalTerm(m[0].weight, 0, 1, 1.0), DiagonalTerm(m[1].weight, 1, 1, -1.0)
    syms = nf.SymmetrySet([ChannelRescaling([up], [down])])
    assert all(v.verified for v in syms.verify(m, x))
    h = handler_for(m[0])
    assert h is not None and h.elementwise
    _hooks_vs_reference(m, syms, x, y)


def test_registered_hf_rmsnorms_compute_like_llama() -> None:
    """Every class registered with the Llama formula has LlamaRMSNorm's forward (Olmo2's casts
    after the product, which gives the same γ-gradient)."""
    base = inspect.getsource(_hf_norm(_NORMS[1]).forward)
    for mod, cls in _HF_RMS_MODELS.items():
        c = _hf_norm(f"transformers.models.{mod}.modeling_{mod}.{cls}RMSNorm")
        assert (inspect.getsource(c.forward) == base) == (mod != "olmo2"), mod


class _Head(nn.Module):
    def __init__(self, body: nn.Module, width: int) -> None:
        super().__init__()
        self.body, self.out = body, nn.Linear(width, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.body(x).last_hidden_state)  # type: ignore[no-any-return]


def _tiny_llama() -> nn.Module:
    pytest.importorskip("transformers")
    import real_models as RM

    torch.manual_seed(0)
    return _Head(RM.llama(attn_implementation="eager")[0], 16).to(DT)


# torch.func's vmap has no batching rule for CPU flash attention (the reference estimator)
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
def test_tiny_llama_hooks_and_monitor() -> None:
    """A Llama-style model (RMSNorm, rotary, GQA, SwiGLU): hooks = reference, monitor 5 steps.

    LlamaRMSNorm and the eager softmax compute in float32 even in a float64 model, so the
    per-sample gradients of the parameters before the last RMSNorm differ between the
    batched backward (hooks) and the per-sample one (reference) by float32 round-off
    (measured 1.1e-7 relative): those are compared at 1e-6, the last RMSNorm and the head
    (float64 all the way) at 1e-11.
    """
    m = _tiny_llama().eval()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 32, (6, 5), generator=gen), torch.randn(6, 5, 3, dtype=DT)
    syms = nf.find_symmetries(m, x)
    exact = {id(m.body.norm.weight), id(m.out.weight), id(m.out.bias)}
    norms = [n for n, mod in m.named_modules() if type(mod).__name__ == "LlamaRMSNorm"]
    assert len(norms) == 3 and all(any(n in s for s in syms.names) for n in norms)
    lf = nn.MSELoss()
    r = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    for level in LEVELS:
        h = nf.collect_stats(m, syms, lf, x, y, level=level)
        for p in h.mean:
            tol = 1e-11 if id(p) in exact else 1e-6
            assert rel(h.mean[p], r.mean[p]) < tol
            assert p not in h.sq or rel(h.sq[p], r.sq[p]) < tol
    assert rel(h.mean[m.body.norm.weight], r.mean[m.body.norm.weight]) < 1e-11
    m.train()  # no dropout in the config: hooks apply in training mode too
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=6,
        distance=False,
        logging=nf.LogOptions(progress=False),
    )
    last = "rescaling:body.norm→out"
    for step in range(5):
        xs = torch.randint(0, 32, (6, 5), generator=gen)
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = lf(m(xs), y)
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        want = nf.noether_flow(
            syms, nf.collect_stats(m, syms, lf, xs, y, estimator="reference"), lr=0.05, batch_size=6
        )
        got = torch.as_tensor(row[f"flow/{mon.keys[last]}"])
        assert rel(got, want[last]) < 1e-9, step
        for name in syms.names:
            assert np.isfinite(row[f"flow/{mon.keys[name]}"]).all(), name
        opt.step()
    mon.close()


def _bn_group_model() -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    """conv → BN (eval) → ReLU → depthwise conv → ReLU → grouped conv (2 groups) → head."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.ReLU(),
        nn.Conv2d(8, 6, 1, groups=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 16, 3),
    ).to(DT)
    bn = m[1]
    assert isinstance(bn, nn.BatchNorm2d) and bn.running_mean is not None
    with torch.no_grad():  # running statistics away from (0, 1)
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
    m.eval()
    w = {i: m[i].weight for i in (1, 3, 5, 8)}
    b = {i: m[i].bias for i in (1, 3, 5)}
    syms = nf.SymmetrySet(
        [  # BN channel → depthwise channel; grouped-conv channel → its 16 head columns
            ChannelRescaling(
                [DiagonalTerm(w[1], 0, 1, 1.0), DiagonalTerm(b[1], 0, 1, 1.0)],
                [DiagonalTerm(w[3], 0, 1, -1.0)],
                label="bn→dw",
            ),
            ChannelRescaling(
                [DiagonalTerm(w[5], 0, 1, 1.0), DiagonalTerm(b[5], 0, 1, 1.0)],
                [DiagonalTerm(w[8], 1, 16, -1.0)],
                label="group→head",
            ),
        ]
    )
    x = torch.randn(6, 3, 4, 4, dtype=DT)
    assert all(v.verified for v in syms.verify(m, x))
    return m, syms, x, torch.randn(6, 3, dtype=DT)


def test_eval_batchnorm_and_grouped_convs_match_reference() -> None:
    m, syms, x, y = _bn_group_model()
    _hooks_vs_reference(m, syms, x, y)


def test_batchnorm1d_without_and_with_tokens() -> None:
    torch.manual_seed(0)
    for x in (torch.randn(6, 4, dtype=DT), torch.randn(6, 4, 5, dtype=DT)):
        m = nn.Sequential(nn.Linear(x.shape[-1], 4) if x.dim() == 2 else nn.Identity())
        m.append(nn.BatchNorm1d(4)).append(nn.ReLU()).append(nn.Flatten())
        m.append(nn.Linear(4 * (x.shape[2] if x.dim() == 3 else 1), 3))
        m = m.to(DT)
        m.train()(x)  # running statistics from one batch
        m.eval()
        bn, head = m[1], m[4]
        blk = 1 if x.dim() == 2 else x.shape[2]
        syms = nf.SymmetrySet(
            [
                ChannelRescaling(
                    [DiagonalTerm(bn.weight, 0, 1, 1.0), DiagonalTerm(bn.bias, 0, 1, 1.0)],
                    [DiagonalTerm(head.weight, 1, blk, -1.0)],
                )
            ]
        )
        assert all(v.verified for v in syms.verify(m, x))
        _hooks_vs_reference(m, syms, x, torch.randn(6, 3, dtype=DT))


def test_training_mode_batchnorm_is_refused_with_the_microbatch_advice() -> None:
    m, syms, x, y = _bn_group_model()
    m.train()
    with pytest.raises(nf.UnsupportedLayerError, match="training-mode BatchNorm") as err:
        handler_for(m[1], "1")
    assert "estimator='microbatch'" in str(err.value) and "'reference'" not in str(err.value)
    with pytest.raises(nf.StatisticsError, match="estimator='microbatch'"):
        nf.collect_stats(m, syms, nn.MSELoss(), x, y)
    m.eval()
    m[1].track_running_stats, m[1].running_mean, m[1].running_var = False, None, None
    with pytest.raises(nf.UnsupportedLayerError, match="without running statistics"):
        nf.collect_stats(m, syms, nn.MSELoss(), x, y)


class _ConvNeXtBlock(nn.Module):
    """Stem → depthwise 3×3 → LayerNorm (channels last) → pw1 → ReLU → pw2, residual, head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 2, stride=2)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.ln = nn.LayerNorm(8)
        self.pw1, self.pw2 = nn.Linear(8, 16), nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x)
        z = self.ln(self.dw(h).permute(0, 2, 3, 1))
        z = self.pw2(torch.relu(self.pw1(z))).permute(0, 3, 1, 2)
        return self.head((h + z).mean((2, 3)))  # type: ignore[no-any-return]


def test_depthwise_separable_block_matches_reference() -> None:
    torch.manual_seed(0)
    m = _ConvNeXtBlock().to(DT).eval()
    x = torch.randn(6, 3, 8, 8, dtype=DT)
    syms = nf.find_symmetries(m, x)
    assert "scale:dw→ln" in syms.names  # the depthwise conv's weight and bias
    _hooks_vs_reference(m, syms, x, torch.randn(6, 3, dtype=DT))


def test_hf_convnext_depthwise_and_channels_first_norms() -> None:
    """HF ConvNeXt: every symmetry but the layer-scale ones (a bare parameter, no layer)."""
    import real_models as RM

    pytest.importorskip("transformers")
    torch.manual_seed(0)
    body, x = RM.convnext()

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.b = body

        def forward(self, x: Tensor) -> Tensor:
            return self.b(x).pooler_output  # type: ignore[no-any-return]

    m, x = Pooled().to(DT).eval(), torch.randn(6, 3, 16, 16, dtype=DT)
    syms = nf.find_symmetries(m, x)
    names = {id(p): n for n, p in m.named_parameters()}
    keep = nf.SymmetrySet(
        s for s in syms if not any("layer_scale" in names[id(p)] for p in s.params)
    )
    assert len(keep) == 6 and sum("dwconv" in n for n in keep.names) == 2
    _hooks_vs_reference(m, keep, x, torch.randn(6, 16, dtype=DT))
