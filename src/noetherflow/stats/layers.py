"""Pure formulas: gradient statistics of linear layers from their inputs and output-gradients.

Index legend: n = samples, t = tokens (or conv positions), i = input features,
o = output features, γ = groups. For sample n the per-sample gradient of a linear map is
G_n = Σ_t g_{nto} a_{nti} (docs/extending.md), with ``a`` the layer input and ``scale · g`` the
gradient of the per-sample loss ℓ_n with respect to the layer output (``scale`` = N when the
captured gradients are those of a batch-mean loss). Every function returns averages over
samples (1/N Σ_n), the convention of :class:`noetherflow.GradStats`. Constant factors are
applied to the smallest operand, never to a large result (a pass over a d×d result costs
about half a matmul here).

Grouped layers (grouped and depthwise convolutions) pass factors with a group axis,
``a`` ``[N, T, G, I]`` and ``g`` ``[N, T, G, O]``: group γ's gradient is
Σ_t g_{ntγo} a_{ntγi} and the weight matrix is the ``[G·O, I]`` stack of the groups' blocks.
:func:`weight_mean`, :func:`weight_sq`, :func:`per_sample_weight` and the bias formulas take
them (a depthwise convolution's per-sample gradients are ``[N, C, k]``: no cross-group zeros
are ever formed); the row/column moments and per-neuron sums are for ``[N, T, I]`` factors.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "bias_mean",
    "bias_sq",
    "block_moments",
    "col_moment",
    "front_factors",
    "gram_cheaper",
    "row_moment",
    "sliced_moment",
    "weight_mean",
    "neuron_sums",
    "weight_sq",
]

_CHUNK_ELEMS = 2**24  # per-sample gradient elements materialised at once with a token axis


def gram_cheaper(t: int, i: int, o: int) -> bool:
    """Whether the per-sample Gram form is the cheaper one: T·(I+O) < I·O.

    Per-neuron sums of a ``[N, T, I]``, ``[N, T, O]`` layer cost about N·T²·(I+O)
    multiply-adds in the Gram form and about N·T·I·O from materialised per-sample gradients.
    """
    return t * (i + o) < i * o


def weight_mean(a: Tensor, g: Tensor, *, scale: float = 1.0) -> Tensor:
    """Mean gradient (1/N) Σ_n G_n. ``a``: ``[N, T, I]``, ``g``: ``[N, T, O]`` → ``[O, I]``.

    Grouped factors ``[N, T, G, I]``, ``[N, T, G, O]`` give ``[G·O, I]``.
    """
    n = a.shape[0]
    if a.dim() == 4:
        return torch.einsum("ntgo,ntgi->goi", g, a).reshape(-1, a.shape[3]).mul_(scale / n)
    if a.shape[1] == 1:
        return g[:, 0].T @ (a[:, 0] * (scale / n))
    return torch.einsum("nto,nti->oi", g, a).mul_(scale / n)


def bias_mean(g: Tensor, *, scale: float = 1.0) -> Tensor:
    """Mean bias gradient. ``g``: ``[N, T, O]`` (or ``[N, T, G, O]``) → ``[O]`` (``[G·O]``)."""
    return g.sum(dim=(0, 1)).reshape(-1).mul_(scale / g.shape[0])


def _per_sample_chunks(a: Tensor, g: Tensor, scale: float = 1.0) -> list[Tensor]:
    """Per-sample gradients ``[n, O, I]`` (grouped: ``[n, G·O, I]``) in chunks of samples."""
    n, i, o = a.shape[0], a.shape[-1], g.shape[-1]
    grp = a.shape[2] if a.dim() == 4 else 1
    step = max(1, _CHUNK_ELEMS // max(1, grp * o * i))
    gs = g if scale == 1.0 else g * scale
    eq = "ntgo,ntgi->ngoi" if a.dim() == 4 else "nto,nti->noi"
    return [
        torch.einsum(eq, gs[s : s + step], a[s : s + step]).reshape(-1, grp * o, i)
        for s in range(0, n, step)
    ]


def weight_sq(a: Tensor, g: Tensor, *, scale: float = 1.0) -> Tensor:
    """Per-coordinate second moment (1/N) Σ_n G_n ⊙ G_n. Shapes as :func:`weight_mean`.

    Without a token axis (T = 1) this is one matmul, (g²)ᵀ(a²)/N, and nothing per-sample is
    formed; with tokens the per-sample gradients are materialised in chunks, one layer at a time.
    """
    n = a.shape[0]
    if a.shape[1] == 1 and a.dim() == 3:
        return g[:, 0].square().T @ a[:, 0].square().mul_(scale * scale / n)
    rows = g.shape[2] * g.shape[3] if g.dim() == 4 else g.shape[2]
    out = torch.zeros(rows, a.shape[-1], dtype=a.dtype, device=a.device)
    for chunk in _per_sample_chunks(a, g):
        out += chunk.square().sum(0)
    return out.mul_(scale * scale / n)


def neuron_sums(
    a: Tensor, g: Tensor, axes: tuple[int, ...], *, bias: bool = False, scale: float = 1.0
) -> tuple[dict[int, Tensor], Tensor | None]:
    """:func:`weight_sq` summed over the other axis for each axis in ``axes``, and the bias's.

    Returns ``({0: [O], 1: [I]}, [O] or None)`` (the requested keys; the bias entry when
    ``bias``). Without tokens this is O(N·(O+I)): (1/N) Σ_n g_n² ‖a_n‖² per output,
    (1/N) Σ_n ‖g_n‖² a_n² per input and (1/N) Σ_n g_n² for the bias — the per-neuron sums a
    rescaling flow needs. Each elementwise square is formed at most once per layer. With tokens
    the sums use the per-sample Gram form when :func:`gram_cheaper` says so (T small relative
    to I·O/(I+O)), else the chunked per-sample gradients.
    """
    n = a.shape[0]
    c = scale * scale / n
    t = a.shape[1]
    if t != 1:
        b_sq = bias_sq(g, scale=scale) if bias else None
        if not gram_cheaper(t, a.shape[2], g.shape[2]):
            full = weight_sq(a, g, scale=scale)
            return {ax: full.sum(1 - ax) for ax in axes}, b_sq
        # per-sample Gram form: Σ_i G_{oi}² = Σ_{t,s} g_{to} g_{so} (a_t·a_s), and alike per input
        res = {}
        if 0 in axes:
            gram_a = torch.einsum("nti,nsi->nts", a, a).mul_(c)
            res[0] = torch.einsum("nto,nts,nso->o", g, gram_a, g)
        if 1 in axes:
            gram_g = torch.einsum("nto,nso->nts", g, g).mul_(c)
            res[1] = torch.einsum("nti,nts,nsi->i", a, gram_g, a)
        return res, b_sq
    a0, g0 = a[:, 0], g[:, 0]
    g2 = g0.square() if (0 in axes or bias) else None
    a2 = a0.square() if 1 in axes else None
    out = {}
    if 0 in axes:
        assert g2 is not None
        an2 = a2.sum(1) if a2 is not None else torch.linalg.vector_norm(a0, dim=1).square_()
        out[0] = g2.T.mv(an2).mul_(c)
    if 1 in axes:
        assert a2 is not None
        gn2 = g2.sum(1) if g2 is not None else torch.linalg.vector_norm(g0, dim=1).square_()
        out[1] = a2.T.mv(gn2).mul_(c)
    b = g2.sum(0).mul_(c) if g2 is not None and bias else None
    return out, b


def bias_sq(g: Tensor, *, scale: float = 1.0) -> Tensor:
    """Per-coordinate second moment of the bias gradient. ``g``: ``[N, T, O]`` → ``[O]``.

    Grouped ``[N, T, G, O]`` → ``[G·O]``.
    """
    s = g[:, 0] if g.shape[1] == 1 else g.sum(1)
    return s.square().sum(0).reshape(-1).mul_(scale * scale / g.shape[0])


def row_moment(
    a: Tensor, g: Tensor, rows: slice, *, bias: bool = False, scale: float = 1.0
) -> Tensor:
    """(1/N) Σ_n G_n[rows] G_n[rows]ᵀ for a row block of the weight (or of the bias).

    This is M_W of docs/concepts/equilibrium.md for the map applied first. ``a``: ``[N, T, I]``,
    ``g``: ``[N, T, O]`` → ``[d, d]`` with d the number of rows. Without tokens it is
    gᵀ diag(‖a_n‖²) g; with tokens it uses the per-sample Gram matrix a_n a_nᵀ (``[T, T]``).
    For many blocks of one layer, form :func:`front_factors` once instead.
    """
    return sliced_moment(*front_factors(a, g, "bias" if bias else "row", scale=scale), rows)


def col_moment(a: Tensor, g: Tensor, cols: slice, *, scale: float = 1.0) -> Tensor:
    """(1/N) Σ_n G_n[:, cols]ᵀ G_n[:, cols] for a column block of the weight.

    This is M_U of docs/concepts/equilibrium.md for the map applied second. ``a``: ``[N, T, I]``,
    ``g``: ``[N, T, O]`` → ``[d, d]``. Without tokens it is aᵀ diag(‖g_n‖²) a.
    """
    return sliced_moment(*front_factors(a, g, "col", scale=scale), cols)


def per_sample_weight(
    a: Tensor, g: Tensor, *, scale: float = 1.0, transposed: bool = False
) -> Tensor:
    """Materialised per-sample gradients. ``[N, T, I]``, ``[N, T, O]`` → ``[N, O, I]``.

    ``transposed``: in the ``[I, O]`` layout instead, ``[N, I, O]`` (a weight stored
    transposed, e.g. Hugging Face's ``Conv1D``), contiguous, so that later reductions over
    the samples read memory in order (a transposed view of ``[N, O, I]`` made them 15×
    slower). Written in place chunk by chunk (no concatenation); the factor ``scale`` goes
    on the smaller operand. Grouped ``[N, T, G, I]``, ``[N, T, G, O]`` → ``[N, G·O, I]``.
    """
    if a.dim() == 4:
        assert not transposed, "grouped factors come from convolutions (stored [O, I])"
        return torch.cat(_per_sample_chunks(a, g, scale), dim=0)
    n, i, o = a.shape[0], a.shape[-1], g.shape[-1]
    if scale != 1.0:  # on the operand with fewer entries
        a, g = (a * scale, g) if i < o else (a, g * scale)
    out = a.new_empty((n, i, o) if transposed else (n, o, i))
    step = max(1, _CHUNK_ELEMS // max(1, o * i))
    for s in range(0, n, step):
        x, y = a[s : s + step], g[s : s + step]
        if transposed:
            torch.bmm(x.mT, y, out=out[s : s + step])
        else:
            torch.bmm(y.mT, x, out=out[s : s + step])
    return out


def front_factors(a: Tensor, g: Tensor, kind: str, *, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """(L, R) with Σ_{n,t} L[n, t, s]ᵀ R[n, t, s] the front moment of any slice s of E.

    The front moments of :func:`row_moment` (``kind="row"``: rows of the weight, E = O),
    :func:`col_moment` (``"col"``: its columns, E = I) and of the bias rows (``"bias"``):

    * row: L = g, R = (c·a_n a_nᵀ) g_n, since G_n[s] G_n[s]ᵀ = Σ_{t,u} g_nt[s] (a_nt·a_nu)
      g_nu[s]ᵀ;
    * col: L = a, R = (c·g_n g_nᵀ) a_n;
    * bias: L = Σ_t g (one token), R = c·L;

    with c = scale²/N. ``a``: ``[N, T, I]``, ``g``: ``[N, T, O]`` → two ``[N, T, E]``
    (``[N, 1, O]`` for the bias). Formed once per layer, they serve every slice (every head of
    a fused projection): a slice costs N·T·d² (:func:`sliced_moment`, :func:`block_moments`)
    instead of a per-sample Gram matrix N·T²·I each.
    """
    if kind not in ("row", "col", "bias"):
        raise ValueError(f"front_factors: kind={kind!r}; expected 'row', 'col' or 'bias'.")
    n, t = a.shape[0], a.shape[1]
    c = scale * scale / n
    if kind == "bias":
        s = g.sum(1, keepdim=True)
        return s, s * c
    left, other = (g, a) if kind == "row" else (a, g)
    if t == 1:
        return left, left * other.square().sum(-1, keepdim=True).mul_(c)
    gram = torch.bmm(other, other.mT).mul_(c)  # [N, T, T]
    return left, torch.bmm(gram, left)


def sliced_moment(left: Tensor, right: Tensor, sl: slice) -> Tensor:
    """Σ_{n,t} L[n, t, sl]ᵀ R[n, t, sl] of :func:`front_factors`. Has shape ``[d, d]``."""
    lv, rv = left[..., sl], right[..., sl]
    d = lv.shape[-1]
    return lv.reshape(-1, d).T @ rv.reshape(-1, d)


def block_moments(left: Tensor, right: Tensor, d: int) -> Tensor:
    """:func:`sliced_moment` of every aligned slice [k·d, (k+1)·d) at once. ``[E // d, d, d]``.

    One batched product for all heads of a projection instead of one small product per head.
    """
    nb = left.shape[-1] // d
    lb = left[..., : nb * d].reshape(-1, nb, d)
    rb = right[..., : nb * d].reshape(-1, nb, d)
    return torch.bmm(lb.permute(1, 2, 0), rb.transpose(0, 1))
