"""Private: the convex function F(λ) of all diagonal generators and its derivatives.

Paper Thm 4.3, eq. 9 with diagonal A (docs/concepts/equilibrium.md): the flows of all
diagonal charges are −∇F for

    F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κ θ_k² e^{2a_k·λ}),

a sum over parameter coordinates k whose generator rows a_k are sparse: a coordinate of a
weight is touched by the generators of its row (output neuron) and of its column (input
neuron) only. So the Hessian H = Σ_k 2(M_kk e^{−2s_k} + κθ_k² e^{2s_k}) a_k a_kᵀ is
block-sparse: a generator couples only with generators of the adjacent layers, through the
weight between them. :meth:`_DiagProblem.derivatives` forms H densely (the reference, for
small problems); :class:`HessianOperator` applies it matrix-free in O(Σ grid sizes) per
product with memory linear in the number of generators (the Newton–CG solver).

Index legend: a grid is ``[n0, n1]`` (rows × columns of one parameter, summed over the axes no
generator distinguishes); a term ``(offset, k, block, sign)`` says that generators
``offset … offset+k−1`` act on consecutive blocks of ``block`` rows (or columns) with entry
``sign``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["NEGLIGIBLE", "HessianOperator", "Term", "_DiagProblem", "_Grid", "balance", "compress"]

Term = tuple[int, int, int, float]  # (offset in λ, generators k, block b, sign)
# A term of F below this fraction of the gross terms of its generator counts as absent
# (its balance would sit beyond |λ| ≈ ½·ln 10¹³ ≈ 15: at infinity in float64 terms).
NEGLIGIBLE = 1e-13


@dataclass
class _Grid:
    """One parameter's terms of F, summed over the axes no generator distinguishes.

    ``m`` and ``c`` have shape ``[n0, n1]`` (rows × columns; n1 = 1 for vectors); each row
    (column) term is ``(offset, n_generators, block, sign)`` in the global λ vector.
    """

    m: Tensor
    c: Tensor
    rows: list[Term]
    cols: list[Term]


def compress(g: _Grid) -> _Grid:
    """The same terms of F with the axis that no generator reads summed out.

    A grid with row terms only depends on λ through its rows, so F's terms, gradient and
    Hessian are unchanged when ``m`` and ``c`` are summed over the columns (and vice versa).
    Has shapes ``[n0, 1]`` or ``[1, n1]`` where that applies.
    """
    if not g.cols and g.m.shape[1] > 1:
        return _Grid(g.m.sum(1, keepdim=True), g.c.sum(1, keepdim=True), g.rows, g.cols)
    if not g.rows and g.m.shape[0] > 1:
        return _Grid(g.m.sum(0, keepdim=True), g.c.sum(0, keepdim=True), g.rows, g.cols)
    return g


def balance(grids: list[_Grid], n: int) -> tuple[list[_Grid], Tensor]:
    """Grids with signed ``m`` turned into the same F with non-negative terms, where possible.

    F = ½ Σ_b w_b e^{b·λ} once its terms are grouped by exponent b (m terms have b = −2a_k,
    c terms b = +2a_k; a coordinate's M may be negative with the momentum cross term, and
    e.g. a neuron's incoming noise M_in e^{−2λ} and its outgoing decay κc_out e^{−2λ} share
    one exponent). Within a group with w_b ≥ 0 the positive terms are scaled to sum to w_b
    and the negative ones set to 0: F, its gradient and Hessian are unchanged, and every
    term is ≥ 0 as the solver and the recession check assume. A group with w_b < 0 makes F
    unbounded below along b (no stationary point): its terms are set to 0, and the returned
    ``[n]`` float64 vector holds, on the generators b moves, the sign of the direction in
    which F decreases (0 elsewhere). Groups are found by hashing b with a fixed random
    vector (distinct exponents collide with probability 0).
    """
    gen = torch.Generator().manual_seed(0x5EED)
    r = 1.0 + torch.rand(n, generator=gen, dtype=torch.float64)
    keys, vals = [], []
    for g in grids:
        n0, n1 = g.m.shape
        s = _spread(r, g.rows, n0)[:, None] + _spread(r, g.cols, n1)[None, :]
        keys += [-s.reshape(-1), s.reshape(-1)]  # m terms e^{−2s}, c terms e^{2s}
        vals += [g.m.to(torch.float64).cpu().reshape(-1), g.c.to(torch.float64).cpu().reshape(-1)]
    key = torch.cat(keys)
    val = torch.cat(vals)
    scale = float(key.abs().max()) if key.numel() else 1.0
    _, group = torch.unique(torch.round(key / scale * 2.0**40), return_inverse=True)
    total = torch.zeros(int(group.max()) + 1 if group.numel() else 0, dtype=torch.float64)
    total.index_add_(0, group, val)
    pos = torch.zeros_like(total).index_add_(0, group, val.clamp(min=0))
    gross = torch.zeros_like(total).index_add_(0, group, val.abs())
    negative = total < -1e-12 * gross  # beyond round-off of the group's own terms
    ratio = torch.where(negative | (pos == 0), 0.0, total.clamp(min=0) / pos.clamp_min(1e-300))
    new = val.clamp(min=0) * ratio[group]
    direction = torch.zeros(n, dtype=torch.float64)
    out: list[_Grid] = []
    start = 0
    for g in grids:
        size = g.m.numel()
        m_new, c_new = new[start : start + size], new[start + size : start + 2 * size]
        bad = negative[group[start : start + size]].reshape(g.m.shape)
        if bool(bad.any()):
            cells = bad.nonzero()
            for terms, idx in ((g.rows, cells[:, 0]), (g.cols, cells[:, 1])):
                for off, _, blk, sg in terms:  # m e^{−2a·λ}: F falls as a·λ → −∞
                    direction[off + torch.div(idx, blk, rounding_mode="floor")] = -sg
        out.append(
            _Grid(
                m_new.reshape(g.m.shape).to(g.m), c_new.reshape(g.c.shape).to(g.c), g.rows, g.cols
            )
        )
        start += 2 * size
    return out, direction


def _spread(lam: Tensor, terms: list[Term], n: int) -> Tensor:
    """Σ_t sign_t λ_t repeated over each generator's block. Has shape ``[n]``."""
    out = torch.zeros(n, dtype=torch.float64)
    for off, k, b, sg in terms:
        out += sg * lam[off : off + k].repeat_interleave(b)
    return out


