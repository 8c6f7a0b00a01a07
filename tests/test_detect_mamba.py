"""Mamba's two per-block symmetries: B/C per-state rescaling and GL(time_step_rank) (issue 26).

A selective scan ``h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t u_t``, ``y_t = h_t · C_t`` with
``(Δ, B, C) = split(x_proj(u))`` and ``Δ = dt_proj.weight @ Δ_raw`` keeps its output under

* B rows of ``x_proj`` × e^{λ_n}, C rows × e^{−λ_n} (a ``DiagonalTerm`` over a slice of rows);
* x_proj's Δ rows → G⁻¹·, ``dt_proj.weight`` → ·G (a rotation on a row slice).

Checked on a float64 toy scan written here (exact to round-off) and on Hugging Face's
``MambaModel`` (its scan casts B and u to float32: the statistics agree with the reference
to float32 round-off there). Every claim is checked by an independent float64 change on
unseen inputs, eval and train; the statistics against the torch.func reference; flows, the
solver and a teleport on the claimed set.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.kernels.diagonal import diagonal_block
from noetherflow.symmetry.base import DiagonalTerm
from noetherflow.symmetry.channel import ChannelRescaling
from noetherflow.symmetry.detect import symmetry_signature

sys.path.insert(0, str(Path(__file__).parent))
import hf_zoo as Z

DT = torch.float64


class ToyScan(nn.Module):
    """Mamba's mixer in plain float64 (no casts): in_proj, conv, SiLU, x_proj, dt, scan, out."""

    def __init__(self, d: int = 6, inner: int = 8, state: int = 3, rank: int = 2) -> None:
        super().__init__()
        self.r, self.n = rank, state
        self.in_proj = nn.Linear(d, 2 * inner)
        self.conv = nn.Conv1d(inner, inner, 3, groups=inner, padding=2)
        self.x_proj = nn.Linear(inner, rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(rank, inner)
        self.A_log = nn.Parameter(torch.rand(inner, state))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, d)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        u, z = self.in_proj(x).transpose(1, 2).chunk(2, dim=1)
        u = F.silu(self.conv(u)[..., :t]).transpose(1, 2)  # [N, T, inner]
        delta, b, c = torch.split(self.x_proj(u), [self.r, self.n, self.n], dim=-1)
        dt = F.softplus(self.dt_proj.weight @ delta.transpose(1, 2) + self.dt_proj.bias[:, None])
        a = -torch.exp(self.A_log)
        h = torch.zeros(x.shape[0], u.shape[-1], self.n, dtype=x.dtype)
        ys = []
        for i in range(t):
            da = torch.exp(a[None] * dt[:, :, i, None])
            h = da * h + dt[:, :, i, None] * b[:, None, i, :] * u[:, i, :, None]
            ys.append((h @ c[:, i, :, None])[..., 0])
        y = torch.stack(ys, dim=1) + u * self.D
        return self.out_proj(y * F.silu(z.transpose(1, 2)))


