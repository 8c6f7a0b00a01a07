"""The momentum cross term c_cross·vᵀA∇L in the flows and solvers (issue #18).

With it, κ_eff·C* = Tr[A·M] + c_cross·⟨vᵀA∇L⟩ is the exact stationary point of the (C, B, E)
map (eq. 3 of noetherflow.optim.momentum); without it the effective-coefficient flow assumes
⟨vᵀA∇L⟩ = 0. Checked here in float64 against slow references: the closed forms and the 3 × 3
solve; the bilinear form vᵀAḡ by polarisation of the charges (no kernel code); after a solve
and a teleport that moves v as a gradient, fresh statistics show zero flow, for the diagonal
families (scale invariance, rescaling), the double rotation and a coupled set.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.optim import (
    MomentumStep,
    momentum_displacement,
    momentum_noise,
    stationary_moments,
)

DT = torch.float64
KW: dict[str, Any] = {"lr": 0.05, "batch_size": 8, "weight_decay": 0.01, "time": "discrete"}


@pytest.mark.parametrize(
    ("nesterov", "dampening"), [(False, 0.0), (False, 0.3), (True, 0.0)], ids=str
)
@pytest.mark.parametrize("beta", [0.5, 0.9])
def test_cross_coefficient_gives_the_exact_stationary_charge(
    beta: float, nesterov: bool, dampening: float
) -> None:
    """(η_eff²⟨G⟩ + c_cross⟨H⟩)/κ_eff equals the stationary C* of the 3 × 3 map, any G, H."""
    eta, gam = 0.07, 0.3
    nm = nf.NoiseModel.create(
        lr=eta,
        batch_size=8,
        weight_decay=gam,
        time="discrete",
        momentum=beta,
        nesterov=nesterov,
        dampening=dampening,
    )
    st = MomentumStep.create(
        lr=eta, momentum=beta, weight_decay=gam, nesterov=nesterov, dampening=dampening
    )
    gen = torch.Generator().manual_seed(0)
    g = torch.rand(20, generator=gen, dtype=DT) + 0.1
    h = torch.randn(20, generator=gen, dtype=DT)
    want, _, _ = stationary_moments(g, h, st)
    eff2 = nm.c_mean + nm.c_second  # η_eff²: E[G] = Tr A(ḡḡᵀ(1 − 1/S) + E[ggᵀ]/S) per unit
    got = (eff2 * g + nm.c_cross * h) / nm.kappa
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert nm.c_cross < 0
    assert (
        nm.c_cross
        == momentum_noise(
            lr=eta,
            batch_size=8,
            weight_decay=gam,
            momentum=beta,
            nesterov=nesterov,
            dampening=dampening,
        ).c_cross
    )


def test_no_cross_term_without_momentum_or_in_continuous_time() -> None:
    assert nf.NoiseModel.create(**KW).c_cross == 0.0
    cont = {**KW, "time": "continuous"}
    assert nf.NoiseModel.create(**cont, momentum=0.9).c_cross == 0.0


# -- models --------------------------------------------------------------------------------
def _diag_model() -> tuple[nn.Module, nf.SymmetrySet]:
    """Linear(4, 6) → LayerNorm → Linear(6, 6) → ReLU → Linear(6, 3): scale + rescaling."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(4, 6, bias=False),
        nn.LayerNorm(6, eps=0.0, elementwise_affine=False),  # exact scale invariance
        nn.Linear(6, 6),
        nn.ReLU(),
        nn.Linear(6, 3),
    ).to(DT)
    syms = nf.SymmetrySet(
        [
            nf.ScaleInvariance([m[0].weight], norm=m[1], label="scale"),
            nf.Rescaling(m[2], m[4], label="neuron"),
        ]
    )
    return m, syms


def _rotation_model() -> tuple[nn.Module, nf.SymmetrySet]:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(4, 3, bias=False), nn.Linear(3, 3)).to(DT)
    return m, nf.SymmetrySet([nf.DoubleRotation(m[0], m[1], label="rot")])


def _coupled_model() -> tuple[nn.Module, nf.SymmetrySet]:
    """Two per-head rotations sharing weights with a rescaling: test_solver_coupled's model at
    another seed (at its seed a head's direction runs off with this test's displacement)."""
    from test_solver_coupled import _model

    m, syms, _, _ = _model(seed=2)
    return m, syms


