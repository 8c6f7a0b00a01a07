"""Embedding tables summed and projected: GL(embedding size) (DeBERTa-v2's ``embed_proj``, #26).

``y = W·(E_w[ids] + E_p[pos] (+ E_t[types]))``: E_k → E_k G⁻ᵀ, W → W G keeps y for every
invertible G. Claimed only for a pure sum of embedding outputs feeding the dense layer
directly; a LayerNorm between (ALBERT, ELECTRA), a non-homogeneous map, or a sum read
elsewhere too gets no claim. Checked: independently in float64 on unseen inputs (eval and
train), the hooks' statistics of the tables (one-hot factors, ``padding_idx``) against the
torch.func reference, and the teleport of the noise equilibrium (exact, flows ~0 after).
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

sys.path.insert(0, str(Path(__file__).parent))
import hf_zoo as Z

DT = torch.float64


class _Factorised(nn.Module):
    """word (padding_idx 0) + token-type embeddings (size 4) → proj (4 → 6) → ReLU → head."""

    def __init__(self, between: str = "none", reuse: bool = False) -> None:
        super().__init__()
        self.word = nn.Embedding(11, 4, padding_idx=0)
        self.types = nn.Embedding(3, 4)
        self.norm = nn.LayerNorm(4)
        self.proj, self.head = nn.Linear(4, 6), nn.Linear(6, 2)
        self.between, self.reuse = between, reuse

    def forward(self, ids: Tensor, types: Tensor) -> Tensor:
        e = self.word(ids) + self.types(types)
        h = self.norm(e) if self.between == "norm" else F.gelu(e) if self.between == "gelu" else e
        out = self.head(F.relu(self.proj(h)))
        if self.reuse:  # the sum also read by a residual path
            out = out + e[..., :2]
        return out  # type: ignore[no-any-return]


def _inputs(seed: int) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "ids": torch.randint(0, 11, (6, 5), generator=g),
        "types": torch.randint(0, 3, (6, 5), generator=g),
    }


def _model(**kw: Any) -> nn.Module:
    torch.manual_seed(0)
    return _Factorised(**kw).to(DT)


def _change(model: nn.Module, s: nf.Symmetry, seed: int) -> float:
    return Z.independent_change(model, s, _inputs(seed), model.training, False)


def test_summed_embeddings_into_a_linear_get_one_gl_rotation() -> None:
    model = _model()
    for train in (False, True):
        syms = nf.find_symmetries(model.train(train), _inputs(0))
        assert "rotation:word+types→proj" in syms.names, syms.names
        assert all(r.verified for r in syms.verification.values())
        for s in syms:
            assert max(_change(model, s, k) for k in (1, 2)) <= 1e-12, s.label


@pytest.mark.parametrize("kw", [{"between": "norm"}, {"between": "gelu"}, {"reuse": True}])
def test_no_embedding_rotation_through_a_norm_a_gelu_or_a_shared_sum(kw: dict[str, Any]) -> None:
    model = _model(**kw)
    for train in (False, True):
        syms = nf.find_symmetries(model.train(train), _inputs(0))
        assert not any("word" in n for n in syms.names), syms.names
        why = " ".join(syms.coverage(model)["word.weight"].reasons)
        assert "only a sum of embedding tables read by a dense layer" in why, why
        for s in syms:
            assert max(_change(model, s, k) for k in (1, 2)) <= 1e-12, s.label


def test_hook_statistics_of_embedding_tables_match_the_reference() -> None:
    model = _model().eval()
    x = _inputs(0)
    x["ids"][0, :2] = 0  # padding_idx rows: no gradient
    syms = nf.find_symmetries(model, x)
    y = torch.randn(6, 5, 2, dtype=DT, generator=torch.Generator().manual_seed(9))
    loss = nn.MSELoss()
    ref = nf.collect_stats(model, syms, loss, x, y, estimator="reference")
    nm = NoiseModel.create(batch_size=6, lr=0.1, weight_decay=1e-3)
    want = nf.noether_flow(syms, ref, nm)
    for level in ("diag", "solve", "neuron"):
        stats = nf.collect_stats(model, syms, loss, x, y, level=level)
        for p in (model.word.weight, model.types.weight):
            assert torch.allclose(stats.mean[p], ref.mean[p], rtol=1e-12, atol=1e-15)
        got = nf.noether_flow(syms, stats, nm)
        for k in want:
            err = float((got[k] - want[k]).abs().max())
            assert err <= 1e-10 * float(want[k].abs().max()), (level, k)


def _hf_loss(out: Any, t: Tensor) -> Tensor:
    return (out.last_hidden_state - t).square().mean()


def test_deberta_v2_embed_proj_teleport_is_exact_and_zeroes_its_flow() -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, make = Z.MODELS["deberta-v2-rel"]()
    model = model.to(DT).eval()
    found = nf.find_symmetries(model, make(0))
    name = (
        "rotation:embeddings.word_embeddings+embeddings.position_embeddings→embeddings.embed_proj"
    )
    assert name in found.names, found.names
    syms = nf.SymmetrySet([s for s in found if s.family.value != "scale"])  # exact ones only
    ids = {"input_ids": torch.randint(0, Z.V, (8, 5), generator=torch.Generator().manual_seed(3))}
    y = torch.randn(8, 5, Z.H, dtype=DT, generator=torch.Generator().manual_seed(4))
    # the position table is read once for the whole batch: the reference estimator
    ref = nf.collect_stats(model, syms, _hf_loss, ids, y, estimator="reference")
    nm = NoiseModel.create(batch_size=4, lr=0.1, weight_decay=1e-3)
    before = float(nf.noether_flow(syms, ref, nm)[name].abs().max())
    sol = nf.solve_equilibrium(syms, ref, nm)
    with torch.no_grad():
        out = model(**make(5)).last_hidden_state
    nf.teleport(model, sol)
    with torch.no_grad():
        assert float((model(**make(5)).last_hidden_state - out).norm() / out.norm()) <= 1e-12
    after = nf.collect_stats(model, syms, _hf_loss, ids, y, estimator="reference")
    assert float(nf.noether_flow(syms, after, nm)[name].abs().max()) <= 1e-10 * before
