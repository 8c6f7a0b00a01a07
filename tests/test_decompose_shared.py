"""StepRecorder shares θ_d = kθ and θ' − θ_d across symmetries of one parameter (issue 28).

A fused projection is acted on by tens of symmetries; the recorder snapshots and splits each
parameter once. Pinned: every symmetry's parts equal :func:`decompose_step` on its own,
bit for bit, with several symmetries sharing parameters and two decay factors.
"""

from __future__ import annotations

import torch
from torch import nn

import noetherflow as nf
from noetherflow.optim.decompose import StepRecorder, decompose_step
from noetherflow.symmetry.rotation import Block


def test_recorder_parts_equal_decompose_step_per_symmetry() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 12), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    heads = [
        nf.DoubleRotation.from_blocks(
            [Block(m[0].weight, 0, 6 * h, 6 * h + 6), Block(m[0].bias, 0, 6 * h, 6 * h + 6)],
            [Block(m[1].weight, 1, 6 * h, 6 * h + 6)],
            label=f"head{h}",
        )
        for h in range(2)
    ]
    syms = nf.SymmetrySet([*heads, nf.Rescaling(m[1], m[3], label="r")])
    opt = torch.optim.SGD(
        [
            {"params": [m[0].weight, m[0].bias], "weight_decay": 0.1},
            {"params": [*m[1].parameters(), *m[3].parameters()], "weight_decay": 0.02},
        ],
        lr=0.05,
        momentum=0.9,
    )
    rec = StepRecorder(dict(syms.items()), opt)
    x, y = torch.randn(16, 5, dtype=torch.float64), torch.randn(16, 3, dtype=torch.float64)
    nn.functional.mse_loss(m(x), y).backward()
    before = {p: p.detach().clone() for p in m.parameters()}
    rec.before_step()
    opt.step()
    got = rec.after_step()
    k = {m[0].weight: 1 - 0.05 * 0.1, m[0].bias: 1 - 0.05 * 0.1}
    for p in [*m[1].parameters(), *m[3].parameters()]:
        k[p] = 1 - 0.05 * 0.02
    after = {p: p.detach() for p in m.parameters()}
    for name, s in syms.items():
        want = decompose_step(s, before, after, {p: k[p] for p in s.params})
        for part in ("before", "after", "decay", "drift", "noise"):
            assert torch.equal(getattr(got[name], part), getattr(want, part)), (name, part)
        assert float(got[name].residual.abs().max()) < 1e-12
        assert float(got[name].noise.abs().max()) > 0
