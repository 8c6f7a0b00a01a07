"""Rotations on disjoint coordinates solved as one batched step (issue 28).

The heads of one attention layer act on disjoint slices, so solving them one after the other
(the reference path, :func:`noetherflow._sweep_plan.sequential_sweeps`) and as one batched
geometric mean give the same moves. Pinned here, in float64: the batched rotation step
equals the single one (singular pairs sent back to it), a sweep plan batches exactly the
disjoint runs, batched solves take the reference's steps to 1e-10 (a chain of heads and
rescalings, a tiny GPT-2 found by detection), Anderson-mixed sweeps reach the same
equilibrium (λ and P = GGᵀ to 1e-8, the flows gone after the teleport) in fewer sweeps,
also from a warm start, and the cover classes that decide staleness equal the Gram matrix
of the coverage masks and are found once per symmetry set.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow._sweep_plan import plan_sweep, sequential_sweeps, sweep_options
from noetherflow.kernels.base import overlaps, overlaps_by_param
from noetherflow.kernels.rotation import _solve_rotation
from noetherflow.kernels.rotation_batch import _nonsingular, batched_rotation
from noetherflow.symmetry.rotation import Block

DT = torch.float64
KW: dict[str, Any] = {"lr": 0.05, "batch_size": 8, "weight_decay": 1e-2}


def _model(
    heads: int = 3, seed: int = 0, inputs: int = 5
) -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    """Linear(inputs, 6h) → Linear(6h, 6) → ReLU → Linear(6, 3): ``heads`` heads of 6 between
    the first two and a rescaling between the last two, sharing the second weight (a chain)."""
    torch.manual_seed(seed)
    w = 6 * heads
    m = nn.Sequential(nn.Linear(inputs, w), nn.Linear(w, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    rots = [
        nf.DoubleRotation.from_blocks(
            [Block(m[0].weight, 0, 6 * h, 6 * h + 6), Block(m[0].bias, 0, 6 * h, 6 * h + 6)],
            [Block(m[1].weight, 1, 6 * h, 6 * h + 6)],
            label=f"head{h}",
        )
        for h in range(heads)
    ]
    syms = nf.SymmetrySet([*rots, nf.Rescaling(m[1], m[3], label="r")])
    x, y = torch.randn(40, inputs, dtype=DT), torch.randn(40, 3, dtype=DT)
    return m, syms, x, y


def _spd(b: int, d: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(b, d, d, generator=g, dtype=DT)
    return a @ a.mT / d + 0.1 * torch.eye(d, dtype=DT)


def _close(a: nf.EquilibriumSolution, b: nf.EquilibriumSolution, tol: float = 1e-10) -> None:
    """The same elements and steps (the batched path takes the reference's steps)."""
    assert a.elements.keys() == b.elements.keys()
    for name, e in a.elements.items():
        f = b.elements[name]
        assert torch.allclose(torch.as_tensor(e), torch.as_tensor(f), rtol=tol, atol=tol), name
    assert a.iterations == b.iterations and a.converged and b.converged
    assert [i for i, _ in a.steps] == [i for i, _ in b.steps]


def _same_equilibrium(a: nf.EquilibriumSolution, b: nf.EquilibriumSolution, tol: float) -> None:
    """The same equilibrium: λ, and P = GGᵀ per rotation (G itself is fixed only up to an
    orthogonal factor, G·Q, which the path picks: X(GQ) = QᵀX(G)Q, Y likewise)."""
    assert a.converged and b.converged
    for name, e in a.elements.items():
        e, f = torch.as_tensor(e), torch.as_tensor(b.elements[name])
        if e.dim() == 2:
            e, f = e @ e.T, f @ f.T
        assert float((e - f).abs().max()) <= tol * max(float(f.abs().max()), 1.0), name
        assert torch.allclose(a.distance[name], b.distance[name], rtol=tol, atol=tol), name


def test_batched_rotation_equals_the_single_step() -> None:
    x, y = _spd(5, 7, 1), _spd(5, 7, 2)
    g, gi, ok, pre, res = batched_rotation(x, y, rtol=1e-10, ridge=None)
    assert bool(ok.all())
    for i in range(5):
        g1, nb, pre1, res1 = _solve_rotation(x[i], y[i], rtol=1e-10, ridge=None)
        assert nb is None
        assert torch.allclose(g[i], g1, rtol=0, atol=1e-13)
        assert abs(float(pre[i]) - pre1) < 1e-14 and abs(float(res[i]) - res1) < 1e-13
        # the returned inverse is G's, and the step balances the pair: G⁻¹XG⁻ᵀ = GᵀYG
        assert torch.allclose(gi[i], torch.linalg.inv(g[i]), rtol=0, atol=1e-12)
        assert torch.allclose(gi[i] @ x[i] @ gi[i].T, g[i].T @ y[i] @ g[i], atol=1e-12)


def test_batched_rotation_sends_singular_pairs_back() -> None:
    x, y = _spd(3, 4, 3), _spd(3, 4, 4)
    x[1, :, 0] = 0.0
    x[1, 0, :] = 0.0  # rank deficient: the single path finds the common range
    y[2] = 0.0
    x[2] = 0.0  # nothing at all
    _, _, ok, _, _ = batched_rotation(x, y, rtol=1e-10, ridge=None)
    assert ok.tolist() == [True, False, False]
    _, _, ok, _, _ = batched_rotation(x, y, rtol=1e-10, ridge=1e-3)
    assert ok.tolist() == [True, True, True]  # a ridge makes every pair definite


def _with_spectrum(spectra: Tensor, seed: int) -> Tensor:
    """Q diag(λ) Qᵀ per row of ``spectra`` ``[B, d]``, Q a random orthogonal matrix."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(*spectra.shape, spectra.shape[-1], generator=g, dtype=DT))
    return (q * spectra.unsqueeze(-2)) @ q.mT


def test_the_certified_singularity_rule_is_the_eigenvalue_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """_nonsingular's bounds (λ_min ≥ 1/tr(A⁻¹), λ_max ≤ row sums) decide as the spectra do.

    Pairs on both sides of the cut rtol·λ_max (a factor 2 from it), well conditioned ones the
    bounds certify, a zero eigenvalue, a negative one, and a zero pair; the certificate alone
    decides the well conditioned ones, the eigenvalues the rest.
    """
    rtol, d = 1e-10, 6
    base = torch.linspace(1.0, 3.0, d, dtype=DT)
    lows = [1.0, 1e-3, 2 * rtol * 3.0, 0.5 * rtol * 3.0, 0.0, -1e-3]
    spec_x = torch.stack([torch.cat([base[:-1], torch.tensor([v], dtype=DT)]) for v in lows])
    spec_y = torch.stack([base] * len(lows))
    x, y = _with_spectrum(spec_x, 5), _with_spectrum(spec_y, 6)
    # the same cases on Y's side, and a pair of zeros
    x = torch.cat([x, y[:-1], torch.zeros(1, d, d, dtype=DT)])
    y = torch.cat([y, _with_spectrum(spec_x, 7)[:-1], torch.zeros(1, d, d, dtype=DT)])
    *_, ok = _nonsingular(x, y, rtol)
    ex, ey = torch.linalg.eigvalsh(x), torch.linalg.eigvalsh(y)
    top = torch.maximum(ex.amax(-1), ey.amax(-1)).clamp_min(0.0)
    cut = (rtol * top).unsqueeze(-1)
    rule = (top > 0) & ~((ex <= cut).any(-1) | (ey <= cut).any(-1))
    assert ok.tolist() == rule.tolist()
    assert ok.tolist() == [True, True, True, False, False, False] + [True] * 3 + [False] * 3
    # the well conditioned pairs need no spectrum: the bounds alone pass them
    monkeypatch.setattr(torch.linalg, "eigvalsh", _no_spectrum)
    *_, ok = _nonsingular(x[:2], y[:2], rtol)
    assert ok.tolist() == [True, True]


def _no_spectrum(*_: Any) -> Tensor:
    raise AssertionError("eigvalsh called where the bounds decide")


def test_the_plan_batches_disjoint_runs_only() -> None:
    _, syms, _, _ = _model(heads=3)
    touch = overlaps(list(syms))
    steps = plan_sweep(list(syms), touch)
    assert [(len(s.members), s.disjoint) for s in steps] == [(1, False), (3, True)]
    with sequential_sweeps():
        steps = plan_sweep(list(syms), touch)
    assert [(len(s.members), s.disjoint) for s in steps] == [(1, False), (1, False)] + [
        (1, False)
    ] * 2
    # two rotations on the same slice touch: they stay apart
    h0 = syms["head0"]
    twin = nf.DoubleRotation.from_blocks(h0.w_blocks, h0.u_blocks, label="twin")
    both = [syms["head0"], twin, syms["head1"]]
    steps = plan_sweep(both, overlaps(both))
    assert [len(s.members) for s in steps] == [1, 2]


@pytest.mark.parametrize("heads", [4, 33])  # 33: more members than one code word holds
def test_cover_classes_equal_the_mask_gram(heads: int) -> None:
    _, syms, _, _ = _model(heads=heads)
    ref: dict[Any, set[Any]] = {s: {s} for s in syms}
    for a in syms:
        for b in syms:
            for p in a.params:
                if any(p is q for q in b.params) and bool(
                    (a.covered_mask(p) & b.covered_mask(p)).any()
                ):
                    ref[a].add(b)
    got = overlaps(list(syms))
    assert {s: set(v) for s, v in got.items()} == ref


def test_cover_classes_are_found_once_per_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # a solve's blocks read the classes from their set's memo: found at the first solve,
    # shared with subsets, renewed when the set grows, not pickled
    import pickle

    import noetherflow.kernels.base as base

    m, syms, x, y = _model(heads=4)
    found = []
    real = base._cover_classes
    monkeypatch.setattr(
        base, "_cover_classes", lambda p, group: found.append(len(group)) or real(p, group)
    )
    want = overlaps_by_param(list(syms))
    shared = len(found)  # the parameters that more than one symmetry acts on
    assert found == [4, 4, 5]  # the heads' W and bias sides, their U side with the rescaling
    memo = syms._cover_memo()
    assert overlaps_by_param(list(syms), memo) == want and len(found) == 2 * shared
    assert overlaps_by_param(list(syms), memo) == want  # from the memo
    sub = syms.subset(range(len(syms)))
    assert sub._cover_memo() is memo
    assert overlaps_by_param(list(sub), sub._cover_memo()) == want
    st = _stats(m, syms, x, y)
    sol = nf.solve_equilibrium(syms, st, **KW)  # its coupled block reads the memo
    assert len(found) == 2 * shared and sol.converged
    part = syms.subset(range(1, len(syms)))
    assert part._cover_memo() is memo
    part.add(syms[0])
    assert part._cover_memo() is not memo and syms._cover_memo() is memo
    assert pickle.loads(pickle.dumps(syms))._cover_memo() == {}


def test_kept_value_grams_stay_true_and_spare_the_wide_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a coupled solve keeps each block's Grams of θ and ḡ: moved by congruence with its own
    # rotation where nothing else moves the block (the first weight's rows, 20 wide > 2d),
    # rebuilt where the rescaling moves it (the second weight) and where a Gram is cheaper
    # than the congruence (the bias); each kept Gram is the current values' at every read
    import noetherflow.kernels.rotation_batch as rb

    m, syms, x, y = _model(heads=3, inputs=20)
    st = _stats(m, syms, x, y)
    real_xy, real_grams = rb.batched_xy, rb._block_grams
    index = {id(p): i for i, p in enumerate(m.parameters())}
    built: list[int] = []  # the parameter of each θ or ḡ Gram built
    steps, worst = [0], [0.0]

    def grams(blocks: Any, tensors: Any, offset: int) -> Any:
        if offset == 0:
            built.extend(index[id(b.param)] for b in blocks)
        return real_grams(blocks, tensors, offset)

    def xy(group: Any, values: Any, stats: Any, nm: Any, kept: Any = None) -> Any:
        out = real_xy(group, values, stats, nm, kept)
        steps[0] += 1
        for b, pair in (kept or {}).items():
            for got, of in zip(pair, (values, stats.mean), strict=True):
                want = real_grams([b], {b.param: of[b.param]}, 0)[b]
                worst[0] = max(worst[0], float((got - want).norm() / want.norm()))
        return out

    monkeypatch.setattr(rb, "_block_grams", grams)
    monkeypatch.setattr(rb, "batched_xy", xy)
    kept = nf.solve_equilibrium(syms, st, **KW)
    assert kept.converged and steps[0] >= 4
    assert worst[0] < 1e-13
    # the first weight's 3 blocks: built (θ and ḡ) in the first two steps, then moved
    assert built.count(0) == 3 * 2 * 2
    assert built.count(1) == built.count(2) == 3 * 2 * steps[0]  # the bias, the shared weight
    # the same equilibrium as with nothing kept
    monkeypatch.setattr(rb, "batched_xy", lambda *a, **k: real_xy(*a[:4], None))
    _close(kept, nf.solve_equilibrium(syms, st, **KW), 1e-11)


def _stats(m: nn.Module, syms: nf.SymmetrySet, x: Tensor, y: Tensor) -> nf.GradStats:
    return nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")


def test_a_chain_of_heads_solves_as_the_reference() -> None:
    m, syms, x, y = _model(heads=4)
    st = _stats(m, syms, x, y)
    with sweep_options(accelerate=False):
        batched = nf.solve_equilibrium(syms, st, **KW)
    with sequential_sweeps():
        ref = nf.solve_equilibrium(syms, st, **KW)
    assert ref.iterations > 2  # a real coupled solve
    _close(batched, ref)
    # Anderson mixing: the same equilibrium in fewer sweeps
    fast = nf.solve_equilibrium(syms, st, **KW)
    assert fast.iterations < ref.iterations
    _same_equilibrium(fast, ref, 1e-8)
    # a warm start (the monitor's init) agrees too
    warm = nf.solve_equilibrium(syms, st, init=ref, **KW)
    with sequential_sweeps():
        warm_ref = nf.solve_equilibrium(syms, st, init=ref, **KW)
    _same_equilibrium(warm, warm_ref, 1e-8)


def lands_at_zero_flow(
    m: nn.Module, syms: nf.SymmetrySet, x: Tensor, y: Tensor, sol: Any, bound: float
) -> None:
    """Teleporting ``m`` to ``sol`` keeps its outputs, and each flow, from fresh statistics,
    falls below ``bound`` times its value before."""
    before = nf.noether_flow(syms, _stats(m, syms, x, y), **KW)
    with torch.no_grad():
        out0 = m(x).clone()
    nf.teleport(m, sol)
    with torch.no_grad():
        assert float((m(x) - out0).abs().max()) < 1e-12 * float(out0.abs().max())
    after = nf.noether_flow(syms, _stats(m, syms, x, y), **KW)
    for k in before:
        assert float(after[k].norm() / before[k].norm()) < bound, k


def test_the_accelerated_solve_lands_at_zero_flow() -> None:
    m, syms, x, y = _model(heads=4)
    sol = nf.solve_equilibrium(syms, _stats(m, syms, x, y), **KW)
    lands_at_zero_flow(m, syms, x, y, sol, 1e-8)


def _tiny_gpt2() -> tuple[nn.Module, nf.SymmetrySet, nf.GradStats, dict[str, Any]]:
    """A 1-layer GPT-2 of width 16 with 4 heads, its symmetries found, "solve" statistics."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=4,
        vocab_size=32,
        n_positions=8,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    body = transformers.GPT2LMHeadModel(cfg).double()

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = body

        def forward(self, t: Tensor) -> Tensor:
            return self.body(t).logits

    model = LM()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (6, 8), generator=g)
    y = torch.randint(0, 32, (6, 8), generator=g)

    def loss(out: Tensor, t: Tensor) -> Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), t.reshape(-1))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        syms = nf.find_symmetries(model, x[:2])
    st = nf.collect_stats(model, syms, loss, x, y, level="solve")
    kw: dict[str, Any] = {"lr": 0.01, "batch_size": 6, "weight_decay": 0.01}
    return model, syms, st, kw


