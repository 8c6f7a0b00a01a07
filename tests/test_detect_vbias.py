"""Biases stored apart from their layer (issue #26): ``self.v(x) + self.v_bias``.

DeBERTa adds ``q_bias``/``v_bias`` to a bias-free fused ``in_proj`` per head; BEiT-style
attention keeps them as parameters too. The V/O (and q·k) rotations must turn those biases
with the rows they are added to: W_V → G⁻¹W_V, b_V → G⁻¹b_V. Checked here in float64 apart
from the library's checker (outputs on unseen inputs, eval and train mode), against the
rotation written out by hand, and with the statistics against the torch.func reference.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.symmetry.rotation import DoubleRotation

DT = torch.float64


class _SplitBias(nn.Module):
    """q, k, v without bias; q_bias and v_bias added per head (DeBERTa's layout), dropout."""

    def __init__(self, d: int = 8, heads: int = 2, fused: bool = False) -> None:
        super().__init__()
        self.h, self.fused = heads, fused
        if fused:  # DeBERTa: in_proj, heads first, then q | k | v inside each head
            self.in_proj = nn.Linear(d, 3 * d, bias=False)
        else:
            self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.q_bias = nn.Parameter(torch.randn(d))
        self.v_bias = nn.Parameter(torch.randn(d))
        self.o = nn.Linear(d, d)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(d, 3)

    def split(self, t: Tensor) -> Tensor:
        return t.view(*t.shape[:-1], self.h, -1).permute(0, 2, 1, 3)

    def forward(self, x: Tensor) -> Tensor:
        if self.fused:
            q, k, v = self.split(self.in_proj(x)).chunk(3, dim=-1)
        else:
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        q = q + self.split(self.q_bias[None, None, :])
        v = v + self.split(self.v_bias[None, None, :])
        att = self.drop(torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1))
        y = (att @ v).permute(0, 2, 1, 3).flatten(2)
        return self.head(F.relu(self.o(y) + x))


def _outputs(model: nn.Module, x: Tensor, train: bool) -> Tensor:
    model.train(train)
    torch.manual_seed(3)
    with torch.no_grad():
        return model(x).clone()


@pytest.mark.parametrize("fused", [False, True])
def test_vo_and_qk_rotations_turn_the_separate_biases(fused: bool) -> None:
    torch.manual_seed(0)
    model = _SplitBias(fused=fused).to(DT)
    x = torch.randn(3, 5, 8, dtype=DT)
    syms = nf.find_symmetries(model, x)
    vo = [s for s in syms if "→o[" in s.label]
    qk = [s for s in syms if "·" in s.label]
    assert len(vo) == 2 and len(qk) == 2, syms.names
    for s in vo:
        assert any(p is model.v_bias for p in s.params), s.label
    for s in qk:
        assert any(p is model.q_bias for p in s.params), s.label
    assert syms.coverage(model)["v_bias"].symmetries
    unseen = torch.randn(4, 7, 8, dtype=DT, generator=torch.Generator().manual_seed(9))
    for train in (False, True):
        before = _outputs(model, unseen, train)
        start = copy.deepcopy(model.state_dict())
        gen = torch.Generator().manual_seed(1)
        for s in syms:
            s.apply_(s.random_element(1.0, gen))
        after = _outputs(model, unseen, train)
        assert float((after - before).norm() / before.norm()) <= 1e-12, train
        assert not torch.equal(model.v_bias, start["v_bias"])
        model.load_state_dict(start)


def test_the_bias_moves_like_the_value_rows_written_out() -> None:
    """Head 1 of V/O by hand: W_V rows, b_V entries by G⁻¹, W_O's columns by G."""
    torch.manual_seed(0)
    model = _SplitBias().to(DT)
    x = torch.randn(3, 5, 8, dtype=DT)
    sym = nf.find_symmetries(model, x)["rotation:v→o[h1]"]
    assert isinstance(sym, DoubleRotation)
    g = torch.linalg.matrix_exp(
        torch.randn(4, 4, dtype=DT, generator=torch.Generator().manual_seed(2)) * 0.3
    )
    wv, bv, wo = (
        model.v.weight.detach().clone(),
        model.v_bias.detach().clone(),
        model.o.weight.detach().clone(),
    )
    want_v, want_b, want_o = wv.clone(), bv.clone(), wo.clone()
    want_v[4:] = torch.linalg.solve(g, wv[4:])
    want_b[4:] = torch.linalg.solve(g, bv[4:])
    want_o[:, 4:] = wo[:, 4:] @ g
    sym.apply_(g)  # W-side blocks by G⁻¹, U-side blocks (O's columns) by Gᵀ
    assert torch.allclose(model.v_bias, want_b, atol=1e-12)
    assert torch.allclose(model.v.weight, want_v, atol=1e-12)
    assert torch.allclose(model.o.weight, want_o, atol=1e-12)
    assert torch.equal(model.v_bias[:4], bv[:4])  # head 0 untouched


