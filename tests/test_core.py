"""Core engine: every fast path against the torch.func reference, the exact per-step identity,
and teleport landing at the equilibrium, for every symmetry family (float64)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


class Normed(nn.Module):
    """Explicit normalisation w/‖w‖: the first layer is exactly scale invariant."""

    def __init__(self, d_in: int, d_h: int, d_out: int) -> None:
        super().__init__()
        self.first = nn.Linear(d_in, d_h)
        self.head = nn.Linear(d_h, d_out)

    def forward(self, x: Tensor) -> Tensor:
        w, b = self.first.weight, self.first.bias
        norm = torch.sqrt(w.square().sum() + b.square().sum())
        return self.head(torch.relu((x @ w.T + b) / norm))


def mlp(act: nn.Module) -> tuple[nn.Module, nf.SymmetrySet]:
    m = nn.Sequential(nn.Linear(5, 7), act, nn.Linear(7, 6), act, nn.Linear(6, 3))
    return m, nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.Rescaling(m[2], m[4])])


def token_mlp() -> tuple[nn.Module, nf.SymmetrySet]:
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.Linear(5, 3))
    return m, nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.DoubleRotation(m[2], m[3])])


def conv() -> tuple[nn.Module, nf.SymmetrySet]:
    m = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 3, 3, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 2 * 2, 2),
    )
    return m, nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.Rescaling(m[2], m[5], block=4)])


def rotation_pair() -> tuple[nn.Module, nf.SymmetrySet]:
    m = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 5))
    return m, nf.SymmetrySet([nf.DoubleRotation(m[0], m[1])])


def chain() -> tuple[nn.Module, nf.SymmetrySet]:
    m = nn.Sequential(*(nn.Linear(4, 4, bias=False) for _ in range(4)))
    return m, nf.SymmetrySet([nf.DoubleRotation(m[i], m[i + 1]) for i in range(3)])


def mixed() -> tuple[nn.Module, nf.SymmetrySet]:
    """Rescaling and a rotation sharing a layer: coupled, solved by sweeps."""
    m = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 4))
    return m, nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.DoubleRotation(m[2], m[3])])


def scale() -> tuple[nn.Module, nf.SymmetrySet]:
    m = Normed(4, 6, 3)
    return m, nf.SymmetrySet([nf.ScaleInvariance([m.first.weight, m.first.bias])])


def dense() -> tuple[nn.Module, nf.SymmetrySet]:
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    w1, b1, w2 = m[0].weight, m[0].bias, m[2].weight
    n = w1.numel() + b1.numel() + w2.numel()
    a = torch.zeros(n, n, dtype=DT)
    # neurons 0 and 1 rescaled together with different speeds: A = diag(+1 in, −1 out)·c_j
    for j, c in ((0, 1.0), (1, 0.5)):
        for i in range(3):
            a[j * 3 + i, j * 3 + i] = c
        a[12 + j, 12 + j] = c
        for o in range(2):
            a[16 + o * 4 + j, 16 + o * 4 + j] = -c
    return m, nf.SymmetrySet([nf.DenseSymmetry([w1, b1, w2], a)])


FAMILIES: dict[str, Callable[[], tuple[nn.Module, nf.SymmetrySet]]] = {
    "relu": lambda: mlp(nn.ReLU()),
    "leaky": lambda: mlp(nn.LeakyReLU(0.2)),
    "conv": conv,
    "rotation": rotation_pair,
    "chain": chain,
    "mixed": mixed,
    "scale": scale,
    "dense": dense,
}


def make(name: str, seed: int = 0) -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(seed)
    m, syms = FAMILIES[name]()
    m = m.to(DT)
    if name == "conv":
        x = torch.randn(12, 2, 5, 5, dtype=DT)
        y = torch.randint(0, 2, (12,))
    elif name in ("relu", "leaky", "dense", "scale"):
        d_in = {"dense": 3, "scale": 4}.get(name, 5)
        d_out = {"dense": 2}.get(name, 3)
        x = torch.randn(40, d_in, dtype=DT)
        y = torch.randn(40, d_out, dtype=DT)
    elif name == "chain":
        x = torch.randn(40, 4, dtype=DT)
        y = x @ torch.randn(4, 4, dtype=DT) + 0.3 * torch.randn(40, 4, dtype=DT)
    elif name == "mixed":
        x = torch.randn(40, 5, dtype=DT)
        y = torch.randn(40, 4, dtype=DT)
    else:
        x = torch.randn(40, 6, dtype=DT)
        y = torch.randn(40, 5, dtype=DT)
    return m, syms, x, y


def loss_for(name: str, reduction: str) -> Callable[[Tensor, Tensor], Tensor]:
    if name == "conv":
        return nn.CrossEntropyLoss(reduction=reduction)
    return nn.MSELoss(reduction=reduction)


def rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# -- statistics ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_hooks_match_reference(name: str, reduction: str) -> None:
    m, syms, x, y = make(name)
    syms.verify(m, x)
    lf = loss_for(name, reduction)
    if name == "scale":  # parameters used directly (w/‖w‖), not through a layer's forward
        with pytest.raises(nf.UnsupportedLayerError, match="estimator='reference'"):
            nf.collect_stats(m, syms, lf, x, y, reduction=reduction, estimator="hooks")
        return
    h = nf.collect_stats(m, syms, lf, x, y, reduction=reduction, estimator="hooks")
    r = nf.collect_stats(m, syms, lf, x, y, reduction=reduction, estimator="reference")
    assert h.n == r.n == x.shape[0]
    for p in r.mean:
        assert rel(h.mean[p], r.mean[p]) < 1e-12
    for p in r.sq:
        assert rel(h.sq[p], r.sq[p]) < 1e-12
    for s, (w, u) in r.side.items():
        assert rel(h.side[s][0], w) < 1e-12 and rel(h.side[s][1], u) < 1e-12
    for s, d in r.dense.items():
        assert rel(h.dense[s], d) < 1e-12
    for p, v in r.samples.items():
        assert rel(h.samples[p], v) < 1e-12


def test_token_axis_hooks_match_reference() -> None:
    torch.manual_seed(1)
    m, syms = token_mlp()
    m = m.to(DT)
    x = torch.randn(10, 7, 4, dtype=DT)
    y = torch.randn(10, 7, 3, dtype=DT)
    lf = nn.MSELoss()
    h = nf.collect_stats(m, syms, lf, x, y)
    r = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    for p in r.sq:
        assert rel(h.sq[p], r.sq[p]) < 1e-12
    for s in r.side:
        assert rel(h.side[s][0], r.side[s][0]) < 1e-12
        assert rel(h.side[s][1], r.side[s][1]) < 1e-12


@pytest.mark.parametrize("name", ["relu", "rotation", "dense"])
def test_microbatch_of_one_equals_reference(name: str) -> None:
    m, syms, x, y = make(name)
    lf = loss_for(name, "mean")
    mb = nf.collect_stats(m, syms, lf, x, y, estimator="microbatch")
    r = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    for p in r.mean:
        assert rel(mb.mean[p], r.mean[p]) < 1e-12
    for p in r.sq:
        assert rel(mb.sq[p], r.sq[p]) < 1e-12


def test_microbatch_estimates_covariance_under_batchnorm() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, eps=1e-30), nn.ReLU(), nn.Linear(4, 2)).to(
        DT
    )
    syms = nf.SymmetrySet([nf.ScaleInvariance([m[0].weight, m[0].bias], per_channel=True)])
    x, y = torch.randn(32, 3, dtype=DT), torch.randn(32, 2, dtype=DT)
    syms.verify(m, x)
    with pytest.raises(nf.StatisticsError, match="microbatch"):
        nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    before = m[1].running_mean.clone()
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="microbatch", micro_batch_size=4)
    assert torch.equal(m[1].running_mean, before)  # running statistics restored
    assert st.n == 8
    flows = nf.noether_flow(syms, st, lr=0.1, batch_size=4, weight_decay=0.0)
    # scale invariance without weight decay: the noise only ever grows the norm (eq. 24)
    assert bool((flows["scale0"] > 0).all())


def test_capture_reuses_callers_backward() -> None:
    m, syms, x, y = make("relu")
    with nf.capture(m, syms, reduction="mean") as cap:
        nn.MSELoss()(m(x), y).backward()
    r = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    for p in r.mean:
        assert rel(cap.stats.sq[p], r.sq[p]) < 1e-12
        # the caller's own .grad is the mean gradient
        assert p.grad is not None and rel(p.grad, r.mean[p]) < 1e-12


def test_float32_hooks_close_to_reference() -> None:
    torch.manual_seed(0)
    m, syms = mlp(nn.ReLU())
    x, y = torch.randn(64, 5), torch.randn(64, 3)
    h = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
    r = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    for p in r.sq:
        assert h.sq[p].dtype == torch.float32
        assert rel(h.sq[p], r.sq[p]) < 1e-5


# -- flows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_exact_identity_over_100_sgd_steps(name: str) -> None:
    """C(θ') = (1−2ηγ)²C(θ) + η²gᵀAg at every step, to round-off (paper eqs. 96–97)."""
    m, syms, x, y = make(name)
    lf = loss_for(name, "mean")
    lr, wd = 0.05, 1e-2
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(100):
        idx = torch.randint(0, x.shape[0], (8,), generator=gen)
        m.zero_grad()
        lf(m(x[idx]), y[idx]).backward()
        grads = {p: p.grad.detach().clone() for p in syms.params()}
        pred = nf.exact_step_charges(syms, grads, lr=lr, weight_decay=wd)
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1 - 2 * lr * wd).sub_(lr * p.grad)
        now = nf.charges(syms)
        for k in now:
            scale = float(now[k].abs().max().clamp_min(1e-3))
            worst = max(worst, float((now[k] - pred[k]).abs().max()) / scale)
    assert worst < 1e-11


