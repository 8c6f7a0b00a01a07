"""Hook statistics through ``nn.MultiheadAttention`` (issue 14): the fused ``in_proj`` and
``out_proj`` read from the whole call, against the torch.func reference in float64 at every
statistics level (batch_first True and False, key padding and causal masks, cross-attention,
three different inputs), the closed-form attention backward against autograd, the refusals,
and the monitor for 5 steps on a transformer encoder layer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.stats.attention import attention_grads
from noetherflow.stats.registry import handler_for

sys.path.insert(0, str(Path(__file__).parent))
from test_hooks_layers import _hooks_vs_reference
from test_tokens import rel

DT = torch.float64

# torch.func's vmap has no batching rule for CPU flash attention (the reference estimator)
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


class Encoder(nn.Module):
    """A TransformerEncoderLayer with masks passed as inputs (split per sample by the
    reference) and a read-out per token; ``batch_first=False`` transposes around it."""

    def __init__(self, batch_first: bool = True, causal: bool = False) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=batch_first)
        self.out = nn.Linear(16, 3)
        self.batch_first, self.causal = batch_first, causal

    def forward(self, x: Tensor, kpm: Tensor | None = None) -> Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=x.dtype)
        kw: dict[str, Any] = {"src_key_padding_mask": kpm}
        if self.causal:
            kw.update(src_mask=mask, is_causal=kpm is None)
        if self.batch_first:
            return self.out(self.layer(x, **kw))  # type: ignore[no-any-return]
        return self.out(self.layer(x.transpose(0, 1), **kw).transpose(0, 1))  # type: ignore[no-any-return]


def _kpm() -> Tensor:
    kpm = torch.zeros(6, 5, dtype=torch.bool)
    kpm[1, 4] = kpm[2, 3:] = kpm[5, 2:] = True  # padded keys; every query keeps one
    return kpm


@pytest.mark.parametrize(
    "batch_first,causal,padded",
    [
        (True, False, False),
        (False, False, False),
        (True, False, True),
        (True, True, False),
        (True, True, True),
        (False, True, True),
    ],
)
def test_encoder_layer_matches_reference(batch_first: bool, causal: bool, padded: bool) -> None:
    torch.manual_seed(0)
    m = Encoder(batch_first, causal).to(DT).eval()
    x = torch.randn(6, 5, 16, dtype=DT)
    inputs: Any = (x, _kpm()) if padded else x
    syms = nf.find_symmetries(m, inputs)
    att = [s for s in syms.names if "self_attn" in s]
    assert len(att) == 8  # per head: q·k and v·out_proj
    if not batch_first:  # the FFN's Linear layers see [L, N, E]: hooks need the batch first
        syms = nf.SymmetrySet(syms[n] for n in att)
    _hooks_vs_reference(m, syms, inputs, torch.randn(6, 5, 3, dtype=DT))


def test_seq_first_linear_layers_are_refused_clearly() -> None:
    torch.manual_seed(0)
    m = Encoder(batch_first=False).to(DT).eval()
    x = torch.randn(6, 5, 16, dtype=DT)
    syms = nf.find_symmetries(m, x)
    with pytest.raises(nf.UnsupportedLayerError, match="batch_first=True"):
        nf.collect_stats(m, syms, nn.MSELoss(), x, torch.randn(6, 5, 3, dtype=DT))


class Cross(nn.Module):
    """MHA with different query and key/value inputs (key is value, or all three distinct)."""

    def __init__(self, distinct: bool) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(16, 16), nn.Linear(16, 16)
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 3)
        self.distinct = distinct

    def forward(self, q: Tensor, mem: Tensor) -> Tensor:
        k = torch.relu(self.enc(mem))
        v = k.flip(1) if self.distinct else k
        h, _ = self.mha(torch.relu(self.dec(q)), k, v)  # the weights are returned, unused
        return self.out(h)  # type: ignore[no-any-return]


@pytest.mark.parametrize("distinct", [False, True], ids=["key_is_value", "distinct"])
def test_cross_attention_matches_reference(distinct: bool) -> None:
    torch.manual_seed(0)
    m = Cross(distinct).to(DT).eval()
    q, mem = torch.randn(6, 4, 16, dtype=DT), torch.randn(6, 7, 16, dtype=DT)
    syms = nf.find_symmetries(m, (q, mem))
    assert sum("mha" in s for s in syms.names) >= 4
    _hooks_vs_reference(m, syms, (q, mem), torch.randn(6, 4, 3, dtype=DT))


def test_closed_form_attention_backward_matches_autograd() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, t, 8, dtype=DT, requires_grad=True) for t in (4, 6, 6))
    d_out = torch.randn(3, 4, 8, dtype=DT)
    mask = torch.randn(3, 1, 1, 6, dtype=DT)
    for msk, causal in ((mask, False), (None, True)):
        out, dq, dk, dv = attention_grads(q.detach(), k.detach(), v.detach(), 2, msk, causal, d_out)
        split = [t.view(3, -1, 2, 4).transpose(1, 2) for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*split, attn_mask=msk, is_causal=causal)
        ref = ref.transpose(1, 2).reshape(3, 4, 8)
        gq, gk, gv = torch.autograd.grad(ref, (q, k, v), d_out)
        for got, want in ((out, ref.detach()), (dq, gq), (dk, gk), (dv, gv)):
            assert rel(got, want) < 1e-13


def test_attention_refusals_name_the_reason() -> None:
    for kw, why in (
        ({"kdim": 8, "vdim": 8}, "kdim=8"),
        ({"add_bias_kv": True}, "add_bias_kv"),
        ({"add_zero_attn": True}, "add_zero_attn"),
    ):
        with pytest.raises(nf.UnsupportedLayerError, match=why):
            handler_for(nn.MultiheadAttention(16, 2, **kw), "mha")
    mha = nn.MultiheadAttention(16, 2, dropout=0.1)
    assert handler_for(mha.eval()) is not None
    with pytest.raises(
        nf.UnsupportedLayerError, match=r"dropout=0.1 in training mode.*'reference'"
    ):
        handler_for(mha.train(), "mha")


def test_attention_weights_in_the_loss_are_refused() -> None:
    torch.manual_seed(0)
    m = Cross(False).to(DT).eval()
    q, mem = torch.randn(6, 4, 16, dtype=DT), torch.randn(6, 7, 16, dtype=DT)
    syms = nf.find_symmetries(m, (q, mem))
    with nf.capture(m, syms) as cap:
        h = torch.relu(m.dec(q))
        k = torch.relu(m.enc(mem))
        out, w = m.mha(h, k, k)
        (m.out(out).square().mean() + w.square().mean()).backward()
    with pytest.raises(nf.UnsupportedLayerError, match="attention weights"):
        _ = cap.stats


def test_monitor_runs_5_steps_on_an_encoder_layer_with_hooks() -> None:
    """The example of issue 14: encoder layer → flatten → linear, monitored with the hooks;
    every record's flows equal those of the reference on the same batch."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True),
        nn.Flatten(),
        nn.Linear(80, 3),
    ).to(DT)
    x0 = torch.randn(8, 5, 16, dtype=DT)
    syms = nf.find_symmetries(m, x0)
    names = {id(p): n for n, p in m.named_parameters()}
    touched = {names[id(p)] for s in syms for p in s.params}
    assert {"0.self_attn.in_proj_weight", "0.self_attn.out_proj.weight"} <= touched
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    mon = nf.NoetherMonitor(
        m, syms, every=1, optimizer=opt, batch_size=8, logging=nf.LogOptions(progress=False)
    )
    assert mon.estimator.value == "hooks"
    gen = torch.Generator().manual_seed(1)
    for step in range(5):
        x = torch.randn(8, 5, 16, dtype=DT, generator=gen)
        y = torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.cross_entropy(m(x), y)
            loss.backward()
        row = mon.step(loss)
        assert row is not None
        ref = nf.collect_stats(m, syms, F.cross_entropy, x, y, estimator="reference")
        want = nf.noether_flow(syms, ref, lr=0.05, batch_size=8)
        for name in syms.names:
            got = torch.as_tensor(row[f"flow/{mon.keys[name]}"])
            w = want[name] if got.dim() else want[name].norm()
            assert rel(got.reshape(w.shape), w) < 1e-9, (step, name)
            assert np.isfinite(row[f"charge/{mon.keys[name]}"]).all()
        opt.step()
    mon.close()
