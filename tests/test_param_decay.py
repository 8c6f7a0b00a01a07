"""Per-parameter weight decay (issue #31): γ per parameter, e.g. a no-decay bias group.

References that do not use the derivation of docs/concepts/flow.md (PD1–PD8): an actual
``torch.optim.SGD`` step with param groups, the expectation of one SGD step computed from
per-sample gradients without using θᵀAg = 0, a brute-force root of the rotation's flow, and
a long SGD simulation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import least_squares
from torch import nn

import noetherflow as nf
from noetherflow.stats.reference import per_sample_grads

DT = torch.float64
LR, S = 0.1, 8
LOSS = nn.functional.mse_loss


class Split(nn.Module):
    """Two hidden units from two parameters, read by one layer: a rotation mixing parameters.

    Its dense generator mixes ``a.weight`` with ``b.weight``, so a Γ with γ_a ≠ γ_b does not
    commute with A.
    """

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 1, bias=False)
        self.b = nn.Linear(3, 1, bias=False)
        self.u = nn.Linear(2, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.u(torch.cat([self.a(x), self.b(x)], 1))


def _split_generator() -> torch.Tensor:
    a = torch.zeros(12, 12, dtype=DT)
    for i in range(3):  # W → e^{−ρB}W with B = [[0, 1], [1, 0]] mixes a's row with b's
        a[i, 3 + i] = a[3 + i, i] = -1.0
    for o in range(3):  # U → U e^{ρB}
        a[6 + 2 * o, 7 + 2 * o] = a[7 + 2 * o, 6 + 2 * o] = 1.0
    return a


def build(family: str, seed: int = 0) -> tuple[nn.Module, nf.SymmetrySet, dict, torch.Tensor]:
    """(model, symmetries, a mixed decay mapping, inputs) per family."""
    torch.manual_seed(seed)
    if family == "diagonal":
        m = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
        m = m.to(DT)
        syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.Rescaling(m[2], m[4])])
        dec = {p: 0.0 if p.ndim == 1 else 0.03 for p in m.parameters()}
    elif family == "rotation":
        m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 4)).to(DT)
        syms = nf.SymmetrySet([nf.DoubleRotation(m[0], m[1])])
        dec = {m[0].weight: 0.03, m[0].bias: 0.0, m[1].weight: 0.05, m[1].bias: 0.0}
    else:
        m = Split().to(DT)
        ps = [m.a.weight, m.b.weight, m.u.weight]
        syms = nf.SymmetrySet([nf.DenseSymmetry(ps, _split_generator())])
        dec = {m.a.weight: 0.05, m.b.weight: 0.0, m.u.weight: 0.02}
    x = torch.randn(64, 3, dtype=DT)
    return m, syms, dec, x


def targets(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = m(x)
    return torch.randn(out.shape, dtype=DT, generator=torch.Generator().manual_seed(7))


FAMILIES = ["diagonal", "rotation", "dense"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("family", FAMILIES)
def test_one_sgd_step_identity_exact(family: str) -> None:
    """C(θ') = θᵀKAKθ + 4η²θᵀΓAg + η²gᵀAg after a real SGD step with a no-decay group (PD2)."""
    m, syms, dec, x = build(family)
    y = targets(m, x)
    groups: dict[float, list[nn.Parameter]] = {}
    for p, g in dec.items():
        groups.setdefault(g, []).append(p)
    # torch's coupled weight_decay=w is γ = w/2
    opt = torch.optim.SGD([{"params": ps, "weight_decay": 2 * g} for g, ps in groups.items()], LR)
    opt.zero_grad()
    LOSS(m(x[:S]), y[:S]).backward()
    grads = {p: p.grad.clone() for p in syms.params()}
    pred = nf.exact_step_charges(syms, grads, lr=LR, weight_decay=dec)
    uniform = nf.exact_step_charges(syms, grads, lr=LR, weight_decay=0.03)
    opt.step()
    after = nf.charges(syms)
    for k in after:
        assert _rel(pred[k], after[k]) < 1e-12
        assert _rel(uniform[k], after[k]) > 1e-6  # one γ for all would be wrong here


def _expected_change(
    m: nn.Module, syms: nf.SymmetrySet, dec: dict, x: torch.Tensor, y: torch.Tensor, time: str
) -> dict[str, torch.Tensor]:
    """E[ΔC] (discrete) or dC/dt (continuous) from per-sample gradients, no symmetry used.

    Discrete: θ' = Kθ − η g_B with E[g_B] = ḡ and Cov[g_B] = Σ/S (a batch of S drawn with
    replacement), so E[C(θ')] = C(Kθ) − 2ηθᵀKAḡ + η²(C(ḡ) + Tr[AΣ]/S). Continuous (SGF,
    Itô): 2θᵀA(−ḡ − 2Γθ) + (η/S)Tr[AΣ].
    """
    ps = syms.params()
    samples = per_sample_grads(m, ps, LOSS, x, y)
    out = {}
    for name, s in syms.items():
        th = {p: p.detach() for p in s.params}
        gbar = {p: samples[p].mean(0) for p in s.params}
        n = x.shape[0]
        tr = sum(s.charge_of({p: samples[p][i] - gbar[p] for p in s.params}) for i in range(n))
        tr = tr / n  # Tr[AΣ]

        def q(u: dict, v: dict, s: nf.Symmetry = s) -> torch.Tensor:
            plus = s.charge_of({p: u[p] + v[p] for p in s.params})
            minus = s.charge_of({p: u[p] - v[p] for p in s.params})
            return (plus - minus) / 4

        if time == "discrete":
            kt = {p: (1 - 2 * LR * dec[p]) * th[p] for p in s.params}
            out[name] = (
                s.charge_of(kt)
                - 2 * LR * q(kt, gbar)
                + LR**2 * (s.charge_of(gbar) + tr / S)
                - s.charge_of(th)
            )
        else:
            gth = {p: -gbar[p] - 2 * dec[p] * th[p] for p in s.params}
            out[name] = 2 * q(th, gth) + LR / S * tr
    return out


@pytest.mark.parametrize("time", ["continuous", "discrete"])
@pytest.mark.parametrize("family", FAMILIES)
def test_flow_is_the_expected_change(family: str, time: str) -> None:
    m, syms, dec, x = build(family)
    y = targets(m, x)
    st = nf.collect_stats(m, syms, LOSS, x, y)
    flows = nf.noether_flow(syms, st, lr=LR, batch_size=S, weight_decay=dec, time=time)
    ref = _expected_change(m, syms, dec, x, y, time)
    for k in flows:
        assert _rel(flows[k].to(DT), ref[k]) < 1e-10


@pytest.mark.parametrize("time", ["continuous", "discrete"])
@pytest.mark.parametrize("family", FAMILIES)
def test_teleport_to_mixed_equilibrium_zero_flow(family: str, time: str) -> None:
    """Flows vanish after the teleport, measured with fresh statistics at the new point."""
    m, syms, dec, x = build(family)
    y = targets(m, x)
    nm = nf.NoiseModel.create(lr=LR, batch_size=S, weight_decay=dec, time=time)
    st = nf.collect_stats(m, syms, LOSS, x, y)
    before = nf.noether_flow(syms, st, nm)
    with torch.no_grad():
        out0 = m(x)
    sol = nf.solve_equilibrium(syms, st, nm)
    assert sol.converged and not sol.at_infinity
    nf.teleport(sol)
    with torch.no_grad():
        assert _rel(m(x), out0) < 1e-12
    after = nf.noether_flow(syms, nf.collect_stats(m, syms, LOSS, x, y), nm)
    for k in after:
        assert float(after[k].abs().max()) < 1e-9 * float(before[k].abs().max())


@pytest.mark.parametrize("time", ["continuous", "discrete"])
@pytest.mark.parametrize("family", FAMILIES)
def test_uniform_mapping_is_the_float_path(family: str, time: str) -> None:
    m, syms, _, x = build(family)
    y = targets(m, x)
    st = nf.collect_stats(m, syms, LOSS, x, y)
    same = {p: 0.03 for p in m.parameters()}
    kw = {"lr": LR, "batch_size": S, "time": time}
    a = nf.noether_flow(syms, st, weight_decay=same, **kw)
    b = nf.noether_flow(syms, st, weight_decay=0.03, **kw)
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa = nf.solve_equilibrium(syms, st, weight_decay=nf.ParamDecay({}, default=0.03), **kw)
    sb = nf.solve_equilibrium(syms, st, weight_decay=0.03, **kw)
    for k in sa.elements:
        assert torch.equal(torch.as_tensor(sa.elements[k]), torch.as_tensor(sb.elements[k]))


def test_rotation_fixed_point_against_brute_force_root() -> None:
    """The discrete rotation with its non-covariant cross term: G against a least-squares root.

    The brute force parametrises G = exp(S), S symmetric, moves a copy of the model and
    transports the statistics by the symmetry's own action, and drives the flow matrix to 0.
    """
    m, syms, dec, x = build("rotation")
    y = targets(m, x)
    nm = nf.NoiseModel.create(lr=LR, batch_size=S, weight_decay=dec, time="discrete")
    st = nf.collect_stats(m, syms, LOSS, x, y)
    (s,) = syms
    sol = nf.solve_equilibrium(syms, st, nm, options=nf.SolveOptions(tol=1e-14))
    g = torch.as_tensor(sol.elements[s and syms.names[0]])
    iu = torch.triu_indices(3, 3)
    base = {p: p.detach().clone() for p in s.params}
    samples = per_sample_grads(m, s.params, LOSS, x, y)

    def flow_at(v: np.ndarray) -> np.ndarray:
        sym = torch.zeros(3, 3, dtype=DT)
        sym[iu[0], iu[1]] = torch.as_tensor(v)
        sym = sym + sym.T - torch.diag(sym.diagonal())
        elem = torch.linalg.matrix_exp(sym)
        with torch.no_grad():
            for p in s.params:
                p.copy_(base[p])
            s.act_(elem, {p: p.data for p in s.params})
        moved = {p: samples[p].clone() for p in s.params}
        s.transport_grads_(elem, moved)
        stats = nf.kernels.base.stats_from_samples(moved, syms, estimator="reference")
        f = nf.noether_flow(syms, stats, nm)[syms.names[0]]
        return f[iu[0], iu[1]].numpy()

    fit = least_squares(flow_at, np.zeros(6), xtol=1e-15, ftol=1e-15, gtol=1e-15)
    with torch.no_grad():
        for p in s.params:
            p.copy_(base[p])
    sym = torch.zeros(3, 3, dtype=DT)
    sym[iu[0], iu[1]] = torch.as_tensor(fit.x)
    brute = torch.linalg.matrix_exp(sym + sym.T - torch.diag(sym.diagonal()))
    # both are roots; the equilibrium fixes P = GGᵀ (G up to a rotation on the right)
    assert float(np.abs(fit.fun).max()) < 1e-14
    assert _rel(g @ g.T, brute @ brute.T) < 1e-8


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_long_sgd_matches_the_mixed_equilibrium(beta: float) -> None:
    """Time-averaged charge of a long float64 SGD run with a no-decay bias vs the solver.

    Model y = u·relu(w x + b) on data with label noise; w, u decayed (γ = 0.01), the bias b
    not; plain SGD (β = 0) and PyTorch's heavy ball (β = 0.5, the buffer's displacement at
    the end passed as ``displacement=``). The tolerance, fixed before running: 5% of the
    scale w² + b² + u² at the end. The solver's discrete equilibrium at the run's end
    predicts the time average of C = w² + b² − u² over the second half (5·10⁴ of 10⁵ steps
    of S = 4 from N = 64; measured 1.8% (β = 0) and 0.2% (β = 0.5) of the scale apart); one
    γ for all parameters predicts a value more than 5% off (it misses by ~30%), so the test
    tells the two apart.
    """
    rng = np.random.default_rng(0)
    n, s, eta, gam = 64, 4, 0.05, 0.01
    x = rng.uniform(0.5, 1.5, n)
    y = 0.8 * x + 0.6 + 0.3 * rng.standard_normal(n)
    theta = np.array([1.5, 0.2, 0.4])  # w, b, u
    decay = np.array([gam, 0.0, gam])
    buf = None
    steps, cs = 100_000, []
    for t in range(steps):
        i = rng.integers(0, n, s)
        w, b, u = theta
        h = w * x[i] + b
        r = u * h - y[i]  # ½ mean r² per batch, h > 0 throughout (checked below)
        grad = np.array([np.mean(r * u * x[i]), np.mean(r * u), np.mean(r * h)])
        d = grad + 2 * decay * theta
        buf = d if buf is None else beta * buf + d  # torch.optim.SGD, dampening 0
        theta = theta - eta * buf
        if t >= steps // 2:
            cs.append(theta[0] ** 2 + theta[1] ** 2 - theta[2] ** 2)
    w, b, u = theta
    assert w * x.min() + b > 0
    net = nn.Sequential(nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 1, bias=False)).to(DT)
    ps = (net[0].weight, net[0].bias, net[2].weight)
    with torch.no_grad():
        for p, v in zip(ps, theta, strict=True):
            p.fill_(float(v))
    syms = nf.SymmetrySet([nf.Rescaling(net[0], net[2])])
    xt, yt = torch.as_tensor(x)[:, None], torch.as_tensor(y)[:, None]

    def loss(out: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((out - tgt) ** 2).mean()

    st = nf.collect_stats(net, syms, loss, xt, yt)
    dec = dict(zip(ps, decay.tolist(), strict=True))
    kw: dict = {"lr": eta, "batch_size": s, "time": "discrete", "momentum": beta}
    disp = None
    if beta:
        disp = {p: torch.full_like(p, -eta * float(v)) for p, v in zip(ps, buf, strict=True)}
    opts = nf.SolveOptions(displacement=disp)

    def predicted(decay: object) -> float:
        sol = nf.solve_equilibrium(syms, st, weight_decay=decay, **kw, options=opts)
        lam = float(torch.as_tensor(sol.elements[syms.names[0]]).reshape(()))
        e = np.exp(2 * lam)  # C(e^{λA}θ) with A = diag(+1, +1, −1) on (w, b, u)
        return float(w * w * e + b * b * e - u * u / e)

    avg = float(np.mean(cs))
    scale = w * w + b * b + u * u
    assert abs(predicted(dec) - avg) < 0.05 * scale
    assert abs(predicted(gam) - avg) > 0.05 * scale


@pytest.mark.parametrize("dampening", [0.0, 0.3])
@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
def test_heavy_ball_decay_cross_coefficient(beta: float, dampening: float) -> None:
    """PD9 against the 3 × 3 maps: per γ-class, the stationary combination of (C, B, E).

    A class of coordinates with one γ follows eq. (2) of optim.momentum plus X_c = θ_cᵀA_cg_c
    with the vector (2pr, pu + rs, 2su). The row ℓ with ℓ(I − T) = (κ_eff, 0, 0) and
    ℓ·𝐠 = η_eff² gives the class's weights of H and X: c_cross and, up to the constant
    −2e/(1 − β) that cancels across classes (Σ_c X_c = 0), cross·γ.
    """
    from noetherflow.optim.momentum import MomentumStep, moment_map

    eta, s = 0.1, 8
    for gam in (0.003, 0.02, 0.2):
        st = MomentumStep.create(lr=eta, momentum=beta, weight_decay=gam, dampening=dampening)
        tmat, gvec, hvec = moment_map(st)
        p, r, s_, u = st.p, st.r, st.s, st.u
        xvec = torch.tensor([2 * p * r, p * u + r * s_, 2 * s_ * u], dtype=DT)
        row = torch.linalg.solve(
            (torch.eye(3, dtype=DT) - tmat).T, torch.tensor([1.0, 0, 0], dtype=DT)
        )
        e = eta * (1 - dampening) if beta else eta
        scale = (e / (1 - beta)) ** 2 / float(row @ gvec)
        nm = nf.NoiseModel.create(
            lr=eta,
            batch_size=s,
            weight_decay=gam,
            time="discrete",
            momentum=beta,
            dampening=dampening,
        )
        assert abs(scale - nm.kappa) < 1e-12 * nm.kappa
        assert abs(scale * float(row @ hvec) - nm.c_cross) < 1e-12 * max(abs(nm.c_cross), 1e-30)
        a, b2 = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
        mixed = nf.NoiseModel.create(
            lr=eta,
            batch_size=s,
            weight_decay={a: gam, b2: 0.0},
            time="discrete",
            momentum=beta,
            dampening=dampening,
        )
        cross = mixed.mixed_terms([a, b2]).cross
        want = scale * float(row @ xvec) + 2 * e / (1 - beta)
        assert abs(cross * gam - want) < 1e-10 * abs(want)


def test_bad_mappings_say_what_to_pass() -> None:
    m, syms, dec, x = build("diagonal")
    y = targets(m, x)
    st = nf.collect_stats(m, syms, LOSS, x, y)
    kw = {"lr": LR, "batch_size": S}
    with pytest.raises(TypeError, match=r"name '0.weight'.*nn.Parameter"):
        nf.noether_flow(syms, st, weight_decay={"0.weight": 0.1}, **kw)
    with pytest.raises(TypeError, match=r"not an nn\.Parameter"):
        nf.noether_flow(syms, st, weight_decay={m[0].weight.detach(): 0.1}, **kw)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite γ >= 0"):
            nf.noether_flow(syms, st, weight_decay={**dec, m[0].weight: bad}, **kw)
    missing = {p: g for p, g in dec.items() if p is not m[2].bias}
    with pytest.raises(ValueError, match=r"no entry for a parameter of shape \(4,\).*default"):
        nf.noether_flow(syms, st, weight_decay=missing, **kw)
    # a default covers it: the same flows as the full mapping
    full = nf.noether_flow(syms, st, weight_decay=dec, **kw)
    dflt = nf.noether_flow(syms, st, weight_decay=nf.ParamDecay(missing, default=0.0), **kw)
    assert all(torch.equal(full[k], dflt[k]) for k in full)
    other = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="none of the 2 parameters"):
        nf.solve_equilibrium(
            syms, st, weight_decay=nf.ParamDecay(dict.fromkeys(other.parameters(), 0.1), 0.0), **kw
        )
    with pytest.raises(ValueError, match=r"Nesterov momentum.*does not split by γ"):
        nf.noether_flow(
            syms, st, weight_decay=dec, momentum=0.9, nesterov=True, time="discrete", **kw
        )
    # the heavy ball and continuous time (the SGF limit) take per-parameter decay
    nf.noether_flow(syms, st, weight_decay=dec, momentum=0.9, time="discrete", **kw)
    nf.noether_flow(syms, st, weight_decay=dec, momentum=0.9, time="continuous", **kw)
    dm, dsyms, ddec, dx = build("dense")
    dst = nf.collect_stats(dm, dsyms, LOSS, dx, targets(dm, dx))
    with pytest.raises(ValueError, match=r"a generator that mixes them"):
        nf.noether_flow(dsyms, dst, weight_decay=ddec, momentum=0.5, time="discrete", **kw)


