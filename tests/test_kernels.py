"""Kernels and registries: one kernel per family, resolved by MRO; one layer registry.

Every fast path is checked against the torch.func reference (per-sample gradients) in
float64 at 1e-12: a custom layer type registered with one call (weights stored [in, out],
like Hugging Face's Conv1D), a new diagonal family declared in one class (no kernel needed),
and a new family with its own kernel (a closed-form solve, checked against the built-in
diagonal kernel's Newton solve of the same problem).
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import snippets
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.kernels import (
    InfinityReport,
    kernel_for,
    register_kernel,
)
from noetherflow.kernels.diagonal import DiagonalKernel
from noetherflow.stats import LayerHandler, register_layer
from noetherflow.stats.registry import linear_factors
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry

DT = torch.float64

TransposedLinear = snippets.load("new_layer").TransposedLinear
TransposedRescaling = snippets.load("diagonal_family").TransposedRescaling
GroupScale = snippets.load("new_family").GroupScale
GroupScaleStats = snippets.load("new_family").GroupScaleStats


def rel(a: Tensor, b: Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# -- a layer type stored [in, out] (as Hugging Face's Conv1D), registered with one call ------


# -- a new diagonal family: one class, no kernel (the diagonal kernel is found by MRO) --------


def _transposed_problem(
    tokens: bool,
) -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(
        TransposedLinear(5, 6), nn.ReLU(), TransposedLinear(6, 4), TransposedLinear(4, 3)
    )
    rot = nf.DoubleRotation.from_blocks(
        [nf.Block(m[2].weight, 1, 0, 4), nf.Block(m[2].bias, 0, 0, 4)],
        [nf.Block(m[3].weight, 0, 0, 4)],
        label="rot",
    )
    syms = nf.SymmetrySet([TransposedRescaling(m[0], m[2]), rot])
    shape = (7, 3, 5) if tokens else (9, 5)
    x = torch.randn(*shape, dtype=DT)
    y = torch.randn(*shape[:-1], 3, dtype=DT)
    return m, syms, x, y


@pytest.mark.parametrize("tokens", [False, True])
@pytest.mark.parametrize("level", ["diag", "solve", "neuron"])
def test_registered_layer_matches_reference(tokens: bool, level: str) -> None:
    m, syms, x, y = _transposed_problem(tokens)
    syms.verify(m, x)  # both symmetries are exact
    lf = nn.MSELoss()
    ref = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    hk = nf.collect_stats(m, syms, lf, x, y, estimator="hooks", level=level)
    for p, v in ref.mean.items():
        assert rel(hk.mean[p], v) < 1e-12
    for p, v in hk.sq.items():
        assert rel(v, ref.sq[p]) < 1e-12
    for (p, ax), v in hk.sq_axis.items():
        assert rel(v, ref.block("diagonal").axis_sq(p, ax)) < 1e-12
    for s, (w, u) in ref.side.items():
        assert rel(hk.side[s][0], w) < 1e-12 and rel(hk.side[s][1], u) < 1e-12
    for p, v in ref.samples.items():
        assert rel(hk.samples[p], v) < 1e-12
    # the set is coupled (the rotation shares m[2].weight): per-sample gradients are kept
    assert set(hk.samples) == set(syms.params())
    noise = nf.NoiseModel.create(lr=0.05, batch_size=4, weight_decay=1e-3)
    fr, fh = nf.noether_flow(syms, ref, noise), nf.noether_flow(syms, hk, noise)
    for k in fr:
        assert rel(fh[k], fr[k]) < 1e-11


def test_registered_layer_diagonal_only_levels() -> None:
    """Without coupling, 'neuron' keeps per-neuron sums only, from the transposed factors."""
    m, _, x, y = _transposed_problem(False)
    syms = nf.SymmetrySet([TransposedRescaling(m[0], m[2])])
    lf = nn.MSELoss()
    ref = nf.collect_stats(m, syms, lf, x, y, estimator="reference")
    neu = nf.collect_stats(m, syms, lf, x, y, level="neuron")
    assert not neu.sq and not neu.samples
    assert {(tuple(p.shape), ax) for p, ax in neu.sq_axis} == {((5, 6), 1), ((6,), 0), ((6, 4), 0)}
    for (p, ax), v in neu.sq_axis.items():
        assert rel(v, ref.block("diagonal").axis_sq(p, ax)) < 1e-12
    kw = {"lr": 0.05, "batch_size": 4, "weight_decay": 1e-3}
    a = nf.solve_equilibrium(syms, neu, **kw)
    b = nf.solve_equilibrium(syms, ref, **kw)
    assert rel(a.elements["trescale"], b.elements["trescale"]) < 1e-10


def test_layer_registry_refuses_silent_overwrite() -> None:
    with pytest.raises(ValueError, match="overwrite=True"):
        register_layer(TransposedLinear, LayerHandler(linear_factors, transposed=True))
    register_layer(TransposedLinear, LayerHandler(linear_factors, transposed=True), overwrite=True)


def test_unregistered_layer_names_the_registry() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3, dtype=DT))

        def forward(self, x: Tensor) -> Tensor:
            return x * self.weight

    m = nn.Sequential(Odd(), nn.Linear(3, 2).to(DT))
    syms = nf.SymmetrySet([nf.ScaleInvariance([m[0].weight])])
    x, y = torch.randn(4, 3, dtype=DT), torch.randn(4, 2, dtype=DT)
    with pytest.raises(nf.UnsupportedLayerError, match="register_layer"):
        nf.collect_stats(m, syms, nn.MSELoss(), x, y)


# -- kernel registry --------------------------------------------------------------------------
def test_kernel_registry_mro_and_overwrite() -> None:
    assert isinstance(kernel_for(nf.Rescaling), DiagonalKernel)
    assert isinstance(kernel_for(TransposedRescaling), DiagonalKernel)  # by MRO
    assert kernel_for(nf.DoubleRotation).name == "rotation"
    assert kernel_for(nf.DenseSymmetry).name == "dense"
    with pytest.raises(ValueError, match="overwrite=True"):
        register_kernel(DiagonalSymmetry, DiagonalKernel())

    class Lonely(Symmetry):
        pass

    with pytest.raises(TypeError, match="register_kernel"):
        kernel_for(Lonely)


# -- a new family with its own kernel: one generator scaling a group, closed-form solve -------


def test_new_family_with_its_own_kernel_matches_the_diagonal_kernel() -> None:
    """The closed form of a new kernel against the Newton solve of the same problem."""
    torch.manual_seed(3)
    ln = nn.LayerNorm(5, eps=0.0, elementwise_affine=False)
    m = nn.Sequential(nn.Linear(4, 5), ln, nn.Linear(5, 2))
    m = m.to(DT)
    x, y = torch.randn(16, 4, dtype=DT), torch.randn(16, 2, dtype=DT)
    mine = nf.SymmetrySet([GroupScale([m[0].weight, m[0].bias], label="g")])
    builtin = nf.SymmetrySet([nf.ScaleInvariance([m[0].weight, m[0].bias], label="g")])
    mine.verify(m, x)
    noise = nf.NoiseModel.create(lr=0.1, batch_size=4, weight_decay=1e-2)
    lf = nn.MSELoss()
    sa = nf.collect_stats(m, mine, lf, x, y, level="neuron")
    sb = nf.collect_stats(m, builtin, lf, x, y, estimator="reference")
    fa, fb = nf.noether_flow(mine, sa, noise), nf.noether_flow(builtin, sb, noise)
    assert rel(fa["g"].reshape(1), fb["g"]) < 1e-12
    a = nf.solve_equilibrium(mine, sa, noise)
    b = nf.solve_equilibrium(builtin, sb, noise)
    assert abs(float(a.elements["g"]) - float(b.elements["g"][0])) < 1e-10
    assert abs(float(a.distance["g"]) - float(b.distance["g"][0])) < 1e-10
    # teleport along the new family: the flow recomputed there vanishes
    nf.teleport(m, a)
    after = nf.noether_flow(mine, nf.collect_stats(m, mine, lf, x, y), noise)["g"]
    assert abs(float(after)) < 1e-10 * float(sa.block("group_scale").sq_total[mine["g"]])


# -- GradStats: blocks, legacy attributes, generic finiteness ----------------------------------
def test_gradstats_blocks_and_attributes() -> None:
    m, syms, x, y = _transposed_problem(False)
    st = nf.collect_stats(m, syms, nn.MSELoss(), x, y)
    assert set(st.blocks) == {"diagonal", "rotation"}
    assert st.sq is st.block("diagonal").sq  # type: ignore[union-attr]
    assert st.dense == {}  # no dense symmetry: an empty block field
    with pytest.raises(AttributeError, match="fields"):
        _ = st.no_such_field
    names = [what for what, _ in st.tensors()]
    assert "mean gradient" in names and any("rotation" in n for n in names)
    st.side[syms["rot"]] = (st.side[syms["rot"]][0] * math.nan, st.side[syms["rot"]][1])
    with pytest.raises(nf.NonFiniteGradientError, match="rotation side"):
        st.check_finite()


# -- NoiseModel and the deprecation of the dead model argument ---------------------------------
def _small() -> tuple[nn.Module, nf.SymmetrySet, nf.GradStats]:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(8, 3, dtype=DT), torch.randn(8, 2, dtype=DT)
    return m, syms, nf.collect_stats(m, syms, nn.MSELoss(), x, y)


@pytest.mark.parametrize("time", ["continuous", "discrete"])
def test_noise_model_equals_keyword_form(time: str) -> None:
    _, syms, st = _small()
    kw = {"lr": 0.1, "batch_size": 4, "weight_decay": 1e-3, "time": time}
    noise = nf.NoiseModel.create(**kw)  # type: ignore[arg-type]
    a, b = nf.noether_flow(syms, st, noise), nf.noether_flow(syms, st, **kw)  # type: ignore[arg-type]
    assert torch.equal(a["rescaling0"], b["rescaling0"])
    sa, sb = nf.solve_equilibrium(syms, st, noise), nf.solve_equilibrium(syms, st, **kw)  # type: ignore[arg-type]
    assert torch.equal(sa.elements["rescaling0"], sb.elements["rescaling0"])
    with pytest.raises(ValueError, match="pass one of them"):
        nf.noether_flow(syms, st, noise, lr=0.1)
    with pytest.raises(TypeError, match=r"NoiseModel\.create"):
        nf.noether_flow(syms, st)
    coef = nf.NoiseModel.from_coefficients(
        kappa=noise.kappa, c_mean=noise.c_mean, c_second=noise.c_second
    )
    assert torch.equal(nf.noether_flow(syms, st, coef)["rescaling0"], a["rescaling0"])


def test_old_model_argument_warns_and_gives_the_same_result() -> None:
    m, syms, st = _small()
    kw: dict[str, Any] = {"lr": 0.1, "batch_size": 4, "weight_decay": 1e-3}
    with pytest.warns(FutureWarning, match=r"charges\(syms\)"):
        c_old = nf.charges(m, syms)
    with pytest.warns(FutureWarning, match=r"noether_flow\(syms, stats, noise\)"):
        f_old = nf.noether_flow(m, syms, st, **kw)
    with pytest.warns(FutureWarning, match=r"solve_equilibrium\(syms, stats, noise\)"):
        s_old = nf.solve_equilibrium(None, syms, st, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(nf.charges(syms)["rescaling0"], c_old["rescaling0"])
        assert torch.equal(nf.noether_flow(syms, st, **kw)["rescaling0"], f_old["rescaling0"])
        s_new = nf.solve_equilibrium(syms, st, **kw)
    assert torch.equal(s_new.elements["rescaling0"], s_old.elements["rescaling0"])


@pytest.mark.parametrize("named", [True, False])
def test_teleport_acts_on_the_model_it_is_given(named: bool) -> None:
    m, syms, st = _small()
    if named:
        syms.param_names = {id(p): n for n, p in m.named_parameters()}
    sol = nf.solve_equilibrium(syms, st, lr=0.1, batch_size=4, weight_decay=1e-3)
    assert sol.max_distance() > 1e-3
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    twin = copy.deepcopy(m)
    nf.teleport(twin, sol)
    for n, p in m.named_parameters():  # the original is untouched
        assert torch.equal(p, before[n])
    moved = dict(twin.named_parameters())
    assert not torch.equal(moved["0.weight"], before["0.weight"])
    x = torch.randn(5, 3, dtype=DT)
    assert rel(twin(x), m(x)) < 1e-12  # the copy's function is unchanged
    nf.teleport(m, sol)  # and the original still accepts it: the same move
    for n, p in m.named_parameters():
        assert rel(p, moved[n]) < 1e-14


# -- what the monitor reads from a kernel: record, distance shape, at-infinity decoding -------
def test_monitor_records_from_kernels() -> None:
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2), nn.Linear(2, 2)).to(DT)
    ln = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4, eps=0.0, elementwise_affine=False))
    ln = ln.to(DT)
    syms = nf.SymmetrySet(
        [
            nf.Rescaling(m[0], m[2], label="r"),
            nf.DoubleRotation(m[2], m[3], label="rot"),
            nf.ScaleInvariance([ln[0].weight, ln[0].bias], label="s"),
        ]
    )
    kr, kq, ks = (kernel_for(syms[n]) for n in ("r", "rot", "s"))
    assert kr.distance_shape(syms["r"]) == (6,) and kq.distance_shape(syms["rot"]) == ()
    assert kq.matrix_valued and not kr.matrix_valued
    c = nf.charges(syms)
    assert torch.equal(kq.record(c["rot"]), c["rot"].norm())
    assert torch.equal(kr.record(c["r"]), c["r"])
    # diagonal: the generators that run off get an infinite distance
    d, k = ks.mark_infinity(torch.zeros(1, dtype=DT), InfinityReport("s", torch.ones(1), ""))
    assert k == 1 and torch.isinf(d).all()
    d, k = kr.mark_infinity(
        torch.ones(6, dtype=DT), InfinityReport("r", torch.tensor([0, 1, 0, 0, -1, 0.0]), "")
    )
    assert k == 2 and torch.isinf(d).sum() == 2 and d[0] == 1
    # rotation: the distance stays, k hidden directions are counted
    d, k = kq.mark_infinity(
        torch.tensor(0.5, dtype=DT), InfinityReport("rot", torch.eye(2)[:, :1], "")
    )
    assert k == 1 and float(d) == 0.5
    dense = nf.DenseSymmetry([m[3].bias], torch.eye(2, dtype=DT))
    d, k = kernel_for(dense).mark_infinity(
        torch.tensor(0.0), InfinityReport("d", torch.tensor(1.0), "")
    )
    assert k == 1 and torch.isinf(d)


def test_optimizer_state_transport_by_kernel() -> None:
    """Cotangents move as T^{-T} (checked against transport_grads_ on a batch of one);
    squared state moves exactly under a diagonal element and is refused by a rotation."""
    torch.manual_seed(4)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.Linear(2, 2)).to(DT)
    r = nf.Rescaling(m[0], m[2])
    q = nf.DoubleRotation(m[2], m[3])
    gen = torch.Generator().manual_seed(0)
    for s in (r, q):
        el = s.random_element(0.5, gen)
        state = {p: torch.randn_like(p) for p in s.params}
        want = {p: v.clone().unsqueeze(0) for p, v in state.items()}
        s.transport_grads_(el, want)
        assert kernel_for(s).transport_(s, el, state)
        for p in s.params:
            assert rel(state[p], want[p][0]) < 1e-14
    lam = r.random_element(0.5, gen)
    sq = {p: torch.rand_like(p) for p in r.params}
    g = {p: v.sqrt().clone() for p, v in sq.items()}
    assert kernel_for(r).transport_(r, lam, sq, squared=True)
    kernel_for(r).transport_(r, lam, g)
    for p in r.params:
        assert rel(sq[p], g[p].square()) < 1e-14
    assert not kernel_for(q).transport_(q, q.random_element(0.5, gen), {}, squared=True)


def test_gradstats_all_finite() -> None:
    _, syms, st = _small()
    assert st.all_finite()
    st.sq[syms.params()[0]] = st.sq[syms.params()[0]] * math.inf
    assert not st.all_finite()


def test_no_layer_switch_in_the_hook_collector() -> None:
    """The hook collector knows no layer class: it asks the layer registry."""
    root = Path(nf.__file__).resolve().parent
    collect = (root / "stats" / "collect.py").read_text(encoding="utf-8")
    assert not re.search(r"isinstance\([^)]*nn\.(Linear|Conv[123]d)", collect)