def test_a_tiny_gpt2_solves_as_the_reference() -> None:
    _, syms, st, kw = _tiny_gpt2()
    assert sum(s.family.value == "rotation" for s in syms) >= 8  # Q/K and V/O per head
    with sweep_options(accelerate=False):
        batched = nf.solve_equilibrium(syms, st, **kw)
    with sequential_sweeps():
        ref = nf.solve_equilibrium(syms, st, **kw)
    _close(batched, ref, 1e-9)
    fast = nf.solve_equilibrium(syms, st, **kw)
    assert fast.iterations <= ref.iterations
    _same_equilibrium(fast, ref, 1e-8)


def _heads() -> tuple[list[nf.DoubleRotation], list[nn.Parameter]]:
    """Rotations as on a fused projection: 3 heads of 4 tiling a [7, 24] weight's columns
    (the W sides) and its [24] bias, their U sides rows of a [12, 5] weight, one more rotation
    on columns out of order (not a tiling), all pairwise disjoint."""
    g = torch.Generator().manual_seed(3)
    a = nn.Parameter(torch.randn(7, 24, generator=g, dtype=DT))
    bias = nn.Parameter(torch.randn(24, generator=g, dtype=DT))
    u = nn.Parameter(torch.randn(12, 5, generator=g, dtype=DT))
    rots = [
        nf.DoubleRotation.from_blocks(
            [Block(a, 1, 4 * h, 4 * h + 4), Block(bias, 0, 4 * h, 4 * h + 4)],
            [Block(u, 0, 4 * h, 4 * h + 4)],
        )
        for h in range(3)
    ]
    rots.append(nf.DoubleRotation.from_blocks([Block(a, 1, 20, 24)], [Block(a, 1, 12, 16)]))
    return rots, [a, bias, u]