def _groups(m: nn.Module, opt_cls: type, **kw: object) -> torch.optim.Optimizer:
    decay = [p for p in m.parameters() if p.ndim > 1]
    rest = [p for p in m.parameters() if p.ndim <= 1]
    return opt_cls(
        [{"params": decay, "weight_decay": 0.06}, {"params": rest, "weight_decay": 0.0}], **kw
    )


@pytest.mark.parametrize("time", ["continuous", "discrete"])
def test_monitor_reads_no_decay_groups(time: str) -> None:
    """The monitor's flows and distances with a no-decay group: γ per parameter, same lr."""
    m, syms, _, x = build("diagonal")
    y = targets(m, x)
    opt = _groups(m, torch.optim.SGD, lr=LR)
    mon = nf.NoetherMonitor(
        m,
        syms,
        optimizer=opt,
        batch_size=16,
        every=1,
        time=time,
        distance=nf.DistanceOptions(every=1),
        estimator="reference",
        loss_fn=LOSS,
    )
    dec = {p: 0.03 if p.ndim > 1 else 0.0 for p in m.parameters()}
    xb, yb = x[:16], y[:16]
    opt.zero_grad()
    loss = LOSS(m(xb), yb)
    loss.backward()
    st = nf.collect_stats(m, syms, LOSS, xb, yb)
    want = nf.noether_flow(syms, st, lr=LR, batch_size=16, weight_decay=dec, time=time)
    sol = nf.solve_equilibrium(syms, st, lr=LR, batch_size=16, weight_decay=dec, time=time)
    mon.step(loss, inputs=xb, targets=yb)
    opt.step()
    h = mon.history
    for name, key in mon.keys.items():
        np.testing.assert_allclose(h[f"flow/{key}"][0], want[name].numpy(), rtol=1e-10, atol=1e-16)
        np.testing.assert_allclose(
            h[f"distance/{key}"][0], sol.distance[name].numpy(), rtol=1e-6, atol=1e-12
        )
    assert float(h["weight_decay"][0]) == 0.03  # the largest γ of the watched groups
    mon.close()


