"""Deep linear nets on the library: the rotation flows of a chain, checked by hand.

For ``ℓ = ‖W_D⋯W_1x − y‖²`` (paper eq. 16) with forward ``h_0 = x``, ``h_i = W_ih_{i−1}`` and
backward ``δ_D = 2r``, ``δ_i = W_{i+1}ᵀδ_{i+1}`` (``r = h_D − y``), the per-sample gradient is
``∇W_i = δ_ih_{i−1}ᵀ``. The pair ``(W_i, W_{i+1})`` rotates hidden space ``i``
(docs/concepts/equilibrium.md):

    M_W = E[∇W_i∇W_iᵀ] − Ḡ_iḠ_iᵀ = E[‖h_{i−1}‖²δ_iδ_iᵀ] − Ḡ_iḠ_iᵀ,
    M_U = E[∇W_{i+1}ᵀ∇W_{i+1}] − Ḡ_{i+1}ᵀḠ_{i+1} = E[‖δ_{i+1}‖²h_ih_iᵀ] − Ḡ_{i+1}ᵀḠ_{i+1},

with ``Ḡ_i = E[∇W_i]``; the continuous-time flow of the pair's charges (γ = 0) is
``(η/S)(M_U − M_W)``. :func:`library_chain_flow_check` compares ``nf.noether_flow`` on the
``nn.Module`` with these hand-written formulas.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["library_chain_flow_check", "pair_noise_matrices"]

_DTYPE = torch.float64


def pair_noise_matrices(weights: list[Tensor], x: Tensor, y: Tensor) -> list[tuple[Tensor, Tensor]]:
    """``(M_U, M_W)`` of every adjacent pair (module docstring), each ``[d_i, d_i]``.

    ``weights`` ``[W_1, …, W_D]`` (``W_i`` of shape ``[d_i, d_{i−1}]``); ``x`` ``[N, d_x]``,
    ``y`` ``[N, d_y]``.
    """
    n = x.shape[0]
    hs = [x]
    for w in weights:
        hs.append(hs[-1] @ w.T)
    deltas = [2.0 * (hs[-1] - y)]  # δ_D
    for w in reversed(weights[1:]):
        deltas.insert(0, deltas[0] @ w)  # δ_i = W_{i+1}ᵀ δ_{i+1}, as rows
    out = []
    for i in range(len(weights) - 1):  # pair (W_{i+1}, W_{i+2}) in 1-based names
        d_i, h_prev = deltas[i], hs[i]
        d_next, h_i = deltas[i + 1], hs[i + 1]
        g_i = d_i.T @ h_prev / n
        g_next = d_next.T @ h_i / n
        m_w = (d_i * (h_prev * h_prev).sum(1, keepdim=True)).T @ d_i / n - g_i @ g_i.T
        m_u = (h_i * (d_next * d_next).sum(1, keepdim=True)).T @ h_i / n - g_next.T @ g_next
        out.append((m_u, m_w))
    return out


def _sq_loss(out: Tensor, target: Tensor) -> Tensor:
    return ((out - target) ** 2).sum(dim=-1).mean()


def library_chain_flow_check(
    weights: list[Tensor],
    V: Tensor,
    sx: Tensor,
    se: Tensor,
    *,
    lr: float,
    batch_size: int,
    n_eval: int,
    seed: int,
) -> dict[str, float]:
    """The library's rotation flows of the chain at ``weights`` against the formulas above.

    On ``n_eval`` fresh samples ``x ~ N(0, Σ_x)``, ``y = Vx + ε``, ``ε ~ N(0, Σ_ε)``,
    ``nf.collect_stats`` (hooks) and ``nf.noether_flow`` (continuous time, γ = 0) on an
    ``nn.Sequential`` of bias-free linear layers with one ``nf.DoubleRotation`` per adjacent
    pair. Returns the largest relative Frobenius difference to ``(η/S)(M_U − M_W)`` over the
    pairs and the largest ``‖M_U − M_W‖/‖M_W‖`` (distance from the pairs' noise equilibrium).
    """
    import noetherflow as nf

    gen = torch.Generator().manual_seed(int(seed))
    x = torch.randn(n_eval, V.shape[1], generator=gen, dtype=_DTYPE) @ torch.linalg.cholesky(sx).T
    eps = torch.randn(n_eval, V.shape[0], generator=gen, dtype=_DTYPE)
    y = x @ V.T + eps @ torch.linalg.cholesky(se).T
    layers = [nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=_DTYPE) for w in weights]
    with torch.no_grad():
        for layer, w in zip(layers, weights, strict=True):
            layer.weight.copy_(w)
    model = nn.Sequential(*layers)
    syms = nf.SymmetrySet(
        [
            nf.DoubleRotation(layers[i], layers[i + 1], label=f"pair{i + 1}")
            for i in range(len(layers) - 1)
        ]
    )
    stats = nf.collect_stats(model, syms, _sq_loss, x, y)
    flows = nf.noether_flow(syms, stats, lr=lr, batch_size=batch_size)
    c = lr / batch_size
    norm = torch.linalg.matrix_norm
    errs, gaps = [], []
    for i, (m_u, m_w) in enumerate(pair_noise_matrices(weights, x, y)):
        ref = c * (m_u - m_w)
        errs.append(float(norm(flows[f"pair{i + 1}"] - ref) / norm(ref)))
        gaps.append(float(norm(m_u - m_w) / norm(m_w)))
    return {"flow_vs_oracle": max(errs), "pair_imbalance": max(gaps)}