def test_rescaling_across_a_separate_bias_is_refused_with_a_reason() -> None:
    """fc → + b → ReLU → fc2: the rescaling would have to scale b: not claimed, said why."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.fc2 = nn.Linear(4, 6, bias=False), nn.Linear(6, 2)
            self.b = nn.Parameter(torch.randn(6))

        def forward(self, x: Tensor) -> Tensor:
            return self.fc2(torch.relu(self.fc(x) + self.b))

    model = Net().to(DT)
    syms = nf.find_symmetries(model, torch.randn(8, 4, dtype=DT))
    assert len(syms) == 0
    why = " ".join(syms.coverage(model)["b"].reasons)
    assert "stored apart" in why, why


def test_charge_and_noether_identity_with_the_bias_against_torch_func() -> None:
    """Q = U_f U_fᵀ − W_f W_fᵀ with b_V a column of W_f; ∇L ⊥ the action's tangent.

    The tangent of W_f → (I + εB)⁻¹W_f, U_f → (I + εB)ᵀU_f is (−B W_f, Bᵀ U_f); an exact
    symmetry leaves L unchanged along it, so ⟨∇L, tangent⟩ = 0 (gradients by torch.func,
    float64). Leaving the bias out of the tangent breaks it: the bias must move.
    """
    torch.manual_seed(0)
    model = _SplitBias().to(DT).eval()
    x = torch.randn(3, 5, 8, dtype=DT)
    sym = nf.find_symmetries(model, x)["rotation:v→o[h0]"]
    wv, bv, wo = model.v.weight, model.v_bias, model.o.weight
    w_f = torch.cat([wv[:4], bv[:4, None]], 1).detach()
    u_f = wo[:, :4].T.detach()
    q_ref = u_f @ u_f.T - w_f @ w_f.T
    assert torch.allclose(sym.charge(), q_ref, atol=1e-12)

    params = {n: p.detach() for n, p in model.named_parameters()}
    y = torch.randn(3, 5, 3, dtype=DT)

    def loss(ps: dict[str, Tensor]) -> Tensor:
        return (torch.func.functional_call(model, ps, (x,)) - y).square().mean()

    g = torch.func.grad(loss)(params)
    b = torch.randn(4, 4, dtype=DT, generator=torch.Generator().manual_seed(4))
    d_wf, d_uf = -b @ w_f, b.T @ u_f
    with_bias = (
        (g["v.weight"][:4] * d_wf[:, :8]).sum()
        + (g["v_bias"][:4] * d_wf[:, 8]).sum()
        + (g["o.weight"][:, :4].T * d_uf).sum()
    )
    scale = float(g["v.weight"].norm() * d_wf.norm() + g["o.weight"].norm() * d_uf.norm())
    assert abs(float(with_bias)) <= 1e-12 * scale
    without = with_bias - (g["v_bias"][:4] * d_wf[:, 8]).sum()
    assert abs(float(without)) > 1e-4 * scale


def test_statistics_with_the_bias_reference_and_microbatch_agree_hooks_refuse() -> None:
    """The rotations' flows from torch.func per-sample gradients (``reference``) and from
    one-sample micro-batches (plain autograd) agree; the mean gradient of ``v_bias`` is the
    batch gradient; ``hooks`` cannot read a bias stored apart and says so, naming it."""
    torch.manual_seed(0)
    model = _SplitBias().to(DT).eval()
    x, y = torch.randn(6, 5, 8, dtype=DT), torch.randn(6, 5, 3, dtype=DT)
    syms = nf.find_symmetries(model, x)

    def loss(out: Tensor, t: Tensor) -> Tensor:
        return (out - t).square().mean()

    ref = nf.collect_stats(model, syms, loss, x, y, estimator="reference")
    mb = nf.collect_stats(model, syms, loss, x, y, estimator="microbatch", micro_batch_size=1)
    nm = nf.NoiseModel.create(batch_size=6, lr=0.1, weight_decay=1e-3)
    f_ref, f_mb = nf.noether_flow(syms, ref, nm), nf.noether_flow(syms, mb, nm)
    for name in syms.names:
        a, b = torch.as_tensor(f_ref[name]), torch.as_tensor(f_mb[name])
        assert float(a.norm()) > 1e-4, name
        assert float((a - b).norm()) <= 1e-12 * float(a.norm()), name
    params = {n: p.detach() for n, p in model.named_parameters()}
    g = torch.func.grad(lambda ps: loss(torch.func.functional_call(model, ps, (x,)), y))(params)
    assert torch.allclose(ref.mean[model.v_bias], g["v_bias"], rtol=1e-10, atol=1e-14)
    with pytest.raises(nf.UnsupportedLayerError, match="v_bias"):
        nf.collect_stats(model, syms, loss, x, y, estimator="hooks")
