"""Rotations on disjoint coordinates solved as one batched step (the heads of one layer).

Two double rotations that act on no common coordinate do not interact: the solve step of one
reads only the statistics and values of its own slices, and its move changes only those. So
a run of them, solved one after the other by :meth:`RotationKernel.solve`, gives what one
batched geometric mean over the run gives (:func:`solve_disjoint`): X, Y stacked
``[B, d, d]``, one batched ``eigh`` per stage instead of B small calls. Members that need the
single path (singular X or Y: a common range to find; per-parameter decay with its cross
term) take it, one at a time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from noetherflow._threads import one_thread
from noetherflow.kernels.base import GroupSolve, StepOptions
from noetherflow.kernels.noise import NoiseModel
from noetherflow.kernels.rotation import RotationKernel, RotationSettings, _mixed_cross
from noetherflow.stats.core import GradStats
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.rotation import DoubleRotation

__all__ = ["batched_rotation", "solve_disjoint"]


def _sym(a: Tensor) -> Tensor:
    return (a + a.mT) / 2


def _rel(x: Tensor, y: Tensor) -> Tensor:
    """‖X − Y‖ / (‖X‖ + ‖Y‖) per matrix: ``[B, d, d]`` → ``[B]``."""
    n = torch.linalg.matrix_norm
    return n(x - y) / (n(x) + n(y)).clamp_min(1e-300)


def _fn(v: Tensor, f: Tensor) -> Tensor:
    """V diag(f) Vᵀ per matrix: ``v`` ``[B, d, d]``, ``f`` ``[B, d]``."""
    return (v * f.unsqueeze(-2)) @ v.mT


def batched_rotation(
    X: Tensor, Y: Tensor, *, rtol: float, ridge: float | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """G = P^{1/2}, P Y P = X, for a batch of nonsingular pairs (docs/concepts/equilibrium.md).

    ``X``, ``Y``: ``[B, d, d]`` float64. Returns (G ``[B, d, d]``, ok ``[B]`` bool, relative
    flow before ``[B]``, after ``[B]``); where ``ok`` is False (X or Y singular to ``rtol``,
    or both zero) the entries are meaningless and the caller solves that pair alone. The
    arithmetic is :func:`noetherflow.kernels.rotation._solve_rotation`'s, batched.
    """
    d = X.shape[-1]
    X, Y = _sym(X), _sym(Y)
    if ridge is not None:
        eye = torch.eye(d, dtype=X.dtype)
        X, Y = X + ridge * eye, Y + ridge * eye
    ex = torch.linalg.eigvalsh(X)
    ey, vy = torch.linalg.eigh(Y)
    top = torch.maximum(ex.amax(-1), ey.amax(-1)).clamp_min(0.0)
    cut = (rtol * top).unsqueeze(-1)
    ok = (top > 0) & ~((ex <= cut).any(-1) | (ey <= cut).any(-1))
    # P = Y^{-1/2}(Y^{1/2} X Y^{1/2})^{1/2} Y^{-1/2} (the singular members get a harmless
    # positive spectrum so that the batch stays finite)
    ey = torch.where(ok.unsqueeze(-1), ey, 1.0)
    yh = _fn(vy, ey.sqrt())
    yih = _fn(vy, 1 / ey.sqrt())
    wz, vz = torch.linalg.eigh(_sym(yh @ X @ yh))
    p = _sym(yih @ _fn(vz, wz.clamp(min=0).sqrt()) @ yih)
    w, v = torch.linalg.eigh(p)
    w = torch.maximum(w, w.amax(-1, keepdim=True) * 1e-300)
    w = torch.where(ok.unsqueeze(-1), w, 1.0)
    gr = _fn(v, w.sqrt())
    gri = _fn(v, 1 / w.sqrt())
    return gr, ok, _rel(X, Y), _rel(gri @ X @ gri, gr @ Y @ gr)


def solve_disjoint(
    kernel: RotationKernel,
    syms: Sequence[DoubleRotation],
    values: Mapping[nn.Parameter, Tensor],
    stats: GradStats,
    nm: NoiseModel,
    names: Mapping[Symmetry, str],
    opts: StepOptions,
) -> GroupSolve:
    """One solve step for rotations on pairwise disjoint coordinates, batched by width d.

    The same steps, residuals, reports and progress (the largest) as calling
    ``kernel.solve([s], ...)`` for each member in order, to rounding.
    """
    own: RotationSettings = opts.of(kernel)
    single: dict[DoubleRotation, GroupSolve] = {}
    batch: dict[int, list[tuple[DoubleRotation, Tensor, Tensor]]] = {}
    with one_thread():  # d×d algebra: see noetherflow._threads
        for s in syms:
            if _mixed_cross(s, values, stats, nm) is not None:
                single[s] = kernel.solve([s], values, stats, nm, names, opts)
                continue
            x, y = kernel.xy(s, values, stats, nm)
            batch.setdefault(s.d, []).append((s, x, y))
        solved: dict[DoubleRotation, tuple[Tensor, float, float]] = {}
        for members in batch.values():
            X = torch.stack([x for _, x, _ in members])
            Y = torch.stack([y for _, _, y in members])
            g, ok, pre, res = batched_rotation(X, Y, rtol=own.rtol_singular, ridge=own.ridge)
            for i, (s, _, _) in enumerate(members):
                if bool(ok[i]):
                    solved[s] = (g[i], float(pre[i]), float(res[i]))
                else:
                    single[s] = kernel.solve([s], values, stats, nm, names, opts)
    out = GroupSolve()
    for s in syms:
        one = single.get(s)
        if one is not None:
            out.steps.extend(one.steps)
            out.reports.extend(one.reports)
            out.residual.update(one.residual)
            out.progress = max(out.progress, one.progress)
            continue
        gs, before, after = solved[s]
        out.steps.append((s, gs.to(s.params[0].device)))
        out.residual[s] = after
        out.progress = max(out.progress, before if opts.coupled else after)
    return out
