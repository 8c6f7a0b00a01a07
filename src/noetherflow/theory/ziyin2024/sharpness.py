"""Sharpness of the two-layer linear net: Prop 5.3 and eq. (15)."""

from __future__ import annotations

import torch
from torch import Tensor

from noetherflow.theory.ziyin2024._common import (
    InitScheme,
    LossScaling,
    _check_matrix,
    _check_positive,
    _check_square,
)
from noetherflow.theory.ziyin2024.two_layer import two_layer_sgd_solution


def _reduction_factor(reduction: str, d_y: int) -> float:
    if reduction == "sum":
        return 2.0
    if reduction == "mean":
        return 2.0 / d_y
    if reduction == "half_sum":
        return 1.0
    raise ValueError(
        f"reduction={reduction!r} is not a loss normalisation; expected 'sum' (ℓ = ‖r‖², "
        "paper eq. 12), 'mean' (ℓ = ‖r‖²/d_y, nn.MSELoss) or 'half_sum' (ℓ = ½‖r‖²)."
    )


def two_layer_hessian_trace(
    U: Tensor,
    W: Tensor,
    sigma_x: Tensor,
    *,
    reduction: LossScaling = "sum",
    weight_decay: float = 0.0,
) -> float:
    """``Tr ∇²L(U, W)`` for ``L = E[ℓ(UWx − y)]`` (Prop 5.3), exact at every ``(U, W)``.

    ``Tr ∇²L = c (d_y‖WΣ_x^{1/2}‖_F² + ‖U‖_F² Tr[Σ_x]) + 2γ·(#parameters)``, with ``c = 2``
    for ``ℓ = ‖r‖²`` (``"sum"``, the paper's eq. 12), ``2/d_y`` for ``"mean"`` and ``1`` for
    ``"half_sum"``. The diagonal of the Hessian has no residual term, so this holds away
    from minima too. The paper's Prop 5.3 states ``c = 1`` for its loss (12): its App. B.5
    drops the factor 2 of ``∇‖r‖²``; it is exact for ``½‖r‖²``. ``weight_decay`` adds the
    ``2γI`` of ``γ‖θ‖²`` (the paper's ``S`` excludes it; default 0).

    Args:
        U: shape ``[d_y, d]``.
        W: shape ``[d, d_x]``.
        sigma_x: ``E[xxᵀ]``, shape ``[d_x, d_x]``.
        reduction: ``"sum"``, ``"mean"`` or ``"half_sum"`` (the factor ``c``).
        weight_decay: ``γ``; adds ``2γ`` per parameter.
    """
    _check_matrix("W", W)
    d, d_x = W.shape
    _check_matrix("U", U, cols=d)
    _check_square("sigma_x", sigma_x, d_x)
    d_y = U.shape[0]
    c = _reduction_factor(reduction, d_y)
    data = d_y * torch.trace(W @ sigma_x @ W.T) + (U * U).sum() * torch.trace(sigma_x)
    return c * float(data) + 2.0 * weight_decay * (U.numel() + W.numel())


def two_layer_sgd_sharpness(
    V: Tensor,
    sigma_x: Tensor,
    sigma_eps: Tensor,
    *,
    hidden_dim: int,
    reduction: LossScaling = "sum",
) -> float:
    """Prop 5.3 evaluated at the Thm 5.2 solution: SGD's predicted end-of-training ``Tr ∇²L``.

    Unique although the solution is only unique up to rotation (``WᵀW`` and ``‖U‖`` are).
    Shapes as in :func:`two_layer_sgd_solution`.
    """
    sol = two_layer_sgd_solution(V, sigma_x, sigma_eps, hidden_dim=hidden_dim)
    return two_layer_hessian_trace(sol.U, sol.W, sigma_x, reduction=reduction)


def init_variances(
    scheme: InitScheme, *, d_x: int, d: int, d_y: int, gain: float = 1.0
) -> tuple[float, float]:
    """Entry variances ``(σ_W², σ_U²)`` of PyTorch's normal initialisers for ``W`` and ``U``.

    ``"kaiming"``: ``kaiming_normal_(mode="fan_in")`` with the given gain,
    ``σ² = gain²/fan_in`` → ``(gain²/d_x, gain²/d)``. ``"xavier"``: ``xavier_normal_``,
    ``σ² = 2 gain²/(fan_in + fan_out)`` → ``(2g²/(d + d_x), 2g²/(d_y + d))``.

    The paper (§5.2) writes Kaiming ``σ_U² = 1`` (the fan-in value only when ``d = 1``, the
    rank-one model of its Fig. 4) and Xavier ``(d_y + d)^{-1}`` (half of Glorot's variance).
    With ``σ_U² = 1/d`` its claim "no flattening iff ``d = d_x = d_y``" holds; with
    ``σ_U² = 1`` it does not.
    """
    for name, v in (("d_x", d_x), ("d", d), ("d_y", d_y)):
        _check_positive(name, v)
    g2 = gain**2
    if scheme == "kaiming":
        return g2 / d_x, g2 / d
    if scheme == "xavier":
        return 2.0 * g2 / (d + d_x), 2.0 * g2 / (d_y + d)
    raise ValueError(f"scheme={scheme!r} is unknown; expected 'kaiming' or 'xavier'.")


def sharpness_at_init(
    sigma_w_sq: float,
    sigma_u_sq: float,
    *,
    trace_sigma_x: float,
    d: int,
    d_y: int,
    reduction: LossScaling = "sum",
) -> float:
    """Expected ``Tr ∇²L`` at an i.i.d. init, eq. (15): ``c·d_y·d·Tr[Σ_x](σ_W² + σ_U²)``.

    ``c`` as in :func:`two_layer_hessian_trace`. The paper's eq. (15) prints ``d_x d`` where
    its preceding sentence (and Prop 5.3) give ``d_y d``; they agree for autoencoders.
    """
    c = _reduction_factor(reduction, d_y)
    return c * d_y * d * trace_sigma_x * (sigma_w_sq + sigma_u_sq)


def sharpness_at_end_autoencoder(
    trace_sigma_x: float, *, d_x: int, d: int, reduction: LossScaling = "sum"
) -> float:
    """``Tr ∇²L`` at SGD's end point for an isotropic autoencoder, eq. (15).

    ``Σ_x ∝ I``, ``Σ_ε ∝ I``, ``d_y = d_x``: Thm 5.2 makes the layers balanced with
    ``min(d, d_x)`` unit singular values, so ``S_end = c·2·min(d, d_x)·Tr[Σ_x]`` (``c = 1`` is
    the paper's value).
    """
    c = _reduction_factor(reduction, d_x)
    return c * 2.0 * min(d, d_x) * trace_sigma_x
