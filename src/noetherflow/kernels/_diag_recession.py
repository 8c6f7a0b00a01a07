"""Private: the directions along which the joint F(λ) of the diagonal generators runs off.

The recession condition (docs/good-to-know.md, "What equilibrium at infinity means"). Along
λ + t·d every term of

    F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κθ_k² e^{2a_k·λ}),        M_kk, κθ_k² ≥ 0,

is multiplied by e^{∓2t·a_k·d}, so F is non-increasing along d (from every λ) iff

    a_k·d ≥ 0 wherever M_kk > 0   and   a_k·d ≤ 0 wherever κθ_k² > 0            (R)

(the recession cone D; a coordinate with both terms, e.g. any θ_k ≠ 0 under weight decay
with gradient noise on it, pins a_k·d = 0; without weight decay only the M side remains).
F ≥ 0 is never unbounded below; its infimum is *not attained* iff some d ∈ D has a strict
inequality in (R) at a present term: F then decreases strictly along d from every λ, towards
the terms with a_k·d = 0. Otherwise every d ∈ D leaves F constant (the lineality space) and F
restricted to its orthogonal complement has bounded level sets: a finite minimiser. The
single-generator case d = ±e_j is :meth:`_DiagProblem.one_sided`; a *combined* direction
(several generators, each bounded alone) needs the whole sign pattern.

Detection, cheap first (:func:`combined_directions`):

1. the **pinning pre-check** (:func:`pinned`, four reductions of each weight's grid, no LP,
   about the cost of one evaluation of F): every coordinate
   touched by one generator u gives σ·d_u ≥ 0 or ≤ 0, one touched by a generator u on its rows
   and v on its columns with opposite entries gives d_u ≥ d_v or ≤; as edges of a directed
   graph with a node for 0 (and the frozen generators), every generator in the strongly
   connected component of 0 has d_u = 0 for all d ∈ D. If that is every free generator,
   D = {0}: the equilibrium is finite and no LP runs (every problem with weight decay and
   noisy coordinates, or a plain rescaling chain without decay);
2. otherwise a **linear program** (HiGHS through :func:`scipy.optimize.linprog`) on the sign
   pattern of (R), over one variable per strongly connected component that is not pinned:
   maximise Σ_t z_t subject to s_t·d + z_t ≤ 0, 0 ≤ z_t ≤ 1 (s_t = −a_k for a present M, +a_k
   for a present κθ²). D is a cone, so the optimum has z_t = 1 exactly on the terms that some
   d ∈ D makes strict, all at once; none: the equilibrium is finite. A second LP then takes the
   sparsest such direction, min ‖d‖₁ with s_t·d ≤ −1 on those terms and ≤ 0 on the others
   (no flat components of F in it). Its generators are frozen and both steps repeat on the
   rest until it is bounded.

A term below ``NEGLIGIBLE`` of the gross terms of a generator it touches counts as absent, as
in :meth:`_DiagProblem.one_sided`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.optimize import linprog
from scipy.sparse.csgraph import connected_components
from torch import Tensor

from noetherflow.kernels._diag_problem import NEGLIGIBLE, Term, _DiagProblem, _Grid

__all__ = ["combined_directions", "pinned", "present"]

_STRICT = 0.5  # z_t above this in the first LP: a term some direction of D makes strict
_SUPPORT = 1e-7  # |d_j| / max|d| below this: not part of the direction (LP tolerances)


def _gens(terms: list[Term], size: int) -> list[tuple[Tensor, float]]:
    """Per term, the generator of each of ``size`` rows (or columns) and its entry."""
    return [(off + torch.arange(size) // b, sg) for off, _, b, sg in terms]


def _lows(g: _Grid, total: Tensor) -> tuple[Tensor, Tensor]:
    """Per row and per column, the least gross terms among the generators reading it.

    ``total`` ``[n]``; has shapes ``[n0]``, ``[n1]`` (inf where no generator reads it).
    """
    n0, n1 = g.m.shape
    low_r = torch.full((n0,), float("inf"), dtype=torch.float64)
    for gi, _ in _gens(g.rows, n0):
        low_r = torch.minimum(low_r, total[gi])
    low_c = torch.full((n1,), float("inf"), dtype=torch.float64)
    for gi, _ in _gens(g.cols, n1):
        low_c = torch.minimum(low_c, total[gi])
    return low_r, low_c


def present(g: _Grid, total: Tensor) -> tuple[Tensor, Tensor]:
    """Which of the grid's M and κθ² terms count (``[n0, n1]`` bool each).

    A term counts when it exceeds ``NEGLIGIBLE`` times the gross terms ``total`` ``[n]`` of
    the least-loaded generator it touches.
    """
    low_r, low_c = _lows(g, total)
    thr = NEGLIGIBLE * torch.minimum(low_r[:, None], low_c[None, :])
    return g.m > thr, g.c > thr


# -- 1. the pinning pre-check ----------------------------------------------------------------
def _largest(
    v: Tensor, low_r: Tensor, low_c: Tensor, axis: int, keep: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The largest term of each row (``axis=1``) or column (``axis=0``) of ``v`` in ``keep``.

    Returns (the kept indices whose largest term counts (:func:`present`), the position of
    that term along ``axis``, the mask of those among the kept). One pass over the kept part.
    """
    idx = keep.nonzero().squeeze(1)
    part = v if idx.numel() == keep.numel() else (v[idx] if axis == 1 else v[:, idx])
    # a row-wise max with indices is several times faster than a column-wise one, even after
    # the copy of the transpose
    val, at = part.max(1) if axis == 1 else part.T.contiguous().max(1)
    i, j = (idx, at) if axis == 1 else (at, idx)
    ok = val > NEGLIGIBLE * torch.minimum(low_r[i], low_c[j])
    return idx[ok], at[ok], ok


