"""Rotations on disjoint coordinates solved as one batched step (the heads of one layer).

Two double rotations that act on no common coordinate do not interact: the solve step of one
reads only the statistics and values of its own slices, and its move changes only those. So
a run of them, solved one after the other by :meth:`RotationKernel.solve`, gives what one
batched geometric mean over the run gives (:func:`solve_disjoint`): X, Y stacked
``[B, d, d]``, one batched ``eigh`` per stage instead of B small calls. Members that need the
single path (singular X or Y: a common range to find; per-parameter decay with its cross
term) take it, one at a time.

The same holds for the moves and the moments: the run's moves act on disjoint slices, so
their products on the parameters and on the per-sample gradients are one batched product per
(parameter, axis) (:func:`act_disjoint_`, :func:`transport_disjoint_`), and the d × d
moments of every slice one batched Gram product (:func:`sample_moments`): the same numbers as
slice by slice, in a few large products where 24 heads made a hundred small ones.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._blas import matmul
from noetherflow._scratch import bmm_, left_mm_
from noetherflow._threads import one_thread
from noetherflow.kernels.base import GroupSolve, StepOptions
from noetherflow.kernels.noise import NoiseModel, cross_values
from noetherflow.kernels.rotation import RotationKernel, RotationSettings, _mixed_cross
from noetherflow.stats.core import GradStats
from noetherflow.stats.sample_factors import (
    HeldSamples,
    SampleFactors,
    block_grams,
    left_product_,
)
from noetherflow.stats.source import SampleSource
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.rotation import Block, DoubleRotation

__all__ = [
    "act_disjoint_",
    "move_stats_",
    "refresh_",
    "batched_rotation",
    "batched_xy",
    "sample_moments",
    "solve_disjoint",
    "transport_disjoint_",
]

# (parameter id, axis, d): the slices of one parameter along one axis, of one width
_Key = tuple[int, int, int]


def _sym(a: Tensor) -> Tensor:
    return (a + a.mT) / 2


def _rel(x: Tensor, y: Tensor) -> Tensor:
    """‖X − Y‖ / (‖X‖ + ‖Y‖) per matrix: ``[B, d, d]`` → ``[B]``."""
    n = torch.linalg.matrix_norm
    return n(x - y) / (n(x) + n(y)).clamp_min(1e-300)


def _mm3(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """The product a·b·c of each matrix of a batch (:func:`noetherflow._blas.matmul`)."""
    return matmul(matmul(a, b), c)


def _fn(v: Tensor, f: Tensor) -> Tensor:
    """V diag(f) Vᵀ per matrix: ``v`` ``[B, d, d]``, ``f`` ``[B, d]``."""
    return matmul(v * f.unsqueeze(-2), v.mT)


def batched_rotation(
    X: Tensor, Y: Tensor, *, rtol: float, ridge: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """G = P^{1/2}, P Y P = X, for a batch of nonsingular pairs (docs/concepts/equilibrium.md).

    ``X``, ``Y``: ``[B, d, d]`` float64. Returns (G ``[B, d, d]``, G⁻¹ ``[B, d, d]`` from the
    same eigendecomposition, ok ``[B]`` bool, relative flow before ``[B]``, after ``[B]``);
    where ``ok`` is False (X or Y singular to ``rtol``, or both zero) the entries are
    meaningless and the caller solves that pair alone. The
    arithmetic is :func:`noetherflow.kernels.rotation._solve_rotation`'s, batched, with Y's
    Cholesky factor in place of its eigendecomposition (the same unique SPD P).
    """
    d = X.shape[-1]
    X, Y = _sym(X), _sym(Y)
    eye = torch.eye(d, dtype=X.dtype)
    if ridge is not None:
        X, Y = X + ridge * eye, Y + ridge * eye
    ly, liy, ok = _nonsingular(X, Y, rtol)
    # Y = LLᵀ, Z = LᵀXL: P = L⁻ᵀ Z^{1/2} L⁻¹ is SPD with P Y P = L⁻ᵀ Z L⁻¹ = X (the singular
    # members get L = I, so that the batch stays finite)
    keep = ok[:, None, None]
    ly, liy = torch.where(keep, ly, eye), torch.where(keep, liy, eye)
    wz, vz = torch.linalg.eigh(_sym(_mm3(ly.mT, X, ly)))
    p = _sym(_mm3(liy.mT, _fn(vz, wz.clamp(min=0).sqrt()), liy))
    w, v = torch.linalg.eigh(p)
    w = torch.maximum(w, w.amax(-1, keepdim=True) * 1e-300)
    w = torch.where(ok.unsqueeze(-1), w, 1.0)
    gr = _fn(v, w.sqrt())
    gri = _fn(v, 1 / w.sqrt())
    return gr, gri, ok, _rel(X, Y), _rel(_mm3(gri, X, gri), _mm3(gr, Y, gr))


def _nonsingular(X: Tensor, Y: Tensor, rtol: float) -> tuple[Tensor, Tensor, Tensor]:
    """(Y's Cholesky factor L, L⁻¹, each ``[B, d, d]``; ok ``[B]``): X, Y nonsingular to ``rtol``.

    The rule is :func:`noetherflow.kernels.rotation._solve_rotation`'s: every eigenvalue of X
    and of Y above ``rtol`` times the largest of both. Most pairs are certified without
    their spectra: for an SPD A (its Cholesky succeeded), λ_min(A) ≥ 1/tr(A⁻¹) =
    1/‖L⁻¹‖_F², and λ_max(A) ≤ A's largest absolute row sum. Only the pairs the bounds
    leave open are decided by their eigenvalues. A pair the rule passes but whose Y has no
    Cholesky factor in floating point counts as singular (solved alone).
    """
    eye = torch.eye(X.shape[-1], dtype=X.dtype).expand_as(X)
    lx, bad_x = torch.linalg.cholesky_ex(X)
    ly, bad_y = torch.linalg.cholesky_ex(Y)
    factored = (bad_x == 0) & (bad_y == 0)
    # L⁻¹, and tr(A⁻¹) = ‖L⁻¹‖_F² (L = I where the factorisation failed: all stays finite)
    lix, liy = (
        torch.linalg.solve_triangular(
            torch.where((bad == 0)[:, None, None], lo, eye), eye, upper=False
        )
        for lo, bad in ((lx, bad_x), (ly, bad_y))
    )
    inv_tr = [li.square().sum((-2, -1)) for li in (lix, liy)]
    top_hi = torch.maximum(X.abs().sum(-1).amax(-1), Y.abs().sum(-1).amax(-1))
    certain = factored & (inv_tr[0] * rtol * top_hi < 1) & (inv_tr[1] * rtol * top_hi < 1)
    ok = certain.clone()
    open_ = (~certain).nonzero().flatten()
    if open_.numel():
        ex = torch.linalg.eigvalsh(X[open_])
        ey = torch.linalg.eigvalsh(Y[open_])
        top = torch.maximum(ex.amax(-1), ey.amax(-1)).clamp_min(0.0)
        cut = (rtol * top).unsqueeze(-1)
        rule = (top > 0) & ~((ex <= cut).any(-1) | (ey <= cut).any(-1))
        ok[open_] = rule & (bad_y[open_] == 0)
    return ly, liy, ok


def solve_disjoint(
    kernel: RotationKernel,
    syms: Sequence[DoubleRotation],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    names: Mapping[Symmetry, str],
    opts: StepOptions,
    cache: dict[Any, Any] | None = None,
) -> GroupSolve:
    """One solve step for rotations on pairwise disjoint coordinates, batched by width d.

    The same steps, residuals, reports and progress (the largest) as calling
    ``kernel.solve([s], ...)`` for each member in order, to rounding. ``cache``: a coupled
    solve's scratch of this kernel (:func:`refresh_`, :func:`move_stats_`), whose Grams of
    θ and ḡ per block are reused where still true.
    """
    own: RotationSettings = opts.of(kernel)
    single: dict[DoubleRotation, GroupSolve] = {}
    batch: dict[int, list[tuple[DoubleRotation, Tensor, Tensor]]] = {}
    grams = None if cache is None else cache.setdefault(_VALUES, {})
    with one_thread():  # d×d algebra: see noetherflow._threads
        fast = batched_xy(syms, values, stats, nm, grams)
        for s in syms:
            if _mixed_cross(s, values, stats, nm) is not None:
                single[s] = kernel.solve([s], values, stats, nm, names, opts)
                continue
            x, y = fast[s] if s in fast else kernel.xy(s, values, stats, nm)
            batch.setdefault(s.d, []).append((s, x, y))
        solved: dict[DoubleRotation, tuple[Tensor, float, float]] = {}
        for members in batch.values():
            X = torch.stack([x for _, x, _ in members])
            Y = torch.stack([y for _, _, y in members])
            g, gi, ok, pre, res = batched_rotation(X, Y, rtol=own.rtol_singular, ridge=own.ridge)
            for i, (s, _, _) in enumerate(members):
                if bool(ok[i]):
                    solved[s] = (g[i], float(pre[i]), float(res[i]))
                else:
                    single[s] = kernel.solve([s], values, stats, nm, names, opts)
            if len(batch) == 1 and not single:  # the run the moves will ask for: G⁻¹ known
                _LAST.run = ([solved[s][0] for s, _, _ in members], (g, gi))
    out = GroupSolve(before=0.0)
    for s in syms:
        one = single.get(s)
        if one is not None:
            out.add(one)
            continue
        gs, before, after = solved[s]
        out.steps.append((s, gs.to(s.params[0].device)))
        out.residual[s] = after
        out.progress = max(out.progress, before if opts.coupled else after)
        out.before = None if out.before is None else max(out.before, before)
    return out


def _by_axis(items: Sequence[tuple[Block, Any]]) -> dict[_Key, list[tuple[Block, Any]]]:
    """``(block, payload)`` pairs grouped by (parameter, axis, width), in order."""
    out: dict[_Key, list[tuple[Block, Any]]] = {}
    for b, x in items:
        out.setdefault((id(b.param), b.axis, b.d), []).append((b, x))
    return out


def _tiles(v: Tensor, dim: int, blocks: Sequence[Block]) -> Tensor | None:
    """The slices as a view ``[pre, B, d, post]`` of ``v`` where they tile one range in order.

    ``pre``, ``post``: the products of the axes before and after ``dim``. None where the
    slices are not consecutive (or ``v`` is not contiguous): the caller goes slice by slice.
    """
    d = blocks[0].d
    first = blocks[0].start
    if not v.is_contiguous() or any(b.start != first + i * d for i, b in enumerate(blocks)):
        return None
    pre = math.prod(v.shape[:dim])
    v3 = v.view(pre, v.shape[dim], -1)
    return v3[:, first : first + len(blocks) * d].unflatten(1, (len(blocks), d))


def _left_product_(mats: Tensor, y: Tensor) -> None:
    """y[p, b] → M_b · y[p, b] for every p, b, in place.

    ``mats``: ``[B, d, d]``; ``y``: ``[pre, B, d, post]``, a view of the tensor to move.

    With ``post`` = 1 (the sliced axis last: a fused projection's output columns) each
    slice, a strided ``[pre, d]`` matrix, as y Mᵀ; with ``pre`` = 1 (the sliced axis first:
    an output projection's input rows) each ``[d, post]`` slice as M y; both through a
    reused buffer (:mod:`noetherflow._scratch`). Else one broadcast product of ``[d, d]`` by
    ``[d, post]`` matrices.
    """
    if y.shape[-1] == 1:
        bmm_(y[..., 0].transpose(0, 1), mats.mT, "rotation.left")  # [B, pre, d]
        return
    if y.shape[0] == 1:
        left_mm_(mats, y[0], "rotation.rows")  # [B, d, post]
        return
    y.copy_(torch.matmul(mats, y))


def _apply_(
    tensors: Mapping[nn.Parameter, HeldSamples],
    items: Sequence[tuple[Block, Tensor]],
    offset: int,
) -> None:
    """Front_f → M·Front_f for each ``(block, M [d, d])``, in place, batched per axis.

    ``offset``: 1 for per-sample tensors ``[N, *shape]``, 0 for single ones. Blocks whose
    parameter is not in ``tensors`` are left out. Slices that tile a range are one batched
    product; others go one by one (:meth:`Block.write_front_`).
    """
    for group in _by_axis(items).values():
        blocks = sorted((b for b, _ in group), key=lambda b: b.start)
        v = tensors.get(blocks[0].param)
        if v is None:
            continue
        mat = {id(b): m.to(v.dtype) for b, m in group}
        if isinstance(v, SampleFactors):  # on the factor of that axis (stats/sample_factors.py)
            mats = torch.stack([mat[id(b)] for b in blocks])
            left_product_(v, blocks[0].axis, [b.start for b in blocks], mats)
            continue
        y = _tiles(v, blocks[0].axis + offset, blocks)
        if y is not None:
            _left_product_(torch.stack([mat[id(b)] for b in blocks]), y)
            continue
        for b in blocks:
            if offset:
                b.write_front_batched_(v, mat[id(b)] @ b.front_batched(v))
            else:
                b.write_front_(v, mat[id(b)] @ b.front(v))


# per thread, the last run's elements and (G, G⁻¹): one step's moves reach the moments, θ,
# the samples, ḡ and v, each asking for them (solve_disjoint leaves its own run here, G⁻¹
# from the eigendecomposition that gave G)
_LAST = threading.local()


def _elements(moves: Sequence[tuple[DoubleRotation, Tensor]]) -> tuple[Tensor, Tensor]:
    """(G ``[B, d, d]`` float64, G⁻¹) of a run of moves of one width."""
    es = [e for _, e in moves]
    last = getattr(_LAST, "run", None)
    if (
        last is not None
        and len(last[0]) == len(es)
        and all(a is b for a, b in zip(last[0], es, strict=True))
    ):
        return last[1]  # the same element objects (kept alive here, so never a reused id)
    g = torch.stack([s._check_g(e).to(torch.float64) for s, e in moves])
    out = (g, torch.linalg.inv(g))
    _LAST.run = (es, out)
    return out


def _by_width(
    moves: Sequence[tuple[DoubleRotation, Tensor]],
) -> list[list[tuple[DoubleRotation, Tensor]]]:
    """The moves grouped by the rotations' width d, in order (one batch of elements each)."""
    widths: dict[int, list[tuple[DoubleRotation, Tensor]]] = {}
    for s, e in moves:
        widths.setdefault(s.d, []).append((s, e))
    return list(widths.values())


def _sides(
    moves: Sequence[tuple[DoubleRotation, Tensor]], w_of: int, u_of: int
) -> list[tuple[Block, Tensor]]:
    """(block, matrix) for every block of the moves.

    W blocks get ``mats[w_of]``, U blocks ``mats[u_of]`` of (Gᵀ, G⁻¹), per width (each
    width's inverses in one call).
    """
    out: list[tuple[Block, Tensor]] = []
    for run in _by_width(moves):
        g, ginv = _elements(run)
        mats = (g.mT, ginv)
        for i, (s, _) in enumerate(run):
            out += [(b, mats[w_of][i]) for b in s.w_blocks]
            out += [(b, mats[u_of][i]) for b in s.u_blocks]
    return out


def act_disjoint_(
    moves: Sequence[tuple[DoubleRotation, Tensor]], values: Mapping[nn.Parameter, Tensor]
) -> None:
    """W_f → G⁻¹W_f, U_f → GᵀU_f for each move (disjoint coordinates), in place.

    What :meth:`DoubleRotation.act_` for each gives; one batched product per parameter axis.
    """
    with one_thread():
        _apply_(values, _sides(moves, 1, 0), 0)


def transport_disjoint_(
    moves: Sequence[tuple[DoubleRotation, Tensor]], grads: Mapping[nn.Parameter, HeldSamples]
) -> None:
    """∇W_f → Gᵀ∇W_f, ∇U_f → G⁻¹∇U_f per sample for each move (disjoint coordinates).

    What :meth:`DoubleRotation.transport_grads_` for each gives, on ``[N, *shape]`` tensors;
    parameters missing from ``grads`` are left out.
    """
    with one_thread():
        _apply_(grads, _sides(moves, 0, 1), 1)


def _block_grams(
    blocks: Sequence[Block], tensors: Mapping[nn.Parameter, HeldSamples], offset: int
) -> dict[Block, Tensor]:
    """Σ_r F_r F_rᵀ (``[d, d]``) of each block, F_r the d-front of sample r of its parameter.

    ``tensors``: per parameter ``[N, *shape]`` (``offset`` 1) or its shape (``offset`` 0,
    one F). The slices of one parameter axis that tile a range are one batched Gram product.
    """
    out: dict[Block, Tensor] = {}
    for group in _by_axis([(b, None) for b in blocks]).values():
        run = sorted({b: None for b, _ in group}, key=lambda b: b.start)
        v = tensors[run[0].param]
        if isinstance(v, SampleFactors):  # from the factors (stats/sample_factors.py)
            gram = block_grams(v, run[0].axis, [b.start for b in run], run[0].d)
            out.update(zip(run, gram, strict=True))
            continue
        y = _tiles(v, run[0].axis + offset, run)
        if y is None:  # slice by slice
            for b in run:
                f = b.front_batched(v) if offset else b.front(v).unsqueeze(0)
                out[b] = torch.einsum("rim,rjm->ij", f, f)
            continue
        gram = _tile_grams(y)
        for i, b in enumerate(run):
            out[b] = gram[i]
    return out


def _tile_grams(y: Tensor) -> Tensor:
    """Σ_{p,q} y[p, b, :, q] y[p, b, :, q]ᵀ per slice b of ``y`` ``[pre, B, d, post]``.

    Has shape ``[B, d, d]``. One batched product of the slices as ``[B, d, pre]`` (a fused
    projection's columns) or ``[B, d, post]`` (an output projection's rows) matrices
    (:func:`noetherflow._blas.matmul`).
    """
    if y.shape[-1] == 1:
        a = y[..., 0].permute(1, 2, 0)
    elif y.shape[0] == 1:
        a = y[0]
    else:
        return torch.einsum("pbiq,pbjq->bij", y, y)
    return matmul(a, a.mT)


def _total(parts: Sequence[Tensor]) -> Tensor:
    """The blocks' moments added in order (as ``side_moment`` does)."""
    return sum(parts[1:], parts[0])


def _side_grams(
    syms: Sequence[DoubleRotation], tensors: Mapping[nn.Parameter, HeldSamples], offset: int
) -> dict[DoubleRotation, tuple[Tensor, Tensor]]:
    """Σ over each side's blocks of Σ_r F_r F_rᵀ (``[d, d]``), per rotation: (W side, U side).

    :func:`_block_grams` of every block, added per side in order, as
    :func:`noetherflow.kernels.rotation.side_moment` does.
    """
    grams = _block_grams([b for s in syms for b in [*s.w_blocks, *s.u_blocks]], tensors, offset)
    return {
        s: (_total([grams[b] for b in s.w_blocks]), _total([grams[b] for b in s.u_blocks]))
        for s in syms
    }


# keys of a coupled solve's scratch of this kernel (besides the rotations' block moments):
# per block, (θ's Gram, ḡ's Gram) of the current values; the blocks the last refresh rebuilt
_VALUES, _VOLATILE = "value grams", "volatile blocks"


def _value_grams(
    syms: Sequence[DoubleRotation],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    grams: dict[Block, tuple[Tensor, Tensor]] | None,
) -> tuple[
    dict[DoubleRotation, tuple[Tensor, Tensor]], dict[DoubleRotation, tuple[Tensor, Tensor]]
]:
    """(θ's, ḡ's) Grams per rotation and side, as :func:`_side_grams` gives them.

    ``grams``: the blocks' Grams kept true by the sweeps (dropped where another symmetry
    moved the block, :func:`refresh_`; moved by congruence with the block's own rotation,
    :func:`move_stats_`); only the blocks missing there are computed, then kept.
    """
    blocks = [b for s in syms for b in [*s.w_blocks, *s.u_blocks]]
    if grams is None:
        grams = {}
    todo = list({b: None for b in blocks if b not in grams})
    if todo:
        params = {b.param: None for b in todo}
        th = _block_grams(todo, {p: values[p].to(torch.float64) for p in params}, 0)
        gm = _block_grams(todo, {p: stats.mean[p] for p in params}, 0)
        grams.update({b: (th[b], gm[b]) for b in todo})

    def sides(k: int) -> dict[DoubleRotation, tuple[Tensor, Tensor]]:
        return {
            s: (
                _total([grams[b][k] for b in s.w_blocks]),
                _total([grams[b][k] for b in s.u_blocks]),
            )
            for s in syms
        }

    return sides(0), sides(1)


def refresh_(
    members: Sequence[DoubleRotation],
    samples: Mapping[nn.Parameter, HeldSamples],
    stats: GradStats,
    stale: Mapping[Symmetry, Mapping[nn.Parameter, None]],
    cache: dict[Any, Any],
) -> None:
    """(M_W, M_U) of ``members`` rebuilt from the moments of their blocks, in place.

    Each block's moment (1/N) Σ_n F_n F_nᵀ is kept in ``cache`` and recomputed from
    ``samples`` only where its parameter is stale (another symmetry moved there) or not yet
    cached; the others were moved by the rotation's own moves in closed form
    (:func:`move_stats_`). The sides are their sums, as ``side_moment`` adds them.
    """
    from noetherflow.kernels.rotation import _block

    need: list[Block] = []
    for s in members:
        own = cache.get(s)
        for b in [*s.w_blocks, *s.u_blocks]:
            if own is None or b not in own or b.param in stale.get(s, {}):
                need.append(b)
    # another symmetry moved these blocks' coordinates (or they are new): their θ and ḡ
    # Grams are no longer true, and their next own move is followed by a rebuild, most likely
    kept = cache.setdefault(_VALUES, {})
    volatile = cache.setdefault(_VOLATILE, {})
    for b in need:
        kept.pop(b, None)
        volatile[b] = None
    n = next(iter(samples.values())).shape[0]
    fresh = _block_grams(need, samples, 1)
    side = _block(stats).side
    for s in members:
        own = cache.setdefault(s, {})
        for b in [*s.w_blocks, *s.u_blocks]:
            if b in fresh:
                own[b] = fresh[b] / n
        side[s] = (_total([own[b] for b in s.w_blocks]), _total([own[b] for b in s.u_blocks]))


def move_stats_(
    moves: Sequence[tuple[DoubleRotation, Tensor]],
    stats: GradStats,
    cache: dict[Any, Any],
) -> bool:
    """Each moved rotation's block moments by its own G, exactly: GᵀMG (W), G⁻¹MG⁻ᵀ (U).

    The d-fronts of the gradients move as F_W → GᵀF_W, F_U → G⁻¹F_U (the transport), so
    their moments (1/N) Σ F Fᵀ move by congruence. Only for rotations whose moments are all
    cached (fresh: :func:`refresh_` ran after the last move of anything sharing them);
    False, changing no moment, otherwise. The blocks' kept Grams of θ and ḡ move too
    (:func:`_move_value_grams`), either way.
    """
    from noetherflow.kernels.rotation import _block

    _move_value_grams(moves, cache)
    if any(s not in cache for s, _ in moves):
        return False
    side = _block(stats).side
    with one_thread():
        for run in _by_width(moves):
            g, ginv = _elements(run)
            # every block's moment M → L M Lᵀ (L = Gᵀ on W, G⁻¹ on U) in one batched product
            slots = [
                (cache[s], b, side_mats[i])
                for i, (s, _) in enumerate(run)
                for blocks, side_mats in ((s.w_blocks, g.mT), (s.u_blocks, ginv))
                for b in blocks
            ]
            moms = torch.stack([own[b] for own, b, _ in slots])
            ls = torch.stack([m for _, _, m in slots]).to(moms.dtype)
            moved = _sym(_mm3(ls, moms, ls.mT))
            for (own, b, _), m in zip(slots, moved, strict=True):
                own[b] = m
            for s, _ in run:
                own = cache[s]
                side[s] = (
                    _total([own[b] for b in s.w_blocks]),
                    _total([own[b] for b in s.u_blocks]),
                )
    return True


def _move_value_grams(
    moves: Sequence[tuple[DoubleRotation, Tensor]], cache: dict[Any, Any]
) -> None:
    """The kept Grams of the moved blocks' θ (W_f → G⁻¹W_f, U_f → GᵀU_f) and ḡ, by congruence.

    ḡ moves as a gradient (F_W → GᵀF_W, F_U → G⁻¹F_U). A block the last refresh rebuilt
    (another symmetry moves its coordinates every sweep: on GPT-2, ``c_attn``'s under the
    rescaling) loses its Grams instead, which the next step would find untrue anyway, and so
    does a block whose Gram is cheaper than the two d × d products (a bias); the others
    (``c_proj``'s rows) move in 64 × 64 products instead of a [768, 64] Gram per sweep.
    """
    grams: dict[Block, tuple[Tensor, Tensor]] = cache.get(_VALUES, {})
    volatile: dict[Block, None] = cache.get(_VOLATILE, {})
    with one_thread():
        for run in _by_width(moves):
            g, ginv = _elements(run)
            slots: list[tuple[Block, Tensor, Tensor]] = []  # (block, L for θ, L for ḡ)
            for i, (s, _) in enumerate(run):
                for blocks, lt, lg in ((s.w_blocks, ginv, g.mT), (s.u_blocks, g.mT, ginv)):
                    for b in blocks:
                        cheap = b.param.numel() // b.param.shape[b.axis] <= 2 * b.d
                        if b in volatile or cheap:  # cheap: its Gram costs less than 2 d³
                            volatile.pop(b, None)
                            grams.pop(b, None)
                        elif b in grams:
                            slots.append((b, lt[i], lg[i]))
            if not slots:
                continue
            old = torch.stack([grams[b][k] for k in (0, 1) for b, _, _ in slots])
            ls = torch.stack([lt for _, lt, _ in slots] + [lg for _, _, lg in slots]).to(old.dtype)
            moved = _sym(_mm3(ls, old, ls.mT))
            n = len(slots)
            for j, (b, _, _) in enumerate(slots):
                grams[b] = (moved[j], moved[n + j])


def sample_moments(
    syms: Sequence[DoubleRotation], src: SampleSource
) -> dict[Symmetry, tuple[Tensor, Tensor]]:
    """(M_W, M_U) of each rotation from per-sample gradients, each ``[d, d]``.

    What :func:`noetherflow.kernels.rotation.side_moment` gives per side (Σ over its blocks
    of (1/N) Σ_n F_n F_nᵀ), with the slices of one parameter axis in one batched Gram
    product (:func:`_side_grams`).
    """
    params = {b.param: None for s in syms for b in [*s.w_blocks, *s.u_blocks]}
    grams = _side_grams(syms, {p: src.held(p) for p in params}, 1)
    return {s: (w / src.n, u / src.n) for s, (w, u) in grams.items()}


def batched_xy(
    syms: Sequence[DoubleRotation],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    grams: dict[Block, tuple[Tensor, Tensor]] | None = None,
) -> dict[DoubleRotation, tuple[Tensor, Tensor]]:
    """X = M_U + κWWᵀ, Y = M_W + κUᵀU (float64, CPU), each ``[d, d]``, batched.

    :meth:`RotationKernel.xy` for the rotations with one γ and no momentum cross term, the
    Gram products of θ and ḡ batched (:func:`_side_grams`); the others are left out (the
    caller takes :meth:`RotationKernel.xy` for them). ``grams``: per block, (θ's Gram,
    ḡ's Gram) of the current values, read where present and filled where not
    (:func:`_value_grams`).
    """
    from noetherflow.kernels.rotation import _block

    plain = [
        s
        for s in syms
        if (sub := nm.uniform(s.params)) is not None and cross_values(stats, sub, s.params) is None
    ]
    if not plain:
        return {}
    theta, mean = _value_grams(plain, values, stats, grams)
    side = _block(stats).side
    out = {}
    for s in plain:
        sub = nm.uniform(s.params)
        assert sub is not None
        (sw, su), (gw, gu), (ww, uu) = side[s], mean[s], theta[s]
        x = sub.matrix(gu, su).to(torch.float64) + sub.kappa * ww
        y = sub.matrix(gw, sw).to(torch.float64) + sub.kappa * uu
        out[s] = (x.cpu(), y.cpu())
    return out