def test_mixed_groups_still_refused_for_lr_and_momentum() -> None:
    m, syms, _, _ = build("diagonal")
    decay = [p for p in m.parameters() if p.ndim > 1]
    rest = [p for p in m.parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "lr": 0.1}, {"params": rest, "lr": 0.2}], lr=0.1)
    with pytest.raises(ValueError, match="lr, momentum, nesterov or dampening"):
        nf.NoetherMonitor(m, syms, optimizer=opt, batch_size=8)
    opt = _groups(m, torch.optim.SGD, lr=LR, momentum=0.9, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov momentum"):
        nf.NoetherMonitor(m, syms, optimizer=opt, batch_size=8, time="discrete")


def test_from_optimizer_one_model_with_per_parameter_decay() -> None:
    m, syms, _, x = build("diagonal")
    y = targets(m, x)
    opt = _groups(m, torch.optim.SGD, lr=LR)
    nm = nf.NoiseModel.from_optimizer(opt, S, per_group=False)
    st = nf.collect_stats(m, syms, LOSS, x, y)
    dec = {p: 0.03 if p.ndim > 1 else 0.0 for p in m.parameters()}
    a = nf.noether_flow(syms, st, nm)
    b = nf.noether_flow(syms, st, lr=LR, batch_size=S, weight_decay=dec, time="discrete")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert len(nf.NoiseModel.from_optimizer(opt, S)) == 2


def test_adamw_monitor_per_group_decay() -> None:
    """AdamW with a no-decay group: each scale-invariant symmetry uses its own group's λ."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 6).to(DT)
    norm = nn.LayerNorm(6, elementwise_affine=True).to(DT)
    head = nn.Linear(6, 2).to(DT)
    m = nn.Sequential(lin, norm, head)
    syms = nf.SymmetrySet([nf.ScaleInvariance([lin.weight, lin.bias])])
    opt = torch.optim.AdamW(
        [
            {"params": [lin.weight, lin.bias, head.weight], "weight_decay": 0.1},
            {"params": [norm.weight, norm.bias, head.bias], "weight_decay": 0.0},
        ],
        lr=1e-2,
    )
    with pytest.warns(UserWarning, match="AdamW's random-walk equilibrium charge"):
        mon = nf.NoetherMonitor(m, syms, optimizer=opt, batch_size=8, every=1)
    x, y = torch.randn(8, 4, dtype=DT), torch.randn(8, 2, dtype=DT)
    for _ in range(2):
        opt.zero_grad()
        with mon.track():
            loss = LOSS(m(x), y)
            loss.backward()
        mon.step(loss)
        opt.step()
    key = mon.keys[syms.names[0]]
    noise = mon.history[f"adamw_noise/{key}"][-1]
    assert np.all(np.isfinite(noise)) and np.all(noise > 0)
    want = nf.optim.adamw_equilibrium_charge(
        torch.as_tensor(noise), lr=1e-2, weight_decay=0.1, beta1=0.9
    )
    np.testing.assert_allclose(mon.history[f"adamw_charge/{key}"][-1], want.numpy(), rtol=1e-12)
    mon.close()


@pytest.mark.parametrize("time", ["continuous", "discrete"])
def test_monitor_tracked_distance_with_no_decay_group(time: str) -> None:
    """Incremental (first-order) rows with per-parameter κ equal full solves, in discrete
    time too: the chord steps minimise the kernel's F with its linear decay cross term."""
    m, syms, _, x = build("diagonal")
    y = targets(m, x)
    opt = _groups(m, torch.optim.SGD, lr=0.05)
    dec = {p: 0.03 if p.ndim > 1 else 0.0 for p in m.parameters()}
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        distance=nf.DistanceOptions(every=1, solve_every=100, tol=1e-11),
        optimizer=opt,
        batch_size=24,
        time=time,
        estimator="reference",
        loss_fn=LOSS,
        logging=nf.LogOptions(progress=False),
    )
    idx = torch.arange(24)
    for _ in range(5):
        opt.zero_grad()
        loss = LOSS(m(x[idx]), y[idx])
        loss.backward()
        row = mon.step(loss, inputs=x[idx], targets=y[idx])
        assert row is not None
        st = nf.collect_stats(m, syms, LOSS, x[idx], y[idx])
        sol = nf.solve_equilibrium(syms, st, lr=0.05, batch_size=24, weight_decay=dec, time=time)
        for name, key in mon.keys.items():
            assert np.abs(row[f"distance/{key}"] - sol.distance[name].numpy()).max() <= 1e-9
        opt.step()
    exact = mon.history["distance_exact"]
    assert exact[0] == 1 and (exact[1:] == 0).all()  # one full solve, then incremental
    mon.close()


