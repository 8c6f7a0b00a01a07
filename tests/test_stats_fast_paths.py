"""The hooks' fast paths against slow references in float64 (issue 28).

Front moments of every head from one pair of factors per layer (``front_factors`` and one
batched product), per-sample gradients written in the parameter's layout chunk by chunk,
ḡ taken from autograd even where per-sample gradients are kept, and per-neuron sums at
``level="solve"``/``"neuron"`` read off kept per-sample gradients: each against materialised
per-sample gradients or the torch.func reference, on a GPT-2-like model too.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.stats import layers as L
from noetherflow.stats.blocks import stats_from_samples
from noetherflow.stats.contributions import per_sample_contributions
from noetherflow.stats.core import Level
from noetherflow.stats.factor_source import FactorSource, MeanGapError, Record, Unit
from noetherflow.stats.registry import handler_for

DT = torch.float64


def rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _per_sample(a: Tensor, g: Tensor, scale: float) -> Tensor:
    """G_n = Σ_t (scale·g_nt) a_ntᵀ, ``[N, O, I]``: the slow reference."""
    return torch.einsum("nto,nti->noi", g * scale, a)


@pytest.mark.parametrize("t", [1, 5])
def test_front_moments_of_every_slice_match_per_sample_gradients(t: int) -> None:
    torch.manual_seed(0)
    n, i, o, sc = 6, 10, 12, 3.0
    a, g = torch.randn(n, t, i, dtype=DT), torch.randn(n, t, o, dtype=DT)
    ps = _per_sample(a, g, sc)
    bias = (g * sc).sum(1)  # [N, O]
    cases = {
        "row": lambda sl: torch.einsum("nop,nqp->oq", ps[:, sl], ps[:, sl]) / n,
        "col": lambda sl: torch.einsum("npi,npj->ij", ps[:, :, sl], ps[:, :, sl]) / n,
        "bias": lambda sl: bias[:, sl].T @ bias[:, sl] / n,
    }
    for kind, ref in cases.items():
        lr = L.front_factors(a, g, kind, scale=sc)
        extent = lr[0].shape[-1]
        for d in (3, 4):  # 4 does not divide I = 10: the last partial block is left out
            blocks = L.block_moments(*lr, d)
            assert blocks.shape == (extent // d, d, d)
            for k in range(extent // d):
                assert rel(blocks[k], ref(slice(k * d, (k + 1) * d))) < 1e-13
        for sl in (slice(1, 5), slice(0, extent)):  # unaligned, and the whole axis
            assert rel(L.sliced_moment(*lr, sl), ref(sl)) < 1e-13
    assert rel(L.row_moment(a, g, slice(2, 6), scale=sc), cases["row"](slice(2, 6))) < 1e-13
    assert rel(L.col_moment(a, g, slice(2, 6), scale=sc), cases["col"](slice(2, 6))) < 1e-13
    got = L.row_moment(a, g, slice(2, 6), bias=True, scale=sc)
    assert rel(got, cases["bias"](slice(2, 6))) < 1e-13
    with pytest.raises(ValueError, match="kind='rows'"):
        L.front_factors(a, g, "rows")


@pytest.mark.parametrize("chunk", [2**24, 100])  # one chunk; several (the last one short)
@pytest.mark.parametrize("i,o", [(4, 9), (9, 4)])  # the scale on a, or on g
def test_per_sample_weight_in_both_layouts_and_chunks(
    monkeypatch: pytest.MonkeyPatch, chunk: int, i: int, o: int
) -> None:
    monkeypatch.setattr(L, "_CHUNK_ELEMS", chunk)
    torch.manual_seed(1)
    a, g = torch.randn(7, 3, i, dtype=DT), torch.randn(7, 3, o, dtype=DT)
    ref = _per_sample(a, g, 2.5)
    got = L.per_sample_weight(a, g, scale=2.5)
    assert got.shape == (7, o, i) and rel(got, ref) < 1e-14
    got_t = L.per_sample_weight(a, g, scale=2.5, transposed=True)
    assert got_t.shape == (7, i, o) and got_t.is_contiguous()
    assert rel(got_t, ref.transpose(1, 2)) < 1e-14


def _linear_source(lin: nn.Linear, a: Tensor, g: Tensor, known: dict) -> FactorSource:
    handler = handler_for(lin)
    assert handler is not None
    rec = Record(lin, "lin", handler, handler.parts_of(lin))
    owners = {id(lin.weight): Unit(rec, "", "weight"), id(lin.bias): Unit(rec, "", "bias")}
    facs = {(id(lin), ""): (a, g)}
    return FactorSource(a.shape[0], facs, owners, float(a.shape[0]), known, True, reduced=True)


def test_factor_source_front_moments_unaligned_and_aligned() -> None:
    """FactorSource serves aligned blocks from the batched product and other slices alone."""
    torch.manual_seed(2)
    lin = nn.Linear(6, 8).to(DT)
    a, g = torch.randn(5, 4, 6, dtype=DT), torch.randn(5, 4, 8, dtype=DT)
    src = _linear_source(lin, a, g, {})
    ps = _per_sample(a, g, 5.0)
    w = lin.weight
    for start, stop in ((0, 4), (4, 8), (1, 3), (2, 7)):
        sl = slice(start, stop)
        want = torch.einsum("nop,nqp->oq", ps[:, sl], ps[:, sl]) / 5
        assert rel(src.front_moment(w, 0, start, stop), want) < 1e-13
        if stop <= 6:
            want_c = torch.einsum("npi,npj->ij", ps[:, :, sl], ps[:, :, sl]) / 5
            assert rel(src.front_moment(w, 1, start, stop), want_c) < 1e-13
    # samples kept: ḡ is autograd's (no pass over them); per-neuron sums read off them
    known = {w: ps.mean(0), lin.bias: (5.0 * g.sum(1)).mean(0)}
    src = _linear_source(lin, a, g, known)
    assert rel(src.samples(w), ps) < 1e-14 and not src.has_samples(w)
    assert src.mean(w).data_ptr() == known[w].data_ptr()
    sums = src.axis_sq({w: (0, 1), lin.bias: (0,)})
    full = ps.square().mean(0)
    assert rel(sums[(w, 0)], full.sum(1)) < 1e-13 and rel(sums[(w, 1)], full.sum(0)) < 1e-13
    assert rel(sums[(lin.bias, 0)], (5.0 * g.sum(1)).square().mean(0)) < 1e-13
    src.verify_means()  # the check still runs on the known mean


def _gpt2(n_head: int = 4) -> tuple[nn.Module, Tensor, Tensor]:
    T = pytest.importorskip("transformers")
    cfg = T.GPT2Config(
        n_layer=2,
        n_embd=16,
        n_head=n_head,
        vocab_size=40,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = T.GPT2LMHeadModel(cfg)

        def forward(self, x: Tensor) -> Tensor:
            return self.body(x).logits

    x = torch.randint(0, 40, (5, 7))
    y = torch.randint(0, 40, (5, 7))
    return LM().to(DT).eval(), x, y


def _ce(out: Tensor, y: Tensor) -> Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


@pytest.mark.parametrize("level", ["solve", "neuron"])
def test_gpt2_lm_hooks_at_solve_and_neuron_levels_match_reference(level: str) -> None:
    """A GPT-2 LM (per-head Q/K and V/O rotations on the fused ``c_attn``, LayerNorm
    rescalings, a coupled set whose per-sample gradients are kept): every statistic of the
    hooks equals the torch.func reference at the same level, with the same entries."""
    m, x, y = _gpt2()
    syms = nf.find_symmetries(m, x)
    assert sum(s.family == "rotation" for s in syms) == 2 * 2 * 4
    h = nf.collect_stats(m, syms, _ce, x, y, level=level)
    full = nf.collect_stats(m, syms, _ce, x, y, estimator="reference")
    assert h.samples and set(h.samples) == set(full.samples)
    if level == "solve":  # the entries the solver's own refresh (SampleSource) gives
        ps = per_sample_contributions(m, syms.params(), _ce, x, y)
        r = stats_from_samples(ps, syms, estimator="reference", level=Level.SOLVE)
        assert set(h.sq) == set(r.sq) and set(h.sq_axis) == set(r.sq_axis) and h.sq_axis
    c_attn = m.body.transformer.h[0].attn.c_attn.weight
    assert c_attn not in h.sq and (c_attn, 0) in h.sq_axis  # read off the kept samples
    for p in h.mean:
        assert rel(h.mean[p], full.mean[p]) < 1e-11
    for p in h.sq:
        assert rel(h.sq[p], full.sq[p]) < 1e-11
    for (p, ax), v in h.sq_axis.items():
        dims = [d for d in range(full.sq[p].dim()) if d != ax]
        assert rel(v, full.sq[p].sum(dims) if dims else full.sq[p]) < 1e-11
    assert len(h.side) == 16
    for s, (w, u) in h.side.items():
        assert rel(w, full.side[s][0]) < 1e-11 and rel(u, full.side[s][1]) < 1e-11
    for p, v in h.samples.items():
        assert v.is_contiguous() and rel(v, full.samples[p]) < 1e-11
    kw = {"lr": 0.01, "batch_size": 5, "weight_decay": 1e-2}
    fh, fr = nf.noether_flow(syms, h, **kw), nf.noether_flow(syms, full, **kw)
    assert set(fh) == set(fr) and fh
    for k in fr:
        assert rel(fh[k], fr[k]) < 1e-10


def test_gpt2_solve_from_hooks_equals_solve_from_reference() -> None:
    m, x, y = _gpt2(n_head=2)
    syms = nf.find_symmetries(m, x)
    kw = {"lr": 0.01, "batch_size": 5, "weight_decay": 1e-2}
    sols = [
        nf.solve_equilibrium(syms, nf.collect_stats(m, syms, _ce, x, y, **e), **kw)
        for e in ({"level": "solve"}, {"estimator": "reference", "level": "solve"})
    ]
    assert sols[0].converged and sols[1].converged
    assert set(sols[0].elements) == set(sols[1].elements) and sols[1].elements
    for k, v in sols[1].elements.items():
        assert rel(torch.as_tensor(sols[0].elements[k]), torch.as_tensor(v)) < 1e-8


def test_gpt2_mean_check_still_runs_where_samples_are_kept() -> None:
    """ḡ of ``c_attn`` comes from autograd although its per-sample gradients are kept: the
    random-projection check must still catch a penalty in ``loss_fn``."""
    m, x, y = _gpt2(n_head=2)
    syms = nf.find_symmetries(m, x)
    w = m.body.transformer.h[1].attn.c_attn.weight

    def penalised(out: Tensor, y: Tensor) -> Tensor:
        return _ce(out, y) + 0.1 * w.square().sum()

    with pytest.raises(MeanGapError, match="c_attn"):
        nf.collect_stats(m, syms, penalised, x, y, level="solve")


@pytest.mark.parametrize("chunk", [13 * 2**16, 26])  # one chunk; several and a short tail
def test_fingerprint_by_chunks_matches_the_float64_sums(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    from noetherflow import _checks

    monkeypatch.setattr(_checks, "_FP_CHUNK", chunk)
    torch.manual_seed(5)
    for p in (torch.randn(10, 11), torch.randn(7, dtype=DT), torch.randn(0)):
        x = p.reshape(-1).to(DT)
        w = (torch.arange(x.numel()) % 13 + 1).to(DT)
        want = (float(x.sum()), float(x @ x), float(x @ w))
        (got,) = _checks.fingerprint([p])
        assert _checks.same_fingerprint(got, want)
        assert all(abs(a - b) <= 1e-13 * (1 + abs(b)) for a, b in zip(got, want, strict=True))