def _grads(params: list[nn.Parameter], n: int, transposed: bool) -> dict[nn.Parameter, Tensor]:
    g = torch.Generator().manual_seed(4)
    out = {}
    for p in params:
        t = torch.randn(n, *p.shape, generator=g, dtype=DT)
        if transposed and p.dim() == 2:  # a strided layout, as hooks give for Conv1D
            t = torch.randn(n, *p.shape[::-1], generator=g, dtype=DT).transpose(1, 2)
        out[p] = t
    return out


@pytest.mark.parametrize("transposed", [False, True])
def test_batched_moves_equal_one_at_a_time(transposed: bool) -> None:
    from noetherflow.kernels import kernel_for

    rots, params = _heads()
    k = kernel_for(rots[0])
    gen = torch.Generator().manual_seed(5)
    moves = [(s, s.random_element(0.5, gen)) for s in rots]
    for n in (3, 0):  # per-sample tensors, then single ones (the parameters' values)
        ref = _grads(params, max(n, 1), transposed)
        if n == 0:
            ref = {p: t[0].clone() for p, t in ref.items()}
        new = {p: t.clone() for p, t in ref.items()}
        for s, e in moves:
            (s.transport_grads_ if n else s.act_)(e, ref)
        (k.transport_disjoint_ if n else k.act_disjoint_)(moves, new)
        for p in params:
            assert torch.allclose(new[p], ref[p], rtol=1e-14, atol=1e-14)
    # a parameter left out of the mapping is left out of the moves
    some = {params[0]: _grads(params, 2, transposed)[params[0]]}
    k.transport_disjoint_(moves, some)


