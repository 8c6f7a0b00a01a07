"""The monitor's incremental distance (#15) against full solves and its first-order bound."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.kernels.noise import NoiseModel
from noetherflow.monitor.first_order import (
    at_infinity,
    chord_bound,
    chord_solve,
    chord_step,
    derivatives,
    diagonal_problem,
    factor,
    max_exponent,
)
from noetherflow.stats.core import with_displacement

DT = torch.float64
NM = NoiseModel.create(lr=0.05, batch_size=8, weight_decay=0.01, time="discrete")


def _model(seed: int = 0) -> tuple[nn.Sequential, nf.SymmetrySet]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3)).to(
        DT
    )
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="a"), nf.Rescaling(m[2], m[4])])
    return m, syms


def _data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(24, 5, generator=g, dtype=DT), torch.randn(24, 3, generator=g, dtype=DT)


def _stats(m: nn.Module, syms: nf.SymmetrySet, x: torch.Tensor, y: torch.Tensor) -> nf.GradStats:
    return nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")


def _lam(sol: nf.EquilibriumSolution, syms: nf.SymmetrySet) -> torch.Tensor:
    return torch.cat([torch.as_tensor(sol.elements[n]).reshape(-1) for n in syms.names])


def _problem(m: nn.Module, syms: nf.SymmetrySet, st: nf.GradStats):  # type: ignore[no-untyped-def]
    return diagonal_problem(syms, {p: p.detach() for p in syms.params()}, st, NM)


def test_gradient_is_minus_the_flow_at_the_teleported_model() -> None:
    """∇F(λ) = −flows of the model teleported by λ, statistics recomputed there (orbit
    transport is exact); the Hessian matches central differences of that gradient."""
    m, syms = _model()
    x, y = _data()
    prob = _problem(m, syms, _stats(m, syms, x, y))
    lam = 0.3 * torch.randn(prob.n, generator=torch.Generator().manual_seed(2), dtype=DT)
    m2 = copy.deepcopy(m)
    syms2 = nf.SymmetrySet([nf.Rescaling(m2[0], m2[2], label="a"), nf.Rescaling(m2[2], m2[4])])
    for s, s2 in zip(syms, syms2, strict=True):
        off = prob.offsets[s]
        s2.apply_(lam[off : off + s.num_generators])
    flows = nf.noether_flow(syms2, _stats(m2, syms2, x, y), NM)
    flat = torch.cat([flows[n].reshape(-1) for n in syms2.names])
    grad, diag, _ = derivatives(prob, lam)
    assert float((grad + flat).abs().max()) <= 1e-12 * float(flat.abs().max())
    e = torch.randn(prob.n, generator=torch.Generator().manual_seed(5), dtype=DT)
    fd_value = (derivatives(prob, lam + 1e-5 * e)[2] - derivatives(prob, lam - 1e-5 * e)[2]) / 2e-5
    assert abs(fd_value - float(grad @ e)) <= 1e-7 * float(grad.abs().sum() * e.abs().max())
    h, eps = prob.derivatives(lam)[2], 1e-5
    fd = torch.stack(
        [
            (derivatives(prob, lam + eps * e)[0] - derivatives(prob, lam - eps * e)[0]) / (2 * eps)
            for e in torch.eye(prob.n, dtype=DT)
        ]
    )
    assert float((h - fd).abs().max()) <= 1e-7 * float(h.abs().max())
    assert float((diag - h.diagonal()).abs().max()) <= 1e-12 * float(h.abs().max())


def _perturbed(eps: float):  # type: ignore[no-untyped-def]
    """F₀ at θ and F at θ + ε·Δ (same batch), λ₀ and λ* their full solves, the chord factor."""
    m, syms = _model()
    x, y = _data()
    st0 = _stats(m, syms, x, y)
    lam0 = _lam(nf.solve_equilibrium(syms, st0, NM), syms)
    fac = factor(_problem(m, syms, st0), lam0, torch.ones(lam0.numel(), dtype=torch.bool))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in syms.params():
            p.add_(eps * p.abs().mean() * torch.randn(p.shape, generator=g, dtype=DT))
    st = _stats(m, syms, x, y)
    lam_star = _lam(nf.solve_equilibrium(syms, st, NM), syms)
    return _problem(m, syms, st), fac, lam0, lam_star


@pytest.mark.parametrize("eps", [0.2, 0.05])
def test_first_chord_step_obeys_its_bound(eps: float) -> None:
    """Eq. (C2) with H̃ = S H₀ S, ν and ρ computed exactly: ‖λ₁ − λ*‖_H̃ ≤ β‖λ₀ − λ*‖_H̃."""
    prob, fac, lam0, lam_star = _perturbed(eps)
    lam1, _ = chord_step(fac, prob)
    d1 = derivatives(prob, lam0)[1]
    s = (d1 / fac.diag0).sqrt()
    h_tilde = s[:, None] * (fac.chol @ fac.chol.T) * s[None, :]
    h1 = prob.derivatives(lam0)[2]
    ev, vec = torch.linalg.eigh(h_tilde)
    inv_half = vec @ torch.diag(ev.rsqrt()) @ vec.T
    rho = float(torch.linalg.eigvalsh(inv_half @ (h1 - h_tilde) @ inv_half).abs().max())
    nu = max_exponent(prob, lam_star - lam0)
    beta = chord_bound(nu, rho)

    def norm(v: torch.Tensor) -> float:
        return math.sqrt(float(v @ h_tilde @ v))

    e0 = norm(lam0 - lam_star)
    assert e0 > 1e-4  # the problem did change
    # slack: the full solve's own tolerance (relative flow 1e-12)
    assert norm(lam1 - lam_star) <= beta * e0 * (1 + 1e-6) + 1e-10
    assert beta < 1


def test_first_chord_step_is_exact_to_first_order() -> None:
    """Its error shrinks like the square of the change (C2: β is of the order of the change)."""
    errs, moves = [], []
    for eps in (0.04, 0.01):
        prob, fac, lam0, lam_star = _perturbed(eps)
        lam1, _ = chord_step(fac, prob)
        errs.append(float((lam1 - lam_star).abs().max()))
        moves.append(float((lam_star - lam0).abs().max()))
    assert moves[1] < moves[0] / 2  # the change itself shrinks (about 4×)
    # second order: the error shrinks at least like the change squared, with room 2
    assert errs[1] / errs[0] <= 2 * (moves[1] / moves[0]) ** 2


def test_chord_iterations_converge_to_the_full_solve() -> None:
    prob, fac, _lam0, lam_star = _perturbed(0.3)
    lam, ok, _its, size = chord_solve(fac, prob, tol=1e-13, max_iter=60)
    assert ok and size <= 1e-13
    assert float((lam - lam_star).abs().max()) <= 1e-9


def _optimizer(m: nn.Module, case: str) -> torch.optim.SGD:
    """SGD for a case: plain, with momentum (the cross term c_cross·vᵀA∇L in F), or with a
    no-decay group for the biases (per-parameter γ: F's linear term in discrete time)."""
    if case == "groups":
        ws = [p for n, p in m.named_parameters() if n.endswith("weight")]
        bs = [p for n, p in m.named_parameters() if n.endswith("bias")]
        groups = [{"params": ws}, {"params": bs, "weight_decay": 0.0}]
        return torch.optim.SGD(groups, lr=0.05, weight_decay=0.02)
    return torch.optim.SGD(
        m.parameters(), lr=0.05, weight_decay=0.02, momentum=0.9 if case == "momentum" else 0.0
    )


@pytest.mark.parametrize("case", ["plain", "momentum", "groups"])
def test_monitor_incremental_rows_equal_full_solves(case: str) -> None:
    """Rows with distance_exact = 0 agree with the diagonal kernel's full solve of the same
    statistics (full batch: the problem changes only with θ, so the chord steps converge in
    a few steps): the incremental distance minimises the kernel's own F, momentum cross term
    and per-parameter decay included."""
    m, syms = _model()
    x, y = _data()
    opt = _optimizer(m, case)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        distance=nf.DistanceOptions(every=1, solve_every=100, tol=1e-12),
        optimizer=opt,
        batch_size=24,
        time="discrete",
        estimator="reference",
        loss_fn=F.mse_loss,
        logging=nf.LogOptions(progress=False),
    )
    idx = torch.arange(24)
    momentum = 0.9 if case == "momentum" else None
    decay = 0.01
    if case == "groups":
        decay = {p: (0.01 if p.dim() > 1 else 0.0) for p in m.parameters()}
    crossed = 0
    for _ in range(6):
        opt.zero_grad()
        loss = F.mse_loss(m(x[idx]), y[idx])
        loss.backward()
        row = mon.step(loss, inputs=x[idx], targets=y[idx])
        assert row is not None
        st = _stats(m, syms, x[idx], y[idx])
        sol = nf.solve_equilibrium(
            syms,
            st,
            lr=0.05,
            batch_size=24,
            weight_decay=decay,
            time="discrete",
            momentum=momentum,
            options=nf.SolveOptions(displacement=opt if momentum else None),
        )
        crossed += int(bool(st.displacement) or bool(opt.state))
        inf = {r.name: r.direction.reshape(-1).numpy() != 0 for r in sol.at_infinity}
        for name, key in mon.keys.items():
            d = row[f"distance/{key}"]
            ref = sol.distance[name].numpy().copy()
            ref[inf.get(name, np.zeros(ref.shape, bool))] = np.inf
            assert np.array_equal(np.isinf(d), np.isinf(ref))
            fin = np.isfinite(ref)
            assert np.abs(d[fin] - ref[fin]).max() <= 1e-10 * max(1.0, np.abs(ref[fin]).max())
        opt.step()
    exact = mon.history["distance_exact"]
    assert exact[0] == 1
    if momentum:
        assert crossed >= 5  # the buffers were there at the later records
        # a full solve where the set at infinity changed (the growing buffers leave other
        # term groups negative), incremental rows in between
        assert (exact == 0).sum() >= 2
    else:
        assert (exact[1:] == 0).all()  # one full solve, then incremental
    mon.close()


