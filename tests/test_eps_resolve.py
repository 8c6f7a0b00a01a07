"""Generators held fixed in the equilibrium solve, and the eps-safe re-solve (issue #14).

``SolveOptions(fixed=...)`` against an independent dense Newton on the reduced F
(autograd, float64); ``solve_within_eps`` on small models with BatchNorm in training mode and
with LayerNorm: after the teleport the flows of every generator that was not clipped vanish
(fresh statistics, ``noether_flow``), the outputs change by at most the eps tolerance in train
and eval mode; plain clipping (``clip_to_eps``) leaves the coupled flows, which is the bug.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.kernels.noise import NoiseModel
from noetherflow.symmetry.base import DiagonalSymmetry
from noetherflow.symmetry.eps import eps_bounds

DT = torch.float64
HYPER = {"lr": 0.1, "weight_decay": 1e-3}


def _mse(out: Tensor, y: Tensor) -> Tensor:
    return (out - y).square().mean()


# -- the reduced problem, written out -------------------------------------------------------
def _exponents(s: DiagonalSymmetry, lam: Tensor) -> dict[nn.Parameter, Tensor]:
    """s_k = a_k·λ for every coordinate of the parameters of ``s`` (autograd-friendly)."""
    out: dict[nn.Parameter, Tensor] = {}
    for t in s.terms():
        e = torch.broadcast_to(s._exponent(t, lam), t.param.shape)
        out[t.param] = out.get(t.param, torch.zeros_like(e)) + e
    return out


def _f(syms: Any, lam: dict[str, Tensor], stats: Any, nm: NoiseModel) -> Tensor:
    """F(λ) = ½ Σ_k (M_kk e^{−2s_k} + κθ_k² e^{2s_k}) (paper eq. 9 with diagonal A)."""
    s_of: dict[nn.Parameter, Tensor] = {}
    for name, sym in syms.items():
        for p, e in _exponents(sym, lam[name]).items():
            s_of[p] = s_of.get(p, torch.zeros_like(e)) + e
    total = torch.zeros((), dtype=DT)
    for p, e in s_of.items():
        m = nm.diag(stats.mean[p].to(DT), stats.block("diagonal").sq[p].to(DT)).clamp(min=0)
        c = nm.kappa * p.detach().to(DT).square()
        total = total + 0.5 * (m * torch.exp(-2 * e) + c * torch.exp(2 * e)).sum()
    return total


def _reduced_newton(
    syms: Any, stats: Any, nm: NoiseModel, fixed: dict[str, Tensor]
) -> dict[str, Tensor]:
    """argmin of F over the free generators, the held ones in place: dense Newton, autograd."""
    sizes = {n: s.num_generators for n, s in syms.items()}
    base = {n: fixed.get(n, torch.full((k,), float("nan"), dtype=DT)) for n, k in sizes.items()}
    free = {n: torch.isnan(v) for n, v in base.items()}

    def full(mu: Tensor) -> dict[str, Tensor]:
        out, i = {}, 0
        for n, v in base.items():
            k = int(free[n].sum())
            out[n] = torch.where(free[n], 0.0, v).index_put((free[n],), mu[i : i + k])
            i += k
        return out

    mu = torch.zeros(sum(int(f.sum()) for f in free.values()), dtype=DT)
    fn = lambda m: _f(syms, full(m), stats, nm)  # noqa: E731
    for _ in range(50):
        g = torch.autograd.functional.jacobian(fn, mu)
        if float(g.abs().max()) < 1e-15:
            break
        h = torch.autograd.functional.hessian(fn, mu)
        mu = mu - torch.linalg.solve(h, g)
    return {n: v.detach() for n, v in full(mu).items()}


def _mlp() -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    layers = [nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 3)]
    net = nn.Sequential(*layers).to(DT)
    return net, torch.randn(24, 5, dtype=DT), torch.randn(24, 3, dtype=DT)


@pytest.mark.parametrize("solver", ["dense", "cg"])
def test_fixed_subset_solve_equals_the_dense_reduced_problem(solver: str) -> None:
    net, x, y = _mlp()
    syms = nf.find_symmetries(net, x)
    stats = nf.collect_stats(net, syms, _mse, x, y, estimator="reference")
    nm = NoiseModel.create(batch_size=8, **HYPER)
    n0, n1 = syms.names
    nan = float("nan")
    fixed = {
        n0: torch.tensor([0.3, nan, -0.2, nan, nan, 0.1], dtype=DT),
        n1: torch.tensor([nan, 0.5, nan, nan, nan, nan, nan], dtype=DT),
    }
    sol = nf.solve_equilibrium(syms, stats, nm, options=nf.SolveOptions(fixed=fixed, solver=solver))
    ref = _reduced_newton(syms, stats, nm, fixed)
    for n in (n0, n1):
        lam = torch.as_tensor(sol.elements[n]).cpu()
        held = torch.isfinite(fixed[n])
        assert torch.equal(lam[held], fixed[n][held])  # held exactly
        assert torch.allclose(lam, ref[n], rtol=0, atol=1e-9), (lam - ref[n]).abs().max()
    free = nf.solve_equilibrium(syms, stats, nm, options=nf.SolveOptions(solver=solver))
    assert not torch.allclose(torch.as_tensor(free.elements[n0]).cpu(), ref[n0], atol=1e-3)


def test_fixed_is_checked() -> None:
    net, x, y = _mlp()
    syms = nf.find_symmetries(net, x)
    stats = nf.collect_stats(net, syms, _mse, x, y, estimator="reference")
    n0 = syms.names[0]
    kw: dict[str, Any] = {"batch_size": 8, **HYPER}
    with pytest.raises(ValueError, match=r"'nope', which is not in the set"):
        nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(fixed={"nope": [0.0]}))
    with pytest.raises(ValueError, match=r"has shape \(2,\); expected \(6,\)"):
        nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(fixed={n0: [0.0, 1.0]}))
    with pytest.raises(ValueError, match=r"has shape \(2, 3\); expected \(6,\)"):
        nf.solve_equilibrium(
            syms, stats, **kw, options=nf.SolveOptions(fixed={n0: torch.zeros(2, 3)})
        )
    with pytest.raises(ValueError, match=r"has 1 infinite entries; expected finite"):
        nf.solve_equilibrium(
            syms, stats, **kw, options=nf.SolveOptions(fixed={n0: [float("inf")] + [0.0] * 5})
        )


def test_fixed_in_coupled_sweeps() -> None:
    """A rotation sharing a weight with a rescaling: the held generators stay where held."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 2)).to(DT)
    x, y = torch.randn(32, 4, dtype=DT), torch.randn(32, 2, dtype=DT)
    syms = nf.find_symmetries(net, x)
    assert {s.family.value for s in syms} == {"rotation", "rescaling"}
    (name,) = [n for n, s in syms.items() if s.family.value == "rescaling"]
    fixed = {name: torch.tensor([0.2, float("nan"), -0.3, float("nan"), 0.0], dtype=DT)}
    stats = nf.collect_stats(net, syms, _mse, x, y, estimator="reference")
    sol = nf.solve_equilibrium(
        syms, stats, batch_size=8, **HYPER, options=nf.SolveOptions(fixed=fixed)
    )
    assert sol.converged and sol.iterations > 1
    lam = torch.as_tensor(sol.elements[name]).cpu()
    held = torch.isfinite(fixed[name])
    assert torch.allclose(lam[held], fixed[name][held], rtol=0, atol=1e-15)
    rot = [n for n in syms.names if n != name]
    with pytest.raises(TypeError, match="a rotation symmetry; only diagonal generators"):
        nf.solve_equilibrium(
            syms, stats, batch_size=8, **HYPER, options=nf.SolveOptions(fixed={rot[0]: [0.0]})
        )
    nf.teleport(net, sol)  # (the statistics are those of before: refused from here on)
    after = nf.noether_flow(
        syms, nf.collect_stats(net, syms, _mse, x, y, estimator="reference"), batch_size=8, **HYPER
    )
    assert float(after[name][~held].abs().max()) < 1e-10
    assert float(after[name][held].abs().max()) > 1e-4  # held away from equilibrium
    assert all(float(after[n].abs().max()) < 1e-10 for n in rot)