def test_exact_identity_fails_for_a_non_symmetry() -> None:
    """The identity test can fail: with a tanh between the layers it does not hold."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    with pytest.raises(nf.SymmetryNotPresentError, match="rescaling0"):
        syms.verify(m, torch.randn(10, 5, dtype=DT))
    x, y = torch.randn(20, 5, dtype=DT), torch.randn(20, 3, dtype=DT)
    nn.MSELoss()(m(x), y).backward()
    grads = {p: p.grad.clone() for p in syms.params()}
    pred = nf.exact_step_charges(syms, grads, lr=0.5)
    with torch.no_grad():
        for p in m.parameters():
            p.sub_(0.5 * p.grad)
    assert float((nf.charges(syms)["rescaling0"] - pred["rescaling0"]).abs().max()) > 1e-6


def test_discrete_flow_is_the_expected_step_change() -> None:
    """E[ΔC] over all batches of size S drawn with replacement equals the discrete flow."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(4, 2, dtype=DT), torch.randn(4, 1, dtype=DT)
    lr, wd, s = 0.1, 0.05, 2
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    flow = nf.noether_flow(syms, st, lr=lr, batch_size=s, weight_decay=wd, time="discrete")
    c0 = nf.charges(syms)["rescaling0"]
    total = torch.zeros_like(c0)
    pairs = [(i, j) for i in range(4) for j in range(4)]  # every ordered batch of 2
    for i, j in pairs:
        m.zero_grad()
        idx = torch.tensor([i, j])
        nn.MSELoss()(m(x[idx]), y[idx]).backward()
        g = {p: p.grad.clone() for p in syms.params()}
        total += nf.exact_step_charges(syms, g, lr=lr, weight_decay=wd)["rescaling0"] - c0
    assert rel(total / len(pairs), flow["rescaling0"]) < 1e-12