MODELS = {"diagonal": _diag_model, "rotation": _rotation_model, "coupled": _coupled_model}


def _data(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    n_in = next(iter(m.parameters())).shape[1]
    return torch.randn(40, n_in, generator=gen, dtype=DT), torch.randn(
        40, 3, generator=gen, dtype=DT
    )


def _full_grad(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    m.zero_grad()
    F.mse_loss(m(x), y).backward()
    return {p: p.grad.detach().clone() for p in m.parameters()}  # type: ignore[union-attr]


def _displacement(
    syms: nf.SymmetrySet, grad: dict[nn.Parameter, torch.Tensor], scale: float
) -> dict[nn.Parameter, torch.Tensor]:
    """A buffer-like v: −η_eff·ḡ plus noise of a fiftieth its size (seeded)."""
    gen = torch.Generator().manual_seed(4)
    out = {}
    for p in syms.params():
        noise = torch.randn(p.shape, generator=gen, dtype=DT) * grad[p].abs().mean()
        out[p] = scale * (-grad[p] + 0.02 * noise)
    return out


def _setup(kind: str, **noise: Any) -> tuple[Any, ...]:
    """(model, syms, x, y, ∇L, noise model with β = 0.9, statistics, a displacement v)."""
    m, syms = MODELS[kind]()
    x, y = _data(m)
    grad = _full_grad(m, x, y)
    nm = nf.NoiseModel.create(**KW, momentum=0.9, **noise)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    return m, syms, x, y, grad, nm, stats, _displacement(syms, grad, 0.5)


def _moved(syms: nf.SymmetrySet, sol: Any, v: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
    """v moved along the solution's steps as a gradient (T^{-T}), as a teleport moves it."""
    out = {p: t.clone() for p, t in v.items()}
    for i, element in sol.steps:
        rows = {p: out[p].unsqueeze(0) for p in syms[i].params if p in out}
        syms[i].transport_grads_(element, rows)
    return out


def _bilinear(s: Any, v: dict[Any, torch.Tensor], g: dict[Any, torch.Tensor]) -> torch.Tensor:
    """vᵀAg by polarisation of the charge: (Q(v + g) − Q(v − g))/4 (the charge's shape)."""
    plus = s.charge_of({p: v[p] + g[p] for p in s.params})
    minus = s.charge_of({p: v[p] - g[p] for p in s.params})
    return (plus - minus) / 4


@pytest.mark.parametrize("kind", list(MODELS))
def test_flow_cross_term_is_c_cross_times_the_bilinear_form(kind: str) -> None:
    _, syms, _, _, grad, nm, stats, v = _setup(kind)
    with_v = nf.noether_flow(syms, stats, nm, displacement=v)
    without = nf.noether_flow(syms, stats, nm)
    for name, s in syms.items():
        want = nm.c_cross * _bilinear(s, v, grad)
        torch.testing.assert_close(with_v[name] - without[name], want, rtol=1e-10, atol=1e-15)
        assert float(want.abs().max()) > 1e-3 * float(without[name].abs().max())


@pytest.mark.parametrize("kind", list(MODELS))
def test_solve_with_displacement_lands_on_zero_flow(kind: str) -> None:
    """Teleport to the solution, move v as a gradient: fresh statistics give zero flow."""
    m, syms, x, y, _, nm, stats, v = _setup(kind)
    sol = nf.solve_equilibrium(
        syms, stats, nm, options=nf.SolveOptions(displacement=v, max_sweeps=400)
    )
    assert sol.converged and not sol.at_infinity
    plain = nf.solve_equilibrium(syms, stats, nm, options=nf.SolveOptions(max_sweeps=400))
    nf.teleport(m, sol)
    moved = _moved(syms, sol, v)
    after = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    flows = nf.noether_flow(syms, after, nm, displacement=moved)
    for name, s in syms.items():
        scale = nm.kappa * s.charge().abs().max()
        assert float(flows[name].abs().max() / scale) < 1e-7, name
    # the cross term moves the equilibrium (else the test above would prove nothing)
    moved_by = max(float((sol.distance[n] - plain.distance[n]).abs().max()) for n in syms.names)
    assert moved_by > 1e-4


def test_negative_noise_term_is_reported_at_infinity() -> None:
    """v along +ḡ makes c_cross·vᵀAḡ outweigh Tr[A·M] for the scale invariance."""
    m, syms = _diag_model()
    x, y = _data(m)
    grad = _full_grad(m, x, y)
    nm = nf.NoiseModel.create(**KW, momentum=0.9)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    w = m[0].weight
    v = {w: 1e3 * grad[w]}
    assert float(nf.noether_flow(syms, stats, nm, displacement=v)["scale"].max()) < 0
    sol = nf.solve_equilibrium(syms, stats, nm, options=nf.SolveOptions(displacement=v))
    assert [r.name for r in sol.at_infinity] == ["scale"]
    assert "momentum cross term" in sol.at_infinity[0].reason
    assert bool(torch.isfinite(sol.distance["neuron"]).all())


def test_momentum_displacement_reads_the_buffers() -> None:
    m, syms = _diag_model()
    x, y = _data(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    assert momentum_displacement(opt) == {}  # no buffer before the first step
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
    v = momentum_displacement(opt, syms.params())
    assert set(v) == set(syms.params())
    for p, t in v.items():
        torch.testing.assert_close(t, -0.05 * opt.state[p]["momentum_buffer"], rtol=0, atol=0)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    a = nf.noether_flow(syms, stats, **KW, momentum=0.9, displacement=opt)
    b = nf.noether_flow(syms, stats, **KW, momentum=0.9, displacement=v)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    with pytest.raises(TypeError, match=r"expected a torch\.optim\.SGD"):
        momentum_displacement(torch.optim.Adam(m.parameters()))


def test_bad_displacements_are_refused() -> None:
    m, syms = _diag_model()
    x, y = _data(m)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    kw = {**KW, "momentum": 0.9}
    w = m[0].weight
    other = nn.Parameter(torch.zeros(2, dtype=DT))
    with pytest.raises(ValueError, match="holds none of the symmetry set's parameters"):
        nf.noether_flow(syms, stats, **kw, displacement={other: torch.zeros(2, dtype=DT)})
    # a whole model's buffers: the entries of other parameters are left out
    full = {p: torch.zeros_like(p) for p in m.parameters()}
    nf.noether_flow(syms, stats, **kw, displacement=full)
    with pytest.raises(TypeError, match=r"expected nn\.Parameter keys"):
        nf.noether_flow(syms, stats, **kw, displacement={n: p for n, p in m.named_parameters()})
    with pytest.raises(TypeError, match="is a dict; expected a floating-point tensor"):
        nf.noether_flow(syms, stats, **kw, displacement={w: {"momentum_buffer": w}})
    for bad in (torch.ones_like(w, dtype=torch.bool), torch.ones_like(w, dtype=torch.int64)):
        with pytest.raises(TypeError, match="expected a floating-point tensor"):
            nf.noether_flow(syms, stats, **kw, displacement={w: bad})
    with pytest.raises(ValueError, match="the noise model has no momentum"):
        nf.noether_flow(syms, stats, **KW, displacement={w: torch.zeros_like(w)})
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    with pytest.raises(ValueError, match=r"optimizer's momentum is \[0.9\] but the noise"):
        nf.noether_flow(syms, stats, **{**KW, "momentum": 0.5}, displacement=opt)
    other_opt = torch.optim.SGD([other], lr=0.05, momentum=0.9)
    with pytest.raises(ValueError, match="holds none of the symmetry set's parameters"):
        nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(displacement=other_opt))
    with pytest.raises(TypeError, match=r"momentum_cross='false' is a str; expected True or"):
        nf.NoetherMonitor(m, syms, optimizer=opt, batch_size=8, momentum_cross="false")
    with pytest.raises(ValueError, match=r"has shape \(3,\); expected the parameter's shape"):
        nf.solve_equilibrium(
            syms, stats, **kw, options=nf.SolveOptions(displacement={w: torch.zeros(3, dtype=DT)})
        )
    with pytest.raises(nf.NonFiniteGradientError, match="NaN/Inf"):
        nf.noether_flow(syms, stats, **kw, displacement={w: torch.full_like(w, float("nan"))})
    with pytest.raises(TypeError, match="expected a mapping"):
        nf.noether_flow(syms, stats, **kw, displacement=[1.0])


def test_monitor_track_mode_uses_the_cross_term() -> None:
    """The monitor's first-order distances (track mode) follow the solve with the buffers."""
    m, syms = _diag_model()
    x, y = _data(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=0.02)
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        optimizer=opt,
        batch_size=40,
        logging=nf.LogOptions(progress=False),
        time="discrete",
        distance=nf.DistanceOptions(every=1, mode="track", solve_every=50),
    )
    kw = {"lr": 0.05, "batch_size": 40, "weight_decay": 0.01, "time": "discrete", "momentum": 0.9}
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
        want = nf.solve_equilibrium(
            syms, stats, **kw, options=nf.SolveOptions(displacement=opt)
        ).distance
        row = mon.step(loss)
        assert row is not None
        for name in syms.names:
            got = torch.as_tensor(row[f"distance/{name}"])
            torch.testing.assert_close(got, want[name].reshape(got.shape), rtol=1e-6, atol=1e-9)
        opt.step()
    mon.close()


@pytest.mark.parametrize("nesterov", [False, True], ids=["heavy-ball", "nesterov"])
@pytest.mark.parametrize("kind", ["diagonal", "rotation"])
def test_solution_reports_the_stationary_cross_and_buffer_terms(kind: str, nesterov: bool) -> None:
    """(C*, B*, E*) of the solution = the 3 × 3 stationary point of ⟨G⟩, ⟨H⟩ measured afresh
    at the teleported model (v moved as a gradient), and C* its charge."""
    m, syms, x, y, _, nm, stats, v = _setup(kind, nesterov=nesterov)
    sol = nf.solve_equilibrium(syms, stats, nm, options=nf.SolveOptions(displacement=v))
    nf.teleport(m, sol)
    moved = _moved(syms, sol, v)
    after = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    grad_after = _full_grad(m, x, y)
    st = MomentumStep.create(lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=nesterov)
    eff2 = nm.c_mean + nm.c_second
    plain = nf.NoiseModel.create(**KW)  # its noise term is η²⟨G⟩
    for name, s in syms.items():
        c, b, e = sol.momentum_terms[name]
        torch.testing.assert_close(c, s.charge(), rtol=1e-10, atol=1e-14)
        g_mean = (nf.noether_flow(syms, after, plain)[name] + plain.kappa * s.charge()) / 0.05**2
        h = _bilinear(s, moved, grad_after)
        want = stationary_moments(g_mean, h, st)
        for got, ref in zip((c, b, e), want, strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-7, atol=1e-12)
        assert float(h.abs().max()) > 1e-3 * float(eff2 * g_mean.abs().max())


def test_no_momentum_terms_without_momentum() -> None:
    m, syms = _diag_model()
    x, y = _data(m)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    assert nf.solve_equilibrium(syms, stats, **KW).momentum_terms == {}
    cont = {**KW, "time": "continuous", "momentum": 0.9}
    assert nf.solve_equilibrium(syms, stats, **cont).momentum_terms == {}


def test_tools_can_drop_the_cross_term_and_say_why_directions_run_off() -> None:
    """momentum_cross=False gives the H = 0 flows; a negative rotation term says so."""
    m, syms = _rotation_model()
    x, y = _data(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=0.02)
    opts: dict[str, Any] = {
        "every": 1,
        "optimizer": opt,
        "batch_size": 40,
        "logging": nf.LogOptions(progress=False),
    }
    mons = [
        nf.NoetherMonitor(m, syms, **opts, time="discrete", momentum_cross=cross)
        for cross in (True, False)
    ]
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with mons[0].track(), mons[1].track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
        kw = {**KW, "batch_size": 40, "weight_decay": 0.01, "momentum": 0.9}
        with_v = nf.noether_flow(syms, stats, **kw, displacement=opt)["rot"].norm()
        without = nf.noether_flow(syms, stats, **kw)["rot"].norm()
        rows = [mon.step(loss) for mon in mons]
        opt.step()
    for mon in mons:
        mon.close()
    assert rows[0] is not None and rows[1] is not None
    torch.testing.assert_close(torch.as_tensor(rows[0]["flow/rot"]), with_v, rtol=1e-10, atol=0)
    torch.testing.assert_close(torch.as_tensor(rows[1]["flow/rot"]), without, rtol=1e-10, atol=0)
    assert not torch.isclose(with_v, without, rtol=1e-3)
    grad = _full_grad(m, x, y)
    v = {p: 3.0 * grad[p] for p in syms.params()}  # v along +ḡ: c_cross·vᵀAḡ dominates
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    sol = nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(displacement=v))
    (rep,) = sol.at_infinity
    assert "negative eigenvalues" in rep.reason and "momentum cross term" in rep.reason


def _docs_mlp() -> tuple[nn.Module, nf.SymmetrySet, torch.optim.SGD, torch.Tensor, torch.Tensor]:
    """The concept page's MLP after 3 SGD(momentum=0.9) steps (float64)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).to(DT)
    x, y = torch.randn(64, 5, dtype=DT), torch.randn(64, 3, dtype=DT)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=2e-3)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(m(x[:16]), y[:16]).backward()
        opt.step()
    return m, nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="r")]), opt, x, y


def test_a_negative_side_is_balanced_by_the_other_sides_decay() -> None:
    """A neuron whose noise term in one parameter (here its bias) turns negative with the
    cross term still has a stationary point: only the sum of the terms that share an
    exponent (its incoming weights and bias, M_in, with the outgoing decay κc_out) must be
    non-negative. The solve finds it (zero flow after the teleport); clamping per parameter
    did not (a user's report)."""
    m, syms, opt, x, y = _docs_mlp()
    (noise,) = nf.NoiseModel.from_optimizer(opt, batch_size=16)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    v = momentum_displacement(opt, syms.params())
    w1, b1, w2 = m[0].weight, m[0].bias, m[2].weight
    sums = [noise.diag(stats.mean[p], stats.sq[p], v[p]).reshape(8, -1).sum(1) for p in (w1, b1)]
    sums.append(noise.diag(stats.mean[w2], stats.sq[w2], v[w2]).sum(0))
    assert min(float(t.min()) for t in sums) < 0  # one parameter's part of a neuron
    sol = nf.solve_equilibrium(syms, stats, noise, options=nf.SolveOptions(displacement=opt))
    assert sol.converged and not sol.at_infinity
    nf.teleport(sol)
    nf.transform_optimizer_state(opt, sol)
    after = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    flow = nf.noether_flow(syms, after, noise, displacement=opt)["r"]
    assert float((flow.abs() / (noise.kappa * syms["r"].charge())).max()) < 1e-9


def test_a_neuron_without_a_stationary_point_is_reported_and_left_unmoved() -> None:
    """Both sides of neuron 0 negative: no stationary point; it is reported (with the cross
    term's reason), left at λ = 0 with NaN stationary terms, and the others still solved."""
    m, syms, _, x, y = _docs_mlp()
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    w1, b1, w2 = m[0].weight, m[0].bias, m[2].weight
    v = {p: torch.zeros_like(p) for p in (w1, b1, w2)}
    v[w1][0], v[b1][0] = 1e3 * stats.mean[w1][0], 1e3 * stats.mean[b1][0]
    v[w2][:, 0] = -1e3 * stats.mean[w2][:, 0]
    nm = nf.NoiseModel.create(**{**KW, "batch_size": 16, "weight_decay": 1e-3}, momentum=0.9)
    sol = nf.solve_equilibrium(syms, stats, nm, options=nf.SolveOptions(displacement=v))
    (rep,) = sol.at_infinity
    assert rep.direction.ne(0).tolist() == [True] + [False] * 7
    assert "momentum cross term" in rep.reason
    lam = torch.as_tensor(sol.elements["r"])
    assert float(lam[0]) == 0.0 and bool(lam[1:].ne(0).all())
    c = sol.momentum_terms["r"][0]
    assert bool(c[0].isnan()) and not bool(c[1:].isnan().any())
    nf.teleport(sol)
    moved = _moved(syms, sol, v)
    after = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    flow = nf.noether_flow(syms, after, nm, displacement=moved)["r"]
    assert float((flow[1:].abs() / (nm.kappa * syms["r"].charge()[1:])).max()) < 1e-9


def test_a_teleport_that_resets_the_buffers_solves_without_them() -> None:
    """EquilibriumTeleport(optimizer_state="reset") zeroes the buffers, so v = 0 afterwards:
    its solve is the solve without displacement."""
    m, syms, opt, x, y = _docs_mlp()
    kw = {"batch_size": 16, "time": "discrete", "optimizer": opt}
    reset = nf.EquilibriumTeleport(m, syms, F.mse_loss, optimizer_state="reset", **kw)
    keep = nf.EquilibriumTeleport(m, syms, F.mse_loss, **kw)
    (noise,) = nf.NoiseModel.from_optimizer(opt, batch_size=16)
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y)
    want = nf.solve_equilibrium(syms, stats, noise).distance["r"]
    torch.testing.assert_close(reset.solve(x, y).distance["r"], want, rtol=1e-12, atol=0)
    assert not torch.allclose(keep.solve(x, y).distance["r"], want, rtol=1e-6)


def test_teleport_names_a_wrong_first_argument() -> None:
    m, syms, _, x, y = _docs_mlp()
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y)
    sol = nf.solve_equilibrium(syms, stats, **KW)
    with pytest.raises(TypeError, match="the first argument is a SymmetrySet; expected the nn"):
        nf.teleport(syms, sol)  # type: ignore[arg-type]