# -- solve_within_eps --------------------------------------------------------------------------
class _NormNet(nn.Module):
    """Linear → norm → ReLU, twice, then a linear head: scale invariances and rescalings.

    BatchNorm's eps is chosen so that the eps-safe intervals (τ = 1e-6, channel variances
    about 0.05) cut through the solved λ: some channels are clipped, some are not.
    """

    def __init__(self, norm: str) -> None:
        super().__init__()
        make = {
            "batchnorm": lambda d: nn.BatchNorm1d(d, eps=2e-7),
            "layernorm": lambda d: nn.LayerNorm(d, eps=1e-3),
        }[norm]
        self.fc1, self.n1 = nn.Linear(6, 10), make(10)
        self.fc2, self.n2 = nn.Linear(10, 10), make(10)
        self.head = nn.Linear(10, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.n1(self.fc1(x)))
        return self.head(torch.relu(self.n2(self.fc2(h))))


def _outputs(model: nn.Module, x: Tensor) -> dict[bool, Tensor]:
    out = {}
    for train in (True, False):
        with torch.no_grad():
            out[train] = copy.deepcopy(model).train(train)(x)
    return out


def _gross(syms: Any, stats: Any, nm: NoiseModel) -> dict[str, Tensor]:
    """Σ_k |a_kj| (κθ_k² + M_kk) per generator: the size of the terms the flow balances."""
    out = {}
    for name, s in syms.items():

        def a_dot(lam: Tensor, s: Any = s) -> Tensor:
            return torch.cat([e.reshape(-1) for e in _exponents(s, lam).values()])

        lam0 = torch.zeros(s.num_generators, dtype=DT)
        a = torch.autograd.functional.jacobian(a_dot, lam0).abs()  # [coordinates, J]
        parts = []
        for p in _exponents(s, lam0):
            m = nm.diag(stats.mean[p].to(DT), stats.block("diagonal").sq[p].to(DT))
            parts.append((nm.kappa * p.detach().to(DT).square() + m.clamp(min=0)).reshape(-1))
        out[name] = torch.cat(parts) @ a
    return out


