"""Per-sample gradients held as a linear layer's factors in the coupled solver (issue 28).

g_n = L_nᵀ R_n: the moves, Grams, per-axis sums and means of
:class:`~noetherflow.stats.sample_factors.SampleFactors` equal those of the materialised
samples in float64 (to 1e-13), and a coupled solve on factored samples (the default) takes
the steps of the solve on ``[N, *shape]`` samples (``sweep_options(factored=False)``, the
previous path) to 1e-11: a small GPT-2 (fused ``c_attn``, heads, the ``ln_1`` rescaling),
with ignored targets (``ignore_index``), and a hand-built block of token-axis linear layers.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow._sweep_plan import sweep_options
from noetherflow.stats.sample_factors import (
    SampleFactors,
    axis_sq,
    block_grams,
    compresses,
    left_product_,
)
from noetherflow.stats.source import SampleSource
from noetherflow.symmetry.rotation import Block

DT = torch.float64


def _factors(n: int = 3, t: int = 5, d0: int = 12, d1: int = 8, seed: int = 0) -> SampleFactors:
    g = torch.Generator().manual_seed(seed)
    return SampleFactors(
        torch.randn(n, t, d0, generator=g, dtype=DT), torch.randn(n, t, d1, generator=g, dtype=DT)
    )


def _close(a: Tensor, b: Tensor, tol: float = 1e-13) -> None:
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= tol * max(float(b.abs().max()), 1.0)


@pytest.mark.parametrize("t", [2, 5, 20])  # fewer, more tokens than a factor's width
def test_factor_reductions_equal_the_dense_ones(t: int) -> None:
    f = _factors(t=t)
    g = f.dense()
    _close(g, torch.einsum("nti,ntj->nij", f.left, f.right))
    _close(f.mean(), g.mean(0))
    for axis in (0, 1):
        _close(axis_sq(f, axis), axis_sq(g, axis))
        _close(axis_sq(g, axis), g.square().sum((0, 2 - axis)))
        for starts, d in (([0, 2, 4], 2), ([4, 0], 4), ([3], 3)):
            front = g.movedim(axis + 1, 1)
            want = torch.stack(
                [
                    torch.einsum("nim,njm->ij", front[:, s : s + d], front[:, s : s + d])
                    for s in starts
                ]
            )
            _close(block_grams(f, axis, starts, d), want)
        p = nn.Parameter(torch.zeros(12, 8, dtype=DT))
        got = SampleSource({p: f}).front_moment(p, axis, 2, 6)
        _close(got, SampleSource({p: g}).front_moment(p, axis, 2, 6))


@pytest.mark.parametrize("starts", [[0, 2, 4], [6, 1]])
@pytest.mark.parametrize("axis", [0, 1])
def test_factor_moves_equal_the_dense_moves(axis: int, starts: list[int]) -> None:
    f = _factors()
    g = f.dense()
    mats = torch.randn(len(starts), 2, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    left_product_(f, axis, starts, mats)
    front = g.movedim(axis + 1, 1)
    for s, m in zip(starts, mats, strict=True):
        front[:, s : s + 2] = torch.einsum("ij,njm->nim", m, front[:, s : s + 2].clone())
    _close(f.dense(), g)
    # a diagonal move along either axis scales that factor (DiagonalSymmetry's broadcast)
    for shape in ((12, 1), (1, 8), (1, 12, 1)):
        v = torch.rand(*shape, dtype=DT) + 0.5
        f.mul_(v)
        g.mul_(v)
        _close(f.dense(), g)


def test_a_move_along_both_axes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"varies along one axis.*factored=False"):
        _factors().mul_(torch.rand(12, 8, dtype=DT))


def test_compresses_counts_entries() -> None:
    assert compresses(128, 768, 2304) and not compresses(8, 16, 16) and compresses(7, 16, 16)


class _LM(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, t: Tensor) -> Tensor:
        return self.body(t).logits


def _gpt2(ignore: bool, layers: int = 1) -> tuple[nf.SymmetrySet, nf.GradStats, dict[str, Any]]:
    """A GPT-2 of width 32 with 4 heads (c_attn [32, 96] and c_proj [32, 32] both factored
    at 8 tokens), float64; ``ignore``: a third of the targets ignored (-100)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=layers,
        n_embd=32,
        n_head=4,
        vocab_size=40,
        n_positions=8,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = _LM(transformers.GPT2LMHeadModel(cfg).double())
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 40, (6, 8), generator=g)
    y = torch.randint(0, 40, (6, 8), generator=g)
    if ignore:
        y[torch.rand(6, 8, generator=g) < 0.33] = -100
        y[0] = -100  # a sample with no loss at all: zero gradients

    def loss(out: Tensor, t: Tensor) -> Tensor:
        return nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), t.reshape(-1), ignore_index=-100
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        syms = nf.find_symmetries(model, x[:2])
    st = nf.collect_stats(model, syms, loss, x, y, level="solve")
    return syms, st, {"lr": 0.01, "batch_size": 6, "weight_decay": 0.01}