@pytest.mark.parametrize("transposed", [False, True])
def test_batched_moments_equal_the_side_moments(transposed: bool) -> None:
    from noetherflow.kernels import kernel_for
    from noetherflow.kernels.rotation import side_moment
    from noetherflow.stats.source import SampleSource

    rots, params = _heads()
    src = SampleSource(_grads(params, 5, transposed), reduced=True)
    got = kernel_for(rots[0]).collect(rots, src, nf.Level.SOLVE).side
    for s in rots:
        for new, blocks in zip(got[s], (s.w_blocks, s.u_blocks), strict=True):
            ref = side_moment(blocks, src)
            assert torch.allclose(new, ref, rtol=1e-14, atol=1e-14)
    # a subset (a refresh of the stale members only), overlapping slices included
    sub = [rots[3], rots[1]]
    got = kernel_for(rots[0]).collect(sub, src, nf.Level.SOLVE).side
    for s in sub:
        assert torch.allclose(got[s][0], side_moment(s.w_blocks, src), rtol=1e-14, atol=1e-14)


def test_batched_xy_equals_the_single_assembly() -> None:
    from noetherflow.kernels import kernel_for
    from noetherflow.kernels.base import stats_from_samples
    from noetherflow.kernels.rotation_batch import batched_xy

    rots, params = _heads()
    st = stats_from_samples(_grads(params, 5, True), nf.SymmetrySet(rots), estimator="reference")
    values = {p: p.detach().clone() for p in params}
    k = kernel_for(rots[0])
    for nm in (
        nf.NoiseModel.create(lr=0.1, batch_size=4, weight_decay=1e-2),
        nf.NoiseModel.create(lr=0.1, batch_size=4, weight_decay=1e-2, time="continuous"),
    ):
        got = batched_xy(rots, values, st, nm)
        assert set(got) == set(rots)
        for s in rots:
            for a, b in zip(got[s], k.xy(s, values, st, nm), strict=True):
                assert torch.allclose(a, b, rtol=1e-13, atol=1e-13)
    # per-parameter γ (the heads: their bias has none), or a momentum cross term: left to
    # the single assembly; the last rotation, on one parameter, has one γ
    decay = {params[0]: 1e-2, params[1]: 0.0, params[2]: 1e-2}
    mixed = nf.NoiseModel.create(lr=0.1, batch_size=4, weight_decay=decay)
    got = batched_xy(rots, values, st, mixed)
    assert set(got) == {rots[3]}
    for a, b in zip(got[rots[3]], k.xy(rots[3], values, st, mixed), strict=True):
        assert torch.allclose(a, b, rtol=1e-13, atol=1e-13)
    st.displacement = {p: torch.ones_like(p) for p in params}
    heavy = nf.NoiseModel.create(
        lr=0.1, batch_size=4, weight_decay=1e-2, momentum=0.9, time="discrete"
    )
    assert heavy.c_cross != 0
    assert not batched_xy(rots, values, st, heavy)


