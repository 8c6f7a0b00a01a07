"""Combined directions at infinity of the joint diagonal solve (issue #15).

F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κθ_k² e^{2a_k·λ}) has no minimiser iff some d has
a_k·d ≥ 0 at every present M, ≤ 0 at every present κθ², strictly somewhere (the recession
condition of ``kernels/_diag_recession.py``). Random layer chains get such a direction
injected on 2–3 coupled generators, each bounded alone: both solvers must report it (up to
scale), freeze it and agree on the rest. Random sign patterns are checked against an
independent oracle, Stiemke's alternative on the raw terms (F attains its minimum iff
Σ_t y_t s_t = 0 for some y > 0): no false positives, no misses, and the remainder finite.
Float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog
from test_solver_cg import CG, DENSE, _agree, _chain, _Sym

from noetherflow.kernels._diag_newton import solve_diag
from noetherflow.kernels._diag_problem import _DiagProblem, _Grid, _spread

DT = torch.float64


def _slopes(prob: _DiagProblem, g: Any, d: torch.Tensor) -> torch.Tensor:
    """a_k·d for every coordinate of grid ``g`` (``[n0, n1]``)."""
    n0, n1 = g.m.shape
    return _spread(d, g.rows, n0)[:, None] + _spread(d, g.cols, n1)[None, :]


def _inject(prob: _DiagProblem, d: torch.Tensor) -> None:
    """Drop every term that grows along ``d``: then F decreases along d (strictly where a
    term decays) while terms with a_k·d = 0 keep both sides."""
    for g in prob.grids:
        s = _slopes(prob, g, d)
        g.c[s > 0] = 0.0  # κθ² e^{2a·λ} would grow
        g.m[s < 0] = 0.0  # M e^{−2a·λ} would grow


def _oracle_bounded(prob: _DiagProblem, free: torch.Tensor) -> bool:
    """Stiemke: F restricted to the ``free`` generators attains its minimum iff some y ≥ 1
    (any y > 0, scaled) has Σ_t y_t s_t = 0 over the present terms (s = −a for M, +a for κθ²).
    Dense, every coordinate its own term: independent of the solver's pre-check and LP."""
    cols = free.nonzero().squeeze(1)
    rows = []
    for g in prob.grids:
        n0, n1 = g.m.shape
        a = torch.zeros(n0, n1, prob.n, dtype=DT)
        for off, _, b, sg in g.rows:
            a[torch.arange(n0), :, off + torch.arange(n0) // b] += sg
        for off, _, b, sg in g.cols:
            a[:, torch.arange(n1), off + torch.arange(n1) // b] += sg
        rows += [-a[g.m > 0], a[g.c > 0]]
    s = torch.cat(rows)[:, cols].numpy()
    s = s[np.abs(s).sum(1) > 0]
    if not s.shape[0]:
        return True
    res = linprog(np.zeros(s.shape[0]), A_eq=s.T, b_eq=np.zeros(s.shape[1]), bounds=(1.0, None))
    assert res.status in (0, 2), res.message
    return bool(res.status == 0)


def _direction(prob: _DiagProblem, reports: list[Any], names: dict[Any, str]) -> torch.Tensor:
    """The reported directions laid out over all generators (``[n]``)."""
    out = torch.zeros(prob.n, dtype=DT)
    by_name = {r.name: r for r in reports}
    for s, off in prob.offsets.items():
        if names[s] in by_name:
            out[off : off + s.num_generators] = by_name[names[s]].direction
    return out


def _is_recession(prob: _DiagProblem, d: torch.Tensor) -> bool:
    """F is non-increasing along ``d`` and strictly decreasing in some present term."""
    strict = False
    for g in prob.grids:
        s = _slopes(prob, g, d)
        if bool((s[g.m > 0] < -1e-9).any()) or bool((s[g.c > 0] > 1e-9).any()):
            return False
        strict = strict or bool((s[g.m > 0] > 1e-9).any()) or bool((s[g.c > 0] < -1e-9).any())
    return strict


def _injected(kind: int, widths: list[int], pick: int, prob: _DiagProblem) -> torch.Tensor:
    """A combined direction on 2–3 coupled generators.

    0: neuron i of layer 0 and j of layer 1 together (+, +; coupled through W₁[j, i]);
    1: a neuron in each of three layers (+, +, +); 2: row 2p of layer 0 against the pair
    symmetry p that also scales it (+, −; two symmetries on the same axis).
    """
    d = torch.zeros(prob.n, dtype=DT)
    offs = np.cumsum([0, *widths[:-1]]).tolist()
    i, j = pick % widths[0], (pick // 7) % widths[1]
    if kind == 2:
        p = i // 2
        d[2 * p], d[sum(widths) + p] = 1.0, -1.0
        return d
    d[offs[0] + i], d[offs[1] + j] = 1.0, 1.0
    if kind == 1:
        d[offs[2] + (pick // 49) % widths[2]] = 1.0
    return d


@pytest.mark.parametrize("kind", [0, 1, 2])
@settings(max_examples=5, deadline=None)
@given(
    st.integers(0, 10_000),
    st.lists(st.integers(2, 6), min_size=3, max_size=4),
    st.integers(0, 10_000),
    st.integers(1, 2),
)
def test_injected_combined_direction_is_found_by_both_solvers(
    kind: int, seed: int, widths: list[int], pick: int, block: int
) -> None:
    widths = [w + (w % 2) if i == 0 else w for i, w in enumerate(widths)]
    prob, names = _chain(seed, widths, block, shared=kind == 2)
    d0 = _injected(kind, widths, pick, prob)
    _inject(prob, d0)
    assert not bool(prob.one_sided().ne(0).any())  # every generator bounded alone
    assert not _oracle_bounded(prob, torch.ones(prob.n, dtype=torch.bool))
    res = {}
    for method in (DENSE, CG):
        info: dict[str, Any] = {}
        lam, reps, rel, ok, _ = solve_diag(
            prob, names, tol=1e-12, max_iter=200, method=method, info=info
        )
        assert info["recession_lp"] and ok and rel <= 1e-12
        d = _direction(prob, reps, names)
        assert torch.allclose(d, d0, rtol=0, atol=1e-9), (d, d0)  # same scale: max |d_j| = 1
        touched = {names[s] for s, o in prob.offsets.items() if d0[o : o + s.num_generators].any()}
        for r in reps:
            assert set(r.coupled) == touched - {r.name} and "combined" in r.reason
        assert lam[d0 != 0].eq(0).all()
        res[method] = lam
    assert _oracle_bounded(prob, d0 == 0)  # the remainder has a finite equilibrium
    assert _agree(res[CG], res[DENSE])


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
    st.booleans(),
    st.sampled_from([0.05, 0.2, 0.5]),
)
def test_random_sign_patterns_match_the_stiemke_oracle(
    seed: int, widths: list[int], shared: bool, p: float
) -> None:
    """Terms dropped at random (each M and κθ² with probability ``p``): a report iff the
    oracle finds F's infimum not attained; every reported direction decreases F; after
    freezing what is reported the oracle finds the rest bounded, and the solvers agree on it
    (every term of F, as drops may leave directions along which F is flat)."""
    widths = [w + (w % 2) if shared and i == 0 else w for i, w in enumerate(widths)]
    prob, names = _chain(seed, widths, 1, shared=shared)
    g = torch.Generator().manual_seed(seed)
    for gr in prob.grids:
        gr.m[torch.rand(gr.m.shape, generator=g) < p] = 0.0
        gr.c[torch.rand(gr.c.shape, generator=g) < p] = 0.0
    bounded = _oracle_bounded(prob, torch.ones(prob.n, dtype=torch.bool))
    res = {}
    for method in (DENSE, CG):
        lam, reps, rel, ok, _ = solve_diag(prob, names, tol=1e-12, max_iter=200, method=method)
        assert ok and rel <= 1e-12
        assert bool(reps) is not bounded
        d = _direction(prob, reps, names)
        assert bounded or _is_recession(prob, d)  # one-sided rays and combined parts, summed
        assert _oracle_bounded(prob, d == 0)
        assert lam[d != 0].eq(0).all()
        res[method] = lam
    # The same equilibrium up to F's flat directions (random drops leave some): every term.
    for (_, lo, hi), (_, lo2, hi2) in zip(prob.terms(res[CG]), prob.terms(res[DENSE]), strict=True):
        assert torch.allclose(lo, lo2, rtol=1e-9, atol=0) and torch.allclose(hi, hi2, rtol=1e-9)


def test_bounded_problem_needing_the_lp_has_no_report() -> None:
    """A second symmetry on the rows of layer 0 (coordinates read by two generators of one
    axis): the pinning pre-check cannot decide, the LP runs and finds F bounded."""
    prob, names = _chain(5, [4, 3], 1, shared=True)
    info: dict[str, Any] = {}
    _, reps, rel, ok, _ = solve_diag(prob, names, tol=1e-12, max_iter=200, info=info)
    assert info["recession_lp"] and not reps and ok and rel <= 1e-12
    assert _oracle_bounded(prob, torch.ones(prob.n, dtype=torch.bool))


def test_pinned_problems_skip_the_lp() -> None:
    """The fast path: a chain with weight decay, and one without (M only), are proved
    bounded by the pre-check alone."""
    for zero_c in (False, True):
        prob, names = _chain(2, [5, 4, 3], 2, shared=False)
        if zero_c:
            for gr in prob.grids:
                gr.c.zero_()
        info: dict[str, Any] = {}
        *_, ok, _ = solve_diag(prob, names, tol=1e-12, max_iter=200, info=info)
        assert ok and info["recession_lp"] is False


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_held_generators_and_combined_directions(seed: int) -> None:
    """``fixed`` with a combined direction (the bnfix × recession merge): holding one of its
    generators leaves the other bounded alone, so nothing is at infinity and both solvers
    agree; holding a generator outside it keeps the direction reported, the held value in
    place, and no held generator in any report."""
    widths = [4, 3, 5]
    prob, names = _chain(seed, widths, 1, shared=False)
    d0 = _injected(0, widths, seed, prob)
    _inject(prob, d0)
    inside = int(d0.nonzero()[0])
    outside = int((d0 == 0).nonzero()[-1])
    for held_at, expect_report in ((inside, False), (outside, True)):
        fixed = torch.full((prob.n,), float("nan"), dtype=DT)
        fixed[held_at] = 0.3
        res = {}
        for method in (DENSE, CG):
            lam, reps, rel, ok, _ = solve_diag(
                prob, names, tol=1e-12, max_iter=200, method=method, fixed=fixed
            )
            assert ok and rel <= 1e-12
            assert float(lam[held_at]) == 0.3
            d = _direction(prob, reps, names)
            assert float(d[held_at]) == 0.0
            if expect_report:
                assert torch.allclose(d, d0, rtol=0, atol=1e-9)
            else:
                assert not reps
                assert _oracle_bounded(prob, torch.arange(prob.n) != held_at)
            res[method] = lam
        assert _agree(res[CG], res[DENSE])


def test_a_single_generator_held_back_only_by_negligible_terms_is_not_called_combined() -> None:
    """Restoring terms each below the cut-off but summing above it: ``one_sided`` (sums)
    calls the generator bounded, the recession condition (each term) finds it alone at
    infinity. The report says why, and does not call one generator a combined direction."""
    g = _Grid(
        torch.full((1, 1000), 1e-12, dtype=DT), torch.ones(1, 1000, dtype=DT), [(0, 1, 1, 1.0)], []
    )
    s = _Sym(1)
    prob = _DiagProblem(1, {s: 0}, [g])
    assert not bool(prob.one_sided().ne(0).any())
    for method in (DENSE, CG):
        lam, reps, _, ok, _ = solve_diag(prob, {s: "s"}, tol=1e-12, max_iter=200, method=method)
        assert ok and lam.eq(0).all() and len(reps) == 1
        assert reps[0].direction.tolist() == [-1.0] and reps[0].coupled == ()
        assert "below 1e-13" in reps[0].reason and "combined" not in reps[0].reason
