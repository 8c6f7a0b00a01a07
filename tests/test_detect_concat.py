"""Concatenations: two layers' outputs joined by ``torch.cat`` into one reader (#26).

Detection follows one layer's features through a ``torch.cat`` with another layer's output
(the other part's entries are blank), so the reader sees them in a slice of its columns or
channels: a rescaling against that slice of the next layer's columns, a GL rotation of a
linear branch against its columns, the per-channel scale invariance before a BatchNorm or
InstanceNorm reading the joined channels (its running statistics scaled from the right
channel), GroupNorm groups covered by one branch. A LayerNorm over the joined features is not
invariant under one branch's scaling: refused with a reason. Checked here: each claim against
the transformation written out by hand on unseen inputs (float64, eval and train mode), the
symmetry's own action against that transformation, the hooks against torch.func, and the
teleport of the noise equilibrium (outputs unchanged).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64
TINY = torch.finfo(DT).tiny


class CatRelu(nn.Module):
    """a, b → cat → ReLU → c: each branch's neurons rescale against their columns of c."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 3), nn.Linear(4, 5), nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(F.relu(torch.cat([self.a(x), self.b(x)], dim=-1)))  # type: ignore[no-any-return]


class CatLinear(nn.Module):
    """a, b → cat → c, nothing between: GL(3) and GL(5) against c's column slices.

    c has 6 outputs: with fewer than a branch's width, part of its rotation equilibrium is at
    infinity (the output gradients do not span the branch).
    """

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 3), nn.Linear(4, 5), nn.Linear(8, 6)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(torch.cat([self.a(x), self.b(x)], dim=-1))  # type: ignore[no-any-return]


