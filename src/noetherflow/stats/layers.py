"""Pure formulas: gradient statistics of linear layers from their inputs and output-gradients.

Index legend: n = samples, t = tokens (or conv positions), i = input features,
o = output features. For sample n the per-sample gradient of a linear map is
G_n = Σ_t g_{nto} a_{nti} (DESIGN §2.2), with ``a`` the layer input and ``g`` the gradient of
the per-sample loss ℓ_n with respect to the layer output. Every function returns averages over
samples (1/N Σ_n), the convention of :class:`noetherflow.GradStats`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "bias_mean",
    "bias_sq",
    "col_moment",
    "row_moment",
    "weight_mean",
    "weight_sq",
    "weight_sq_axis",
]

_CHUNK_ELEMS = 2**24  # per-sample gradient elements materialised at once with a token axis


def weight_mean(a: Tensor, g: Tensor) -> Tensor:
    """Mean gradient (1/N) Σ_n G_n. ``a``: ``[N, T, I]``, ``g``: ``[N, T, O]`` → ``[O, I]``."""
    n = a.shape[0]
    if a.shape[1] == 1:
        return g[:, 0].T @ a[:, 0] / n
    return torch.einsum("nto,nti->oi", g, a) / n


def bias_mean(g: Tensor) -> Tensor:
    """Mean bias gradient. ``g``: ``[N, T, O]`` → ``[O]``."""
    return g.sum(dim=(0, 1)) / g.shape[0]


def _per_sample_chunks(a: Tensor, g: Tensor) -> list[Tensor]:
    n, _, i = a.shape
    o = g.shape[2]
    step = max(1, _CHUNK_ELEMS // max(1, o * i))
    return [
        torch.einsum("nto,nti->noi", g[s : s + step], a[s : s + step]) for s in range(0, n, step)
    ]


def weight_sq(a: Tensor, g: Tensor) -> Tensor:
    """Per-coordinate second moment (1/N) Σ_n G_n ⊙ G_n. Shapes as :func:`weight_mean`.

    Without a token axis (T = 1) this is one matmul, (g²)ᵀ(a²)/N, and nothing per-sample is
    formed; with tokens the per-sample gradients are materialised in chunks, one layer at a time.
    """
    n = a.shape[0]
    if a.shape[1] == 1:
        return g[:, 0].square().T @ a[:, 0].square() / n
    out = torch.zeros(g.shape[2], a.shape[2], dtype=a.dtype, device=a.device)
    for chunk in _per_sample_chunks(a, g):
        out += chunk.square().sum(0)
    return out / n


def weight_sq_axis(a: Tensor, g: Tensor, axis: int) -> Tensor:
    """:func:`weight_sq` summed over the other axis: ``[O]`` (axis 0) or ``[I]`` (axis 1).

    Without tokens this is O(N·(O+I)): (1/N) Σ_n g_n² ‖a_n‖² per output, or
    (1/N) Σ_n ‖g_n‖² a_n² per input — the per-neuron sums a rescaling flow needs.
    """
    n = a.shape[0]
    if a.shape[1] != 1:
        return weight_sq(a, g).sum(1 - axis)
    a0, g0 = a[:, 0], g[:, 0]
    if axis == 0:
        return g0.square().T @ a0.square().sum(1) / n
    return a0.square().T @ g0.square().sum(1) / n


def bias_sq(g: Tensor) -> Tensor:
    """Per-coordinate second moment of the bias gradient. ``g``: ``[N, T, O]`` → ``[O]``."""
    return g.sum(1).square().sum(0) / g.shape[0]


def row_moment(a: Tensor, g: Tensor, rows: slice, *, bias: bool = False) -> Tensor:
    """(1/N) Σ_n G_n[rows] G_n[rows]ᵀ for a row block of the weight (or of the bias).

    This is M_W of DESIGN §2.1 for the map applied first. ``a``: ``[N, T, I]``,
    ``g``: ``[N, T, O]`` → ``[d, d]`` with d the number of rows. Without tokens it is
    gᵀ diag(‖a_n‖²) g; with tokens it uses the per-sample Gram matrix a_n a_nᵀ (``[T, T]``).
    """
    n = a.shape[0]
    gr = g[..., rows]
    if bias:
        s = gr.sum(1)
        return s.T @ s / n
    if a.shape[1] == 1:
        w = a[:, 0].square().sum(1, keepdim=True)
        return (gr[:, 0] * w).T @ gr[:, 0] / n
    gram = torch.einsum("nti,nsi->nts", a, a)
    return torch.einsum("nto,nts,nsp->op", gr, gram, gr) / n


def col_moment(a: Tensor, g: Tensor, cols: slice) -> Tensor:
    """(1/N) Σ_n G_n[:, cols]ᵀ G_n[:, cols] for a column block of the weight.

    This is M_U of DESIGN §2.1 for the map applied second. ``a``: ``[N, T, I]``,
    ``g``: ``[N, T, O]`` → ``[d, d]``. Without tokens it is aᵀ diag(‖g_n‖²) a.
    """
    n = a.shape[0]
    ac = a[..., cols]
    if a.shape[1] == 1:
        w = g[:, 0].square().sum(1, keepdim=True)
        return (ac[:, 0] * w).T @ ac[:, 0] / n
    gram = torch.einsum("nto,nso->nts", g, g)
    return torch.einsum("nti,nts,nsj->ij", ac, gram, ac) / n


def per_sample_weight(a: Tensor, g: Tensor) -> Tensor:
    """Materialised per-sample gradients. ``[N, T, I]``, ``[N, T, O]`` → ``[N, O, I]``."""
    return torch.cat(_per_sample_chunks(a, g), dim=0)