def _block() -> tuple[nf.SymmetrySet, nf.GradStats, dict[str, Any]]:
    """Linear(5, 24) → Linear(24, 6) → ReLU → Linear(6, 3) on 3 tokens per sample: 4 heads
    of 6 between the first two (a fused projection's rows), a rescaling on the second's rows."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(5, 24), nn.Linear(24, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    rots = [
        nf.DoubleRotation.from_blocks(
            [Block(m[0].weight, 0, 6 * h, 6 * h + 6), Block(m[0].bias, 0, 6 * h, 6 * h + 6)],
            [Block(m[1].weight, 1, 6 * h, 6 * h + 6)],
            label=f"head{h}",
        )
        for h in range(4)
    ]
    syms = nf.SymmetrySet([*rots, nf.Rescaling(m[1], m[3], label="r")])
    x, y = torch.randn(30, 3, 5, dtype=DT), torch.randn(30, 3, 3, dtype=DT)
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, level="solve")
    return syms, st, {"lr": 0.05, "batch_size": 30, "weight_decay": 1e-2}


@pytest.mark.parametrize("case", ["gpt2", "gpt2-ignore", "block"])
def test_a_factored_solve_takes_the_dense_steps(case: str) -> None:
    syms, st, kw = _block() if case == "block" else _gpt2(ignore=case == "gpt2-ignore")
    held = [p for p in st.samples if st.sample_factors(p) is not None]
    assert held  # the fused projection (and more) is held as factors
    for p in held:  # the same samples
        fac = st.sample_factors(p)
        assert fac is not None
        _close(fac.dense(), st.samples[p], 1e-13)
    for opts in ({}, {"accelerate": False}, {"covariant": False}):
        runs = []
        for fac in (True, False):
            with sweep_options(factored=fac, **opts):
                runs.append(nf.solve_equilibrium(syms, st, **kw))
        new, ref = runs
        assert new.converged and ref.converged and new.iterations == ref.iterations > 1
        assert [i for i, _ in new.steps] == [i for i, _ in ref.steps]
        for name, e in new.elements.items():
            e, f = torch.as_tensor(e), torch.as_tensor(ref.elements[name])
            assert torch.allclose(e, f, rtol=1e-11, atol=1e-11), (name, opts)
            assert torch.allclose(new.distance[name], ref.distance[name], rtol=1e-11, atol=1e-12)
    # a warm start moves the factors too
    with sweep_options(factored=True):
        warm = nf.solve_equilibrium(syms, st, init=ref, **kw)
    with sweep_options(factored=False):
        warm_ref = nf.solve_equilibrium(syms, st, init=ref, **kw)
    for name, e in warm.elements.items():
        f = warm_ref.elements[name]
        assert torch.allclose(torch.as_tensor(e), torch.as_tensor(f), rtol=1e-11, atol=1e-11)


def test_factors_are_dropped_with_their_samples() -> None:
    _, st, _ = _block()
    p = next(p for p in st.samples if st.sample_factors(p) is not None)
    st.samples[p] = st.samples[p] * 2.0  # e.g. rescaled by a merge: the factors no longer hold
    assert st.sample_factors(p) is None
