"""The uncoupled part of a solve reads θ without keeping float64 copies (issue 28).

Its symmetries are solved in one pass whose steps act on parameters no other step of the
pass reads, so θ need not move after them (``noetherflow.equilibrium._Float64Reads``): the
same solution, bit for bit, as with kept and moved copies; the model untouched; and where
the solution needs θ at the equilibrium (SGD momentum, discrete time: its momentum terms)
the part keeps its copies. Its per-neuron sums of θ² come from the parameter itself, with
no copy. A coupled block's ḡ is the statistics' own (a float64 copy), and its moved copies
are dropped once it is solved unless the momentum terms read them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from test_sample_factors import _gpt2

import noetherflow as nf
import noetherflow.equilibrium as eq
from noetherflow._sweep_plan import coupled_samples


def _same(a: nf.EquilibriumSolution, b: nf.EquilibriumSolution) -> None:
    assert [i for i, _ in a.steps] == [i for i, _ in b.steps]
    for (_, x), (_, y) in zip(a.steps, b.steps, strict=True):
        assert torch.equal(torch.as_tensor(x), torch.as_tensor(y))
    assert a.residual == b.residual and a.iterations == b.iterations
    assert a.momentum_terms.keys() == b.momentum_terms.keys()
    for name, terms in a.momentum_terms.items():
        for x, y in zip(terms, b.momentum_terms[name], strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize("momentum", [None, 0.9])
def test_reads_give_the_kept_copies_solution(
    monkeypatch: pytest.MonkeyPatch, momentum: float | None
) -> None:
    syms, st, kw = _gpt2(ignore=False, layers=2)
    coupled = {i for g in syms.coupled_groups() for i in g}
    assert 0 < len(coupled) < len(syms)  # an uncoupled part (ln_2 → c_fc) besides the blocks
    if momentum is not None:
        kw = {**kw, "momentum": momentum, "time": "discrete"}
    before = [p.detach().clone() for p in syms.params()]
    reads: list[type] = []
    solve_block = eq._solve_block

    def spy(part: Any, coupled: bool, values: Any, *a: Any, **k: Any) -> None:
        if not coupled:
            reads.append(type(values))
        solve_block(part, coupled, values, *a, **k)

    monkeypatch.setattr(eq, "_solve_block", spy)
    copies: list[int] = []  # θ read whole (a float64 copy) by the uncoupled part
    getitem = eq._Float64Reads.__getitem__
    monkeypatch.setattr(
        eq._Float64Reads, "__getitem__", lambda r, p: copies.append(1) or getitem(r, p)
    )
    fast = nf.solve_equilibrium(syms, st, **kw)
    assert reads == [dict if momentum else eq._Float64Reads]
    assert not copies  # its rescalings read per-neuron sums of θ: no copy made
    assert all(torch.equal(p, q) for p, q in zip(syms.params(), before, strict=True))
    monkeypatch.setattr(eq, "_needs_values", lambda nm: True)  # the kept copies, moved
    _same(fast, nf.solve_equilibrium(syms, st, **kw))
    assert bool(fast.momentum_terms) == (momentum is not None)


def test_reads_are_fresh_float64_copies() -> None:
    a = torch.nn.Parameter(torch.randn(3, 4))
    b = torch.nn.Parameter(torch.randn(2))
    gathered = {b: torch.zeros(2, dtype=torch.float64)}
    reads = eq._Float64Reads([a, b], gathered)
    assert list(reads) == [a, b] and len(reads) == 2
    first = reads[a]
    assert first.dtype == torch.float64 and torch.equal(first, a.detach().double())
    first.mul_(2)  # a read is the caller's own: the parameter and the next read unchanged
    assert torch.equal(reads[a], a.detach().double())
    assert reads[b] is gathered[b]  # a gathered FSDP2 shard: the one copy made per solve
    with pytest.raises(KeyError):
        reads[torch.nn.Parameter(torch.zeros(1))]
    # per-neuron sums of θ² in float64 from the parameter itself: the copy's, bit for bit
    for axis in (0, 1):
        want = torch.linalg.vector_norm(a.detach().double(), dim=1 - axis).square()
        got = reads.axis_norm_sq(a, axis)
        assert got.dtype == torch.float64 and torch.equal(got, want)
    assert torch.equal(reads.axis_norm_sq(b, 0), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(KeyError):
        reads.axis_norm_sq(torch.nn.Parameter(torch.zeros(1)), 0)


@pytest.mark.parametrize("momentum", [None, 0.9])
def test_blocks_drop_their_copies_unless_the_solution_reads_them(
    monkeypatch: pytest.MonkeyPatch, momentum: float | None
) -> None:
    # a coupled block's moved float64 copies are dead once the block is solved, so that the
    # next block reuses their memory; only the momentum terms (discrete time) read them after
    import gc
    import weakref

    from noetherflow._sweep_plan import sweep_options

    syms, st, kw = _gpt2(ignore=False, layers=2)
    if momentum is not None:
        kw = {**kw, "momentum": momentum, "time": "discrete"}
    made: list[weakref.ref[torch.Tensor]] = []
    alive: list[int] = []  # at each block's start, the earlier blocks' copies still alive
    float64, solve_block, solution = eq._float64, eq._solve_block, eq._solution

    def copy(p: Any) -> torch.Tensor:
        t = float64(p)
        made.append(weakref.ref(t))
        return t

    def block(part: Any, coupled: bool, values: Any, *a: Any, **k: Any) -> None:
        gc.collect()
        mine = {id(v) for v in values.values()} if isinstance(values, dict) else set()
        alive.append(sum(r() is not None and id(r()) not in mine for r in made))
        solve_block(part, coupled, values, *a, **k)

    kept: list[int] = []
    monkeypatch.setattr(eq, "_float64", copy)
    monkeypatch.setattr(eq, "_solve_block", block)
    monkeypatch.setattr(
        eq, "_solution", lambda s, o, v, *a: kept.append(len(v)) or solution(s, o, v, *a)
    )
    with sweep_options(parallel=False):  # the blocks one after the other, in this thread
        sol = nf.solve_equilibrium(syms, st, **kw)
    assert sol.converged and len(alive) == 3  # the uncoupled part, then two blocks
    if momentum is None:
        assert alive[-1] == 0 and kept == [0]
    else:
        assert alive[-1] > 0 and kept == [len(syms.params())]


def test_coupled_blocks_read_the_statistics_mean() -> None:
    """A coupled block's ḡ is a float64 copy of the statistics' own, not the samples' mean
    recomputed: shifted away from the samples' mean, the block reads the shifted one, and
    the solve follows it."""
    syms, st, kw = _gpt2(ignore=True, layers=1)
    (group,) = [g for g in syms.coupled_groups() if len(g) > 1]
    part = nf.SymmetrySet([syms[i] for i in group])
    g = torch.Generator().manual_seed(5)
    shifted = copy.copy(st)
    shifted.mean = {p: m + 1e-3 * torch.randn(m.shape, generator=g) for p, m in st.mean.items()}
    cur = eq._means_of(shifted, coupled_samples(part, shifted), part)
    assert cur.mean.keys() == dict.fromkeys(part.params()).keys()
    for p, m in cur.mean.items():
        assert m.dtype == torch.float64 and torch.equal(m, shifted.mean[p].double())
        m.zero_()  # the sweeps move it in place: a copy
        assert bool(shifted.mean[p].ne(0).any())
    a, b = nf.solve_equilibrium(syms, st, **kw), nf.solve_equilibrium(syms, shifted, **kw)
    assert a.converged and b.converged
    name = next(n for n, e in a.elements.items() if torch.as_tensor(e).dim() == 2)
    assert not torch.allclose(torch.as_tensor(a.elements[name]), torch.as_tensor(b.elements[name]))
