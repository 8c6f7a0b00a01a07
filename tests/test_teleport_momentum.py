"""The SGD momentum buffer under a teleport: a cotangent, and what that buys (issue #18).

After θ → Tθ (a symmetry: ℓ(Tθ) = ℓ(θ), so ∇ℓ(Tθ) = T^{-T}∇ℓ(θ)) the SGD-momentum trajectory
is equivariant, θ_t ↦ Tθ_t, exactly when T is orthogonal (then T^{-T} = T and the
cotangent and tangent transports coincide). For a non-orthogonal T (a rescaling) no
transport of the buffer makes it equivariant: even plain SGD gives Tθ − ηT^{-T}∇ℓ(θ) ≠
T(θ − η∇ℓ(θ)). float64 throughout.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.equilibrium import EquilibriumSolution

DT = torch.float64


def _setup(beta: float, nesterov: bool) -> tuple[nn.Sequential, torch.optim.SGD, list]:
    """A ReLU MLP whose last two linears carry a double rotation, after 4 SGD-momentum steps
    (so the buffer is not zero); and 8 fixed minibatches for the trajectories."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 3)).to(DT)
    x, y = torch.randn(64, 5, dtype=DT), torch.randn(64, 3, dtype=DT)
    batches = [torch.randint(0, 64, (8,)) for _ in range(12)]
    opt = torch.optim.SGD(
        m.parameters(), lr=0.05, momentum=beta, nesterov=nesterov, weight_decay=0.02
    )
    for idx in batches[:4]:
        opt.zero_grad()
        F.mse_loss(m(x[idx]), y[idx]).backward()
        opt.step()
    return m, opt, [(x[i], y[i]) for i in batches[4:]]


def _clone(m: nn.Module, opt: torch.optim.SGD) -> tuple[nn.Module, torch.optim.SGD]:
    m2 = copy.deepcopy(m)
    opt2 = torch.optim.SGD(m2.parameters(), **{k: v for k, v in opt.defaults.items()})
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict may alias buffers
    return m2, opt2


def _losses(m: nn.Module, opt: torch.optim.SGD, batches: list) -> torch.Tensor:
    out = []
    for xb, yb in batches:
        opt.zero_grad()
        loss = F.mse_loss(m(xb), yb)
        loss.backward()
        opt.step()
        out.append(loss.detach())
    return torch.stack(out)


def _move(m: nn.Module, opt: torch.optim.SGD, make_sym, element, *, buffer: str) -> nf.SymmetrySet:
    """Apply ``element`` to ``m`` as a teleport; the buffer: "cotangent" (the library's
    ``transform_optimizer_state``), "tangent" (moved like θ) or "none" (left as it was)."""
    syms = nf.SymmetrySet([make_sym(m)])
    sol = EquilibriumSolution(syms=syms, steps=[(0, element)], elements={}, distance={})
    nf.teleport(sol)
    if buffer == "cotangent":
        assert nf.transform_optimizer_state(opt, sol) == []
    elif buffer == "tangent":
        bufs = {p: opt.state[p]["momentum_buffer"] for p in syms.params()}
        syms[0].act_(element, bufs)
    return syms


def _rotation(m: nn.Sequential) -> nf.Symmetry:
    return nf.DoubleRotation(m[2], m[3])


def _rescaling(m: nn.Sequential) -> nf.Symmetry:
    return nf.Rescaling(m[0], m[2])


@pytest.mark.parametrize("nesterov", [False, True])
def test_orthogonal_teleport_keeps_the_sgd_momentum_trajectory(nesterov: bool) -> None:
    """An orthogonal G of the double rotation, applied by ``nf.teleport`` with the buffer
    moved by ``nf.transform_optimizer_state``: 8 further steps give the same losses to
    round-off and parameters G·(old ones); moving the buffer like θ does too (G^{-T} = G),
    leaving it unmoved does not."""
    m, opt, batches = _setup(0.9, nesterov)
    gen = torch.Generator().manual_seed(1)
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=gen, dtype=DT))
    ref_m, ref_opt = _clone(m, opt)
    stale_m, stale_opt = _clone(m, opt)
    ref = _losses(ref_m, ref_opt, batches)
    syms = _move(m, opt, _rotation, q, buffer="cotangent")
    got = _losses(m, opt, batches)
    assert torch.allclose(got, ref, rtol=1e-12, atol=0)
    # θ_t of the teleported run = G·θ_t of the original run
    ref_syms = nf.SymmetrySet([_rotation(ref_m)])
    moved = {p: p.detach().clone() for p in ref_syms.params()}
    ref_syms[0].act_(q, moved)
    for p, r in zip(syms.params(), ref_syms.params(), strict=True):
        assert torch.allclose(p.detach(), moved[r], rtol=0, atol=1e-12)
    _move(stale_m, stale_opt, _rotation, q, buffer="none")
    stale = _losses(stale_m, stale_opt, batches)
    assert float((stale - ref).abs().max() / ref.abs().max()) > 1e-4
    tan_m, tan_opt = _clone(*_setup(0.9, nesterov)[:2])  # orthogonal: tangent = cotangent
    _move(tan_m, tan_opt, _rotation, q, buffer="tangent")
    assert torch.allclose(_losses(tan_m, tan_opt, batches), ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("beta", [0.0, 0.9])
def test_rescaling_teleport_is_not_equivariant_for_sgd(beta: float) -> None:
    """A non-orthogonal element (rescaling, λ ~ N(0, 1)): the function is the same at the
    teleport (first loss equal), but the later losses differ — by 0.5–2% after 8 steps,
    against 3e-16 for the rotation — for plain SGD too (β = 0), and with the buffer moved as
    a cotangent or as a tangent. This is what the noise equilibrium is about: SGD's path
    depends on the point of the orbit."""
    m, opt, batches = _setup(beta, False)
    ref_m, ref_opt = _clone(m, opt)
    ref = _losses(ref_m, ref_opt, batches)
    lam = torch.randn(6, generator=torch.Generator().manual_seed(2), dtype=DT)
    modes = ["cotangent", "tangent"] if beta > 0 else ["cotangent"]
    for mode in modes:
        mm, oo = _clone(m, opt)
        _move(mm, oo, _rescaling, lam, buffer=mode)
        got = _losses(mm, oo, batches)
        assert torch.allclose(got[0], ref[0], rtol=1e-12, atol=0)  # same function
        assert float((got[1:] - ref[1:]).abs().max() / ref.abs().max()) > 1e-4
