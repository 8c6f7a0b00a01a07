"""Closed-form predictions of Ziyin et al. (2024), "Parameter Symmetry and Noise Equilibrium of
Stochastic Gradient Descent", in the conventions of ``DESIGN.md`` §2.

Conventions (they override the paper where the two differ):

* per-sample loss ``ℓ_i``; the minibatch loss is the mean over ``S`` samples drawn with
  replacement; weight decay is ``γ‖θ‖²`` added to the loss (gradient ``2γθ``);
* discrete SGD: ``θ' = (1 − 2ηγ)θ − ηg``. For a symmetry generator ``A`` and charge
  ``C = θᵀAθ`` the expected flow is ``E[ΔC] = −κC + η² Tr[A(ḡḡᵀ + Σ/S)]`` with
  ``κ = 4ηγ(1 − ηγ)``, ``ḡ`` the full-batch gradient of the data loss and ``Σ`` the per-sample
  gradient covariance;
* continuous time (SGF, Itô, ``σ² = η/(2S)``, time ``t = η · steps``):
  ``dC/dt = −4γC + (η/S) Tr[ΣA] = −4γC + 2σ² Tr[ΣA]``. The paper's eq. (7) (and
  appendix eqs. 27, 31) writes ``σ² Tr[ΣA]``; Itô's lemma applied to its own eq. (1) gives
  ``2σ²``.

The two-layer linear net is ``f(x) = UWx`` with ``U`` of shape ``[d_y, d]`` and ``W`` of shape
``[d, d_x]``; the per-sample loss is the paper's eq. (12), ``ℓ = ‖UWx − y‖²`` (sum over
outputs) unless a function takes a ``reduction`` argument. Second moments are
``Σ_x = E[xxᵀ]`` and ``Σ_ε = E[εεᵀ]``.

Every function is pure. Matrix functions take and return ``torch.Tensor`` (use float64);
scalar formulas take and return Python floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

# Independent of the library (an oracle): plain Literals, named apart from nf.TimeModel and
# nf.Reduction (this one also has "half_sum", the ½Σ convention of some closed forms).
TimeScale = Literal["continuous", "discrete"]
LossScaling = Literal["sum", "mean", "half_sum"]
InitScheme = Literal["kaiming", "xavier"]

__all__ = [
    "DeepLinearSolution",
    "InitScheme",
    "LossScaling",
    "TimeScale",
    "TwoLayerSolution",
    "approximate_symmetry_charge_shift_large_zeta",
    "approximate_symmetry_charge_shift_small_zeta",
    "approximate_symmetry_displacement",
    "approximate_symmetry_flow",
    "charge_relaxation_rate",
    "deep_linear_balance_gaps",
    "deep_linear_intermediate_norm_sq",
    "deep_linear_sgd_solution",
    "equilibration_time",
    "equilibrium_charge",
    "init_variances",
    "kappa",
    "paper_eq19_norm_sq",
    "rank_one_balance_decay_rate",
    "rank_one_balance_factor",
    "rank_one_gradient_moments",
    "scale_invariant_equilibrium_norm_sq",
    "scale_invariant_norm_sq",
    "sharpness_at_end_autoencoder",
    "sharpness_at_init",
    "two_layer_balanced_solution",
    "two_layer_charge_flow",
    "two_layer_equilibrium_gap",
    "two_layer_gammas_at_minimum",
    "two_layer_hessian_trace",
    "two_layer_noise_equilibrium",
    "two_layer_noise_factors",
    "two_layer_sgd_sharpness",
    "two_layer_sgd_solution",
    "weight_decay_ridge",
]


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------


def _check_time(time: str) -> None:
    if time not in ("continuous", "discrete"):
        raise ValueError(
            f"time={time!r} is not a time model; expected 'continuous' (SGF, t = η·steps) "
            "or 'discrete' (per SGD step). Pass one of those two strings."
        )


def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        bound = "≥ 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} is invalid; expected a finite number {bound}.")


def _check_matrix(name: str, m: Tensor, rows: int | None = None, cols: int | None = None) -> None:
    if not isinstance(m, Tensor) or m.dim() != 2:
        shape = tuple(m.shape) if isinstance(m, Tensor) else type(m).__name__
        raise ValueError(
            f"{name} has shape {shape}; expected a 2-D tensor. Pass a matrix "
            "(use .reshape(rows, cols) for vectors)."
        )
    if rows is not None and m.shape[0] != rows:
        raise ValueError(
            f"{name} has shape {tuple(m.shape)}; expected {rows} rows to match the other "
            "arguments. Check the orientation (U is [d_y, d], W is [d, d_x])."
        )
    if cols is not None and m.shape[1] != cols:
        raise ValueError(
            f"{name} has shape {tuple(m.shape)}; expected {cols} columns to match the other "
            "arguments. Check the orientation (U is [d_y, d], W is [d, d_x])."
        )


def _check_square(name: str, m: Tensor, n: int | None = None) -> None:
    _check_matrix(name, m)
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"{name} has shape {tuple(m.shape)}; expected a square matrix.")
    if n is not None and m.shape[0] != n:
        raise ValueError(
            f"{name} has shape {tuple(m.shape)}; expected [{n}, {n}] to match the other arguments."
        )


def _sym(m: Tensor) -> Tensor:
    return 0.5 * (m + m.T)


def _psd_power(m: Tensor, power: float, name: str) -> Tensor:
    """``m**power`` for a symmetric positive (semi)definite ``m`` (negative powers need PD)."""
    evals, evecs = torch.linalg.eigh(_sym(m))
    scale = evals.abs().max().clamp_min(torch.finfo(m.dtype).tiny)
    if power < 0 and bool((evals <= 1e-12 * scale).any()):
        raise ValueError(
            f"{name} is singular (smallest eigenvalue {evals.min().item():.3e}); expected a "
            "positive-definite matrix. Restrict to the span of the data or add an explicit "
            "ridge."
        )
    if bool((evals < -1e-10 * scale).any()):
        raise ValueError(
            f"{name} has a negative eigenvalue ({evals.min().item():.3e}); expected a "
            "positive-semidefinite matrix (a second moment or covariance)."
        )
    return (evecs * evals.clamp_min(0.0).pow(power)) @ evecs.T


def _rank_svd(m: Tensor, rtol: float) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD ``m = L diag(s) R`` truncated to the numerical rank.

    ``L`` has shape ``[rows, k]``, ``s`` shape ``[k]``, ``R`` shape ``[k, cols]``.
    """
    left, s, right = torch.linalg.svd(m, full_matrices=False)
    k = int((s > rtol * s.max().clamp_min(torch.finfo(m.dtype).tiny)).sum().item())
    if k == 0:
        raise ValueError(
            "the target map is zero; expected a nonzero V (the product at the minimum)."
        )
    return left[:, :k], s[:k], right[:k, :]


