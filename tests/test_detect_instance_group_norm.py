"""InstanceNorm and GroupNorm: scale invariance per channel or group, and their affines (#26).

An InstanceNorm normalises each sample's channel over its positions, so every output channel
of the convolution feeding it (its weight row and bias) can be scaled on its own; a GroupNorm
normalises each sample's group of C/G channels, so each group of rows can. With
``track_running_stats`` an InstanceNorm uses running statistics in eval mode: the invariance
then holds in training mode only (as BatchNorm's), and the teleport scales the running
statistics so the eval function is kept. The affines (γ, β) rescale against the next
convolution through ReLU. Checked here: what is claimed (generators, the rows they act on),
every claim against an independent float64 check on inputs detection has not seen (eval and
train mode, eps → 0 for the scale invariances), the hooks' per-sample gradients against
``torch.func`` (the reference loops where vmap refuses the running-statistics update), the
eps-safe intervals per channel/group, the teleport within eps, and bad ``groups``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow._errors import SymmetryDefinitionError
from noetherflow.symmetry.eps import eps_bounds

DT = torch.float64


def _model(norm: nn.Module) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        norm,
        nn.ReLU(),
        nn.Conv2d(8, 4, 3),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 2),
    ).to(DT)


def _x(seed: int, n: int = 6) -> Tensor:
    return torch.randn(n, 3, 8, 8, dtype=DT, generator=torch.Generator().manual_seed(seed))


def _loss(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y)


NORMS = {
    "group": lambda: nn.GroupNorm(2, 8),
    "group4": lambda: nn.GroupNorm(4, 8, affine=False),
    "instance": lambda: nn.InstanceNorm2d(8, affine=True),
    "instance_plain": lambda: nn.InstanceNorm2d(8),
    "instance_tracked": lambda: nn.InstanceNorm2d(8, affine=True, track_running_stats=True),
}


def _built(kind: str, train: bool) -> nn.Sequential:
    m = _model(NORMS[kind]())
    m.train()
    with torch.no_grad():
        for s in range(3):  # running statistics away from their initial values
            m(_x(10 + s))
    return m.train(train)


def _manual_scale(m: nn.Sequential, scale: Tensor) -> nn.Sequential:
    """An independent copy whose conv rows are scaled by ``scale[c]`` (eps → 0 everywhere)."""
    c = copy.deepcopy(m)
    with torch.no_grad():
        c[0].weight.mul_(scale.view(-1, 1, 1, 1))
        c[0].bias.mul_(scale)
    c[1].eps = torch.finfo(DT).tiny
    return c


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kind", list(NORMS))
def test_claims_and_independent_check(kind: str, train: bool) -> None:
    m = _built(kind, train)
    syms = nf.find_symmetries(m, _x(0))
    scale = [s for n, s in syms.items() if n.startswith("scale:0")]
    norm = m[1]
    tracked_eval = kind == "instance_tracked" and not train
    if tracked_eval:
        assert scale == []  # running statistics: not scale invariant
        why = " ".join(syms.coverage(m)["0.weight"].reasons)
        assert "running statistics" in why and "InstanceNorm2d" in why
        return
    assert len(scale) == 1
    sym = scale[0]
    groups = norm.num_groups if isinstance(norm, nn.GroupNorm) else 8
    assert sym.num_generators == groups
    # independent: scale each group of rows by its own factor, compare on unseen inputs
    lam = torch.randn(groups, dtype=DT, generator=torch.Generator().manual_seed(3))
    per_row = torch.exp(lam).repeat_interleave(8 // groups)
    x = _x(99)
    ref = copy.deepcopy(m)
    ref[1].eps = torch.finfo(DT).tiny
    moved = _manual_scale(m, per_row)
    with torch.no_grad():
        y0, y1 = ref(x), moved(x)
    assert torch.allclose(y0, y1, rtol=1e-11, atol=1e-12)
    # the symmetry's own action is that scaling (rows of group g by e^{λ_g})
    w0 = m[0].weight.detach().clone()
    sym.apply_(lam)
    torch.testing.assert_close(m[0].weight.detach(), moved[0].weight, rtol=1e-14, atol=0)
    sym.apply_(-lam)
    torch.testing.assert_close(m[0].weight.detach(), w0, rtol=1e-14, atol=0)
    # a generic perturbation of the same size is seen (the check above can fail)
    generic = _manual_scale(m, torch.exp(torch.randn(8, dtype=DT)))
    if groups < 8:
        with torch.no_grad():
            assert (generic(x) - y0).abs().max() > 1e-3
    rescale = [n for n in syms.names if n.startswith("rescaling:1")]
    assert bool(rescale) == (norm.weight is not None)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("kind", ["group", "instance", "instance_tracked"])
def test_hooks_match_torch_func(kind: str, train: bool) -> None:
    m = _built(kind, train)
    x, y = _x(1), torch.randint(0, 2, (6,), generator=torch.Generator().manual_seed(2))
    syms = nf.find_symmetries(m, x)
    buffers = [b.clone() for b in m.buffers()]
    hooks = nf.collect_stats(m, syms, _loss, x, y, estimator="hooks")
    ref = nf.collect_stats(m, syms, _loss, x, y, estimator="reference")
    for b, b0 in zip(m.buffers(), buffers, strict=True):
        assert torch.equal(b, b0)  # the hooks' recomputation updates no running statistics
    assert set(hooks.mean) == set(ref.mean) == set(syms.params())
    sq_h = hooks.blocks["diagonal"].sq  # type: ignore[attr-defined]
    sq_r = ref.blocks["diagonal"].sq  # type: ignore[attr-defined]
    for p in syms.params():
        torch.testing.assert_close(hooks.mean[p], ref.mean[p], rtol=1e-11, atol=1e-14)
        torch.testing.assert_close(sq_h[p], sq_r[p], rtol=1e-11, atol=1e-16)
    fr = nf.noether_flow(syms, ref, lr=0.1, batch_size=6)
    for level in ("diag", "solve", "neuron"):
        st = nf.collect_stats(m, syms, _loss, x, y, level=level)
        fh = nf.noether_flow(syms, st, lr=0.1, batch_size=6)
        for k in fr:
            scale = float(torch.as_tensor(fr[k]).abs().max())
            diff = float((torch.as_tensor(fh[k]) - torch.as_tensor(fr[k])).abs().max())
            assert diff <= 1e-10 * scale, (level, k)


def test_eps_bounds_per_group_and_channel() -> None:
    for kind, g in (("group", 2), ("instance", 8)):
        m = _built(kind, True)
        syms = nf.find_symmetries(m, _x(0))
        i = next(k for k, n in enumerate(syms.names) if n.startswith("scale:0"))
        lo, hi = eps_bounds(m, syms, _x(0), tolerance=1e-6)[i]
        assert lo.shape == hi.shape == (g,)
        assert bool((lo < 0).all()) and bool((hi > 0).all())


@pytest.mark.parametrize("kind", ["group", "instance", "instance_tracked"])
def test_teleport_within_eps_keeps_the_function(kind: str) -> None:
    m = _built(kind, True)
    x, y = _x(1), torch.randint(0, 2, (6,), generator=torch.Generator().manual_seed(2))
    syms = nf.find_symmetries(m, x)
    st = nf.collect_stats(m, syms, _loss, x, y)
    tol = 1e-6
    sol, rep = nf.solve_within_eps(
        m, syms, st, x, lr=0.1, batch_size=6, weight_decay=0.01, tolerance=tol
    )

    def outs(model: nn.Module) -> dict[bool, Tensor]:
        o = {}
        for train in (True, False):
            c = copy.deepcopy(model).train(train)  # a train forward moves running statistics
            with torch.no_grad():
                o[train] = c(_x(5))
        return o

    before = outs(m)
    nf.teleport(m, sol)
    after = outs(m)
    for train in (True, False):
        change = (after[train] - before[train]).norm() / before[train].norm()
        assert float(change) <= 2 * tol
    assert max(rep.change_train, rep.change_eval) <= tol


def test_bad_groups() -> None:
    conv = nn.Conv2d(3, 8, 3)
    with pytest.raises(SymmetryDefinitionError, match="groups=3 for 8 channels"):
        nf.ScaleInvariance([conv.weight, conv.bias], groups=3)
    with pytest.raises(SymmetryDefinitionError, match="one of them"):
        nf.ScaleInvariance([conv.weight], per_channel=True, groups=2)
    s = nf.ScaleInvariance([conv.weight, conv.bias], groups=4)
    assert s.num_generators == 4 and "4 groups" in s.describe()
