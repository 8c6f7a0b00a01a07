"""Deep linear nets: the noise-equilibrium factorisation (Thm 5.4, App. E, corrected)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from noetherflow.theory.ziyin2024._common import (
    _check_matrix,
    _check_positive,
    _check_square,
    _embedding,
    _psd_power,
    _rank_svd,
)


@dataclass(frozen=True)
class DeepLinearSolution:
    """Noise-equilibrium factorisation ``W_D ⋯ W_1 = V`` (Thm 5.4, corrected).

    Attributes:
        weights: ``[W_1, …, W_D]``; ``W_i`` has shape ``[d_i, d_{i-1}]`` with ``d_0 = d_x``,
            ``d_D = d_y``.
        scale: ``c``, the common singular value of the intermediate layers.
        rank: ``k = rank(V′)``.
        norms_sq: ``‖W_i‖_F²`` for each layer, in order.
        scaled_first_norm_sq: ``‖W_1Σ_x^{1/2}‖_F² = Tr[Σ_1²] = Tr[Σ_x] c²``.
        scaled_last_norm_sq: ``‖Σ_ε^{1/2}W_D‖_F² = Tr[Σ_D²] = Tr[Σ_ε] c²``.
    """

    weights: list[Tensor]
    scale: float
    rank: int
    norms_sq: list[float]
    scaled_first_norm_sq: float
    scaled_last_norm_sq: float


def deep_linear_sgd_solution(
    V: Tensor,
    sigma_x: Tensor,
    sigma_eps: Tensor,
    *,
    hidden_dims: Sequence[int],
    rtol: float = 1e-10,
) -> DeepLinearSolution:
    """Noise-equilibrium solution of ``ℓ = ‖W_D⋯W_1x − y‖²`` at the global minimum (Thm 5.4).

    Let ``a = Tr[Σ_x]``, ``b = Tr[Σ_ε]``, ``V′ = Σ_ε^{1/2}VΣ_x^{1/2} = L S′ R`` (thin SVD,
    rank ``k``; ``S′`` is the diagonal of singular values, so ``Tr S′`` is the nuclear norm of
    ``V′``). With ``U_i = [I_k; 0]`` (shape ``[d_i, k]``):
    ``W_1Σ_x^{1/2} = U_1Σ_1R``, ``W_i = cU_iU_{i−1}ᵀ`` (``1 < i < D``),
    ``Σ_ε^{1/2}W_D = LΣ_DU_{D−1}ᵀ``, where

        ``c = (Tr S′ / sqrt(ab))^{1/D}``, ``Σ_1² = (a c²/Tr S′) S′``, ``Σ_D² = (b c²/Tr S′) S′``.

    This corrects eq. (18): App. E eq. (127) replaces the denominator ``E‖x‖² = Tr[Σ_x]`` of
    the ``i = 1`` balance condition (eq. 122) by ``d``, and likewise ``Tr[Σ_ε]`` at
    ``i = D − 1``. Solving eq. (122) without that substitution gives the above; it reduces
    to the paper's (``Σ_1 = Σ_D``, ``c = (Tr S′/k)^{1/D}``) iff ``Tr[Σ_x] = Tr[Σ_ε] = k``.
    For ``D = 2`` it coincides with Thm 5.2. Verified in the tests against per-sample
    gradients (every adjacent pair's flow vanishes).

    Args:
        V: shape ``[d_y, d_x]``.
        sigma_x: positive definite, shape ``[d_x, d_x]``.
        sigma_eps: positive definite, shape ``[d_y, d_y]``.
        hidden_dims: ``[d_1, …, d_{D−1}]`` (``D ≥ 2``), each ≥ rank.
        rtol: singular values of ``V′`` below ``rtol · s_max`` count as zero.
    """
    _check_matrix("V", V)
    d_y, d_x = V.shape
    _check_square("sigma_x", sigma_x, d_x)
    _check_square("sigma_eps", sigma_eps, d_y)
    dims = list(hidden_dims)
    if len(dims) < 1:
        raise ValueError("hidden_dims is empty; expected at least one hidden width (depth ≥ 2).")
    depth = len(dims) + 1
    a = float(torch.trace(sigma_x))
    b = float(torch.trace(sigma_eps))
    x_ihalf = _psd_power(sigma_x, -0.5, "sigma_x")
    e_ihalf = _psd_power(sigma_eps, -0.5, "sigma_eps")
    left, s, right = _rank_svd(
        _psd_power(sigma_eps, 0.5, "sigma_eps") @ V @ _psd_power(sigma_x, 0.5, "sigma_x"), rtol
    )
    k = s.numel()
    trace_s = float(s.sum())
    c = (trace_s / math.sqrt(a * b)) ** (1.0 / depth)
    sig_1 = torch.sqrt(a * c**2 / trace_s * s)
    sig_d = torch.sqrt(b * c**2 / trace_s * s)
    emb = [_embedding(w, k, V) for w in dims]
    weights = [emb[0] @ (sig_1[:, None] * right) @ x_ihalf]
    for i in range(1, depth - 1):
        weights.append(c * emb[i] @ emb[i - 1].T)
    weights.append(e_ihalf @ (left * sig_d) @ emb[-1].T)
    return DeepLinearSolution(
        weights=weights,
        scale=c,
        rank=k,
        norms_sq=[float((w * w).sum()) for w in weights],
        scaled_first_norm_sq=a * c**2,
        scaled_last_norm_sq=b * c**2,
    )


def deep_linear_intermediate_norm_sq(
    V: Tensor, sigma_x: Tensor, sigma_eps: Tensor, *, depth: int, rtol: float = 1e-10
) -> float:
    """Predicted ``‖W_i‖_F²`` of every intermediate layer (eq. 19, corrected): ``k c²``.

    ``k c² = k (Tr S′ / sqrt(Tr[Σ_x] Tr[Σ_ε]))^{2/D}``; the paper's eq. (19),
    ``(Tr S′)^{2/D} k^{1−2/D}``, is the special case ``Tr[Σ_x] = Tr[Σ_ε] = k`` (see
    :func:`deep_linear_sgd_solution`; :func:`paper_eq19_norm_sq` gives the printed formula).
    Shapes as in :func:`deep_linear_sgd_solution`.
    """
    if depth < 3:
        raise ValueError(f"depth={depth}; intermediate layers exist only for depth ≥ 3.")
    sol = deep_linear_sgd_solution(
        V, sigma_x, sigma_eps, hidden_dims=[V.shape[0] + V.shape[1]] * (depth - 1), rtol=rtol
    )
    return sol.rank * sol.scale**2


def paper_eq19_norm_sq(trace_s_prime: float, rank: int, depth: int) -> float:
    """The paper's eq. (19) as printed: ``(Tr S′)^{2/D} k^{1−2/D}`` (for comparison only).

    Equals :func:`deep_linear_intermediate_norm_sq` only when ``Tr[Σ_x] = Tr[Σ_ε] = k``.
    """
    _check_positive("trace_s_prime", trace_s_prime)
    _check_positive("rank", rank)
    return trace_s_prime ** (2.0 / depth) * rank ** (1.0 - 2.0 / depth)


def deep_linear_balance_gaps(
    weights: Sequence[Tensor], sigma_x: Tensor, sigma_eps: Tensor
) -> list[Tensor]:
    """Per-pair noise imbalance of a deep linear net at the global minimum (eqs. 109–110, 122).

    For ``ℓ = ‖W_D⋯W_1x − y‖²`` with ``r = −ε`` (independent of ``x``), the pair
    ``(W_i, W_{i+1})`` has the charge flow ``Tr[B·G_i]`` (up to ``η/S``) with
    ``G_i = E[∇W_{i+1}ᵀ∇W_{i+1}] − E[∇W_i∇W_iᵀ] = 4(Tr[N_{i+1}] P_i − Tr[P_{i−1}] N_i)``,
    ``P_i = h_{i+1}Σ_xh_{i+1}ᵀ`` (forward second moment after layer ``i``, ``P_0 = Σ_x``) and
    ``N_i = ξ_iᵀΣ_εξ_i`` with ``ξ_i = W_D⋯W_{i+1}`` (``N_D = Σ_ε``).

    Args:
        weights: ``[W_1, …, W_D]``, ``W_i`` of shape ``[d_i, d_{i−1}]``.
        sigma_x: ``E[xxᵀ]``, shape ``[d_0, d_0]``.
        sigma_eps: ``E[εεᵀ]``, shape ``[d_D, d_D]``.

    Returns:
        ``[G_1, …, G_{D−1}]``; ``G_i`` has shape ``[d_i, d_i]``.
    """
    ws = list(weights)
    if len(ws) < 2:
        raise ValueError(f"got {len(ws)} weight(s); expected at least two layers.")
    _check_matrix("weights[0]", ws[0])
    _check_square("sigma_x", sigma_x, ws[0].shape[1])
    for i in range(1, len(ws)):
        _check_matrix(f"weights[{i}]", ws[i], cols=ws[i - 1].shape[0])
    _check_square("sigma_eps", sigma_eps, ws[-1].shape[0])
    forward = [sigma_x]
    for w in ws:
        forward.append(w @ forward[-1] @ w.T)
    backward = [sigma_eps]
    for w in reversed(ws):
        backward.append(w.T @ backward[-1] @ w)
    backward.reverse()  # backward[i] = N_i, i = 0..D
    return [
        4.0
        * (torch.trace(backward[i + 1]) * forward[i] - torch.trace(forward[i - 1]) * backward[i])
        for i in range(1, len(ws))
    ]
