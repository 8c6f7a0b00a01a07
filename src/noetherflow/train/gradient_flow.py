"""Gradient flow dθ/dt = −∇L_γ(θ) on any ``nn.Module``: :func:`run_gf` (RK4 or scipy).

Notation as in :mod:`noetherflow.train.integrators`. Gradient flow conserves every Noether
charge when γ = 0 (paper Remark 4.4), which makes it the test of an integrator's accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow._divergence import DivergenceTracker, all_finite
from noetherflow.train._core import (
    Callback,
    LossFn,
    TrainingData,
    TrainResult,
    _assign_,
    _call_callback,
    _check_float,
    _check_positive_int,
    _final_state,
    _flatten,
    _grads,
    _History,
    _prepare,
    _run_discrete,
)

__all__ = ["GFMethod", "run_gf"]


class GFMethod(str, Enum):
    """Integrators for :func:`run_gf`.

    ``RK4`` is classical fixed-step Runge–Kutta (``steps`` steps of size T/steps); the others
    are ``scipy.integrate.solve_ivp`` methods with adaptive steps controlled by ``rtol`` and
    ``atol``, reporting the state on a grid of ``steps`` equal intervals.
    """

    RK4 = "rk4"
    RK45 = "rk45"
    RK23 = "rk23"
    DOP853 = "dop853"


_SCIPY_NAME = {GFMethod.RK45: "RK45", GFMethod.RK23: "RK23", GFMethod.DOP853: "DOP853"}


class _NonFinite(Exception):
    pass


def run_gf(
    model: nn.Module,
    loss_fn: LossFn,
    X: Tensor,
    Y: Tensor,
    *,
    time: float,
    steps: int = 1000,
    weight_decay: float = 0.0,
    method: GFMethod | str = GFMethod.RK4,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    callback: Callback | None = None,
    log_every: int = 1,
) -> TrainResult:
    """Gradient flow dθ/dt = −∇L_γ(θ) = −∇L(θ) − 2γθ over t ∈ [0, T], in place on ``model``.

    Let T, γ denote ``time``, ``weight_decay``. Gradient flow conserves every Noether charge
    when γ = 0 (paper Remark 4.4: it is the one dynamics without a noise equilibrium), which
    makes it the test of an integrator's accuracy.

    ``method="rk4"``: ``steps`` classical Runge–Kutta steps of size h = T/steps (local error
    O(h⁵)). ``method`` ∈ {``"rk45"``, ``"rk23"``, ``"dop853"``}: ``scipy.integrate.solve_ivp``
    with adaptive steps (tolerances ``rtol``, ``atol``, in float64) restarted at every logged
    grid point t_k = kT/``steps``; the number of right-hand-side evaluations goes to
    ``notes``. Steps in the history are grid indices k, ``time`` is t_k, ``lr`` is NaN.

    Args:
        model: as in :func:`run_sgd`.
        loss_fn: as in :func:`run_sgd`.
        X: as in :func:`run_sgd`.
        Y: as in :func:`run_sgd`.
        callback: as in :func:`run_sgd`.
        log_every: as in :func:`run_sgd`.
        time: T > 0.
        steps: number of RK4 steps, or of grid intervals for the adaptive methods.
        weight_decay: γ.
        method: a :class:`GFMethod` or its value.
        rtol: relative tolerance of the adaptive methods (ignored by RK4).
        atol: absolute tolerance of the adaptive methods (ignored by RK4).
    """
    data, params = _prepare("run_gf", model, loss_fn, X, Y, log_every)
    T = _check_float("time", time, positive=True)
    steps = _check_positive_int("steps", steps)
    gamma = _check_float("weight_decay", weight_decay)
    try:
        meth = GFMethod(method.lower() if isinstance(method, str) else method)
    except ValueError:
        options = ", ".join(repr(m.value) for m in GFMethod)
        raise ValueError(f"run_gf: method={method!r}, expected one of {options}.") from None
    rtol = _check_float("rtol", rtol, positive=True)
    atol = _check_float("atol", atol, positive=True)
    h = T / steps
    config: dict[str, Any] = {
        "method": "gf",
        "integrator": meth.value,
        "time": T,
        "steps": steps,
        "weight_decay": gamma,
        "rtol": rtol if meth is not GFMethod.RK4 else None,
        "atol": atol if meth is not GFMethod.RK4 else None,
        "log_every": log_every,
        "n_samples": data.n,
    }

    def velocity(flat: Tensor) -> tuple[Tensor, Tensor]:
        """Set θ = flat; return (L(θ), −∇L_γ(θ)) as (0-dim, [P])."""
        _assign_(params, flat)
        loss = data.loss(model)
        g = _flatten(_grads(loss, params))
        return loss.detach(), -(g + (2.0 * gamma) * flat)

    if meth is GFMethod.RK4:

        def prepare_step(k: int, eta: float) -> tuple[Tensor, Callable[[], None], list[Tensor]]:
            with torch.no_grad():
                y = _flatten([p.detach() for p in params]).clone()
            loss, k1 = velocity(y)
            _, k2 = velocity(y + (h / 2) * k1)
            _, k3 = velocity(y + (h / 2) * k2)
            _, k4 = velocity(y + h * k3)
            y_new = y + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
            _assign_(params, y)  # θ_k stays in place until the update is applied

            def apply() -> None:
                _assign_(params, y_new)

            return loss, apply, [k1, k2, k3, k4, y_new]

        return _run_discrete(
            method="gf",
            model=model,
            data=data,
            params=params,
            steps=steps,
            lr_at=lambda k: h,
            record_lr=False,
            prepare_step=prepare_step,
            callback=callback,
            log_every=log_every,
            notes=[],
            config=config,
        )
    return _run_gf_adaptive(
        model, data, params, velocity, T, steps, meth, rtol, atol, callback, log_every, config
    )


def _run_gf_adaptive(
    model: nn.Module,
    data: TrainingData,
    params: list[nn.Parameter],
    velocity: Callable[[Tensor], tuple[Tensor, Tensor]],
    T: float,
    steps: int,
    meth: GFMethod,
    rtol: float,
    atol: float,
    callback: Callback | None,
    log_every: int,
    config: dict[str, Any],
) -> TrainResult:
    from scipy.integrate import solve_ivp

    dtype, device = params[0].dtype, params[0].device
    history = _History()
    tracker = DivergenceTracker()
    notes: list[str] = []
    nfev = 0
    k = 0

    def fun(t: float, y: np.ndarray) -> np.ndarray:
        loss, v = velocity(torch.from_numpy(y).to(device=device, dtype=dtype))
        if not bool(all_finite([loss, v]).item()):
            raise _NonFinite
        return v.detach().to(device="cpu", dtype=torch.float64).numpy()

    while True:
        t_k = k * T / steps
        full = data.full_loss(model)
        finite = tracker.observe_loss(full, k)
        extra = _call_callback(callback, k, model) if finite else None
        history.log(k, t_k, float(full), math.nan, extra)
        if not finite or k == steps:
            break
        k_next = min(k + log_every, steps)
        with torch.no_grad():
            y0 = _flatten([p.detach() for p in params]).to(device="cpu", dtype=torch.float64)
        if not bool(torch.isfinite(y0).all()):
            tracker.mark(k)
            break
        try:
            sol = solve_ivp(
                fun,
                (t_k, k_next * T / steps),
                y0.numpy(),
                method=_SCIPY_NAME[meth],
                rtol=rtol,
                atol=atol,
            )
        except _NonFinite:
            # The flow left the finite range inside (t_k, t_next]: report the first grid
            # point not reached and leave the model at the last finite grid state θ_k.
            _assign_(params, y0.to(device=device, dtype=dtype))
            tracker.mark(k_next)
            notes.append(
                f"non-finite loss or gradient inside the solver between steps {k} and {k_next}; "
                f"the model holds the state of step {k}"
            )
            break
        nfev += int(sol.nfev)
        if sol.status != 0:
            _assign_(params, y0.to(device=device, dtype=dtype))
            tracker.mark(k)
            notes.append(f"solve_ivp failed between steps {k} and {k_next}: {sol.message}")
            break
        _assign_(params, torch.from_numpy(sol.y[:, -1]).to(device=device, dtype=dtype))
        k = k_next
    notes.append(f"solve_ivp({_SCIPY_NAME[meth]}, rtol={rtol}, atol={atol}): nfev={nfev}")
    return TrainResult(
        method="gf",
        history=history.arrays(),
        final_state=_final_state(model),
        diverged=tracker.diverged,
        diverged_at_step=tracker.diverged_at_step,
        last_finite_loss=tracker.last_finite_loss,
        steps_completed=k,
        final_time=k * T / steps,
        notes=notes,
        config=config,
    )
