"""The two-layer linear net ``f(x) = UWx``: noise factors and equilibria (Thm 5.2, App. C)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from noetherflow.theory.ziyin2024._common import (
    TimeScale,
    _check_matrix,
    _check_positive,
    _check_square,
    _check_time,
    _embedding,
    _psd_power,
    _rank_svd,
    _sym,
)
from noetherflow.theory.ziyin2024.charge_dynamics import kappa


def weight_decay_ridge(
    weight_decay: float, *, lr: float, batch_size: int, time: TimeScale = "continuous"
) -> float:
    """The ``ρ`` that weight decay adds to ``Γ_W`` and ``Γ_U`` in Thm 5.2: ``Γ → Γ + ρI``.

    Derivation (ours). For ``C_B = Tr[B(UᵀU − WWᵀ)]`` the expected flow is
    ``(4η/S) Tr[B(WΓ_WWᵀ − UᵀΓ_UU)] − 4γ Tr[B(UᵀU − WWᵀ)]`` (continuous), so the weight-decay
    term is absorbed by ``ρ = γS/η``. Discrete: ``ρ = κS/(4η²) = γ(1 − ηγ)S/η``.

    The paper's main text writes ``Γ + 2γI`` and its App. C (eqs. 87–88) ``ηΣ′ + γI`` i.e.
    ``ρ = γ/η``; both drop the batch size, and the main-text form is not even dimensionally
    consistent with the noise term.
    """
    _check_time(time)
    _check_positive("lr", lr)
    _check_positive("batch_size", batch_size)
    _check_positive("weight_decay", weight_decay, allow_zero=True)
    if time == "continuous":
        return weight_decay * batch_size / lr
    return kappa(lr, weight_decay) * batch_size / (4.0 * lr**2)


def two_layer_noise_factors(
    x: Tensor, r: Tensor, *, time: TimeScale = "continuous", batch_size: int = 1
) -> tuple[Tensor, Tensor]:
    """The noise matrices ``Γ_W`` and ``Γ_U`` of Thm 5.2 from samples, exact at any ``(U, W)``.

    For ``ℓ = ‖r‖²``, ``r = UWx − y``, the per-sample gradients are ``∇_U = 2r(Wx)ᵀ`` and
    ``∇_W = 2Uᵀr xᵀ``; hence the ``d×d`` covariances ``M_U`` of ``∇Uᵀ∇U`` and ``M_W`` of
    ``∇W∇Wᵀ`` (docs/concepts/equilibrium.md) are ``M_U = 4WΓ_WWᵀ`` and ``M_W = 4UᵀΓ_UU`` with

    * continuous (covariances): ``Γ_W = E[‖r‖²xxᵀ] − E[xrᵀ]E[rxᵀ]``,
      ``Γ_U = E[‖x‖²rrᵀ] − E[rxᵀ]E[xrᵀ]``;
    * discrete (``ḡḡᵀ + Σ/S`` scaled by ``S``): the second moments plus ``(S − 1)`` times the
      mean outer products.

    The paper's ``Γ`` (after eq. 13) are the second moments; all three coincide where the mean
    gradient vanishes (e.g. at the global minimum without weight decay). Ridge from weight
    decay is not included (see :func:`weight_decay_ridge`).

    Args:
        x: inputs, shape ``[n, d_x]``.
        r: residuals ``UWx − y``, shape ``[n, d_y]``.
        time: ``"continuous"`` (covariances) or ``"discrete"``.
        batch_size: ``S``; only the discrete model uses it.

    Returns:
        ``(Γ_W, Γ_U)``; ``Γ_W`` has shape ``[d_x, d_x]``, ``Γ_U`` has shape ``[d_y, d_y]``.
    """
    _check_time(time)
    _check_positive("batch_size", batch_size)
    _check_matrix("x", x)
    _check_matrix("r", r, rows=x.shape[0])
    n = x.shape[0]
    r_sq = (r * r).sum(dim=1)
    x_sq = (x * x).sum(dim=1)
    second_w = (x * r_sq[:, None]).T @ x / n
    second_u = (r * x_sq[:, None]).T @ r / n
    cross = r.T @ x / n  # E[r xᵀ], shape [d_y, d_x]
    weight = -1.0 if time == "continuous" else float(batch_size - 1)
    return second_w + weight * cross.T @ cross, second_u + weight * cross @ cross.T


def two_layer_gammas_at_minimum(sigma_x: Tensor, sigma_eps: Tensor) -> tuple[Tensor, Tensor]:
    """``Γ_W = Tr[Σ_ε]Σ_x`` and ``Γ_U = Tr[Σ_x]Σ_ε`` at the global minimum (after Thm 5.2).

    Requires ``x`` and ``ε`` independent with ``E[ε] = 0`` (then ``r = −ε``).

    Args:
        sigma_x: ``E[xxᵀ]``, shape ``[d_x, d_x]``.
        sigma_eps: ``E[εεᵀ]``, shape ``[d_y, d_y]``.

    Returns:
        ``(Γ_W, Γ_U)`` with shapes ``[d_x, d_x]`` and ``[d_y, d_y]``.
    """
    _check_square("sigma_x", sigma_x)
    _check_square("sigma_eps", sigma_eps)
    return torch.trace(sigma_eps) * sigma_x, torch.trace(sigma_x) * sigma_eps


def two_layer_equilibrium_gap(
    U: Tensor, W: Tensor, gamma_w: Tensor, gamma_u: Tensor, *, ridge: float = 0.0
) -> Tensor:
    """``W(Γ_W + ρI)Wᵀ − Uᵀ(Γ_U + ρI)U``: zero exactly at the noise equilibrium (Thm 5.2, eq. 13).

    Args:
        U: shape ``[d_y, d]``.
        W: shape ``[d, d_x]``.
        gamma_w: shape ``[d_x, d_x]``.
        gamma_u: shape ``[d_y, d_y]``.
        ridge: ``ρ`` from :func:`weight_decay_ridge` (0 without weight decay).

    Returns:
        Has shape ``[d, d]``.
    """
    _check_matrix("W", W)
    d, d_x = W.shape
    _check_matrix("U", U, cols=d)
    _check_square("gamma_w", gamma_w, d_x)
    _check_square("gamma_u", gamma_u, U.shape[0])
    return W @ gamma_w @ W.T - U.T @ gamma_u @ U + ridge * (W @ W.T - U.T @ U)


def two_layer_charge_flow(
    U: Tensor,
    W: Tensor,
    B: Tensor,
    gamma_w: Tensor,
    gamma_u: Tensor,
    *,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    time: TimeScale = "continuous",
) -> float:
    """Expected flow of ``C_B = Tr[B(UᵀU − WWᵀ)]`` (Prop 5.1 specialised to eq. 12).

    ``dC_B/dt = (4η/S) Tr[B·gap]`` (continuous) or ``E[ΔC_B] = (4η²/S) Tr[B·gap]`` (discrete),
    ``gap`` from :func:`two_layer_equilibrium_gap` with the matching ridge. Pass the ``Γ`` of
    :func:`two_layer_noise_factors` with the same ``time`` and ``batch_size`` for an exact
    flow.

    Args:
        U: shape ``[d_y, d]``.
        W: shape ``[d, d_x]``.
        B: symmetric, shape ``[d, d]``.
        gamma_w: ``Γ_W``, shape ``[d_x, d_x]``.
        gamma_u: ``Γ_U``, shape ``[d_y, d_y]``.
        lr: learning rate ``η``.
        batch_size: minibatch size ``S``.
        weight_decay: ``γ`` (loss term ``γ‖θ‖²``).
        time: ``"continuous"`` or ``"discrete"``.
    """
    _check_square("B", B, W.shape[0])
    ridge = weight_decay_ridge(weight_decay, lr=lr, batch_size=batch_size, time=time)
    gap = two_layer_equilibrium_gap(U, W, gamma_w, gamma_u, ridge=ridge)
    scale = 4.0 * (lr if time == "continuous" else lr**2) / batch_size
    return scale * float(torch.sum(_sym(B) * gap))


@dataclass(frozen=True)
class TwoLayerSolution:
    """A factorisation ``U @ W`` and its Frobenius norms.

    Attributes:
        U: shape ``[d_y, d]``.
        W: shape ``[d, d_x]``.
        norm_u_sq: ``‖U‖_F²``.
        norm_w_sq: ``‖W‖_F²``.
        ratio: ``‖W‖_F² / ‖U‖_F²``.
    """

    U: Tensor
    W: Tensor
    norm_u_sq: float
    norm_w_sq: float
    ratio: float


def _solution(U: Tensor, W: Tensor) -> TwoLayerSolution:
    nu = float((U * U).sum())
    nw = float((W * W).sum())
    return TwoLayerSolution(U=U, W=W, norm_u_sq=nu, norm_w_sq=nw, ratio=nw / nu)


def two_layer_noise_equilibrium(
    V: Tensor, gamma_w: Tensor, gamma_u: Tensor, *, hidden_dim: int, rtol: float = 1e-10
) -> TwoLayerSolution:
    """A solution of ``UW = V`` and ``WΓ_WWᵀ = UᵀΓ_UU`` (App. C, eqs. 89–92).

    With ``W′ = WΓ_W^{1/2}``, ``U′ = Γ_U^{1/2}U`` the conditions read ``U′W′ = V′ :=
    Γ_U^{1/2}VΓ_W^{1/2}`` and ``W′W′ᵀ = U′ᵀU′``. With the thin SVD ``V′ = L S R`` of rank ``k``
    and ``F = [I_k, 0]`` (shape ``[k, d]``; any ``F`` with ``FFᵀ = I`` works),
    ``U′ = L√S F`` and ``W′ = Fᵀ√S R``. ``W′ᵀW′ = (V′ᵀV′)^{1/2}`` is forced, so the norms
    ``‖W‖_F² = Tr[Γ_W^{-1}RᵀSR]`` and ``‖U‖_F² = Tr[Γ_U^{-1}LSLᵀ]`` are the same for every
    solution. To include weight decay pass ``Γ + ρI`` (:func:`weight_decay_ridge`).

    Args:
        V: the product at the minimum, shape ``[d_y, d_x]``.
        gamma_w: positive definite, shape ``[d_x, d_x]``.
        gamma_u: positive definite, shape ``[d_y, d_y]``.
        hidden_dim: ``d`` ≥ rank(V).
        rtol: singular values below ``rtol · s_max`` count as zero.
    """
    _check_matrix("V", V)
    d_y, d_x = V.shape
    _check_square("gamma_w", gamma_w, d_x)
    _check_square("gamma_u", gamma_u, d_y)
    gw_half = _psd_power(gamma_w, 0.5, "gamma_w")
    gu_half = _psd_power(gamma_u, 0.5, "gamma_u")
    gw_ihalf = _psd_power(gamma_w, -0.5, "gamma_w")
    gu_ihalf = _psd_power(gamma_u, -0.5, "gamma_u")
    left, s, right = _rank_svd(gu_half @ V @ gw_half, rtol)
    f = _embedding(hidden_dim, s.numel(), V).T  # [k, d]
    root = s.sqrt()
    U = gu_ihalf @ (left * root) @ f
    W = f.T @ (root[:, None] * right) @ gw_ihalf
    return _solution(U, W)


def two_layer_sgd_solution(
    V: Tensor, sigma_x: Tensor, sigma_eps: Tensor, *, hidden_dim: int, ridge: float = 0.0
) -> TwoLayerSolution:
    """SGD's noise-equilibrium factorisation of ``V`` at the global minimum (Thm 5.2, eq. 14).

    Uses ``Γ_W = Tr[Σ_ε]Σ_x + ρI`` and ``Γ_U = Tr[Σ_x]Σ_ε + ρI``. ``ρ > 0`` (weight decay,
    :func:`weight_decay_ridge`) is the small-decay approximation that keeps the product at
    ``V`` and ``r = −ε``. For isotropic ``Σ_x, Σ_ε`` (and ``ρ = 0``) the ratio
    ``‖W‖²/‖U‖²`` is ``d_x/d_y`` (``WWᵀ/d_x = UᵀU/d_y``).

    Args:
        V: shape ``[d_y, d_x]``.
        sigma_x: shape ``[d_x, d_x]``.
        sigma_eps: shape ``[d_y, d_y]``.
        hidden_dim: ``d`` ≥ rank(V).
        ridge: ``ρ`` from :func:`weight_decay_ridge` (0 without weight decay).
    """
    _check_matrix("V", V)
    _check_square("sigma_x", sigma_x, V.shape[1])
    _check_square("sigma_eps", sigma_eps, V.shape[0])
    gamma_w, gamma_u = two_layer_gammas_at_minimum(sigma_x, sigma_eps)
    eye_w = torch.eye(V.shape[1], dtype=V.dtype, device=V.device)
    eye_u = torch.eye(V.shape[0], dtype=V.dtype, device=V.device)
    return two_layer_noise_equilibrium(
        V, gamma_w + ridge * eye_w, gamma_u + ridge * eye_u, hidden_dim=hidden_dim
    )


def two_layer_balanced_solution(V: Tensor, *, hidden_dim: int) -> TwoLayerSolution:
    """The norm-balanced factorisation ``UᵀU = WWᵀ`` of ``V`` (what GD + weight decay finds).

    ``U = L√S F``, ``W = Fᵀ√S R`` with ``V = LSR``; both norms equal the nuclear norm of
    ``V``. Compare with :func:`two_layer_sgd_solution` (paper Fig. 3).

    Args:
        V: shape ``[d_y, d_x]``.
        hidden_dim: ``d`` ≥ rank(V).
    """
    _check_matrix("V", V)
    eye_w = torch.eye(V.shape[1], dtype=V.dtype, device=V.device)
    eye_u = torch.eye(V.shape[0], dtype=V.dtype, device=V.device)
    return two_layer_noise_equilibrium(V, eye_w, eye_u, hidden_dim=hidden_dim)