def _gather(v: Tensor, k: int, b: int) -> Tensor:
    """Sum consecutive blocks of b entries of ``v`` (length k·b). Has shape ``[k]``."""
    return v.reshape(k, b).sum(1)


TermValues = list[tuple[_Grid, Tensor, Tensor]]


@dataclass
class _DiagProblem:
    """F(λ) = ½ Σ_k (M_kk e^{−2a_k·λ} + κθ_k² e^{2a_k·λ}) for all diagonal generators jointly.

    ``offsets`` maps each symmetry to the offset of its generators in λ (``[n]``);
    ``negative`` (``[n]``, or None) marks with the sign of their run-off the generators of
    term groups whose signed M (momentum cross term) left F unbounded below (:func:`balance`).
    """

    n: int
    offsets: dict[Any, int]
    grids: list[_Grid]
    negative: Tensor | None = None
    # b of a linear term −b·λ (``[n]``; None: none): the decay cross term 4η²Q(Γθ, ḡ) of
    # per-parameter weight decay in discrete time (docs/concepts/flow.md, eq. PD5)
    lin: Tensor | None = None

    def terms(self, lam: Tensor) -> TermValues:
        """Per grid, the two halves of F's terms at ``lam``: m e^{−2s} and c e^{2s}."""
        out = []
        for g in self.grids:
            n0, n1 = g.m.shape
            s = _spread(lam, g.rows, n0)[:, None] + _spread(lam, g.cols, n1)[None, :]
            e = torch.exp(-2 * s)  # one exp per coordinate: e^{2s} = 1/e^{−2s}
            out.append((g, g.m * e, g.c / e))
        return out

    def value_of(self, terms: TermValues, lam: Tensor) -> float:
        """F at ``lam`` from its :meth:`terms` there."""
        f = float(sum(0.5 * (lo.sum() + hi.sum()) for _, lo, hi in terms))
        return f if self.lin is None else f - float(self.lin @ lam)

    def value(self, lam: Tensor) -> float:
        return self.value_of(self.terms(lam), lam)

    def derivatives(
        self,
        lam: Tensor,
        *,
        hessian: bool = True,
        terms: TermValues | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """∇F (= −flow), its gross scale Σ_k |a_kj|(m e^{−2s} + c e^{2s}), and the dense Hessian.

        ``terms`` may pass :meth:`terms` at ``lam`` when already computed. With
        ``hessian=False`` the third result is empty. Shapes ``[n]``, ``[n]``, ``[n, n]``.
        """
        grad = torch.zeros(self.n, dtype=torch.float64)
        scale = torch.zeros(self.n, dtype=torch.float64)
        h = torch.zeros(self.n, self.n, dtype=torch.float64) if hessian else torch.empty(0)
        for g, lo, hi in self.terms(lam) if terms is None else terms:
            d, tot = hi - lo, lo + hi  # ∂/∂s and ½∂²/∂s² of each term
            sums = {}
            for axis, side in ((1, g.rows), (0, g.cols)):
                if not side:
                    continue
                dsum, tsum = d.sum(axis), tot.sum(axis)
                sums[axis] = tsum
                for off, k, b, sg in side:
                    grad[off : off + k] += sg * _gather(dsum, k, b)
                    scale[off : off + k] += abs(sg) * _gather(tsum, k, b)
            if not hessian:
                continue
            for axis, side in ((1, g.rows), (0, g.cols)):
                if not side:
                    continue
                wsum = 2 * sums[axis]
                pos = torch.arange(wsum.shape[0])
                for off1, _, b1, s1 in side:
                    for off2, _, b2, s2 in side:
                        h.index_put_(
                            (off1 + pos // b1, off2 + pos // b2), s1 * s2 * wsum, accumulate=True
                        )
            for off1, k1, b1, s1 in g.rows:
                rowsum = tot.reshape(k1, b1, -1).sum(1)
                for off2, k2, b2, s2 in g.cols:
                    blk = 2 * s1 * s2 * rowsum.reshape(k1, k2, b2).sum(2)
                    h[off1 : off1 + k1, off2 : off2 + k2] += blk
                    h[off2 : off2 + k2, off1 : off1 + k1] += blk.T
        if self.lin is not None:  # −b·λ: ∇ −= b, H unchanged
            grad -= self.lin
            scale += self.lin.abs()
        return grad, scale, h

    def hessian_operator(self, terms: TermValues) -> HessianOperator:
        """H at the point where ``terms`` were computed, as a matrix-free operator."""
        return HessianOperator(self.n, terms)

    def sides(self) -> tuple[Tensor, Tensor]:
        """Per generator, the gross terms pushing it up and down: (up, down), each ``[n]``.

        ``up`` sums the terms that F's flow uses to move the generator towards +∞ (M on its
        positive coordinates, κθ² on its negative ones), ``down`` the others.
        """
        up = torch.zeros(self.n, dtype=torch.float64)
        down = torch.zeros(self.n, dtype=torch.float64)
        for g in self.grids:
            for axis, terms in ((1, g.rows), (0, g.cols)):
                if not terms:
                    continue
                ms, cs = g.m.sum(axis), g.c.sum(axis)
                for off, k, b, sg in terms:
                    mk, ck = abs(sg) * _gather(ms, k, b), abs(sg) * _gather(cs, k, b)
                    up[off : off + k] += mk if sg > 0 else ck
                    down[off : off + k] += ck if sg > 0 else mk
        return up, down

    def one_sided(self, sides: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Per generator: +1 if the noise pushes it to +∞ whatever the others do, −1 to −∞, 0 else.

        A generator whose coordinates offer no restoring term (no κθ² on its positive side and
        no M on its negative side, or the reverse) has no finite equilibrium. ``sides`` may
        pass :meth:`sides` when already computed.
        """
        up, down = self.sides() if sides is None else sides
        tiny = NEGLIGIBLE * (up + down)
        out = torch.zeros(self.n, dtype=torch.float64)
        out[(down <= tiny) & (up > 0)] = 1.0
        out[(up <= tiny) & (down > 0)] = -1.0
        return out

    def ranges(self) -> list[tuple[int, int]]:
        """The distinct generator ranges ``(offset, k)`` of the terms: one per symmetry."""
        seen: dict[tuple[int, int], None] = {}
        for g in self.grids:
            for off, k, _, _ in (*g.rows, *g.cols):
                seen[(off, k)] = None
        return sorted(seen)


class HessianOperator:
    """H = Σ_k w_k a_k a_kᵀ, w_k = 2(m e^{−2s} + c e^{2s}) (the Hessian of F), matrix-free.

    A grid with a single term along one axis only adds to H's diagonal; those are summed into
    one vector. Every other grid keeps its weights w ``[n0, n1]`` and their row and column sums,
    and a product costs two matrix–vector products with w: with v_r, v_c the spread of v over
    rows and columns, (Hv) gathers ``rowsum(w)·v_r + w v_c`` over rows and
    ``wᵀ v_r + colsum(w)·v_c`` over columns. Memory: the weights (as large as the grids) and
    O(n).

    Attributes:
        diagonal: the diagonal of H (exact unless one generator acts on a grid through two
            terms, e.g. a row and a column of the same square weight; it only preconditions).
    """

    def __init__(self, n: int, terms: TermValues) -> None:
        self.n = n
        self._pure = torch.zeros(n, dtype=torch.float64)  # the diagonal-only grids
        self.diagonal = torch.zeros(n, dtype=torch.float64)
        self._grids: list[tuple[_Grid, Tensor, Tensor, Tensor]] = []
        for g, lo, hi in terms:
            w = 2 * (lo + hi)
            rw = w.sum(1) if g.rows else w.new_zeros(0)
            cw = w.sum(0) if g.cols else w.new_zeros(0)
            for side, sums in ((g.rows, rw), (g.cols, cw)):
                for off, k, b, sg in side:
                    self.diagonal[off : off + k] += sg * sg * _gather(sums, k, b)
            n_terms = len(g.rows) + len(g.cols)
            if n_terms == 1 and (w.shape[0] == 1 or w.shape[1] == 1):
                (off, k, b, sg), sums = (g.rows[0], rw) if g.rows else (g.cols[0], cw)
                self._pure[off : off + k] += sg * sg * _gather(sums, k, b)
            else:
                self._grids.append((g, w, rw, cw))

    def matvec(self, v: Tensor) -> Tensor:
        """H v for ``v`` ``[n]`` (float64). Has shape ``[n]``."""
        out = self._pure * v
        for g, w, rw, cw in self._grids:
            n0, n1 = w.shape
            vr = _spread(v, g.rows, n0) if g.rows else None
            vc = _spread(v, g.cols, n1) if g.cols else None
            if g.rows:
                assert vr is not None
                yr = rw * vr if vc is None else torch.addmv(rw * vr, w, vc)
                for off, k, b, sg in g.rows:
                    out[off : off + k] += sg * _gather(yr, k, b)
            if g.cols:
                assert vc is not None
                yc = cw * vc if vr is None else torch.addmv(cw * vc, w.T, vr)
                for off, k, b, sg in g.cols:
                    out[off : off + k] += sg * _gather(yc, k, b)
        return out
