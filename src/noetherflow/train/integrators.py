"""SGD, GD, the stochastic gradient flow (SGF) and gradient flow (GF) on any ``nn.Module``.

Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay``; N the number of samples in
``(X, Y)``; θ the trainable parameters (every ``p`` in ``model.parameters()`` with
``p.requires_grad``), flattened to a vector of length P; ℓ_i(θ) the per-sample loss; and
L(θ) = (1/N)Σ_i ℓ_i(θ) the full-batch loss. Following the paper (and DESIGN §2), weight
decay is the penalty γ‖θ‖² added to the loss, L_γ = L + γ‖θ‖², with gradient ∇L + 2γθ.
(An optimizer's decoupled decay λ corresponds to γ = λ/2.)

* :func:`run_sgd` — θ_{k+1} = (1 − 2η_kγ)θ_k − η_k g_k, with g_k = ∇ℓ_{B_k}(θ_k) the
  gradient of the mean loss over a minibatch B_k of S indices drawn **with replacement**.
  For any exponential symmetry A this gives, exactly and at every step,
  C(θ_{k+1}) = (1 − 2η_kγ)² C(θ_k) + η_k² g_kᵀ A g_k (paper App. D, eqs. 96–98; DESIGN §2).
  With replacement, E[g gᵀ] = ∇L∇Lᵀ + Σ/S (the "expected flow" of DESIGN §2).
* :func:`run_gd` — the same with B_k the whole data set.
* :func:`run_sgf` — Euler–Maruyama for the SGF dθ = −∇L_γ dt + sqrt(2σ²Σ) dW (paper eq. 1)
  with σ² = η/(2S) and step dt = η.
* :func:`run_gf` — gradient flow dθ/dt = −∇L_γ by RK4 or ``scipy.integrate.solve_ivp``.

Here Σ(θ) = (1/N)Σ_i (∇ℓ_i − ∇L)(∇ℓ_i − ∇L)ᵀ is the per-sample gradient covariance, of
shape ``[P, P]``; it is never materialised.

Every integrator calls ``callback(step, model)`` at step 0, every ``log_every`` steps and at
the last step (not on a state whose loss is already non-finite), and returns a
:class:`TrainResult`. A non-finite loss, parameter or gradient
stops the run and is recorded (``diverged``, ``diverged_at_step``, ``last_finite_loss``);
no exception is raised for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from noetherflow.train._divergence import DivergenceTracker, all_finite
from noetherflow.train.schedules import ScheduleLike, resolve_schedule

__all__ = [
    "Callback",
    "GFMethod",
    "LossFn",
    "TrainResult",
    "TrainingData",
    "gradient_noise",
    "per_sample_gradients",
    "run_gd",
    "run_gf",
    "run_sgd",
    "run_sgf",
    "sample_batch",
]

LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss_fn(outputs, targets)`` → 0-dim tensor, the **mean** of the per-sample losses."""

Callback = Callable[[int, nn.Module], "Mapping[str, float] | None"]
"""``callback(step, model)`` → optional dict of floats, added to the history."""

_RESERVED = ("step", "time", "loss", "lr")

MOMENTUM_NOTE = (
    "momentum={mu} > 0: the update uses a velocity buffer v ← μv + ∇L_γ, θ ← θ − ηv, so the "
    "exact per-step charge identity C(θ') = (1−2ηγ)²C(θ) + η²gᵀAg (DESIGN §2) does not hold; "
    "the cross term θᵀA v no longer vanishes once v mixes the weight-decay terms of several steps."
)


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


