"""Scale-invariant parameters with weight decay: the norm's equilibrium and path (eq. 24)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from noetherflow.theory.ziyin2024._common import TimeScale, _check_positive, _check_time
from noetherflow.theory.ziyin2024.charge_dynamics import equilibrium_charge, kappa


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
        lr: learning rate ``η``.
        batch_size: minibatch size ``S``.
        weight_decay: ``γ`` (loss term ``γ‖θ‖²``).
        time: ``"continuous"`` or ``"discrete"``.
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
        norm_sq_init: ``N₀ = ‖θ_0‖²``.
        trace_sigma_unit: ``K``, ``Tr Σ`` at unit norm.
        lr: learning rate ``η``.
        batch_size: minibatch size ``S``.
        weight_decay: ``γ`` (loss term ``γ‖θ‖²``).
        time: ``"continuous"`` or ``"discrete"``.
        mean_grad_sq_unit: ``‖ḡ(θ̂)‖²`` at unit norm; discrete model only.

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