def _embedding(width: int, rank: int, like: Tensor) -> Tensor:
    """The representative semi-orthogonal ``[width, rank]`` matrix ``[I_rank; 0]``."""
    if width < rank:
        raise ValueError(
            f"hidden width {width} is smaller than rank(V) = {rank}; a product of rank {rank} "
            f"cannot pass through width {width}. Use a width ≥ {rank} or a lower-rank V."
        )
    return torch.eye(width, rank, dtype=like.dtype, device=like.device)


# --------------------------------------------------------------------------------------------
# eq. (7)/(9) and §4.2: generic charge dynamics
# --------------------------------------------------------------------------------------------


def kappa(lr: float, weight_decay: float) -> float:
    """Per-step decay of a charge under weight decay: ``κ = 4ηγ(1 − ηγ) = 1 − (1 − 2ηγ)²``.

    From the exact identity ``C(θ') = (1 − 2ηγ)² C(θ) + η² gᵀAg`` (DESIGN §2).
    """
    _check_positive("lr", lr)
    _check_positive("weight_decay", weight_decay, allow_zero=True)
    return 4.0 * lr * weight_decay * (1.0 - lr * weight_decay)


def equilibrium_charge(
    trace_sigma_A: float,
    lr: float,
    batch_size: int,
    weight_decay: float,
    *,
    time: TimeScale = "continuous",
    mean_grad_A: float = 0.0,
) -> float:
    """Charge ``C* = θ*ᵀAθ*`` at a noise equilibrium, paper eq. (9) in our conventions.

    Continuous (SGF): ``4γ C* = (η/S) Tr[ΣA]`` (the paper's ``σ² Tr[ΣA]`` is off by a factor
    2; ``(η/S) = 2σ²``). Discrete SGD: ``κ C* = η² (ḡᵀAḡ + Tr[ΣA]/S)``, ``κ = 4ηγ(1 − ηγ)``.

    Args:
        trace_sigma_A: ``Tr[Σ(θ*)A]`` with ``Σ`` the per-sample gradient covariance at the
            equilibrium.
        lr: learning rate ``η``.
        batch_size: minibatch size ``S`` (sampling with replacement).
        weight_decay: ``γ`` (loss term ``γ‖θ‖²``).
        time: ``"continuous"`` or ``"discrete"``.
        mean_grad_A: ``ḡᵀAḡ`` (full-batch data-loss gradient); only the discrete model uses it.

    Returns:
        ``C*``. With ``γ = 0`` there is no finite equilibrium unless the noise term vanishes:
        returns ``±inf`` with the sign of the noise term (e.g. scale invariance: the norm grows
        for ever, eq. 24), and raises when the noise term is zero too (the equilibrium is then
        the balance condition ``Tr[ΣA] = 0``, not a value of ``C``).
    """
    _check_time(time)
    _check_positive("batch_size", batch_size)
    if time == "continuous":
        _check_positive("lr", lr)
        noise = lr / batch_size * trace_sigma_A
        decay = 4.0 * weight_decay
    else:
        noise = lr**2 * (mean_grad_A + trace_sigma_A / batch_size)
        decay = kappa(lr, weight_decay)
    _check_positive("weight_decay", weight_decay, allow_zero=True)
    if decay == 0.0:
        if noise == 0.0:
            raise ValueError(
                "weight_decay=0 and the noise term is 0: every C is stationary; the "
                "equilibrium condition is Tr[ΣA] = 0 (balance), not a value of C."
            )
        return math.copysign(math.inf, noise)
    return noise / decay