def test_incremental_problem_is_the_kernels() -> None:
    """The monitor's F is the diagonal kernel's: with momentum buffers, its minimiser found by
    chord steps from a perturbed start equals the kernel's Newton solve (float64)."""
    m, syms = _model()
    x, y = _data()
    opt = _optimizer(m, "momentum")
    for _ in range(3):  # fill the buffers
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
    opt.zero_grad()
    F.mse_loss(m(x), y).backward()
    nm = NoiseModel.create(lr=0.05, batch_size=8, weight_decay=0.01, momentum=0.9)
    st = with_displacement(_stats(m, syms, x, y), opt, syms.params(), "test", 0.9)
    assert st.displacement
    sol = nf.solve_equilibrium(syms, st, nm)
    prob = diagonal_problem(syms, {p: p.detach() for p in syms.params()}, st, nm)
    assert float(derivatives(prob, _lam(sol, syms))[0].abs().max()) <= 1e-10
    lam_star = _lam(sol, syms)
    free = ~at_infinity(prob)
    fac = factor(prob, torch.zeros(prob.n, dtype=DT), free)
    lam, ok, _, _ = chord_solve(fac, prob, tol=1e-14, max_iter=60)
    assert ok
    assert float((lam - lam_star).abs().max()) <= 1e-10