def _setup(norm: str) -> tuple[nn.Module, Tensor, Tensor, dict[str, Any]]:
    """The model in training mode, a batch and the estimator that applies to it."""
    torch.manual_seed(0)
    model = _NormNet(norm).to(DT).train()
    x = torch.randn(64, 6, dtype=DT)
    y = torch.randn(64, 3, dtype=DT)
    with torch.no_grad():
        for _ in range(3):  # running statistics away from their initial values
            model(x + 0.1 * torch.randn_like(x))
    est: dict[str, Any] = (
        {"estimator": "microbatch", "micro_batch_size": 8}  # BatchNorm couples the samples
        if norm == "batchnorm"
        else {"estimator": "reference"}
    )
    return model, x, y, est


@pytest.mark.parametrize("norm", ["batchnorm", "layernorm"])
def test_after_solve_within_eps_the_unclipped_flows_vanish(norm: str) -> None:
    """BatchNorm in training mode (micro-batch statistics) and LayerNorm (reference).

    Flows relative to Σ_k |a_kj|(κθ_k² + M_kk): before the teleport O(1); after plain
    clipping still > 1e-3 on the coupled generators; after the re-solve ≤ 10τ (eps perturbs
    the statistics that the solver transports exactly by about τ; measured 4e-6 / 9e-7 for
    BatchNorm / LayerNorm at τ = 1e-6, 2e-7 / 9e-8 at τ = 1e-7).
    """
    model, x, y, est = _setup(norm)
    syms = nf.find_symmetries(model, x)
    assert {s.family.value for s in syms} == {"scale", "rescaling"}
    nm = NoiseModel.create(batch_size=8, **HYPER)
    stats = nf.collect_stats(model, syms, _mse, x, y, **est)
    sol, report = nf.solve_within_eps(model, syms, stats, x, nm, tolerance=1e-6)
    assert sol.converged and not sol.at_infinity
    clipped = {c.name: c.generators for c in report.clipped}
    assert clipped and report.resolves >= 1
    n_free_scale = sum(
        s.num_generators - len(clipped.get(n, [])) for n, s in syms.items() if n.startswith("scale")
    )
    if norm == "batchnorm":
        assert n_free_scale > 0  # some scale generators stay inside their interval
    bounds = eps_bounds(model, syms, x, tolerance=1e-6)
    shrink = 0.5**report.halvings
    for i, (lo, hi) in bounds.items():
        lam = torch.as_tensor(sol.elements[syms.names[i]]).cpu()
        assert bool(((lam >= lo * shrink) & (lam <= hi * shrink)).all())
        gens = clipped.get(syms.names[i], [])
        at_bound = (lam[gens] == lo[gens] * shrink) | (lam[gens] == hi[gens] * shrink)
        assert bool(at_bound.all())
    before = _outputs(model, x)
    flows_before = nf.noether_flow(syms, stats, nm)
    plain, _ = nf.clip_to_eps(model, nf.solve_equilibrium(syms, stats, nm), x, tolerance=1e-6)
    handle = nf.teleport(model, plain)
    flows_plain = nf.noether_flow(syms, nf.collect_stats(model, syms, _mse, x, y, **est), nm)
    handle.undo()
    nf.teleport(model, sol)
    after = _outputs(model, x)
    for train in (True, False):
        change = float((after[train] - before[train]).norm() / before[train].norm())
        assert change <= 1e-6, (train, change)
    new_stats = nf.collect_stats(model, syms, _mse, x, y, **est)
    flows = nf.noether_flow(syms, new_stats, nm)
    gross = _gross(syms, new_stats, nm)
    worst = {"before": 0.0, "clip only": 0.0, "re-solved": 0.0}
    for name in syms.names:
        free = torch.ones(syms[name].num_generators, dtype=torch.bool)
        free[clipped.get(name, [])] = False
        for key, fl in (("before", flows_before), ("clip only", flows_plain), ("re-solved", flows)):
            rel = (fl[name] / gross[name])[free].abs()
            worst[key] = max([worst[key], *rel.tolist()])
    assert worst["before"] > 1e-2 and worst["clip only"] > 1e-3, worst  # the bug, measured
    assert worst["re-solved"] <= 1e-5, worst  # eps perturbs the transported statistics by ~τ