def charge_relaxation_rate(
    trace_sigma_A2: float,
    theta_A2_theta: float,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    *,
    time: TimeScale = "continuous",
    mean_grad_A2: float = 0.0,
) -> float:
    """Linear relaxation rate of a charge towards its noise equilibrium (paper §4.2, App. B.3).

    Derivation (ours). Move along the symmetry orbit ``θ_λ = e^{λA}θ*``. By the orbit transport
    (paper eqs. 34–37) ``Σ(θ_λ) = e^{−λA}Σ e^{−λA}`` and ``C(θ_λ) = θ*ᵀAe^{2λA}θ*``, so
    ``dC/dλ = 2θ*ᵀA²θ*`` and the flow ``G(λ) = −4γC + (η/S)Tr[e^{−2λA}ΣA]`` has
    ``dG/dλ = −8γθ*ᵀA²θ* − (2η/S)Tr[ΣA²]``. Hence ``Ċ ≈ −r (C − C*)`` with

    * continuous (per unit SGF time ``t = η·steps``):
      ``r = 4γ + (η/S) Tr[ΣA²] / θ*ᵀA²θ*``;
    * discrete (per step): ``r = κ + η² (ḡᵀA²ḡ + Tr[ΣA²]/S) / θ*ᵀA²θ*``.

    Special cases: scale invariance (``A = I``) at its weight-decay equilibrium
    ``(η/S)TrΣ = 4γ‖θ‖²`` gives ``r = 8γ``, independent of the noise; with noise only
    (``γ = 0``) ``r = 2σ² Tr[ΣA²]/θᵀA²θ ∝ σ²``, so the equilibration time is ∝ ``1/σ²``. The
    paper's §4.2 text says ``t_equi ∝ σ²``; its own Lemma B.5 (rate ``σ²c₀``) and this
    derivation give the inverse. Prop. 5.1 (rank one, ``A = diag(I, −I)``) is the special case
    ``r = 4(η/S) Var[rx]``, checked against SGD in the tests.

    Args:
        trace_sigma_A2: ``Tr[Σ(θ*)A²]``.
        theta_A2_theta: ``θ*ᵀA²θ*`` (> 0).
        lr, batch_size, weight_decay: ``η``, ``S``, ``γ``.
        time: ``"continuous"`` (rate per unit ``t``) or ``"discrete"`` (rate per step).
        mean_grad_A2: ``ḡᵀA²ḡ``; only the discrete model uses it.
    """
    _check_time(time)
    _check_positive("theta_A2_theta", theta_A2_theta)
    _check_positive("batch_size", batch_size)
    _check_positive("lr", lr)
    _check_positive("weight_decay", weight_decay, allow_zero=True)
    if time == "continuous":
        return 4.0 * weight_decay + lr / batch_size * trace_sigma_A2 / theta_A2_theta
    noise = lr**2 * (mean_grad_A2 + trace_sigma_A2 / batch_size)
    return kappa(lr, weight_decay) + noise / theta_A2_theta