def _edges(g: _Grid, total: Tensor, node: Tensor, zero: int, open_: Tensor) -> list[Tensor]:
    """Edges u → v (d_u ≥ d_v for all d ∈ D) that the grid's present terms imply.

    Only grids whose coordinates give a single-generator or difference constraint are read
    (one term, or one row and one column term with opposite entries); leaving a grid out only
    enlarges the cone, so what is pinned stays pinned. A sparse subset of the grid's
    constraints, from one reduction per side and kind of term: per row the column of its
    largest M (κθ²), per column the row of its largest, where that term counts, and only for
    the rows and columns whose generator is ``open_`` (``[n]`` bool: not pinned yet).
    ``node`` ``[n]`` maps generators to graph nodes (frozen ones to ``zero``).
    Has shape ``[2, E]`` per entry.
    """
    n0, n1 = g.m.shape
    low_r, low_c = _lows(g, total)
    out: list[Tensor] = []
    if len(g.rows) + len(g.cols) == 1:
        (gi, sg), axis = (_gens(g.rows, n0)[0], 1) if g.rows else (_gens(g.cols, n1)[0], 0)
        for v, up in ((g.m, sg > 0), (g.c, sg < 0)):  # M: σ·d_u ≥ 0; κθ²: σ·d_u ≤ 0
            u = node[gi[_largest(v, low_r, low_c, axis, open_[gi])[0]]]
            z = torch.full_like(u, zero)
            out.append(torch.stack((u, z) if up else (z, u)))
        return out
    if len(g.rows) != 1 or len(g.cols) != 1 or g.rows[0][3] != -g.cols[0][3]:
        return out
    (gr, sg), (gc, _) = _gens(g.rows, n0)[0], _gens(g.cols, n1)[0]
    for v, up in ((g.m, sg > 0), (g.c, sg < 0)):  # σ(d_u − d_v) ≥ 0 (M) or ≤ 0 (κθ²)
        if not float(v.amax()) > 0:  # e.g. no weight decay: no κθ² (a cheap pass)
            continue
        i, j, _ = _largest(v, low_r, low_c, 1, open_[gr])
        j2, i2, _ = _largest(v, low_r, low_c, 0, open_[gc])
        u = node[torch.cat((gr[i], gr[i2]))]
        w = node[torch.cat((gc[j], gc[j2]))]
        out.append(torch.stack((u, w) if up else (w, u)))
    return out


def _components(edges: list[Tensor], n: int) -> np.ndarray:
    """Strongly connected components of the graph on ``n + 1`` nodes. Has shape ``[n + 1]``."""
    uv = torch.cat(edges, 1).numpy() if edges else np.zeros((2, 0), dtype=np.int64)
    graph = sp.coo_matrix((np.ones(uv.shape[1]), (uv[0], uv[1])), shape=(n + 1, n + 1))
    return connected_components(graph.tocsr(), directed=True, connection="strong")[1]


