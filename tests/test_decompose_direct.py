"""The step decomposition's direct forms equal the polarisation forms they replace (issue 28).

``Symmetry.bilinear_of`` (one product per family) and decay = (k² − 1)C(θ) for one shrink k
replaced ¼[C(x + y) − C(x − y)] and C(kθ) − C(θ) in the recorder's every record. Pinned in
float64 for every family (diagonal, rotation, dense), with one and with two decay factors per
symmetry; and in float32 the new decay is the float64 one, where C(kθ) − C(θ) cancels.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.optim.decompose import StepDecomposition, StepRecorder
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.rotation import Block

DT = torch.float64


def _old_parts(
    s: Symmetry, before: dict[nn.Parameter, Tensor], after: dict[nn.Parameter, Tensor], k: dict
) -> StepDecomposition:
    """The decomposition as computed before the direct forms: polarisation, C(θ_d) − C(θ)."""
    d = {p: k[p] * before[p] for p in s.params}
    r = {p: after[p] - d[p] for p in s.params}
    plus = {p: d[p] + r[p] for p in s.params}
    minus = {p: d[p] - r[p] for p in s.params}
    c0 = s.charge_of(before)
    return StepDecomposition(
        before=c0,
        after=s.charge_of(after),
        decay=s.charge_of(d) - c0,
        drift=2 * (s.charge_of(plus) - s.charge_of(minus)) / 4,
        noise=s.charge_of(r),
    )


def _model_and_syms() -> tuple[nn.Sequential, nf.SymmetrySet]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 12), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3)).to(DT)
    heads = [
        nf.DoubleRotation.from_blocks(
            [Block(m[0].weight, 0, 6 * h, 6 * h + 6), Block(m[0].bias, 0, 6 * h, 6 * h + 6)],
            [Block(m[1].weight, 1, 6 * h, 6 * h + 6)],
            label=f"head{h}",
        )
        for h in range(2)
    ]
    a = torch.randn(9, 9, dtype=DT)
    dense = nf.DenseSymmetry([m[3].bias, m[1].bias], (a + a.T) / 2, label="dense")
    syms = nf.SymmetrySet([*heads, nf.Rescaling(m[1], m[3], label="r"), dense])
    return m, syms


def test_bilinear_of_equals_polarisation_for_every_family() -> None:
    m, syms = _model_and_syms()
    gen = torch.Generator().manual_seed(1)
    x = {p: torch.randn(p.shape, generator=gen, dtype=DT) for p in m.parameters()}
    y = {p: torch.randn(p.shape, generator=gen, dtype=DT) for p in m.parameters()}
    for name, s in syms.items():
        got = s.bilinear_of(x, y)
        want = Symmetry.bilinear_of(s, x, y)  # the polarisation default
        assert got.shape == s.charge_of(x).shape, name
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)
        torch.testing.assert_close(s.bilinear_of(x, x), s.charge_of(x), rtol=1e-12, atol=1e-12)


def test_recorder_parts_equal_the_polarisation_forms_in_float64() -> None:
    m, syms = _model_and_syms()
    # two groups: the rescaling r and the dense symmetry straddle both (two shrinks)
    opt = torch.optim.SGD(
        [
            {"params": [m[0].weight, m[0].bias, m[1].weight], "weight_decay": 0.1},
            {"params": [m[1].bias, *m[3].parameters()], "weight_decay": 0.02},
        ],
        lr=0.05,
        momentum=0.9,
    )
    k = {p: 1 - 0.05 * 0.1 for p in opt.param_groups[0]["params"]}
    k.update({p: 1 - 0.05 * 0.02 for p in opt.param_groups[1]["params"]})
    rec = StepRecorder(dict(syms.items()), opt)
    x, y = torch.randn(16, 5, dtype=DT), torch.randn(16, 3, dtype=DT)
    for _ in range(2):  # the second step has momentum: a drift
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        before = {p: p.detach().clone() for p in m.parameters()}
        rec.before_step()
        opt.step()
        got = rec.after_step()
    after = {p: p.detach() for p in m.parameters()}
    for name, s in syms.items():
        want = _old_parts(s, before, after, k)
        for part in ("before", "after", "decay", "drift", "noise"):
            g, w = getattr(got[name], part), getattr(want, part)
            scale = float(w.abs().max()) + float(want.after.abs().max()) * 1e-3
            assert float((g - w).abs().max()) <= 1e-12 * scale, (name, part)
        assert float(got[name].drift.abs().max()) > 0, name
        assert float(got[name].residual.abs().max()) < 1e-12


def test_float32_decay_is_the_float64_one() -> None:
    """k = 1 − 1e-6 (AdamW's ηλ): C(kθ) − C(θ) cancels in float32, (k² − 1)C(θ) does not."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 4))
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="r")])
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
    rec = StepRecorder(dict(syms.items()), opt)
    nn.functional.mse_loss(m(torch.randn(8, 6)), torch.randn(8, 4)).backward()
    before = {p: p.detach().to(DT) for p in m.parameters()}
    rec.before_step()
    opt.step()
    got = rec.after_step()["r"].decay.to(DT)
    s = syms["r"]
    k = 1 - 1e-4 * 0.01
    want = s.charge_of({p: k * v for p, v in before.items()}) - s.charge_of(before)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0.0)