def equilibration_time(
    trace_sigma_A2: float,
    theta_A2_theta: float,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    *,
    time: TimeScale = "continuous",
    mean_grad_A2: float = 0.0,
) -> float:
    """Predicted ``t_equi = 1/r`` of paper §4.2, ``r`` from :func:`charge_relaxation_rate`.

    In SGF time units for ``time="continuous"``, in SGD steps for ``time="discrete"``. With
    noise only, ``t_equi = θᵀA²θ / (2σ² Tr[ΣA²]) ∝ 1/σ²`` (the paper's text says ``∝ σ²``).
    """
    rate = charge_relaxation_rate(
        trace_sigma_A2,
        theta_A2_theta,
        lr,
        batch_size,
        weight_decay,
        time=time,
        mean_grad_A2=mean_grad_A2,
    )
    return math.inf if rate == 0.0 else 1.0 / rate


# --------------------------------------------------------------------------------------------
# Thm 5.2 / App. C: two-layer linear net
# --------------------------------------------------------------------------------------------


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
    ``∇_W = 2Uᵀr xᵀ``; hence ``Cov`` summed as in DESIGN §2.1 gives
    ``M_U = 4WΓ_WWᵀ`` and ``M_W = 4UᵀΓ_UU`` with

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
        U: shape ``[d_y, d]``. W: shape ``[d, d_x]``.
        gamma_w: shape ``[d_x, d_x]``. gamma_u: shape ``[d_y, d_y]``.
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
        B: symmetric, shape ``[d, d]``.
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
        V: shape ``[d_y, d_x]``. sigma_x: shape ``[d_x, d_x]``. sigma_eps: shape ``[d_y, d_y]``.
        hidden_dim: ``d`` ≥ rank(V).
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
        V: shape ``[d_y, d_x]``. hidden_dim: ``d`` ≥ rank(V).
    """
    _check_matrix("V", V)
    eye_w = torch.eye(V.shape[1], dtype=V.dtype, device=V.device)
    eye_u = torch.eye(V.shape[0], dtype=V.dtype, device=V.device)
    return two_layer_noise_equilibrium(V, eye_w, eye_u, hidden_dim=hidden_dim)


# --------------------------------------------------------------------------------------------
# Prop 5.3 and eq. (15): sharpness
# --------------------------------------------------------------------------------------------


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
        U: shape ``[d_y, d]``. W: shape ``[d, d_x]``. sigma_x: ``E[xxᵀ]``, shape ``[d_x, d_x]``.
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


# --------------------------------------------------------------------------------------------
# eq. (24): scale invariance
# --------------------------------------------------------------------------------------------


def scale_invariant_equilibrium_norm_sq(
    trace_sigma_unit: float,
    lr: float,
    batch_size: int,
    weight_decay: float,
    *,
    time: TimeScale = "continuous",
    mean_grad_sq_unit: float = 0.0,
) -> float:
    """Equilibrium ``‖θ*‖²`` of scale-invariant parameters with weight decay (eqs. 9, 24).

    Scale invariance gives ``Σ(θ) = Σ(θ̂)/‖θ‖²`` (``θ̂ = θ/‖θ‖``), so with ``K = TrΣ(θ̂)``:

    * continuous: ``4γ‖θ‖² = (η/S)K/‖θ‖²`` → ``‖θ*‖² = sqrt(ηK/(4γS))``;
    * discrete: ``κ‖θ‖² = η²(‖ḡ(θ̂)‖² + K/S)/‖θ‖²`` → ``‖θ*‖² = η sqrt((‖ḡ(θ̂)‖² + K/S)/κ)``.

    The paper's eq. (24) reads ``d‖θ‖²/dt = −γ‖θ‖² + σ²TrΣ``; in our convention (weight decay
    ``γ‖θ‖²`` in the loss, Itô) it is ``−4γ‖θ‖² + 2σ²TrΣ``. Returns ``inf`` for ``γ = 0``.

    Args:
        trace_sigma_unit: ``Tr Σ`` at unit norm (constant along the orbit).
        mean_grad_sq_unit: ``‖∇L‖²`` at unit norm; discrete model only.
    """
    _check_positive("trace_sigma_unit", trace_sigma_unit, allow_zero=True)
    c_times_norm = equilibrium_charge(
        trace_sigma_unit, lr, batch_size, weight_decay, time=time, mean_grad_A=mean_grad_sq_unit
    )
    return math.sqrt(c_times_norm) if math.isfinite(c_times_norm) else math.inf


def scale_invariant_norm_sq(
    t: Tensor,
    *,
    norm_sq_init: float,
    trace_sigma_unit: float,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    time: TimeScale = "continuous",
    mean_grad_sq_unit: float = 0.0,
) -> Tensor:
    """Predicted ``‖θ_t‖²`` of scale-invariant parameters under SGD (eq. 24), mean-field.

    Continuous (``t`` in SGF time ``η·steps``): with ``N = ‖θ‖²`` and ``K = TrΣ(θ̂)``,
    ``dN/dt = −4γN + (η/S)K/N`` is linear in ``N²``:
    ``N(t)² = N*² + (N₀² − N*²) e^{−8γt}`` with ``N*² = ηK/(4γS)``; for ``γ = 0``
    ``N(t)² = N₀² + 2(η/S)K t`` (``‖θ‖ ∝ t^{1/4}``). Discrete (``t`` in steps): iterates
    ``N_{k+1} = (1 − κ)N_k + η²(‖ḡ(θ̂)‖² + K/S)/N_k``. Both replace ``E[1/N]`` by ``1/E[N]``
    (relative error of order the squared relative fluctuation of ``N``).

    Args:
        t: times, any shape (nonnegative integers for ``"discrete"``).

    Returns:
        Same shape as ``t``, float64.
    """
    _check_time(time)
    _check_positive("norm_sq_init", norm_sq_init)
    _check_positive("lr", lr)
    _check_positive("batch_size", batch_size)
    _check_positive("weight_decay", weight_decay, allow_zero=True)
    t64 = torch.as_tensor(t, dtype=torch.float64)
    if bool((t64 < 0).any()):
        raise ValueError("t has negative entries; expected times ≥ 0.")
    if time == "continuous":
        k = lr / batch_size * trace_sigma_unit
        if weight_decay == 0.0:
            return torch.sqrt(norm_sq_init**2 + 2.0 * k * t64)
        target = k / (4.0 * weight_decay)
        return torch.sqrt(
            target + (norm_sq_init**2 - target) * torch.exp(-8.0 * weight_decay * t64)
        )
    if bool((t64 != t64.round()).any()):
        raise ValueError("t has non-integer entries; the discrete model counts SGD steps.")
    steps = int(t64.max().item()) if t64.numel() else 0
    decay = kappa(lr, weight_decay)
    noise = lr**2 * (mean_grad_sq_unit + trace_sigma_unit / batch_size)
    path = [norm_sq_init]
    for _ in range(steps):
        n = path[-1]
        path.append((1.0 - decay) * n + noise / n)
    traj = torch.tensor(path, dtype=torch.float64)
    return traj[t64.long()]


# --------------------------------------------------------------------------------------------
# Thm 5.4 / App. E: deep linear nets
# --------------------------------------------------------------------------------------------


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
        V: shape ``[d_y, d_x]``. sigma_x: positive definite, shape ``[d_x, d_x]``.
        sigma_eps: positive definite, shape ``[d_y, d_y]``.
        hidden_dims: ``[d_1, …, d_{D−1}]`` (``D ≥ 2``), each ≥ rank.
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


# --------------------------------------------------------------------------------------------
# Prop 5.1 / App. B.4: rank-one factorisation
# --------------------------------------------------------------------------------------------


def rank_one_gradient_moments(x: Tensor, y: Tensor, product: float) -> tuple[float, float]:
    """Mean and variance of ``r·x`` over the data, ``r = (u·w)x − y`` (scalar ``x, y``).

    Args:
        x: shape ``[n]``. y: shape ``[n]``. product: ``u·w``.

    Returns:
        ``(E[rx], Var[rx])`` (population variance).
    """
    if x.dim() != 1 or y.shape != x.shape:
        raise ValueError(
            f"x has shape {tuple(x.shape)} and y {tuple(y.shape)}; expected two 1-D tensors "
            "of equal length (scalar input and output)."
        )
    rx = (product * x - y) * x
    return float(rx.mean()), float(rx.var(unbiased=False))


def rank_one_balance_factor(
    minibatch_rx: Tensor, *, lr: float, weight_decay: float = 0.0
) -> Tensor:
    """Exact one-step factor of ``Q = WWᵀ − UᵀU`` for ``U ∈ R^{1×d}``, ``W ∈ R^{d×1}`` (Prop 5.1).

    With ``ℓ = ((u·w)x − y)²`` and ``m`` the minibatch mean of ``r x``, the SGD step is
    ``u′ = (1−2ηγ)u − 2ηm w``, ``w′ = (1−2ηγ)w − 2ηm u``, hence exactly
    ``Q′ = ((1 − 2ηγ)² − 4η²m²) Q``: every entry of ``Q`` is multiplied by the same random
    factor.

    Args:
        minibatch_rx: ``m``, any shape (e.g. one per step or per chain).

    Returns:
        The factor, same shape as ``minibatch_rx``.
    """
    _check_positive("lr", lr)
    return (1.0 - 2.0 * lr * weight_decay) ** 2 - 4.0 * lr**2 * minibatch_rx**2


def rank_one_balance_decay_rate(
    var_rx: float,
    lr: float,
    batch_size: int,
    *,
    weight_decay: float = 0.0,
    mean_rx: float = 0.0,
    time: TimeScale = "discrete",
) -> float:
    """Exponential decay rate of ``E[Q]``, ``Q = WWᵀ − UᵀU``, rank-one case of Prop 5.1.

    From :func:`rank_one_balance_factor` and ``E[m²] = E[rx]² + Var[rx]/S``:

    * discrete (per step): ``E[Q_{t+1}] = (1 − ρ)Q_t`` with
      ``ρ = κ + 4η²(E[rx]² + Var[rx]/S)``;
    * continuous (per unit SGF time): ``ρ = 4γ + 4(η/S)Var[rx] = 4γ + 8σ²Var[rx]``.

    The paper writes ``Ċ_B = −Var[r]C_B``; the random variable is ``r·x`` (the per-sample
    gradient with respect to the product, halved) and the prefactor is ``4η/S``. At a global
    minimum without weight decay ``E[rx] = 0`` and ``ρ = 4η²Var[rx]/S`` per step.
    """
    _check_time(time)
    _check_positive("lr", lr)
    _check_positive("batch_size", batch_size)
    _check_positive("var_rx", var_rx, allow_zero=True)
    _check_positive("weight_decay", weight_decay, allow_zero=True)
    if time == "continuous":
        return 4.0 * weight_decay + 4.0 * lr / batch_size * var_rx
    return kappa(lr, weight_decay) + 4.0 * lr**2 * (mean_rx**2 + var_rx / batch_size)


# --------------------------------------------------------------------------------------------
# §5.4: approximate symmetry ℓ = ℓ₁ + ζℓ₂ (continuous time)
# --------------------------------------------------------------------------------------------


def approximate_symmetry_flow(
    zeta: float, grad_l2_A_theta: float, trace_sigma_A: float, lr: float, batch_size: int
) -> float:
    """``dC/dt = −2ζ ∇ℓ₂ᵀAθ + (η/S) Tr[ΣA]`` for ``ℓ = ℓ₁ + ζℓ₂`` (paper eq. 20).

    The drift of ``C = θᵀAθ`` is ``−∇Cᵀ∇L = −2θᵀA(∇L₁ + ζ∇ℓ₂)`` and ``θᵀA∇L₁ = 0``. The
    paper's ``−ζ∇ℓ₂ᵀAθ + σ²Tr[ΣA]`` has both factors of 2 missing; they cancel in its
    fixed-point condition (20), ``ζ∇ℓ₂ᵀAθ = σ²Tr[ΣA]``, which is therefore right.
    (Weight decay is the case ``ζℓ₂ = γ‖θ‖²``: eq. 9.)
    """
    _check_positive("lr", lr)
    _check_positive("batch_size", batch_size)
    return -2.0 * zeta * grad_l2_A_theta + lr / batch_size * trace_sigma_A


def approximate_symmetry_charge_shift_small_zeta(
    zeta: float,
    grad_l2_A_theta: float,
    trace_sigma_A2: float,
    theta_A2_theta: float,
    lr: float,
    batch_size: int,
    *,
    weight_decay: float = 0.0,
) -> float:
    """First-order shift ``C − C₀`` of the stationary charge for small ``ζ`` (§5.4, eq. 20).

    Derivation (ours; the paper only says "a first-order correction in ζ"). Linearise the
    flow of eq. (20) along the orbit ``e^{λA}θ₀`` of the exact-symmetry equilibrium ``θ₀``:
    ``Ċ ≈ −r (C − C₀) − 2ζ∇ℓ₂(θ₀)ᵀAθ₀`` with ``r`` from :func:`charge_relaxation_rate`, so

        ``C − C₀ = −2ζ ∇ℓ₂(θ₀)ᵀAθ₀ / r + O(ζ²)``,
        ``r = 4γ + (η/S) Tr[Σ(θ₀)A²] / θ₀ᵀA²θ₀``.

    Assumes the motion stays on the orbit (the ``ζ`` term may also move ``θ`` off it).
    """
    rate = charge_relaxation_rate(
        trace_sigma_A2, theta_A2_theta, lr, batch_size, weight_decay, time="continuous"
    )
    return -2.0 * zeta * grad_l2_A_theta / rate


def approximate_symmetry_displacement(
    zeta: float,
    hessian_eigenvalue: float,
    n_A_theta: float,
    trace_sigma_A: float,
    lr: float,
    batch_size: int,
) -> float:
    """Eq. (22): ``s = (θ − θ*)·n = σ²Tr[ΣA] / (ζ h n ᵀAθ*)`` with ``σ² = η/(2S)``.

    For the solution family where ``θ − θ*`` is an eigenvector ``n`` of ``H = ∇²ℓ₂(θ*)``
    with eigenvalue ``h > 0``, ``θ*`` a minimum of ``ℓ₂``; leading order in ``σ²``.
    """
    _check_positive("hessian_eigenvalue", hessian_eigenvalue)
    if zeta == 0.0 or n_A_theta == 0.0:
        raise ValueError("zeta and n_A_theta must be nonzero; expected the large-ζ regime.")
    sigma2 = lr / (2.0 * batch_size)
    return sigma2 * trace_sigma_A / (zeta * hessian_eigenvalue * n_A_theta)


def approximate_symmetry_charge_shift_large_zeta(
    zeta: float, hessian_eigenvalue: float, trace_sigma_A: float, lr: float, batch_size: int
) -> float:
    """Eq. (23): ``C − C* = 2σ²Tr[ΣA]/(ζh) = (η/S)Tr[ΣA]/(ζh)`` to leading order in ``σ²``.

    The paper's constant is right in our convention (the factors of eq. 20 cancel). Use
    ``h = h_min`` for the paper's approximation ``C ≈ C* + 2σ²Tr[ΣA]/h_min``.
    """
    _check_positive("hessian_eigenvalue", hessian_eigenvalue)
    _check_positive("lr", lr)
    _check_positive("batch_size", batch_size)
    if zeta == 0.0:
        raise ValueError("zeta=0; expected the large-ζ regime (ζ > 0).")
    return lr / batch_size * trace_sigma_A / (zeta * hessian_eigenvalue)