# --------------------------------------------------------------------------------------
# Data and result containers
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TrainingData:
    """A full data set and its loss.

    Attributes:
        X: inputs; has shape ``[N, ...]`` (what ``model`` accepts with a leading batch axis).
        Y: targets; has shape ``[N, ...]``.
        loss_fn: ``loss_fn(model(X[idx]), Y[idx])`` must return the **mean** of the
            per-sample losses ℓ_i over the batch (a 0-dim tensor), e.g. ``nn.MSELoss()``.
    """

    X: Tensor
    Y: Tensor
    loss_fn: LossFn

    def __post_init__(self) -> None:
        if not isinstance(self.X, Tensor) or not isinstance(self.Y, Tensor):
            raise ValueError(
                f"X and Y must be torch.Tensors, got {type(self.X).__name__} and "
                f"{type(self.Y).__name__}; convert with torch.as_tensor(...)."
            )
        if self.X.ndim == 0 or self.Y.ndim == 0:
            raise ValueError(
                f"X and Y need a leading sample axis; got shapes {tuple(self.X.shape)} and "
                f"{tuple(self.Y.shape)}. Use X.unsqueeze(0) for a single sample."
            )
        if self.X.shape[0] != self.Y.shape[0]:
            raise ValueError(
                f"Shape mismatch: X has {self.X.shape[0]} samples, Y has {self.Y.shape[0]}; "
                "both need the same leading dimension N."
            )
        if self.X.shape[0] == 0:
            raise ValueError("X and Y are empty (N = 0); pass at least one sample.")
        if self.X.device != self.Y.device:
            raise ValueError(
                f"Device mismatch: X is on {self.X.device}, Y on {self.Y.device}; move both "
                "to the model's device."
            )
        if not callable(self.loss_fn):
            raise ValueError(f"loss_fn={self.loss_fn!r} is not callable; pass e.g. nn.MSELoss().")

    @property
    def n(self) -> int:
        """N, the number of samples."""
        return int(self.X.shape[0])

    def loss(self, model: nn.Module, idx: Tensor | None = None) -> Tensor:
        """Mean loss over ``idx`` (all samples if None), with autograd graph. 0-dim."""
        if idx is None:
            out = model(self.X)
            return _check_scalar(self.loss_fn(out, self.Y))
        out = model(self.X[idx])
        return _check_scalar(self.loss_fn(out, self.Y[idx]))

    def full_loss(self, model: nn.Module) -> Tensor:
        """L(θ) without autograd and without changing the model's buffers. 0-dim."""
        with torch.no_grad(), _preserve_buffers(model):
            return self.loss(model).detach()


@dataclass
class TrainResult:
    """What a run returns.

    Attributes:
        method: ``"sgd"``, ``"gd"``, ``"sgf"`` or ``"gf"``.
        history: numpy arrays, one entry per logged step: ``step`` (int64), ``time``
            (t_k = Σ_{j<k} η_j; for GF the integration time), ``loss`` (full-batch data loss
            L(θ_k), without the γ‖θ‖² term), ``lr`` (η_k, the rate of the update leaving
            step k; NaN for GF), then every key the callback returned (NaN where it did not).
        final_state: detached copy of ``model.state_dict()`` at the end of the run (the
            diverged state if the run diverged).
        diverged: whether a non-finite loss, parameter or gradient stopped the run.
        diverged_at_step: k such that θ_k (or its loss or gradient) was non-finite, else None.
        last_finite_loss: the last finite loss the integrator evaluated (the minibatch loss
            for SGD steps, the full-batch loss otherwise and at logged steps), else None.
        steps_completed: updates actually applied.
        final_time: t at the end of the run.
        notes: caveats raised during the run (momentum, solver statistics, ...).
        config: every setting the run used.
    """

    method: str
    history: dict[str, np.ndarray]
    final_state: dict[str, Tensor]
    diverged: bool
    diverged_at_step: int | None
    last_finite_loss: float | None
    steps_completed: int
    final_time: float
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: everything except ``final_state``, history as lists."""
        hist = {
            k: [None if not math.isfinite(float(x)) else x for x in v.tolist()]
            for k, v in self.history.items()
        }
        return {
            "method": self.method,
            "diverged": self.diverged,
            "diverged_at_step": self.diverged_at_step,
            "last_finite_loss": self.last_finite_loss,
            "steps_completed": self.steps_completed,
            "final_time": self.final_time,
            "notes": list(self.notes),
            "config": dict(self.config),
            "history": hist,
        }


class _History:
    """Collect logged rows; callback keys may appear late (filled with NaN)."""

    def __init__(self) -> None:
        self._rows: list[dict[str, float]] = []
        self._keys: list[str] = list(_RESERVED)

    def log(
        self, step: int, time: float, loss: float, lr: float, extra: Mapping[str, Any] | None
    ) -> None:
        row: dict[str, float] = {"step": step, "time": time, "loss": loss, "lr": lr}
        if extra is not None:
            if not isinstance(extra, Mapping):
                raise TypeError(
                    f"callback returned a {type(extra).__name__} at step {step}; expected a "
                    "dict[str, float] or None."
                )
            for key, value in extra.items():
                if key in _RESERVED:
                    raise ValueError(
                        f"callback returned the key {key!r}, which the history reserves "
                        f"({', '.join(_RESERVED)}); rename it."
                    )
                if isinstance(value, Tensor):
                    value = value.detach()
                try:
                    row[str(key)] = float(value)
                except (TypeError, ValueError, RuntimeError):
                    raise TypeError(
                        f"callback value {key!r}={value!r} at step {step} is not a float; "
                        "return scalars (float, 0-dim tensor, numpy scalar)."
                    ) from None
                if key not in self._keys:
                    self._keys.append(str(key))
        self._rows.append(row)

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for key in self._keys:
            dtype = np.int64 if key == "step" else np.float64
            out[key] = np.array([r.get(key, math.nan) for r in self._rows], dtype=dtype)
        return out


# --------------------------------------------------------------------------------------
# Small pure helpers
# --------------------------------------------------------------------------------------


def _check_scalar(loss: Tensor) -> Tensor:
    if not isinstance(loss, Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ValueError(
            f"loss_fn returned {shape}; it must return the batch mean of the per-sample losses "
            "as a 0-dim tensor (e.g. nn.MSELoss() with reduction='mean')."
        )
    return loss


class _preserve_buffers:
    """Context manager: restore the model's buffers (BatchNorm statistics) on exit."""

    def __init__(self, model: nn.Module) -> None:
        self._buffers = list(model.buffers())
        self._saved: list[Tensor] = []

    def __enter__(self) -> None:
        self._saved = [b.detach().clone() for b in self._buffers]

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for b, s in zip(self._buffers, self._saved, strict=True):
                b.copy_(s)


