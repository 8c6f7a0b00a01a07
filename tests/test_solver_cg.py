"""The matrix-free Newton–CG solver against the dense Newton reference (issue #15).

Random joint diagonal problems (layer chains, two symmetries on the same axis of a weight,
single generators at infinity; combined directions: ``test_solver_recession.py``), the
Hessian operator against the dense Hessian, and full solves through ``solve_equilibrium``
with ``solver="cg"`` and ``solver="dense"``, coupled sets included. Float64, agreement to
1e-9.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import noetherflow as nf
from noetherflow.kernels._diag_newton import DENSE_MAX, NewtonMethod, choose_method, solve_diag
from noetherflow.kernels._diag_problem import _DiagProblem, _Grid

DT = torch.float64
DENSE, CG = NewtonMethod.DENSE, NewtonMethod.CG


class _Sym:
    """A stand-in symmetry for ``_DiagProblem.offsets`` (only ``num_generators`` is read)."""

    def __init__(self, n: int) -> None:
        self.num_generators = n


def _chain(
    seed: int, widths: list[int], block: int, *, shared: bool, wild: bool = False
) -> tuple[_DiagProblem, dict[Any, str]]:
    """Rescalings of the hidden layers of a chain Linear(3, w1) → … → Linear(·, 2).

    Layer l's generators act on the rows of W_l and b_l (+1) and on the columns of W_{l+1}
    (−1; the last weight reads each neuron through ``block`` columns, a Flatten). With
    ``shared`` a second symmetry scales pairs of rows of W_1 and b_1 (+1 on the same axis as
    layer 1's rescaling: a coupled set). Magnitudes vary over four decades (``wild``: six).
    """
    g = torch.Generator().manual_seed(seed)
    decades = 6.0 if wild else 4.0

    def rnd(*shape: int) -> torch.Tensor:
        scale = 10 ** (decades * torch.rand(1, generator=g, dtype=DT).item() - decades / 2)
        return torch.rand(*shape, generator=g, dtype=DT) * scale + 1e-3 * scale

    syms = [_Sym(w) for w in widths]
    offs, n = [], 0
    for w in widths:
        offs.append(n)
        n += w
    grids: list[_Grid] = []
    extra: list[tuple[int, int, int, float]] = []
    offsets: dict[Any, int] = dict(zip(syms, offs, strict=True))
    if shared:
        pairs = _Sym(widths[0] // 2)
        offsets[pairs] = n
        extra = [(n, widths[0] // 2, 2, 1.0)]
        n += widths[0] // 2
    for layer, w in enumerate(widths):
        rows = [(offs[layer], w, 1, 1.0)] + (extra if layer == 0 else [])
        if layer == 0:
            grids.append(_Grid(rnd(w, 3), rnd(w, 3), rows, []))
        else:
            prev = widths[layer - 1]
            cols = [(offs[layer - 1], prev, 1, -1.0)]
            grids.append(_Grid(rnd(w, prev), rnd(w, prev), rows, cols))
        grids.append(_Grid(rnd(w, 1), rnd(w, 1), rows, []))
    last = widths[-1]
    grids.append(
        _Grid(rnd(2, last * block), rnd(2, last * block), [], [(offs[-1], last, block, -1.0)])
    )
    names = {s: f"s{i}" for i, s in enumerate(offsets)}
    return _DiagProblem(n, offsets, grids), names


def _agree(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-9) -> bool:
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.lists(st.integers(1, 7), min_size=1, max_size=4),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
)
def test_cg_matches_dense_on_random_chains(
    seed: int, widths: list[int], block: int, shared: bool, wild: bool
) -> None:
    widths = [w + (w % 2) if shared and i == 0 else w for i, w in enumerate(widths)]
    prob, names = _chain(seed, widths, block, shared=shared, wild=wild)
    ref = solve_diag(prob, names, tol=1e-12, max_iter=200, method=DENSE)
    info: dict[str, Any] = {}
    got = solve_diag(prob, names, tol=1e-12, max_iter=200, method=CG, info=info)
    assert info["method"] == "cg" and info["cg_iterations"]
    assert ref[3] and got[3] and ref[2] <= 1e-12 and got[2] <= 1e-12
    assert not ref[1] and not got[1]
    assume(float(ref[0].abs().max()) > 1e-3)  # compare real moves, not the identity
    assert _agree(got[0], ref[0])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(1, 6), min_size=2, max_size=4))
def test_cg_matches_dense_with_generators_at_infinity(seed: int, widths: list[int]) -> None:
    """Layer 0's first generators have no restoring term (κθ² = 0 on their rows, M = 0 on the
    columns reading them): reported at +∞, left at 0; the rest agree."""
    prob, names = _chain(seed, widths, 1, shared=False)
    k = max(1, widths[0] // 2)
    for gr in prob.grids:
        for off, _, _, _ in gr.rows:
            if off == 0:
                gr.c[:k] = 0.0
        for off, _, _, _ in gr.cols:
            if off == 0:
                gr.m[:, :k] = 0.0
    ref = solve_diag(prob, names, tol=1e-12, max_iter=200, method=DENSE)
    got = solve_diag(prob, names, tol=1e-12, max_iter=200, method=CG)
    for res in (ref, got):
        assert res[3] and res[2] <= 1e-12
        (rep,) = res[1]
        assert rep.name == "s0"
        assert rep.direction[:k].eq(1.0).all() and rep.direction[k:].eq(0.0).all()
        assert res[0][:k].eq(0.0).all()
    assert _agree(got[0], ref[0])


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 10_000),
    st.lists(st.integers(1, 6), min_size=1, max_size=3),
    st.integers(1, 3),
    st.booleans(),
)
def test_hessian_operator_matches_dense_hessian(
    seed: int, widths: list[int], block: int, shared: bool
) -> None:
    widths = [w + (w % 2) if shared and i == 0 else w for i, w in enumerate(widths)]
    prob, _ = _chain(seed, widths, block, shared=shared)
    g = torch.Generator().manual_seed(seed + 1)
    lam = 0.3 * torch.randn(prob.n, generator=g, dtype=DT)
    terms = prob.terms(lam)
    _, _, h = prob.derivatives(lam, terms=terms)
    op = prob.hessian_operator(terms)
    v = torch.randn(prob.n, generator=g, dtype=DT)
    assert torch.allclose(op.matvec(v), h @ v, rtol=1e-12, atol=1e-12 * float((h @ v).abs().max()))
    assert torch.allclose(op.diagonal, h.diagonal(), rtol=1e-12, atol=0)


def test_hessian_operator_one_generator_on_both_axes() -> None:
    """A square weight whose rows and columns one generator scales (a recurrent weight):
    the product is exact (the diagonal, a preconditioner only, may differ)."""
    g = torch.Generator().manual_seed(0)
    s = _Sym(4)
    grids = [
        _Grid(
            torch.rand(4, 4, generator=g, dtype=DT),
            torch.rand(4, 4, generator=g, dtype=DT),
            [(0, 4, 1, 1.0)],
            [(0, 4, 1, -1.0)],
        ),
        _Grid(
            torch.rand(4, 1, generator=g, dtype=DT),
            torch.rand(4, 1, generator=g, dtype=DT),
            [(0, 4, 1, 1.0)],
            [],
        ),
    ]
    prob = _DiagProblem(4, {s: 0}, grids)
    lam = torch.randn(4, generator=g, dtype=DT)
    terms = prob.terms(lam)
    _, _, h = prob.derivatives(lam, terms=terms)
    v = torch.randn(4, generator=g, dtype=DT)
    assert torch.allclose(prob.hessian_operator(terms).matvec(v), h @ v, rtol=1e-12, atol=1e-14)
    ref = solve_diag(prob, {s: "r"}, tol=1e-12, max_iter=100, method=DENSE)
    got = solve_diag(prob, {s: "r"}, tol=1e-12, max_iter=100, method=CG)
    assert ref[3] and got[3] and _agree(got[0], ref[0])


def test_cg_warm_start_and_auto_choice() -> None:
    prob, names = _chain(3, [6, 4, 5], 2, shared=True)
    cold = solve_diag(prob, names, tol=1e-12, max_iter=100, method=CG)
    warm = solve_diag(prob, names, tol=1e-12, max_iter=100, method=CG, init=cold[0])
    assert warm[3] and warm[4] == 1 and _agree(warm[0], cold[0], 1e-12)
    assert choose_method(NewtonMethod.AUTO, DENSE_MAX) is DENSE
    assert choose_method(NewtonMethod.AUTO, DENSE_MAX + 1) is CG
    assert choose_method(CG, 3) is CG and choose_method(DENSE, 10**6) is DENSE


# -- through solve_equilibrium ------------------------------------------------------------------
def _solve_both(syms: nf.SymmetrySet, stats: nf.GradStats, **kw: Any) -> None:
    ref = nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(solver="dense"))
    got = nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(solver="cg"))
    assert ref.converged and got.converged
    assert ref.max_distance() > 1e-2
    for name, el in ref.elements.items():
        assert _agree(torch.as_tensor(got.elements[name]), torch.as_tensor(el)), name
    assert [r.name for r in got.at_infinity] == [r.name for r in ref.at_infinity]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solve_equilibrium_cg_matches_dense_conv_bn(seed: int) -> None:
    """Conv → BN → ReLU → Conv → BN → ReLU → Linear (eval): channel rescalings of the
    BatchNorm affines and the convolutions, as find_symmetries detects them."""
    torch.manual_seed(seed)
    m = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Conv2d(6, 5, 3, padding=1),
        nn.BatchNorm2d(5),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(5 * 4 * 4, 3),
    ).double()
    with torch.no_grad():  # non-trivial running statistics
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
    m.eval()
    x, y = torch.randn(12, 3, 4, 4, dtype=DT), torch.randint(0, 3, (12,))
    syms = nf.find_symmetries(m, x)
    stats = nf.collect_stats(m, syms, nn.CrossEntropyLoss(), x, y, estimator="reference")
    _solve_both(syms, stats, lr=0.1, batch_size=12, weight_decay=1e-3)


def test_solve_equilibrium_cg_matches_dense_coupled_rescaling_rotation() -> None:
    """A rescaling (L1, L2) and a double rotation (L2, L3) share L2: the coupled sweep, with
    its joint diagonal step solved either way."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.Linear(5, 3)).double()
    syms = nf.SymmetrySet(
        [nf.Rescaling(m[0], m[2], label="r"), nf.DoubleRotation(m[2], m[3], label="q")]
    )
    assert syms.coupled_groups()
    x, y = torch.randn(32, 4, dtype=DT), torch.randn(32, 3, dtype=DT)
    stats = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    _solve_both(syms, stats, lr=0.05, batch_size=8, weight_decay=1e-2)