# -- equilibrium and teleport --------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("time", ["continuous", "discrete"])
def test_teleport_lands_at_equilibrium(name: str, time: str) -> None:
    m, syms, x, y = make(name)
    lf = loss_for(name, "mean")
    kw = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2, "time": time}
    est = "reference"
    st = nf.collect_stats(m, syms, lf, x, y, estimator=est)
    before = nf.noether_flow(syms, st, **kw)
    sol = nf.solve_equilibrium(syms, st, **kw)
    assert sol.converged and not sol.at_infinity
    with torch.no_grad():
        out0 = m(x).clone()
    handle = nf.teleport(m, sol)
    with torch.no_grad():
        assert rel(m(x), out0) < 1e-12  # function unchanged
    after = nf.noether_flow(syms, nf.collect_stats(m, syms, lf, x, y, estimator=est), **kw)
    for k in before:
        assert float(before[k].norm()) > 0
        assert float(after[k].norm() / before[k].norm()) < 1e-8, k
    # the solution reported a non-trivial move
    assert sol.max_distance() > 1e-3
    # solving again from the equilibrium gives ~zero distance
    sol2 = nf.solve_equilibrium(syms, nf.collect_stats(m, syms, lf, x, y, estimator=est), **kw)
    assert sol2.max_distance() < 1e-6
    handle.undo()
    with torch.no_grad():
        assert torch.equal(m(x), out0) or rel(m(x), out0) < 1e-14