def test_balance_keeps_f_and_finds_negative_groups() -> None:
    """balance() on signed terms: F, ∇F and the Hessian unchanged at random λ, every term
    ≥ 0; a group whose terms sum below 0 is dropped and its generators marked with the sign
    along which F falls (oracle: the exponents written out by hand)."""
    from noetherflow.kernels._diag_problem import _DiagProblem, _Grid, balance

    gen = torch.Generator().manual_seed(7)

    def grid(shape: tuple[int, int], rows: list[Any], cols: list[Any]) -> _Grid:
        return _Grid(
            torch.rand(shape, generator=gen, dtype=DT) + 0.1,
            torch.rand(shape, generator=gen, dtype=DT) + 0.1,
            rows,
            cols,
        )

    # three neurons (generators 0–2): incoming W [3, 4] and bias [3, 1] by rows (+1),
    # outgoing V [2, 3] by columns (−1). Neuron i's terms at e^{−2λᵢ}: W's and b's M, V's κθ².
    w = grid((3, 4), [(0, 3, 1, 1.0)], [])
    b = grid((3, 1), [(0, 3, 1, 1.0)], [])
    v = grid((2, 3), [], [(0, 3, 1, -1.0)])
    b.m[1, 0] = -0.9 * float(w.m[1].sum() + v.c[:, 1].sum())  # negative, outweighed
    v.m[0, 0] = -0.9 * float(v.m[1, 0] + w.c[0].sum() + b.c[0, 0])  # the same at e^{+2λ₀}
    prob = _DiagProblem(3, {}, [w, b, v])
    grids, neg = balance(prob.grids, 3)
    assert not bool(neg.ne(0).any())
    assert all(bool((g.m >= 0).all()) and bool((g.c >= 0).all()) for g in grids)
    new = _DiagProblem(3, {}, grids)
    for _ in range(3):
        lam = torch.randn(3, generator=gen, dtype=DT)
        assert abs(new.value(lam) - prob.value(lam)) <= 1e-13 * abs(prob.value(lam))
        for got, want in zip(new.derivatives(lam), prob.derivatives(lam), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    # neuron 2's terms at e^{−2λ₂} below 0 overall: F falls as λ₂ → −∞; nothing else moves
    b.m[2, 0] = -2.0 * float(w.m[2].sum() + v.c[:, 2].sum())
    grids, neg = balance([w, b, v], 3)
    assert neg.tolist() == [0.0, 0.0, -1.0]
    assert float(grids[1].m[2, 0]) == 0.0 and bool(grids[0].m[2].eq(0).all())
    assert bool(grids[2].c[:, 2].eq(0).all()) and bool(grids[0].c[2].gt(0).all())