def test_solve_equilibrium_cg_matches_dense_with_scale_at_infinity() -> None:
    """Without weight decay the scale invariance of a Linear before a LayerNorm has its
    equilibrium at infinity (paper eq. 24): both solvers report it and leave it, and agree on
    the rescaling of the layers after it."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(4, 6),
        nn.LayerNorm(6, elementwise_affine=False),
        nn.Linear(6, 5),
        nn.ReLU(),
        nn.Linear(5, 3),
    ).double()
    x, y = torch.randn(16, 4, dtype=DT), torch.randn(16, 3, dtype=DT)
    syms = nf.find_symmetries(m, x)
    assert {s.family.value for s in syms} >= {"scale", "rescaling"}
    stats = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    kw: dict[str, Any] = {"lr": 0.05, "batch_size": 8, "weight_decay": 0.0, "time": "continuous"}
    ref = nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(solver="dense"))
    got = nf.solve_equilibrium(syms, stats, **kw, options=nf.SolveOptions(solver="cg"))
    scale = [n for n, s in syms.items() if s.family.value == "scale"]
    assert scale and sorted(r.name for r in ref.at_infinity) == sorted(scale)
    assert [r.name for r in got.at_infinity] == [r.name for r in ref.at_infinity]
    for r, q in zip(ref.at_infinity, got.at_infinity, strict=True):
        assert torch.equal(r.direction, q.direction)
    assert ref.converged and got.converged and ref.max_distance() > 1e-2
    for name, el in ref.elements.items():
        assert _agree(torch.as_tensor(got.elements[name]), torch.as_tensor(el)), name


def test_solve_equilibrium_rejects_unknown_solver() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    x, y = torch.randn(8, 3, dtype=DT), torch.randn(8, 2, dtype=DT)
    stats = nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")
    with pytest.raises(ValueError, match=r"solver='lu' is not supported; expected 'auto'"):
        nf.solve_equilibrium(
            syms, stats, lr=0.1, batch_size=8, options=nf.SolveOptions(solver="lu")
        )