def test_scale_invariance_without_weight_decay_is_at_infinity() -> None:
    m, syms, x, y = make("scale")
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    sol = nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4, weight_decay=0.0)
    assert [r.name for r in sol.at_infinity] == ["scale0"]
    assert float(sol.at_infinity[0].direction[0]) == 1.0  # the norm grows (eq. 24)
    assert sol.steps == []


def test_scale_invariance_closed_form_equilibrium() -> None:
    """With weight decay, 4γ‖θ‖² = (η/S)Tr Σ at equilibrium (eq. 9, continuous time)."""
    m, syms, x, y = make("scale")
    lr, s, wd = 0.1, 4, 1e-2
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    sol = nf.solve_equilibrium(syms, st, lr=lr, batch_size=s, weight_decay=wd)
    nf.teleport(m, sol)
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    trace = sum(float((st.sq[p] - st.mean[p].square()).sum()) for p in syms.params())
    norm2 = float(nf.charges(syms)["scale0"][0])
    assert abs(4 * wd * norm2 - lr / s * trace) / (lr / s * trace) < 1e-9


def test_rotation_singular_statistics_reported() -> None:
    """Hidden width larger than the output: part of the rotation equilibrium is at infinity."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3, bias=False)).to(DT)
    syms = nf.SymmetrySet([nf.DoubleRotation(m[0], m[1])])
    x, y = torch.randn(30, 6, dtype=DT), torch.randn(30, 3, dtype=DT)
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
    sol = nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4)
    assert len(sol.at_infinity) == 1 and sol.at_infinity[0].direction.shape == (5, 2)
    # with an explicit ridge the problem is regular again
    sol = nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4, options=nf.SolveOptions(ridge=1e-6))
    assert not sol.at_infinity


# -- bad input -----------------------------------------------------------------------------
def test_errors_name_value_expectation_and_fix() -> None:
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(5, 2))
    with pytest.raises(nf.SymmetryDefinitionError, match="do not chain"):
        nf.Rescaling(m[0], m[2])
    with pytest.raises(nf.SymmetryDefinitionError, match="not symmetric"):
        nf.DenseSymmetry([m[0].bias], torch.triu(torch.ones(4, 4)))
    m[0].weight.requires_grad_(False)
    with pytest.raises(nf.SymmetryDefinitionError, match="frozen"):
        nf.ScaleInvariance([m[0].weight])
    ok = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    syms = nf.SymmetrySet([nf.Rescaling(ok[0], ok[2])])
    x, y = torch.randn(1, 3), torch.randn(1, 2)
    with pytest.raises(nf.StatisticsError, match="at least 2"):
        nf.collect_stats(ok, syms, nn.MSELoss(), x, y)
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    with pytest.raises(ValueError, match="reduction='avg'"):
        nf.collect_stats(ok, syms, nn.MSELoss(), x, y, reduction="avg")
    with pytest.raises(nf.StatisticsError, match="dtype"):
        nf.collect_stats(ok, syms, nn.MSELoss(), x.double(), y)
    with pytest.raises(nf.NonFiniteGradientError, match="check_finite=False"):
        nf.collect_stats(ok, syms, nn.MSELoss(), x, y * float("nan"))
    with pytest.raises(ValueError, match="lr="):
        nf.noether_flow(syms, nf.collect_stats(ok, syms, nn.MSELoss(), x, y), lr=-1, batch_size=2)
    # an unregistered layer type (LayerNorm and GroupNorm are registered now)
    ln = nn.Sequential(nn.Linear(3, 4), nn.PReLU(4), nn.Linear(4, 2))
    sc = nf.SymmetrySet([nf.ScaleInvariance([ln[1].weight])])
    with pytest.raises(nf.UnsupportedLayerError, match="estimator='reference'"):
        nf.collect_stats(ln, sc, nn.MSELoss(), x, y)


def test_undeclared_symmetry_is_caught_by_verify() -> None:
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    res = nf.SymmetrySet([nf.ScaleInvariance([m[0].weight])]).verify(
        m, torch.randn(8, 3), strict=False
    )
    assert not res[0].verified and res[0].rel_change > 1e-3


@pytest.mark.parametrize("name", ["relu", "conv"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_neuron_level_flows_match_diag_level(name: str, reduction: str) -> None:
    """level='neuron' keeps only per-neuron sums and gives the same flows as the reference."""
    m, syms, x, y = make(name)
    lf = loss_for(name, reduction)
    kw = {"lr": 0.1, "batch_size": 8, "weight_decay": 1e-3}
    neuron = nf.collect_stats(m, syms, lf, x, y, reduction=reduction, level="neuron")
    assert not neuron.sq and neuron.sq_axis
    ref = nf.collect_stats(m, syms, lf, x, y, reduction=reduction, estimator="reference")
    fn = nf.noether_flow(syms, neuron, **kw)
    fr = nf.noether_flow(syms, ref, **kw)
    for k in fr:
        assert rel(fn[k], fr[k]) < 1e-12
    # the middle layer carries generators on both axes: the solver needs it per coordinate
    with pytest.raises(nf.StatisticsError, match="level='solve'"):
        nf.solve_equilibrium(syms, neuron, **kw)


@pytest.mark.parametrize("name", ["relu", "conv"])
@pytest.mark.parametrize("time", ["continuous", "discrete"])
def test_solve_level_gives_the_diag_level_solution(name: str, time: str) -> None:
    """level='solve' keeps per-coordinate E[g²] only where two axes carry generators."""
    m, syms, x, y = make(name)
    lf = loss_for(name, "mean")
    kw = {"lr": 0.1, "batch_size": 8, "weight_decay": 1e-3, "time": time}
    solve = nf.collect_stats(m, syms, lf, x, y, level="solve")
    middle = m[2].weight
    assert set(solve.sq) == {middle}  # the only parameter between two rescaled layers
    assert solve.sq_axis and all(p is not middle for p, _ in solve.sq_axis)
    ref = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    a = nf.solve_equilibrium(syms, solve, **kw)
    b = nf.solve_equilibrium(syms, ref, **kw)
    assert a.converged and b.converged and a.max_distance() > 1e-3
    for k, v in b.elements.items():
        assert rel(a.elements[k], v) < 1e-9
    fn, fr = nf.noether_flow(syms, solve, **kw), nf.noether_flow(syms, ref, **kw)
    for k in fr:
        assert rel(fn[k], fr[k]) < 1e-12


def test_neuron_level_suffices_for_a_single_rescaling() -> None:
    """With generators along one axis of every parameter, per-neuron sums determine F."""
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(30, 5, dtype=DT), torch.randn(30, 3, dtype=DT)
    kw = {"lr": 0.1, "batch_size": 8, "weight_decay": 1e-3}
    neuron = nf.collect_stats(m, syms, nn.MSELoss(), x, y, level="neuron")
    assert not neuron.sq
    ref = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    a, b = nf.solve_equilibrium(syms, neuron, **kw), nf.solve_equilibrium(syms, ref, **kw)
    assert b.max_distance() > 1e-3
    for k, v in b.elements.items():
        assert rel(a.elements[k], v) < 1e-9


@pytest.mark.parametrize("level", ["neuron", "solve"])
def test_coupled_levels_solve_like_the_reference(level: str) -> None:
    """A coupled set keeps per-sample gradients, so every level can feed the sweeps."""
    m, syms, x, y = make("mixed")
    kw = {"lr": 0.1, "batch_size": 8, "weight_decay": 1e-3}
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y, level=level)
    ref = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    a, b = nf.solve_equilibrium(syms, st, **kw), nf.solve_equilibrium(syms, ref, **kw)
    assert b.max_distance() > 1e-3
    for k, v in b.elements.items():
        assert rel(a.elements[k], v) < 1e-9
    fn, fr = nf.noether_flow(syms, st, **kw), nf.noether_flow(syms, ref, **kw)
    for k in fr:
        assert rel(fn[k], fr[k]) < 1e-12


def test_unknown_level_is_rejected_for_every_estimator() -> None:
    m, syms, x, y = make("relu")
    for est in ("hooks", "reference"):
        with pytest.raises(ValueError, match="level='coords' is not supported"):
            nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator=est, level="coords")