def test_solve_mode_solves_every_time() -> None:
    m, syms = _model()
    x, y = _data()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        distance=nf.DistanceOptions(every=1, mode="solve"),
        lr=0.05,
        batch_size=24,
        logging=nf.LogOptions(progress=False),
    )
    for _ in range(3):
        with mon.track():
            F.mse_loss(m(x), y).backward()
        mon.step()
        m.zero_grad()
    assert (mon.history["distance_exact"] == 1).all()
    with pytest.raises(ValueError, match="distance_mode='chord'"):
        nf.NoetherMonitor(m, syms, lr=0.05, batch_size=8, distance=nf.DistanceOptions(mode="chord"))


def test_one_sided_generators_match_the_solvers_report() -> None:
    """Scale invariance without weight decay has its equilibrium at infinity (paper eq. 24):
    the problem flags it like the joint solve, so the monitor hands such a change to a full
    solve instead of chord steps that run off."""
    torch.manual_seed(0)
    lin, head = nn.Linear(4, 5).to(DT), nn.Linear(5, 2).to(DT)
    m = nn.Sequential(lin, nn.LayerNorm(5, elementwise_affine=False).to(DT), head)
    syms = nf.SymmetrySet([nf.ScaleInvariance([lin.weight, lin.bias], label="s")])
    x, y = torch.randn(16, 4, dtype=DT), torch.randn(16, 2, dtype=DT)
    st = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    for gamma, at_inf in ((0.0, True), (0.01, False)):
        nm = NoiseModel.create(lr=0.05, batch_size=8, weight_decay=gamma)
        sol = nf.solve_equilibrium(syms, st, nm)
        prob = diagonal_problem(syms, {p: p.detach() for p in syms.params()}, st, nm)
        assert bool(at_infinity(prob).all()) is at_inf
        assert bool(sol.at_infinity) is at_inf