def pinned(prob: _DiagProblem, frozen: Tensor, total: Tensor) -> tuple[Tensor, Tensor]:
    """Generators that are 0 in every direction of the recession cone (the pre-check).

    ``frozen`` ``[n]`` bool: generators held at 0; ``total`` ``[n]``: gross terms per
    generator (a generator without any, e.g. a channel that never fired without weight
    decay, is flat: no term of F reads it, so it is no part of a direction at infinity and
    counts as pinned). The grids read by one generator (biases, the first layer's rows, the
    last layer's columns: small) go first; the weights between two layers only if that
    leaves generators open, and only along those. Returns (pinned ``[n]`` bool, frozen and
    flat ones included; the strongly connected component of each generator ``[n]`` long,
    equal components moving together in every d ∈ D).
    """
    n = prob.n
    node = torch.where(frozen | (total == 0), n, torch.arange(n))
    open_ = torch.ones(n, dtype=torch.bool)
    single = [len(g.rows) + len(g.cols) == 1 for g in prob.grids]
    edges = [
        e
        for g, one in zip(prob.grids, single, strict=True)
        if one
        for e in _edges(g, total, node, n, open_)
    ]
    labels = _components(edges, n)
    pin = torch.from_numpy(labels == labels[n])[node]
    if not bool(pin.all()):
        open_ = ~pin
        edges += [
            e
            for g, one in zip(prob.grids, single, strict=True)
            if not one
            for e in _edges(g, total, node, n, open_)
        ]
        labels = _components(edges, n)
    comp = torch.from_numpy(labels.astype(np.int64))[node]
    return comp == int(labels[n]), comp


# -- 2. the linear programs --------------------------------------------------------------------
def _classes(var: Tensor, terms: list[Term], size: int) -> tuple[Tensor, Tensor]:
    """Rows (or columns) grouped by the LP variables they touch: (keys ``[K, T]``, classes)."""
    if not terms:
        return torch.zeros(1, 0, dtype=torch.long), torch.zeros(size, dtype=torch.long)
    key = torch.stack([var[gi] for gi, _ in _gens(terms, size)], 1)
    keys, inv = torch.unique(key, dim=0, return_inverse=True)
    return keys, inv