def test_teleporter_with_eps_tolerance() -> None:
    model, x, y, est = _setup("batchnorm")
    syms = nf.find_symmetries(model, x)
    nm = NoiseModel.create(batch_size=8, **HYPER)
    stats = nf.collect_stats(model, syms, _mse, x, y, level="solve", **est)
    want, _ = nf.solve_within_eps(model, syms, stats, x, nm, tolerance=1e-6)
    before = _outputs(model, x)
    tp = nf.EquilibriumTeleport(
        model, syms, _mse, batch_size=8, eps_tolerance=1e-6, time="continuous", **HYPER, **est
    )
    sol = tp.teleport(x, y)
    report = tp.history[-1].eps
    assert report is not None and report.clipped and report.resolves >= 1
    for name in syms.names:
        assert torch.allclose(
            torch.as_tensor(sol.elements[name]), torch.as_tensor(want.elements[name]), atol=1e-12
        )
    after = _outputs(model, x)
    assert all(
        float((after[t] - before[t]).norm() / before[t].norm()) <= 1e-6 for t in (True, False)
    )
    with pytest.raises(ValueError, match=r"tolerance must be in \(0, 1\).*got 2"):
        nf.EquilibriumTeleport(model, syms, _mse, batch_size=8, eps_tolerance=2, **HYPER)