def _change(model: nn.Module, sym: nf.Symmetry, x: Tensor, seed: int) -> float:
    """Relative output change under a random element (written apart from the library)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        before = model(x)
        sym.apply_(sym.random_element(0.7, torch.Generator().manual_seed(seed)))
        after = model(x)
    model.load_state_dict(state)
    return float((after - before).norm() / before.norm())


def _loss(out: Tensor, y: Tensor) -> Tensor:
    return ((out - y) ** 2).mean()


def _toy() -> ToyScan:
    torch.manual_seed(0)
    return ToyScan().to(DT)


@pytest.mark.parametrize("train", [False, True])
def test_toy_scan_detection_counts_and_independent_check(train: bool) -> None:
    model = _toy().train(train)
    syms = nf.find_symmetries(model, torch.randn(3, 5, 6, dtype=DT))
    assert sorted(syms.names) == [
        "rescaling:x_proj[2:5]↔[5:8]",
        "rotation:x_proj[0:2]→dt_proj.weight",
    ]
    assert all(r.verified for r in syms.verification.values())
    unseen = torch.randn(4, 7, 6, dtype=DT, generator=torch.Generator().manual_seed(5))
    for k, s in enumerate(syms):
        assert _change(model, s, unseen, k) < 1e-12, s.label
    # a generic move of the same rows does change the output (the check is not vacuous)
    w = model.x_proj.weight
    with torch.no_grad():
        saved = w.clone()
        w[2:5] *= 1.5
        moved = _change_by_hand(model, unseen, saved)
    assert moved > 1e-3


def _change_by_hand(model: nn.Module, x: Tensor, saved: Tensor) -> float:
    with torch.no_grad():
        after = model(x)
        model.x_proj.weight.copy_(saved)
        before = model(x)
    return float((after - before).norm() / before.norm())


def test_sliced_terms_act_on_their_slices_only() -> None:
    model = _toy()
    w = model.x_proj.weight
    sym = ChannelRescaling(
        [DiagonalTerm(w, 0, 1, 1.0, start=2, length=3)],
        [DiagonalTerm(w, 0, 1, -1.0, start=5, length=3)],
    )
    assert sym.params == [w] and sym.num_generators == 3
    mask = sym.covered_mask(w)
    assert not mask[:2].any() and mask[2:].all()
    lam = torch.tensor([0.3, -0.2, 0.5], dtype=DT)
    before = w.detach().clone()
    sym.apply_(lam)
    assert torch.equal(w[:2], before[:2])
    torch.testing.assert_close(w[2:5], before[2:5] * lam.exp()[:, None], rtol=1e-15, atol=0)
    torch.testing.assert_close(w[5:], before[5:] * (-lam).exp()[:, None], rtol=1e-15, atol=0)
    charge = sym.charge()
    want = (
        before[2:5].square().sum(1) * (2 * lam).exp()
        - before[5:].square().sum(1) * (-2 * lam).exp()
    )
    torch.testing.assert_close(charge, want, rtol=1e-13, atol=1e-15)
    with pytest.raises(nf.SymmetryDefinitionError, match="overlapping slices"):
        ChannelRescaling(
            [DiagonalTerm(w, 0, 1, 1.0, start=2, length=3)],
            [DiagonalTerm(w, 0, 1, -1.0, start=4, length=3)],
        )
    with pytest.raises(nf.SymmetryDefinitionError, match="non-empty slice inside the axis"):
        DiagonalTerm(w, 0, 1, 1.0, start=6, length=3)


@pytest.mark.parametrize("level", ["diag", "solve", "neuron"])
def test_toy_scan_stats_flows_solve_teleport(level: str) -> None:
    model = _toy()
    x = torch.randn(6, 5, 6, dtype=DT, generator=torch.Generator().manual_seed(1))
    y = torch.randn(6, 5, 6, dtype=DT, generator=torch.Generator().manual_seed(2))
    syms = nf.find_symmetries(model, x)
    diag = nf.SymmetrySet([s for s in syms if s.family == nf.Family.RESCALING])
    # the hooks (x_proj and in_proj are called as modules) against torch.func, per coordinate
    hooks = nf.collect_stats(model, diag, _loss, x, y, estimator="hooks", level=level)
    ref = nf.collect_stats(model, diag, _loss, x, y, estimator="reference", level=level)
    noise = nf.NoiseModel.create(lr=0.1, batch_size=6, weight_decay=1e-3)
    fh, fr = nf.noether_flow(diag, hooks, noise), nf.noether_flow(diag, ref, noise)
    for name in fr:
        torch.testing.assert_close(fh[name], fr[name], rtol=1e-10, atol=1e-18)
    if level == "neuron":
        return  # flows only: the solver needs level='solve' or 'diag'
    bh, br = diagonal_block(hooks), diagonal_block(ref)
    for p in diag.params():
        torch.testing.assert_close(bh.axis_sq(p, 0), br.axis_sq(p, 0), rtol=1e-10, atol=1e-18)
        if p in bh.sq:
            torch.testing.assert_close(bh.sq[p], br.sq[p], rtol=1e-10, atol=1e-18)
    # the whole set: dt_proj.weight is applied by a matmul in the model's forward, where the
    # hooks read it (detection's matmul_reads); both sides of the rotation against torch.func
    assert list(syms.detection.matmul_reads.values()) == [""]  # type: ignore[union-attr]
    full = nf.collect_stats(model, syms, _loss, x, y, estimator="reference")
    fhooks = nf.collect_stats(model, syms, _loss, x, y, estimator="hooks", level=level)
    rh, rr = fhooks.blocks["rotation"], full.blocks["rotation"]
    for s_ in syms:
        if s_.family == nf.Family.ROTATION:
            for a, b in zip(rh.side[s_], rr.side[s_], strict=True):  # type: ignore[attr-defined]
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * float(b.abs().max()))
    before_flow = nf.noether_flow(syms, full, noise)
    hooks_flow = nf.noether_flow(syms, fhooks, noise)
    for name in before_flow:
        torch.testing.assert_close(hooks_flow[name], before_flow[name], rtol=1e-10, atol=1e-18)
    sol = nf.solve_equilibrium(syms, full, noise)
    with torch.no_grad():
        out0 = model(x)
    nf.teleport(model, sol)
    with torch.no_grad():
        out1 = model(x)
    assert float((out1 - out0).norm() / out0.norm()) < 1e-12
    after = nf.noether_flow(
        syms, nf.collect_stats(model, syms, _loss, x, y, estimator="reference"), noise
    )
    for name in before_flow:
        b, a = before_flow[name].norm(), after[name].norm()
        assert float(a) < 1e-8 * float(b) + 1e-16, (name, float(b), float(a))


def _hf_mamba(train: bool) -> tuple[nn.Module, object]:
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, make = Z.MODELS["mamba"]()
    return model.to(DT).train(train), make


@pytest.mark.parametrize("train", [False, True])
def test_hf_mamba_found_and_hold_on_unseen_inputs(train: bool) -> None:
    model, make = _hf_mamba(train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        syms = nf.find_symmetries(model, make(0))  # type: ignore[operator]
    assert sorted(syms.names) == [
        "rescaling:layers.0.mixer.x_proj[4:8]↔[8:12]",
        "rescaling:layers.0.norm→layers.0.mixer.in_proj",
        "rotation:layers.0.mixer.x_proj[0:4]→layers.0.mixer.dt_proj.weight",
    ]
    assert all(r.verified for r in syms.verification.values())
    for s in syms:
        worst = max(Z.independent_change(model, s, make(k), train, False) for k in (1, 2))  # type: ignore[operator]
        assert worst <= 1e-10, (s.label, worst)
    names = {id(p): n for n, p in model.named_parameters()}
    sig = symmetry_signature(next(s for s in syms if "↔" in s.label), names)
    assert sig == (
        "rescaling",
        (("layers.0.mixer.x_proj.weight", 0, 1, (4, 4)),),
        (("layers.0.mixer.x_proj.weight", 0, 1, (8, 4)),),
    )


def test_hf_mamba_stats_solve_teleport() -> None:
    model, _ = _hf_mamba(False)
    ids = torch.randint(0, Z.V, (6, 5), generator=torch.Generator().manual_seed(3))
    y = torch.randn(6, 5, Z.H, dtype=DT, generator=torch.Generator().manual_seed(4))

    def loss(out: object, y: Tensor) -> Tensor:
        return ((out.last_hidden_state - y) ** 2).mean()  # type: ignore[attr-defined]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        syms = nf.find_symmetries(model, {"input_ids": ids[:2]})
    assert list(syms.detection.matmul_reads.values()) == ["layers.0.mixer"]  # type: ignore[union-attr]
    hooks = nf.collect_stats(model, syms, loss, ids, y, estimator="hooks")
    full = nf.collect_stats(model, syms, loss, ids, y, estimator="reference")
    bh, br = diagonal_block(hooks), diagonal_block(full)
    # the scan casts B and u to float32: the gradients behind it carry float32 round-off
    for p, v in br.sq.items():
        torch.testing.assert_close(bh.sq[p], v, rtol=1e-5, atol=1e-12 * float(v.abs().max()))
    rot = next(s for s in syms if s.family == nf.Family.ROTATION)
    for a, b in zip(
        hooks.blocks["rotation"].side[rot], full.blocks["rotation"].side[rot], strict=True
    ):  # type: ignore[attr-defined]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-12 * float(b.abs().max()))
    noise = nf.NoiseModel.create(lr=0.1, batch_size=6, weight_decay=1e-3)
    before = nf.noether_flow(syms, full, noise)
    sol = nf.solve_equilibrium(syms, full, noise)
    with torch.no_grad():
        out0 = model(input_ids=ids).last_hidden_state
    nf.teleport(model, sol)
    with torch.no_grad():
        out1 = model(input_ids=ids).last_hidden_state
    assert float((out1 - out0).norm() / out0.norm()) < 1e-10
    after = nf.noether_flow(
        syms, nf.collect_stats(model, syms, loss, ids, y, estimator="reference"), noise
    )
    for name in before:
        assert float(after[name].norm()) < 1e-6 * float(before[name].norm()), name


def test_hand_built_rotation_on_a_matmul_read_weight_refuses_the_hooks() -> None:
    """Without detection's matmul_reads the hooks cannot see dt_proj: a clear refusal."""
    model = _toy()
    x = torch.randn(4, 5, 6, dtype=DT)
    found = nf.find_symmetries(model, x)
    rot = next(s for s in found if s.family == nf.Family.ROTATION)
    by_hand = nf.SymmetrySet([rot])
    with pytest.raises(nf.UnsupportedLayerError, match="never ran their forward"):
        nf.collect_stats(model, by_hand, _loss, x, torch.randn(4, 5, 6, dtype=DT))


