"""Online SGD on fresh samples and gradient descent on a population loss.

Let η, γ denote ``lr``, ``weight_decay`` (the penalty γ‖θ‖² of the paper, as in
:mod:`noetherflow.train.integrators`). Two dynamics the fixed-data-set integrators lack:

* :func:`run_online_sgd` — every step draws a **fresh** minibatch ``(X_k, Y_k) = sample(k)``
  (online SGD on the population loss, as in the paper's Fig. 4 and in any experiment whose
  data stream is drawn from a distribution), then
  θ_{k+1} = (1 − 2η_kγ)θ_k − η_k ∇ℓ_k(θ_k),  ℓ_k = ``loss_fn(model(X_k), Y_k)``.
  ``sample`` may also replay a fixed sequence of minibatches of a data set (indices drawn by
  the caller), which is how a batched closed-form simulator is checked step for step.
* :func:`run_population_gd` — full gradient descent on an exact expected loss L(θ) given as
  ``population_loss(model)`` (e.g. σ_x²‖UW − V‖² + const for Gaussian inputs):
  θ_{k+1} = (1 − 2η_kγ)θ_k − η_k ∇L(θ_k).

Both log through ``callback(step, model)`` at step 0, every ``log_every`` steps and at the
last step (before that step's update; the callback may modify the model), record divergence
in their :class:`~noetherflow.train.TrainResult` instead of raising, and leave the model in
its final (or diverged) state. Per-step charges obey the exact identity of paper eqs. 96–97 because
the update is plain SGD.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow._divergence import DivergenceTracker, all_finite
from noetherflow.train.integrators import Callback, LossFn, TrainResult
from noetherflow.train.schedules import ScheduleLike, resolve_schedule

__all__ = ["PopulationLoss", "Sampler", "run_online_sgd", "run_population_gd"]

Sampler = Callable[[int], "tuple[Tensor, Tensor]"]
"""``sample(step)`` → ``(X_k, Y_k)``, the fresh minibatch of step k (shapes ``[S, ...]``)."""

PopulationLoss = Callable[[nn.Module], Tensor]
"""``population_loss(model)`` → 0-dim tensor L(θ), differentiable in the parameters."""

_RESERVED = ("step", "time", "loss", "lr")


def _trainable(who: str, model: nn.Module) -> list[nn.Parameter]:
    if not isinstance(model, nn.Module):
        raise ValueError(f"{who}: model is a {type(model).__name__}, expected an nn.Module.")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            f"{who}: {type(model).__name__} has no parameter with requires_grad=True; "
            "nothing to train."
        )
    return params


def _check(who: str, lr: float, steps: int, weight_decay: float, log_every: int) -> None:
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"{who}: lr={lr!r}, expected a finite float > 0.")
    for name, value, low in (("steps", steps, 0), ("log_every", log_every, 1)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise ValueError(f"{who}: {name}={value!r}, expected an int >= {low}.")
    if not (isinstance(weight_decay, int | float) and math.isfinite(weight_decay)):
        raise ValueError(f"{who}: weight_decay={weight_decay!r}, expected a finite float.")


def _scalar(who: str, loss: Any) -> Tensor:
    if not isinstance(loss, Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ValueError(
            f"{who}: the loss has shape {shape}; expected a 0-dim tensor (the batch mean, or "
            "the population loss)."
        )
    return loss


class _Log:
    """Rows of logged values; callback keys may appear late (NaN where absent)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.keys: list[str] = list(_RESERVED)

    def add(
        self, step: int, time: float, loss: float, lr: float, extra: Mapping[str, Any] | None
    ) -> None:
        row = {"step": float(step), "time": time, "loss": loss, "lr": lr}
        for key, value in (extra or {}).items():
            if key in _RESERVED:
                raise ValueError(
                    f"callback returned the key {key!r}, which the history reserves "
                    f"({', '.join(_RESERVED)}); rename it."
                )
            row[key] = float(value.detach() if isinstance(value, Tensor) else value)
            if key not in self.keys:
                self.keys.append(key)
        self.rows.append(row)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            k: np.array(
                [r.get(k, math.nan) for r in self.rows],
                dtype=np.int64 if k == "step" else np.float64,
            )
            for k in self.keys
        }


