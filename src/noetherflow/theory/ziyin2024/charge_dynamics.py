"""Generic charge dynamics: κ, the equilibrium charge (eq. 9) and its time scale (§4.2)."""

from __future__ import annotations

import math

from noetherflow.theory.ziyin2024._common import TimeScale, _check_positive, _check_time


def kappa(lr: float, weight_decay: float) -> float:
    """Per-step decay of a charge under weight decay: ``κ = 4ηγ(1 − ηγ) = 1 − (1 − 2ηγ)²``.

    From the exact identity ``C(θ') = (1 − 2ηγ)² C(θ) + η² gᵀAg`` (paper eqs. 96–97;
    docs/concepts/charges.md).
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
        lr: learning rate ``η``.
        batch_size: minibatch size ``S``.
        weight_decay: ``γ`` (loss term ``γ‖θ‖²``).
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