def test_intervals_are_halved_until_the_change_is_within_tolerance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Intervals 8× too wide (patched): the measured change exceeds τ, the halving restores it."""
    import noetherflow.teleportation.eps as es

    model, x, y, est = _setup("batchnorm")
    syms = nf.find_symmetries(model, x)
    nm = NoiseModel.create(batch_size=8, **HYPER)
    stats = nf.collect_stats(model, syms, _mse, x, y, **est)
    true = eps_bounds(model, syms, x, tolerance=1e-6)
    wide = {i: (8 * lo, 8 * hi) for i, (lo, hi) in true.items()}
    monkeypatch.setattr(es, "eps_bounds", lambda *a, **k: wide)
    sol, report = nf.solve_within_eps(model, syms, stats, x, nm, tolerance=1e-6)
    assert report.halvings >= 1
    assert max(report.change_train, report.change_eval) <= 1e-6
    shrink = 0.5**report.halvings
    for c in report.clipped:
        i = syms.names.index(c.name)
        lo, hi = (b[c.generators] * shrink for b in wide[i])
        assert bool(((c.after[c.generators] == lo) | (c.after[c.generators] == hi)).all())
        assert torch.equal(torch.as_tensor(sol.elements[c.name]).cpu(), c.after)
    with pytest.raises(ValueError, match=r"tolerance must be in \(0, 1\).*got 0"):
        nf.solve_within_eps(model, syms, stats, x, nm, tolerance=0)
    with pytest.raises(TypeError, match="fixed= is set by this function"):
        nf.solve_within_eps(model, syms, stats, x, nm, fixed={})


def test_unchecked_teleport_of_a_scale_invariance_before_a_norm_warns() -> None:
    """An unchecked solution moving a scale invariance before BatchNorm warns (and the output
    change it warns about is real); the eps-checked one neither warns nor changes more than τ."""
    model, x, y, est = _setup("batchnorm")
    syms = nf.find_symmetries(model, x)
    nm = NoiseModel.create(batch_size=8, **HYPER)
    stats = nf.collect_stats(model, syms, _mse, x, y, **est)
    before = _outputs(model, x)
    plain = nf.solve_equilibrium(syms, stats, nm)
    assert plain.eps_tolerance is None
    with pytest.warns(nf.EpsWarning, match=r"scale invariance\(s\) before a normalisation"):
        handle = nf.teleport(plain)
    after = _outputs(model, x)
    assert float((after[True] - before[True]).norm() / before[True].norm()) > 1e-6
    handle.undo()
    checked, _ = nf.solve_within_eps(model, syms, stats, x, nm, tolerance=1e-6)
    assert checked.eps_tolerance == 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error", nf.EpsWarning)
        nf.teleport(checked)
    with pytest.raises(ValueError, match=r"tolerance='1e-6' is a str; expected a number"):
        nf.solve_within_eps(model, syms, stats, x, nm, tolerance="1e-6")  # type: ignore[arg-type]
    # LayerNorm with eps = 0: the invariance is exact, so an unchecked teleport says nothing
    # (PyTorch refuses BatchNorm with eps = 0 in training mode)
    model, x, y, est = _setup("layernorm")
    for mod in model.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            mod.eps = 0.0
    syms = nf.find_symmetries(model, x)
    stats = nf.collect_stats(model, syms, _mse, x, y, **est)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nf.EpsWarning)
        nf.teleport(nf.solve_equilibrium(syms, stats, nm))