def _loop(
    who: str,
    model: nn.Module,
    objective: Callable[[int], Tensor],
    *,
    lr: float,
    steps: int,
    weight_decay: float,
    schedule: ScheduleLike,
    callback: Callback | None,
    log_every: int,
    config: dict[str, Any],
) -> TrainResult:
    """θ_{k+1} = (1 − 2η_kγ)θ_k − η_k ∇objective(k)(θ_k) for k < ``steps``."""
    _check(who, lr, steps, weight_decay, log_every)
    params = _trainable(who, model)
    lr_at = resolve_schedule(schedule, float(lr))
    log, tracker = _Log(), DivergenceTracker()
    time, k = 0.0, 0
    while True:
        logged = k % log_every == 0 or k == steps
        extra = callback(k, model) if (logged and callback is not None) else None
        if k == steps:
            if logged:
                log.add(k, time, math.nan, lr_at(k), extra)
            break
        eta = lr_at(k)
        loss = _scalar(who, objective(k))
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        g = [torch.zeros_like(p) if gp is None else gp for p, gp in zip(params, grads, strict=True)]
        if logged:
            log.add(k, time, float(loss.detach()), eta, extra)
        if not bool(all_finite([loss.detach(), *params, *g]).item()):
            tracker.mark(k)
            break
        tracker.record_finite(loss)
        with torch.no_grad():
            for p, gp in zip(params, g, strict=True):
                p.mul_(1.0 - 2.0 * eta * weight_decay).add_(gp, alpha=-eta)
        time += eta
        k += 1
    return TrainResult(
        method=config["method"],
        history=log.arrays(),
        final_state={n: v.detach().clone() for n, v in model.state_dict().items()},
        diverged=tracker.diverged,
        diverged_at_step=tracker.diverged_at_step,
        last_finite_loss=tracker.last_finite_loss,
        steps_completed=k,
        final_time=time,
        notes=[],
        config={
            **config,
            "lr": float(lr),
            "steps": steps,
            "weight_decay": weight_decay,
            "schedule": repr(schedule) if schedule is not None else "constant",
            "log_every": log_every,
        },
    )


def run_online_sgd(
    model: nn.Module,
    loss_fn: LossFn,
    sample: Sampler,
    *,
    lr: float,
    steps: int,
    weight_decay: float = 0.0,
    schedule: ScheduleLike = None,
    callback: Callback | None = None,
    log_every: int = 1,
) -> TrainResult:
    """SGD on a fresh minibatch every step: θ_{k+1} = (1 − 2η_kγ)θ_k − η_k ∇ℓ_k(θ_k).

    ``sample(k)`` is called exactly once per update, in step order, and returns the
    minibatch ``(X_k, Y_k)``; ℓ_k = ``loss_fn(model(X_k), Y_k)`` (the batch **mean**).

    Args:
        model: any ``nn.Module``; its trainable parameters are updated in place.
        loss_fn: ``loss_fn(outputs, targets)`` → 0-dim mean loss over the batch.
        sample: the data stream, step → ``(X_k, Y_k)`` with shapes ``[S, ...]``.
        lr: η > 0, the base learning rate (times ``schedule``).
        steps: number of updates (≥ 0).
        weight_decay: γ of the penalty γ‖θ‖².
        schedule: a :class:`~noetherflow.train.Schedule`, a name or a callable multiplier.
        callback: ``callback(step, model) -> dict[str, float] | None`` at logged steps.
        log_every: logging period (≥ 1).

    Returns:
        A :class:`~noetherflow.train.TrainResult`; its history's ``loss`` is the minibatch
        loss ℓ_k at logged steps (NaN at the final state, which has no minibatch).
    """

    def objective(k: int) -> Tensor:
        x, y = sample(k)
        return loss_fn(model(x), y)

    return _loop(
        "run_online_sgd",
        model,
        objective,
        lr=lr,
        steps=steps,
        weight_decay=weight_decay,
        schedule=schedule,
        callback=callback,
        log_every=log_every,
        config={"method": "online_sgd", "sampling": "fresh minibatch per step"},
    )


def run_population_gd(
    model: nn.Module,
    population_loss: PopulationLoss,
    *,
    lr: float,
    steps: int,
    weight_decay: float = 0.0,
    schedule: ScheduleLike = None,
    callback: Callback | None = None,
    log_every: int = 1,
) -> TrainResult:
    """Gradient descent on an exact expected loss: θ_{k+1} = (1 − 2η_kγ)θ_k − η_k ∇L(θ_k).

    Args:
        population_loss: ``population_loss(model)`` → 0-dim L(θ), differentiable.
        model: as in :func:`run_online_sgd`.
        lr: as in :func:`run_online_sgd`.
        steps: as in :func:`run_online_sgd`.
        weight_decay: as in :func:`run_online_sgd`.
        schedule: as in :func:`run_online_sgd`.
        callback: as in :func:`run_online_sgd`.
        log_every: as in :func:`run_online_sgd`.

    Returns:
        A :class:`~noetherflow.train.TrainResult`; its history's ``loss`` is L(θ_k) at logged
        steps (NaN at the final state).
    """
    return _loop(
        "run_population_gd",
        model,
        lambda k: population_loss(model),
        lr=lr,
        steps=steps,
        weight_decay=weight_decay,
        schedule=schedule,
        callback=callback,
        log_every=log_every,
        config={"method": "population_gd", "sampling": "exact expected gradient"},
    )