def test_coupled_rotation_chain_with_no_decay_biases() -> None:
    """Coupled sweeps (two rotations sharing a layer) with biases at γ = 0, discrete time."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 4)).to(DT)
    syms = nf.SymmetrySet([nf.DoubleRotation(m[0], m[1]), nf.DoubleRotation(m[1], m[2])])
    dec = {p: 0.0 if p.ndim == 1 else 0.04 for p in m.parameters()}
    x = torch.randn(64, 3, dtype=DT)
    y = targets(m, x)
    nm = nf.NoiseModel.create(lr=LR, batch_size=S, weight_decay=dec, time="discrete")
    st = nf.collect_stats(m, syms, LOSS, x, y)
    before = nf.noether_flow(syms, st, nm)
    sol = nf.solve_equilibrium(syms, st, nm, options=nf.SolveOptions(tol=1e-13, max_sweeps=500))
    assert sol.converged and not sol.at_infinity
    nf.teleport(sol)
    after = nf.noether_flow(syms, nf.collect_stats(m, syms, LOSS, x, y), nm)
    for k in after:
        assert float(after[k].abs().max()) < 1e-9 * float(before[k].abs().max())


def test_momentum_with_one_decay_per_symmetry() -> None:
    """SGD momentum, discrete: symmetries each with one γ (different from each other) solve
    jointly as each alone with its float γ, cross term of the buffers included."""
    torch.manual_seed(0)
    l1, l2 = nn.Linear(4, 6).to(DT), nn.Linear(6, 5).to(DT)
    n1 = nn.LayerNorm(6, elementwise_affine=False, eps=0.0).to(DT)
    n2 = nn.LayerNorm(5, elementwise_affine=False, eps=0.0).to(DT)
    head = nn.Linear(5, 2).to(DT)
    m = nn.Sequential(l1, n1, l2, n2, head)
    s1 = nf.ScaleInvariance([l1.weight, l1.bias])
    s2 = nf.ScaleInvariance([l2.weight, l2.bias])
    syms = nf.SymmetrySet([s1, s2])
    x = torch.randn(32, 4, dtype=DT)
    y = targets(m, x)
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9)
    for _ in range(3):  # momentum buffers
        opt.zero_grad()
        LOSS(m(x), y).backward()
        opt.step()
    opt.zero_grad()
    LOSS(m(x), y).backward()
    st = nf.collect_stats(m, syms, LOSS, x, y)
    dec = {l1.weight: 0.02, l1.bias: 0.02, l2.weight: 0.05, l2.bias: 0.05}
    kw = {"lr": LR, "batch_size": S, "time": "discrete", "momentum": 0.9, "displacement": opt}
    opts = nf.SolveOptions(displacement=opt)
    skw = {k: v for k, v in kw.items() if k != "displacement"}
    joint = nf.solve_equilibrium(syms, st, weight_decay=dec, **skw, options=opts)
    flows = nf.noether_flow(syms, st, weight_decay=dec, **kw)
    for name, s, gam in ((syms.names[0], s1, 0.02), (syms.names[1], s2, 0.05)):
        alone = nf.solve_equilibrium(nf.SymmetrySet([s]), st, weight_decay=gam, **skw, options=opts)
        (other,) = alone.elements.values()
        np.testing.assert_allclose(
            torch.as_tensor(joint.elements[name]).numpy(),
            torch.as_tensor(other).numpy(),
            rtol=1e-9,
        )
        (f,) = nf.noether_flow(nf.SymmetrySet([s]), st, weight_decay=gam, **kw).values()
        assert torch.equal(flows[name], f)


def test_equilibrium_teleport_reads_no_decay_groups() -> None:
    m, syms, _, x = build("diagonal")
    y = targets(m, x)
    opt = _groups(m, torch.optim.SGD, lr=LR)
    dec = {p: 0.03 if p.ndim > 1 else 0.0 for p in m.parameters()}
    kw = {"lr": LR, "batch_size": S, "weight_decay": dec, "time": "discrete"}
    before = nf.noether_flow(syms, nf.collect_stats(m, syms, LOSS, x, y), **kw)
    tp = nf.EquilibriumTeleport(m, syms, LOSS, optimizer=opt, batch_size=S, time="discrete")
    tp.teleport(x, y)
    after = nf.noether_flow(syms, nf.collect_stats(m, syms, LOSS, x, y), **kw)
    for k in after:
        assert float(after[k].abs().max()) < 1e-9 * float(before[k].abs().max())


def test_optim_group_reading_per_parameter_decay() -> None:
    m, syms, _, _ = build("diagonal")
    for cls, want in ((torch.optim.SGD, 0.03), (torch.optim.AdamW, 0.06)):
        opt = _groups(m, cls, lr=LR)
        groups = nf.optim.from_optimizer(opt, S)
        with pytest.raises(ValueError, match="differ in weight decay only"):
            nf.optim.group_for_params(groups, syms.params())
        dec = nf.optim.decay_for_params(groups, syms.params())
        assert dec == {p: want if p.ndim > 1 else 0.0 for p in syms.params()}


def test_explicit_mapping_in_the_monitor_and_teleporter() -> None:
    """lr= and weight_decay= a mapping by hand (no optimizer) work like the optimizer path."""
    m, syms, dec, x = build("diagonal")
    y = targets(m, x)
    mon = nf.NoetherMonitor(
        m,
        syms,
        lr=LR,
        weight_decay=dec,
        batch_size=64,
        every=1,
        time="discrete",
        estimator="reference",
        loss_fn=LOSS,
        logging=nf.LogOptions(progress=False),
    )
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    opt.zero_grad()
    loss = LOSS(m(x), y)
    loss.backward()
    row = mon.step(loss, inputs=x, targets=y)
    assert row is not None
    st = nf.collect_stats(m, syms, LOSS, x, y)
    want = nf.noether_flow(syms, st, lr=LR, batch_size=64, weight_decay=dec, time="discrete")
    for name, key in mon.keys.items():
        np.testing.assert_allclose(row[f"flow/{key}"], want[name].numpy(), rtol=1e-10)
    mon.close()
    kw = {"lr": LR, "batch_size": 64, "weight_decay": dec, "time": "discrete"}
    before = nf.noether_flow(syms, st, **kw)
    nf.EquilibriumTeleport(m, syms, LOSS, **kw).teleport(x, y)
    after = nf.noether_flow(syms, nf.collect_stats(m, syms, LOSS, x, y), **kw)
    for k in after:
        assert float(after[k].abs().max()) < 1e-9 * float(before[k].abs().max())