def test_hf_mamba_causal_lm_two_blocks() -> None:
    """MambaForCausalLM, two blocks: three symmetries per block, the hooks on all of them."""
    t = pytest.importorskip("transformers")
    cfg = t.MambaConfig(
        num_hidden_layers=2,
        hidden_size=16,
        vocab_size=32,
        state_size=4,
        expand=2,
        conv_kernel=4,
        time_step_rank=4,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = t.MambaForCausalLM(cfg).to(DT)
    ids = torch.randint(0, 32, (4, 5), generator=torch.Generator().manual_seed(6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        syms = nf.find_symmetries(model, ids[:2])
    assert len(syms) == 6 and all(r.verified for r in syms.verification.values())
    for block in (0, 1):
        pre = f"backbone.layers.{block}.mixer"
        assert f"rescaling:{pre}.x_proj[4:8]↔[8:12]" in syms.names
        assert f"rotation:{pre}.x_proj[0:4]→{pre}.dt_proj.weight" in syms.names

    def loss(out: object, y: Tensor) -> Tensor:
        logits = out.logits  # type: ignore[attr-defined]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    y = torch.randint(0, 32, (4, 5), generator=torch.Generator().manual_seed(7))
    noise = nf.NoiseModel.create(lr=0.1, batch_size=4, weight_decay=1e-3)
    hooks = nf.noether_flow(syms, nf.collect_stats(model, syms, loss, ids, y), noise)
    ref = nf.noether_flow(
        syms, nf.collect_stats(model, syms, loss, ids, y, estimator="reference"), noise
    )
    for name in ref:  # float32 casts in the scan: agreement to their round-off
        torch.testing.assert_close(hooks[name], ref[name], rtol=1e-5, atol=1e-12)
