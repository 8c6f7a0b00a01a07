"""The rank-one factorisation ``u·w``: the balance's exact step factor and decay (Prop 5.1)."""

from __future__ import annotations

from torch import Tensor

from noetherflow.theory.ziyin2024._common import TimeScale, _check_positive, _check_time
from noetherflow.theory.ziyin2024.charge_dynamics import kappa


def rank_one_gradient_moments(x: Tensor, y: Tensor, product: float) -> tuple[float, float]:
    """Mean and variance of ``r·x`` over the data, ``r = (u·w)x − y`` (scalar ``x, y``).

    Args:
        x: shape ``[n]``.
        y: shape ``[n]``.
        product: ``u·w``.

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
        lr: learning rate ``η``.
        weight_decay: ``γ`` (loss term ``γ‖θ‖²``).

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
