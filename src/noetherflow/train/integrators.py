"""SGD, GD, the stochastic gradient flow (SGF) and gradient flow (GF) on any ``nn.Module``.

Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay``; N the number of samples in
``(X, Y)``; θ the trainable parameters (every ``p`` in ``model.parameters()`` with
``p.requires_grad``), flattened to a vector of length P; ℓ_i(θ) the per-sample loss; and
L(θ) = (1/N)Σ_i ℓ_i(θ) the full-batch loss. Following the paper (docs/concepts/flow.md), weight
decay is the penalty γ‖θ‖² added to the loss, L_γ = L + γ‖θ‖², with gradient ∇L + 2γθ.
(An optimizer's decoupled decay λ corresponds to γ = λ/2.)

* :func:`run_sgd` — θ_{k+1} = (1 − 2η_kγ)θ_k − η_k g_k, with g_k = ∇ℓ_{B_k}(θ_k) the
  gradient of the mean loss over a minibatch B_k of S indices drawn **with replacement**.
  For any exponential symmetry A this gives, exactly and at every step,
  C(θ_{k+1}) = (1 − 2η_kγ)² C(θ_k) + η_k² g_kᵀ A g_k (paper App. D, eqs. 96–98).
  With replacement, E[g gᵀ] = ∇L∇Lᵀ + Σ/S (the "expected flow" of docs/concepts/flow.md).
* :func:`run_gd` — the same with B_k the whole data set.
* :func:`run_sgf` — Euler–Maruyama for the SGF dθ = −∇L_γ dt + sqrt(2σ²Σ) dW (paper eq. 1)
  with σ² = η/(2S) and step dt = η.
* :func:`run_gf` — gradient flow dθ/dt = −∇L_γ by RK4 or ``scipy.integrate.solve_ivp``.

Here Σ(θ) = (1/N)Σ_i (∇ℓ_i − ∇L)(∇ℓ_i − ∇L)ᵀ is the per-sample gradient covariance, of
shape ``[P, P]``; it is never materialised.

:func:`run_sgd` also trains on a data *stream* (``sampler``: fresh minibatches drawn from a
data model each step, "online" SGD on the population risk; ``(X, Y)`` are then only the
evaluation set of the logged loss), and :func:`run_sgd`/:func:`run_gd` report every update to
``on_update(UpdateInfo)`` with the gradient it applies (for per-step checks such as the exact
charge identity, :func:`noetherflow.exact_step_charges`).

Every integrator calls ``callback(step, model)`` at step 0, every ``log_every`` steps and at
the last step (not on a state whose loss is already non-finite), and returns a
:class:`TrainResult`. A non-finite loss, parameter or gradient
stops the run and is recorded (``diverged``, ``diverged_at_step``, ``last_finite_loss``);
no exception is raised for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow.train._core import (
    Callback,
    LossFn,
    Sampler,
    TrainingData,
    TrainResult,
    UpdateHook,
    UpdateInfo,
    _check_float,
    _check_positive_int,
    _flatten,
    _grads,
    _per_sample_grads_and_losses,
    _prepare,
    _run_discrete,
    _sampled_loss,
    _trainable,
    _unflatten,
    gradient_noise,
    per_sample_gradients,
    sample_batch,
)
from noetherflow.train.gradient_flow import GFMethod, run_gf
from noetherflow.train.schedules import ScheduleLike, resolve_schedule

__all__ = [
    "Callback",
    "GFMethod",
    "LossFn",
    "Sampler",
    "TrainResult",
    "TrainingData",
    "UpdateHook",
    "UpdateInfo",
    "gradient_noise",
    "per_sample_gradients",
    "run_gd",
    "run_gf",
    "run_sgd",
    "run_sgf",
    "sample_batch",
]

MOMENTUM_NOTE = (
    "momentum={mu} > 0: the update uses a velocity buffer v ← μv + ∇L_γ, θ ← θ − ηv, so the "
    "exact per-step charge identity C(θ') = (1−2ηγ)²C(θ) + η²gᵀAg (paper eqs. 96–97) does not "
    "hold; the cross term θᵀA v no longer vanishes once v mixes the weight-decay terms of several "
    "steps."
)


def _first_order(
    method: str,
    model: nn.Module,
    loss_fn: LossFn,
    X: Tensor,
    Y: Tensor,
    *,
    lr: float,
    batch_size: int | None,
    steps: int,
    weight_decay: float,
    momentum: float,
    schedule: ScheduleLike,
    generator: torch.Generator | None,
    callback: Callback | None,
    log_every: int,
    sampler: Sampler | None = None,
    on_update: UpdateHook | None = None,
) -> TrainResult:
    who = f"run_{method}"
    data, params = _prepare(who, model, loss_fn, X, Y, log_every)
    lr = _check_float("lr", lr, positive=True)
    steps = _check_positive_int("steps", steps, minimum=0)
    gamma = _check_float("weight_decay", weight_decay)
    mu = _check_float("momentum", momentum)
    if not 0.0 <= mu < 1.0:
        raise ValueError(f"momentum={momentum!r}, expected 0 <= momentum < 1 (0 for plain SGD).")
    if batch_size is not None:
        batch_size = _check_positive_int("batch_size", batch_size)
    if sampler is not None and not callable(sampler):
        raise ValueError(
            f"{who}: sampler={sampler!r} is not callable; pass a function "
            "(step, generator) -> (X_batch, Y_batch)."
        )
    if on_update is not None and not callable(on_update):
        raise ValueError(
            f"{who}: on_update={on_update!r} is not callable; pass a function UpdateInfo -> None."
        )
    lr_at = resolve_schedule(schedule, lr)
    notes: list[str] = []
    if mu > 0:
        notes.append(MOMENTUM_NOTE.format(mu=mu))
    velocity: list[Tensor] | None = None

    def prepare_step(k: int, eta: float) -> tuple[Tensor, Callable[[], None], list[Tensor]]:
        if sampler is not None:
            loss = _sampled_loss(who, model, loss_fn, sampler(k, generator), k, X.device)
        else:
            idx = (
                None
                if batch_size is None
                else sample_batch(data.n, batch_size, generator=generator, device=X.device)
            )
            loss = data.loss(model, idx)
        g = _grads(loss, params)
        if on_update is not None:
            on_update(
                UpdateInfo(
                    step=k,
                    lr=eta,
                    weight_decay=gamma,
                    loss=loss.detach(),
                    grads={p: gp.detach() for p, gp in zip(params, g, strict=True)},
                )
            )

        def apply() -> None:
            nonlocal velocity
            with torch.no_grad():
                if mu == 0.0:
                    # θ' = (1 − 2ηγ)θ − ηg, written exactly as in paper eqs. 96–97.
                    for p, gp in zip(params, g, strict=True):
                        p.mul_(1.0 - 2.0 * eta * gamma).add_(gp, alpha=-eta)
                    return
                d = [gp + (2.0 * gamma) * p for p, gp in zip(params, g, strict=True)]
                if velocity is None:
                    velocity = d
                else:
                    velocity = [v.mul_(mu).add_(dp) for v, dp in zip(velocity, d, strict=True)]
                for p, v in zip(params, velocity, strict=True):
                    p.add_(v, alpha=-eta)

        return loss.detach(), apply, g

    config: dict[str, Any] = {
        "method": method,
        "lr": lr,
        "batch_size": batch_size if batch_size is not None else data.n,
        "sampling": (
            "sampler (data stream)"
            if sampler is not None
            else "with replacement"
            if batch_size is not None
            else "full batch"
        ),
        "steps": steps,
        "weight_decay": gamma,
        "momentum": mu,
        "schedule": repr(schedule) if schedule is not None else "constant",
        "log_every": log_every,
        "n_samples": data.n,
    }
    return _run_discrete(
        method=method,
        model=model,
        data=data,
        params=params,
        steps=steps,
        lr_at=lr_at,
        record_lr=True,
        prepare_step=prepare_step,
        callback=callback,
        log_every=log_every,
        notes=notes,
        config=config,
    )


# --------------------------------------------------------------------------------------
# Public integrators
# --------------------------------------------------------------------------------------


def run_sgd(
    model: nn.Module,
    loss_fn: LossFn,
    X: Tensor,
    Y: Tensor,
    *,
    lr: float,
    batch_size: int,
    steps: int,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    schedule: ScheduleLike = None,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    log_every: int = 1,
    sampler: Sampler | None = None,
    on_update: UpdateHook | None = None,
) -> TrainResult:
    """Minibatch SGD with L2 weight decay, in place on ``model``.

    Let η, S, γ, μ denote ``lr``, ``batch_size``, ``weight_decay``, ``momentum``. Step k:

        B_k = S indices drawn uniformly **with replacement** (:func:`sample_batch`),
        g_k = ∇_θ [(1/S) Σ_{i∈B_k} ℓ_i](θ_k),
        θ_{k+1} = (1 − 2η_kγ) θ_k − η_k g_k,

    with η_k from ``schedule`` (constant η if None). Hence, for every exponential symmetry
    A, C(θ_{k+1}) = (1 − 2η_kγ)² C(θ_k) + η_k² g_kᵀ A g_k exactly (paper App. D).

    With μ > 0, heavy-ball momentum v ← μv + g + 2γθ, θ ← θ − ηv (torch's SGD convention)
    is used and a note in ``TrainResult.notes`` says that it breaks the identity above.

    Args:
        model: any ``nn.Module``; its trainable parameters θ are updated in place (its
            ``.grad`` fields are not touched). Used in whatever train/eval mode it is in.
        loss_fn: ``loss_fn(model(X[B]), Y[B])`` → 0-dim **mean** loss over the batch.
        X: inputs; has shape ``[N, ...]``, on the model's device.
        Y: targets; has shape ``[N, ...]``.
        lr: η > 0, the base learning rate.
        batch_size: S ≥ 1 (may exceed N: sampling is with replacement).
        steps: number of updates (≥ 0).
        weight_decay: γ; the penalty γ‖θ‖² is added to the loss (decoupled λ is γ = λ/2).
        momentum: μ ∈ [0, 1).
        schedule: a :class:`~noetherflow.train.Schedule`, a name (``"constant"``), or a
            callable step → multiplier of ``lr``.
        generator: ``torch.Generator`` for the minibatch draws (one ``torch.randint`` per
            step); pass a seeded one for reproducible runs. Torch's global RNG if None.
        callback: ``callback(step, model) -> dict[str, float] | None``, called at step 0,
            every ``log_every`` steps and at the last step, before that step's update. It may
            modify the model in place (e.g. teleport); the run continues from there.
        log_every: logging period in steps (≥ 1).
        sampler: ``sampler(step, generator) -> (X_b, Y_b)``: draw each step's minibatch from
            a data stream instead of sampling indices of ``(X, Y)`` (online SGD on a data
            model). ``(X, Y)`` are then only the evaluation set of the logged loss, and
            ``batch_size`` is informational (the sampler decides S). The sampler is the only
            user of ``generator``.
        on_update: ``on_update(UpdateInfo)``, called at every update with the minibatch
            gradient before it is applied (e.g. to check the exact charge identity).

    Returns:
        A :class:`TrainResult` (a divergence is recorded there, not raised).
    """
    return _first_order(
        "sgd",
        model,
        loss_fn,
        X,
        Y,
        lr=lr,
        batch_size=batch_size,
        steps=steps,
        weight_decay=weight_decay,
        momentum=momentum,
        schedule=schedule,
        generator=generator,
        callback=callback,
        log_every=log_every,
        sampler=sampler,
        on_update=on_update,
    )


def run_gd(
    model: nn.Module,
    loss_fn: LossFn,
    X: Tensor,
    Y: Tensor,
    *,
    lr: float,
    steps: int,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    schedule: ScheduleLike = None,
    callback: Callback | None = None,
    log_every: int = 1,
    on_update: UpdateHook | None = None,
) -> TrainResult:
    """Full-batch gradient descent: :func:`run_sgd` with B_k = all N samples every step.

    θ_{k+1} = (1 − 2η_kγ) θ_k − η_k ∇L(θ_k). Let η, γ, μ denote ``lr``, ``weight_decay``,
    ``momentum``; the other arguments are as in :func:`run_sgd`. Deterministic. For GD on a
    population risk, pass a data set whose empirical moments are the population's (an exact
    design, or a quadrature).
    """
    return _first_order(
        "gd",
        model,
        loss_fn,
        X,
        Y,
        lr=lr,
        batch_size=None,
        steps=steps,
        weight_decay=weight_decay,
        momentum=momentum,
        schedule=schedule,
        generator=None,
        callback=callback,
        log_every=log_every,
        on_update=on_update,
    )


def run_sgf(
    model: nn.Module,
    loss_fn: LossFn,
    X: Tensor,
    Y: Tensor,
    *,
    lr: float,
    batch_size: int,
    steps: int,
    weight_decay: float = 0.0,
    noise_samples: int | None = None,
    schedule: ScheduleLike = None,
    generator: torch.Generator | None = None,
    callback: Callback | None = None,
    log_every: int = 1,
    chunk_size: int | None = None,
) -> TrainResult:
    """Euler–Maruyama simulation of the stochastic gradient flow (paper eq. 1).

    Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay``. The SGF
    dθ = −∇L_γ(θ) dt + sqrt(2σ²Σ(θ)) dW with σ² = η/(2S) is stepped with dt = η_k:

        θ_{k+1} = (1 − 2η_kγ) θ_k − η_k ∇L(θ_k) + sqrt(η_k · 2σ_k²) ξ_k,   σ_k² = η_k/(2S),

    i.e. the noise term is (η_k/√S) ξ_k, where ξ_k has covariance **exactly** Σ(θ_k) (built
    by :func:`gradient_noise` from per-sample gradients, no ``[P, P]`` matrix). The per-step
    noise covariance is therefore η_k²Σ/S, the same as SGD's minibatch noise (sampling with
    replacement), and the drift is SGD's mean step. Time advances by η_k per step.

    Per-sample gradients come from ``torch.func`` (:func:`per_sample_gradients`): N copies
    of the gradient per step, so this is meant for small models. With ``noise_samples`` = M,
    Σ and ḡ are those of M samples drawn with replacement each step (the drift still uses
    the full batch); by default M = N and Σ is the exact full-data covariance.

    Generator use per step: one ``torch.randint`` (only if ``noise_samples`` is set), then
    one ``torch.randn`` of M normals.

    Args:
        model: as in :func:`run_sgd`.
        loss_fn: as in :func:`run_sgd`.
        X: as in :func:`run_sgd`.
        Y: as in :func:`run_sgd`.
        schedule: as in :func:`run_sgd`.
        callback: as in :func:`run_sgd`.
        log_every: as in :func:`run_sgd`.
        lr: η > 0 (also the Euler–Maruyama step dt).
        batch_size: S ≥ 1; sets the noise temperature σ² = η/(2S).
        steps: number of Euler–Maruyama steps (≥ 0).
        weight_decay: γ.
        noise_samples: M ≥ 2 samples used for Σ, or None for all N.
        generator: ``torch.Generator`` for z (and the M indices); global RNG if None.
        chunk_size: passed to ``vmap`` to bound the memory of per-sample gradients.
    """
    data, params = _prepare("run_sgf", model, loss_fn, X, Y, log_every)
    lr = _check_float("lr", lr, positive=True)
    batch_size = _check_positive_int("batch_size", batch_size)
    steps = _check_positive_int("steps", steps, minimum=0)
    gamma = _check_float("weight_decay", weight_decay)
    if noise_samples is not None:
        noise_samples = _check_positive_int("noise_samples", noise_samples, minimum=2)
    elif data.n < 2:
        raise ValueError(
            "run_sgf: the gradient covariance of N = 1 sample is zero; pass at least 2 samples."
        )
    lr_at = resolve_schedule(schedule, lr)
    names, _ = _trainable(model)

    def prepare_step(k: int, eta: float) -> tuple[Tensor, Callable[[], None], list[Tensor]]:
        if noise_samples is None:
            ps, losses = _per_sample_grads_and_losses(model, loss_fn, X, Y, chunk_size=chunk_size)
            G = torch.cat([ps[n].reshape(data.n, -1) for n in names], dim=1)
            loss = losses.mean()
            drift = G.mean(dim=0)
        else:
            idx = sample_batch(data.n, noise_samples, generator=generator, device=X.device)
            ps, _ = _per_sample_grads_and_losses(
                model, loss_fn, X[idx], Y[idx], chunk_size=chunk_size
            )
            G = torch.cat([ps[n].reshape(noise_samples, -1) for n in names], dim=1)
            full = data.loss(model)
            drift = _flatten(_grads(full, params))
            loss = full.detach()
        xi = gradient_noise(G, generator=generator)
        noise_scale = math.sqrt(eta * 2.0 * (eta / (2.0 * batch_size)))  # = η/√S
        drift_parts = _unflatten(drift, params)
        noise_parts = _unflatten(xi, params)

        def apply() -> None:
            with torch.no_grad():
                for p, d, x in zip(params, drift_parts, noise_parts, strict=True):
                    p.mul_(1.0 - 2.0 * eta * gamma).add_(d, alpha=-eta).add_(x, alpha=noise_scale)

        return loss, apply, [drift, xi]

    config: dict[str, Any] = {
        "method": "sgf",
        "lr": lr,
        "batch_size": batch_size,
        "sigma2": "lr / (2 * batch_size)",
        "steps": steps,
        "weight_decay": gamma,
        "noise_samples": noise_samples if noise_samples is not None else data.n,
        "schedule": repr(schedule) if schedule is not None else "constant",
        "log_every": log_every,
        "n_samples": data.n,
    }
    return _run_discrete(
        method="sgf",
        model=model,
        data=data,
        params=params,
        steps=steps,
        lr_at=lr_at,
        record_lr=True,
        prepare_step=prepare_step,
        callback=callback,
        log_every=log_every,
        notes=[],
        config=config,
    )