def _rows(g: _Grid, pm: Tensor, pc: Tensor, var: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """The grid's constraints s_t·x ≤ 0 on the LP variables ``x``, one row per class pair.

    Coordinates touching the same variables are merged (their constraints coincide), so the
    rows are at most the distinct (row, column) variable pairs. Returns, per kind (M, κθ²),
    (row ``[E]``, variable ``[E]``, entry ``[E]``) of the nonzeros, rows numbered from 0 up to
    the number of pairs (the last entry's row is not the count: pairs may be all pinned).
    """
    n0, n1 = g.m.shape
    kr, ir = _classes(var, g.rows, n0)
    kc, ic = _classes(var, g.cols, n1)
    signs = torch.tensor([sg for *_, sg in (*g.rows, *g.cols)], dtype=torch.float64)
    out = []
    for mask, sgn in ((pm, -1.0), (pc, 1.0)):  # s = −a_k for M, +a_k for κθ²
        agg = torch.zeros(kr.shape[0], n1, dtype=torch.float64).index_add_(0, ir, mask.double())
        agg = torch.zeros(kr.shape[0], kc.shape[0], dtype=torch.float64).index_add_(1, ic, agg)
        p, q = (agg > 0).nonzero().unbind(1)
        cols = torch.cat([kr[p], kc[q]], 1)  # [pairs, T]
        r = torch.arange(p.shape[0])[:, None].expand_as(cols)
        keep = cols >= 0
        out.append((r[keep], cols[keep], (sgn * signs).expand_as(cols)[keep]))
    return out


def _constraints(
    prob: _DiagProblem, masks: list[tuple[Tensor, Tensor]], var: Tensor, n_var: int
) -> sp.csr_matrix:
    """All grids' constraint rows s_t (``[T, n_var]``, empty rows dropped)."""
    rows, cols, data, base = [], [], [], 0
    for g, (pm, pc) in zip(prob.grids, masks, strict=True):
        for r, c, v in _rows(g, pm, pc, var):
            rows.append(r + base)
            cols.append(c)
            data.append(v)
            base += int(r.max()) + 1 if r.numel() else 0
    if not rows:
        return sp.csr_matrix((0, n_var))
    m = sp.coo_matrix(
        (torch.cat(data).numpy(), (torch.cat(rows).numpy(), torch.cat(cols).numpy())),
        shape=(base, n_var),
    ).tocsr()  # duplicates (a generator on both axes of a coordinate) are summed
    m.eliminate_zeros()
    return m[np.diff(m.indptr) > 0]


def _lp_direction(s: sp.csr_matrix) -> np.ndarray | None:
    """A sparsest d with s·d ≤ 0 and strict rows, or None when no row can be strict."""
    t, v = s.shape
    eye = sp.identity(t, format="csr")
    first = linprog(
        np.concatenate([np.zeros(v), -np.ones(t)]),
        A_ub=sp.hstack([s, eye], format="csr"),
        b_ub=np.zeros(t),
        bounds=[(None, None)] * v + [(0.0, 1.0)] * t,
        method="highs",
    )
    if first.status != 0:  # always feasible (d = 0) and bounded (z ≤ 1): numerics only
        raise RuntimeError(
            f"solve_equilibrium: the linear program that looks for directions at infinity "
            f"({t} constraints on {v} generator groups) did not solve: {first.message}. "
            "Expected an optimal solution; please report this problem with its statistics."
        )
    strict = first.x[v:] > _STRICT
    if not strict.any():
        return None
    second = linprog(
        np.ones(2 * v),
        A_ub=sp.hstack([s, -s], format="csr"),
        b_ub=np.where(strict, -1.0, 0.0),
        bounds=(0.0, None),
        method="highs",
    )
    x = second.x[:v] - second.x[v:] if second.status == 0 else first.x[:v]
    return np.asarray(x, dtype=np.float64)


def _one_direction(
    prob: _DiagProblem, frozen: Tensor, total: Tensor, masks: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor | None, bool]:
    """One combined direction among the generators not ``frozen`` (``[n]``), or None.

    ``masks``: :func:`present` per grid, filled here on the first LP (kept for the next).
    Returns (direction or None, whether the LP ran).
    """
    pin, comp = pinned(prob, frozen, total)
    if bool(pin.all()):
        return None, False
    if not masks:  # the slow path only: which terms count, per coordinate
        masks += [present(g, total) for g in prob.grids]
    labels, var = torch.unique(torch.where(pin, -1, comp), return_inverse=True)
    if int(labels[0]) == -1:  # pinned generators: no variable
        var = var - 1
    n_var = int((labels >= 0).sum())
    s = _constraints(prob, masks, var, n_var)
    x = _lp_direction(s) if s.shape[0] else None
    if x is None:
        return None, True
    d = torch.where(var >= 0, torch.from_numpy(x)[var.clamp_min(0)], 0.0)
    d = d / d.abs().max()
    return torch.where(d.abs() > _SUPPORT, d, 0.0), True


def combined_directions(
    prob: _DiagProblem, frozen: Tensor, total: Tensor
) -> tuple[list[Tensor], bool]:
    """The directions at infinity of F among the generators not ``frozen``.

    Args:
        prob: the joint problem.
        frozen: generators held at 0 (``[n]`` bool; the one-sided ones).
        total: gross terms per generator (``[n]``: ``up + down`` of :meth:`_DiagProblem.sides`).

    Returns:
        (directions, each ``[n]`` float64 scaled to max |d_j| = 1, the generators of one
        disjoint from the others' and from ``frozen``; whether the LP ran: False when the
        pinning pre-check proved the equilibrium finite). Freezing every direction's generators
        leaves a problem with a finite equilibrium.
    """
    masks: list[tuple[Tensor, Tensor]] = []
    frozen = frozen.clone()
    out: list[Tensor] = []
    ran = False
    for _ in range(prob.n):
        d, lp = _one_direction(prob, frozen, total, masks)
        ran = ran or lp
        if d is None:
            break
        out.append(d)
        frozen |= d != 0
    return out, ran