def sample_batch(
    n: int, batch_size: int, *, generator: torch.Generator | None = None, device: Any = None
) -> Tensor:
    """Draw S = ``batch_size`` indices uniformly from 0..N−1 (N = ``n``) **with replacement**.

    This is the one call :func:`run_sgd` makes per step (in step order), so a generator
    seeded like the one given to ``run_sgd`` replays its minibatches. Has shape ``[S]``.
    """
    gen_device = generator.device if generator is not None else device
    idx = torch.randint(n, (batch_size,), generator=generator, device=gen_device)
    return idx if device is None else idx.to(device)


def _trainable(model: nn.Module) -> tuple[list[str], list[nn.Parameter]]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError(
            f"{type(model).__name__} has no parameter with requires_grad=True; nothing to train."
        )
    return [n for n, _ in named], [p for _, p in named]


def _grads(loss: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    gs = torch.autograd.grad(loss, list(params), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, gs, strict=True)]


def _flatten(tensors: Sequence[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(flat: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    out, i = [], 0
    for p in like:
        out.append(flat[i : i + p.numel()].view_as(p))
        i += p.numel()
    return out


def _assign_(params: Sequence[Tensor], flat: Tensor) -> None:
    with torch.no_grad():
        for p, v in zip(params, _unflatten(flat, params), strict=True):
            p.copy_(v)


def per_sample_gradients(
    model: nn.Module,
    loss_fn: LossFn,
    X: Tensor,
    Y: Tensor,
    *,
    chunk_size: int | None = None,
) -> dict[str, Tensor]:
    """Per-sample gradients ∇ℓ_i(θ) by ``torch.func`` (``functional_call`` + ``vmap(grad)``).

    ℓ_i is ``loss_fn(model(X[i:i+1]), Y[i:i+1])``. This is the reference (ground-truth)
    estimator; it materialises N copies of every gradient (``chunk_size`` bounds the vmap
    width). Models whose samples interact (BatchNorm in training mode) have no per-sample
    gradients; call ``model.eval()`` or use micro-batches.

    Returns:
        name → tensor, one per trainable parameter; each has shape ``[N, *param.shape]``.
    """
    grads, _ = _per_sample_grads_and_losses(model, loss_fn, X, Y, chunk_size=chunk_size)
    return grads


def _per_sample_grads_and_losses(
    model: nn.Module, loss_fn: LossFn, X: Tensor, Y: Tensor, *, chunk_size: int | None
) -> tuple[dict[str, Tensor], Tensor]:
    names, params = _trainable(model)
    trainable = {n: p.detach() for n, p in zip(names, params, strict=True)}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    buffers = dict(model.named_buffers())

    def one_sample_loss(tp: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        out = functional_call(model, {**tp, **frozen, **buffers}, (x.unsqueeze(0),))
        return _check_scalar(loss_fn(out, y.unsqueeze(0)))

    fn = vmap(grad_and_value(one_sample_loss), in_dims=(None, 0, 0), chunk_size=chunk_size)
    grads, losses = fn(trainable, X, Y)
    return dict(grads), losses


def gradient_noise(
    per_sample_grads: Tensor,
    *,
    generator: torch.Generator | None = None,
    num_draws: int | None = None,
) -> Tensor:
    """Gaussian vector(s) ξ with covariance exactly Σ = (1/N)Σ_i (g_i − ḡ)(g_i − ḡ)ᵀ.

    ξ = Σ_i (g_i − ḡ) z_i / sqrt(N) with z_i iid N(0, 1), so E[ξξᵀ] = Σ without forming a
    ``[P, P]`` matrix (the rank of Σ is at most N − 1). The z are drawn by one
    ``torch.randn`` call from ``generator`` (on the generator's device).

    Args:
        per_sample_grads: rows g_i; has shape ``[N, P]``.
        generator: source of z (torch's global RNG if None).
        num_draws: if given, return that many independent draws.

    Returns:
        ξ; has shape ``[P]`` (or ``[num_draws, P]``).
    """
    if per_sample_grads.ndim != 2:
        raise ValueError(
            f"per_sample_grads has shape {tuple(per_sample_grads.shape)}; expected [N, P] "
            "(flatten each sample's gradient into a row)."
        )
    n = per_sample_grads.shape[0]
    centred = per_sample_grads - per_sample_grads.mean(dim=0, keepdim=True)
    shape = (n,) if num_draws is None else (num_draws, n)
    gen_device = generator.device if generator is not None else per_sample_grads.device
    z = torch.randn(shape, generator=generator, dtype=per_sample_grads.dtype, device=gen_device)
    return (z.to(per_sample_grads.device) @ centred) / math.sqrt(n)


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------


def _check_positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}={value!r}, expected an int >= {minimum}.")
    return int(value)


def _check_float(name: str, value: object, *, positive: bool = False) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}, expected a float.") from None
    if not math.isfinite(v) or (positive and v <= 0):
        what = "a finite float > 0" if positive else "a finite float"
        raise ValueError(f"{name}={value!r}, expected {what}.")
    return v


def _prepare(
    who: str, model: nn.Module, loss_fn: LossFn, X: Tensor, Y: Tensor, log_every: int
) -> tuple[TrainingData, list[nn.Parameter]]:
    if not isinstance(model, nn.Module):
        raise ValueError(f"{who}: model is a {type(model).__name__}, expected an nn.Module.")
    data = TrainingData(X, Y, loss_fn)
    _check_positive_int("log_every", log_every)
    _, params = _trainable(model)
    if params[0].device != X.device:
        raise ValueError(
            f"{who}: X is on {X.device} but the model's parameters are on {params[0].device}; "
            f"move the data with X.to({str(params[0].device)!r}), Y.to(...)."
        )
    _check_mean_reduction(model, data)
    return data, params


def _check_mean_reduction(model: nn.Module, data: TrainingData) -> None:
    """Reject a summed loss: duplicating a sample must not change a mean loss."""
    base = [0, 1] if data.n >= 2 else [0]  # two samples keep BatchNorm (train mode) happy
    with torch.no_grad(), _preserve_buffers(model):
        one = data.loss(model, torch.tensor(base, device=data.X.device))
        two = data.loss(model, torch.tensor(base * 2, device=data.X.device))
    a, b = float(one), float(two)
    if (
        math.isfinite(a)
        and a != 0.0
        and abs(b - 2 * a) <= 1e-6 * abs(a)
        and abs(b - a) > 1e-6 * abs(a)
    ):
        raise ValueError(
            "loss_fn appears to sum the per-sample losses (its value doubles when a sample is "
            "duplicated); it must return the batch mean. Use reduction='mean'."
        )


def _final_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _call_callback(callback: Callback | None, step: int, model: nn.Module) -> Any:
    return None if callback is None else callback(step, model)


# --------------------------------------------------------------------------------------
# The discrete loop shared by SGD, GD, SGF and RK4 gradient flow
# --------------------------------------------------------------------------------------

StepFn = Callable[[int, float], "tuple[Tensor, Callable[[], None], list[Tensor]]"]


def _run_discrete(
    *,
    method: str,
    model: nn.Module,
    data: TrainingData,
    params: list[nn.Parameter],
    steps: int,
    lr_at: Callable[[int], float],
    record_lr: bool,
    prepare_step: StepFn,
    callback: Callback | None,
    log_every: int,
    notes: list[str],
    config: dict[str, Any],
) -> TrainResult:
    """Run ``steps`` updates. ``prepare_step(k, η_k)`` evaluates at θ_k and returns the loss
    to check, a closure applying the update, and extra tensors (gradients) to check."""
    history = _History()
    tracker = DivergenceTracker()
    time = 0.0
    k = 0
    while True:
        if k % log_every == 0 or k == steps:
            full = data.full_loss(model)
            finite = tracker.observe_loss(full, k)
            extra = _call_callback(callback, k, model) if finite else None
            lr_k = lr_at(k) if record_lr else math.nan
            history.log(k, time, float(full), lr_k, extra)
            if not finite:
                break
        if k == steps:
            break
        eta = lr_at(k)
        loss_k, apply_update, checked = prepare_step(k, eta)
        if not bool(all_finite([loss_k.detach(), *params, *checked]).item()):
            tracker.mark(k)
            break
        tracker.record_finite(loss_k)
        apply_update()
        time += eta
        k += 1
    return TrainResult(
        method=method,
        history=history.arrays(),
        final_state=_final_state(model),
        diverged=tracker.diverged,
        diverged_at_step=tracker.diverged_at_step,
        last_finite_loss=tracker.last_finite_loss,
        steps_completed=k,
        final_time=time,
        notes=notes,
        config=config,
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
    lr_at = resolve_schedule(schedule, lr)
    notes: list[str] = []
    if mu > 0:
        notes.append(MOMENTUM_NOTE.format(mu=mu))
    velocity: list[Tensor] | None = None

    def prepare_step(k: int, eta: float) -> tuple[Tensor, Callable[[], None], list[Tensor]]:
        idx = (
            None
            if batch_size is None
            else sample_batch(data.n, batch_size, generator=generator, device=X.device)
        )
        loss = data.loss(model, idx)
        g = _grads(loss, params)

        def apply() -> None:
            nonlocal velocity
            with torch.no_grad():
                if mu == 0.0:
                    # θ' = (1 − 2ηγ)θ − ηg, written exactly as in DESIGN §2.
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
        "sampling": "with replacement" if batch_size is not None else "full batch",
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
) -> TrainResult:
    """Full-batch gradient descent: :func:`run_sgd` with B_k = all N samples every step.

    θ_{k+1} = (1 − 2η_kγ) θ_k − η_k ∇L(θ_k). Let η, γ, μ denote ``lr``, ``weight_decay``,
    ``momentum``; the other arguments are as in :func:`run_sgd`. Deterministic.
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
        model, loss_fn, X, Y, schedule, callback, log_every: as in :func:`run_sgd`.
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
        model, loss_fn, X, Y, callback, log_every: as in :func:`run_sgd`.
        time: T > 0.
        steps: number of RK4 steps, or of grid intervals for the adaptive methods.
        weight_decay: γ.
        method: a :class:`GFMethod` or its value.
        rtol, atol: tolerances of the adaptive methods (ignored by RK4).
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