def test_moved_moments_equal_the_moments_of_moved_samples() -> None:
    """θ → Gθ moves the gradients covariantly (F_W → GᵀF_W, F_U → G⁻¹F_U), so the moments
    move by congruence: GᵀM_WG and G⁻¹M_UG⁻ᵀ equal the moments of the transported samples."""
    from noetherflow.kernels import kernel_for
    from noetherflow.kernels.base import stats_from_samples
    from noetherflow.stats.source import SampleSource

    rots, params = _heads()
    k = kernel_for(rots[0])
    samples = _grads(params, 5, False)
    st = stats_from_samples(samples, nf.SymmetrySet(rots), estimator="reference")
    cache: dict[Any, Any] = {}
    moves = [(s, s.random_element(0.7, torch.Generator().manual_seed(6))) for s in rots[:3]]
    assert not k.move_stats_(moves, st, cache)  # nothing cached yet: rebuilt instead
    k.refresh_(rots, samples, st, {}, cache)
    assert k.move_stats_(moves, st, cache)
    k.transport_disjoint_(moves, samples)
    want = k.collect(rots, SampleSource(samples), nf.Level.SOLVE).side
    for s in rots:
        for a, b in zip(st.blocks["rotation"].side[s], want[s], strict=True):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-13)


def _mlp() -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    m = m.double()
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.Rescaling(m[2], m[4])])
    return m, syms, torch.randn(40, 5, dtype=DT), torch.randn(40, 3, dtype=DT)


@pytest.mark.parametrize("case", ["mlp", "chain", "gpt2"])
def test_closed_form_statistics_take_the_reference_steps(case: str) -> None:
    """The sweeps with the statistics moved in closed form (the default) take the same steps
    as with every changed statistic rebuilt from transported samples (the previous path):
    same elements, same distances, float64, to 1e-11."""
    if case == "gpt2":
        _, syms, st, kw = _tiny_gpt2()
    else:
        m, syms, x, y = _mlp() if case == "mlp" else _model(heads=4)
        st, kw = _stats(m, syms, x, y), KW
    runs = []
    for fast in (True, False):
        with sweep_options(covariant=fast):
            runs.append(nf.solve_equilibrium(syms, st, **kw))
        with sweep_options(covariant=fast, accelerate=False):
            runs.append(nf.solve_equilibrium(syms, st, **kw))
    for new, ref in ((runs[0], runs[2]), (runs[1], runs[3])):
        _close(new, ref, 1e-11)
        for name, d in new.distance.items():
            assert torch.allclose(d, ref.distance[name], rtol=1e-11, atol=1e-12), name