class CatNorm(nn.Module):
    """conv b (2 ch), conv a (4 ch) → cat → norm → ReLU → 1×1 conv → mean."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 2, 1)
        self.n, self.c = norm, nn.Conv2d(6, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.cat([self.b(x), self.a(x)], dim=1)
        return self.c(F.relu(self.n(h))).mean((2, 3))  # type: ignore[no-any-return]


class CatGroup(nn.Module):
    """conv a (4 ch), conv b (4 ch) → cat → GroupNorm(4 groups) → ReLU → conv."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)
        self.n, self.c = nn.GroupNorm(4, 8), nn.Conv2d(8, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.cat([self.a(x), self.b(x)], dim=1)
        return self.c(F.relu(self.n(h))).mean((2, 3))  # type: ignore[no-any-return]


class CatLayerNorm(nn.Module):
    """a, b → cat → LayerNorm → c: one branch alone is not scale invariant."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 5)
        self.ln, self.c = nn.LayerNorm(8), nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(F.relu(self.ln(torch.cat([self.a(x), self.b(x)], dim=-1))))  # type: ignore[no-any-return]


class CatResidual(nn.Module):
    """cat → ReLU → c, plus the cat itself: a residual sum, nothing to claim for a or b."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 3), nn.Linear(4, 5), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.cat([self.a(x), self.b(x)], dim=-1)
        return self.c(F.relu(h)) + h  # type: ignore[no-any-return]


def _dense_x(seed: int) -> Tensor:
    return torch.randn(6, 4, dtype=DT, generator=torch.Generator().manual_seed(seed))


def _image_x(seed: int) -> Tensor:
    return torch.randn(6, 3, 5, 5, dtype=DT, generator=torch.Generator().manual_seed(seed))


def _built(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    m = make().to(DT)
    with torch.no_grad():
        for s in range(3):  # running statistics away from their initial values
            m.train()(_image_x(20 + s) if isinstance(m, CatNorm | CatGroup) else _dense_x(20 + s))
    return m


def _out(m: nn.Module, x: Tensor, train: bool) -> Tensor:
    c = copy.deepcopy(m).train(train)  # a train forward moves running statistics
    with torch.no_grad():
        return c(x)  # type: ignore[no-any-return]


def _by_hand(m: nn.Module, edit: Callable[[nn.Module], None]) -> nn.Module:
    c = copy.deepcopy(m)
    with torch.no_grad():
        edit(c)
    return c


def _close(m1: nn.Module, m2: nn.Module, x: Tensor, train: bool, tol: float = 1e-11) -> bool:
    y1, y2 = _out(m1, x, train), _out(m2, x, train)
    return float((y1 - y2).norm() / y1.norm()) <= tol


def _names(syms: nf.SymmetrySet) -> list[str]:
    return list(syms.names)


@pytest.mark.parametrize("train", [True, False])
def test_rescaling_through_cat(train: bool) -> None:
    m = _built(CatRelu).train(train)
    syms = nf.find_symmetries(m, _dense_x(0))
    assert _names(syms) == ["rescaling:a→c", "rescaling:b→c"]
    lam_a = torch.randn(3, dtype=DT, generator=torch.Generator().manual_seed(1))
    lam_b = torch.randn(5, dtype=DT, generator=torch.Generator().manual_seed(2))

    def edit(c: nn.Module) -> None:
        c.a.weight.mul_(lam_a.exp()[:, None])
        c.a.bias.mul_(lam_a.exp())
        c.b.weight.mul_(lam_b.exp()[:, None])
        c.b.bias.mul_(lam_b.exp())
        c.c.weight[:, :3].mul_((-lam_a).exp())
        c.c.weight[:, 3:].mul_((-lam_b).exp())

    hand = _by_hand(m, edit)
    assert _close(m, hand, _dense_x(99), train)
    wrong = _by_hand(m, lambda c: c.c.weight[:, 3:].mul_(lam_a.exp().mean()))
    assert not _close(m, wrong, _dense_x(99), train, 1e-3)  # the check can fail
    acted = copy.deepcopy(m)
    moved = nf.find_symmetries(acted, _dense_x(0))
    moved["rescaling:a→c"].apply_(lam_a)
    moved["rescaling:b→c"].apply_(lam_b)
    for p, q in zip(acted.parameters(), hand.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-14, atol=0)


def test_rotation_through_cat() -> None:
    m = _built(CatLinear)
    syms = nf.find_symmetries(m, _dense_x(0))
    assert sorted(_names(syms)) == ["rotation:a→c[0:3]", "rotation:b→c[0:5]"]
    g = torch.linalg.matrix_exp(0.3 * torch.randn(3, 3, dtype=DT))

    def edit(c: nn.Module) -> None:  # a's outputs through G, c's columns through G⁻¹
        c.a.weight.copy_(g @ c.a.weight)
        c.a.bias.copy_(g @ c.a.bias)
        c.c.weight[:, :3] = c.c.weight[:, :3] @ torch.linalg.inv(g)

    hand = _by_hand(m, edit)
    assert _close(m, hand, _dense_x(99), True)
    cols = syms["rotation:b→c[0:5]"].covered_mask(m.c.weight)
    assert bool(cols[:, 3:].all()) and not bool(cols[:, :3].any())


@pytest.mark.parametrize(
    ("norm", "train"),
    [
        (lambda: nn.BatchNorm2d(6), True),
        (lambda: nn.InstanceNorm2d(6, affine=True), False),
        (lambda: nn.InstanceNorm2d(6, affine=True, track_running_stats=True), True),
    ],
)
def test_per_channel_scale_through_cat(norm: Callable[[], nn.Module], train: bool) -> None:
    m = _built(lambda: CatNorm(norm())).train(train)
    syms = nf.find_symmetries(m, _image_x(0))
    assert {"scale:a→n", "scale:b→n"} <= set(_names(syms))
    s_a = syms["scale:a→n"]
    assert s_a.num_generators == 4 and s_a.norm_start == 2  # a's channels come after b's
    lam = torch.randn(4, dtype=DT, generator=torch.Generator().manual_seed(3))

    def edit(c: nn.Module) -> None:
        c.a.weight.mul_(lam.exp()[:, None, None, None])
        c.a.bias.mul_(lam.exp())
        c.n.eps = TINY

    ref = _by_hand(m, lambda c: setattr(c.n, "eps", TINY))
    assert _close(ref, _by_hand(m, edit), _image_x(99), train)
    # the teleport's own action keeps the eval function through the running statistics of
    # channels 2…5 (BatchNorm, tracked InstanceNorm), eps included
    acted = copy.deepcopy(m)
    nf.find_symmetries(acted, _image_x(0))["scale:a→n"].apply_(lam)
    if getattr(m.n, "running_var", None) is not None:
        assert _close(m, acted, _image_x(99), False, 1e-12)
        torch.testing.assert_close(acted.n.running_var[:2], m.n.running_var[:2], rtol=0, atol=0)


def test_group_norm_groups_of_one_branch() -> None:
    m = _built(CatGroup)
    syms = nf.find_symmetries(m, _image_x(0))
    s_b = syms["scale:b→n"]
    assert s_b.num_generators == 2  # b's 4 channels are GroupNorm's groups 2 and 3
    lam = torch.randn(2, dtype=DT, generator=torch.Generator().manual_seed(4))

    def edit(c: nn.Module) -> None:
        c.b.weight.mul_(lam.exp().repeat_interleave(2)[:, None, None, None])
        c.b.bias.mul_(lam.exp().repeat_interleave(2))
        c.n.eps = TINY

    ref = _by_hand(m, lambda c: setattr(c.n, "eps", TINY))
    assert _close(ref, _by_hand(m, edit), _image_x(99), True)


def test_layer_norm_and_residual_refused() -> None:
    m = _built(CatLayerNorm)
    syms = nf.find_symmetries(m, _dense_x(0))
    assert not [n for n in _names(syms) if n.startswith("scale:")]
    why = " ".join(syms.coverage(m)["a.weight"].reasons)
    assert "normalised together with another layer" in why
    m = _built(CatResidual)
    syms = nf.find_symmetries(m, _dense_x(0))
    assert not [n for n in _names(syms) if "a→" in n or "b→" in n]


@pytest.mark.parametrize("make", [CatRelu, CatLinear, lambda: CatNorm(nn.InstanceNorm2d(6))])
def test_hooks_and_teleport(make: Callable[[], nn.Module]) -> None:
    m = _built(make).eval()
    image = isinstance(m, CatNorm)
    x = _image_x(1) if image else _dense_x(1)
    y = torch.randn(6, m.c.out_channels if image else m.c.out_features, dtype=DT)
    loss = nn.MSELoss()
    syms = nf.find_symmetries(m, x)
    hooks = nf.collect_stats(m, syms, loss, x, y)
    ref = nf.collect_stats(m, syms, loss, x, y, estimator="reference")
    fh = nf.noether_flow(syms, hooks, lr=0.1, batch_size=6)
    fr = nf.noether_flow(syms, ref, lr=0.1, batch_size=6)
    for k in fr:
        scale = float(torch.as_tensor(fr[k]).abs().max())
        assert float((torch.as_tensor(fh[k]) - torch.as_tensor(fr[k])).abs().max()) <= 1e-10 * scale
    probe = _image_x(7) if image else _dense_x(7)
    before = _out(m, probe, False)
    if image:  # the scale invariance: within the norm's eps
        sol, _ = nf.solve_within_eps(
            m, syms, hooks, x, lr=0.1, batch_size=6, weight_decay=0.01, tolerance=1e-7
        )
    else:
        sol = nf.solve_equilibrium(syms, hooks, lr=0.1, batch_size=6, weight_decay=0.01)
    nf.teleport(m, sol)
    after = _out(m, probe, False)
    assert float((after - before).norm() / before.norm()) <= (2e-7 if image else 1e-10)
    assert sol.converged and not sol.at_infinity and max(sol.residual.values()) <= 1e-10
    if not image:  # exact transport: no flow left at the equilibrium
        st = nf.collect_stats(m, syms, loss, x, y)
        flows = nf.noether_flow(syms, st, lr=0.1, batch_size=6, weight_decay=0.01)
        for k, v in flows.items():
            assert float(torch.as_tensor(v).abs().max()) <= 1e-8, k
