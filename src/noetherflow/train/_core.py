"""Plumbing shared by the integrators.

Data and result containers, the logged history, argument checks, per-sample gradients and
the discrete loop (:func:`_run_discrete`).

Notation as in :mod:`noetherflow.train.integrators`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow._checks import check_real
from noetherflow._divergence import DivergenceTracker, all_finite
from noetherflow.stats.reference import per_sample_grads_and_losses

__all__ = [
    "Callback",
    "LossFn",
    "Sampler",
    "TrainResult",
    "TrainingData",
    "UpdateHook",
    "UpdateInfo",
    "gradient_noise",
    "per_sample_gradients",
    "sample_batch",
]

LossFn = Callable[[Tensor, Tensor], Tensor]
"""``loss_fn(outputs, targets)`` → 0-dim tensor, the **mean** of the per-sample losses."""

Callback = Callable[[int, nn.Module], "Mapping[str, float] | None"]
"""``callback(step, model)`` → optional dict of floats, added to the history."""

Sampler = Callable[[int, "torch.Generator | None"], "tuple[Tensor, Tensor]"]
"""``sampler(step, generator)`` → ``(X_b, Y_b)``, the minibatch of step k (shapes ``[S, ...]``)."""

_RESERVED = ("step", "time", "loss", "lr")


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


@dataclass(frozen=True, eq=False)
class UpdateInfo:
    """One update θ_k → θ_{k+1} of :func:`run_sgd` / :func:`run_gd`, as ``on_update`` sees it.

    ``on_update`` is called after the gradient is computed and before it is applied, so the
    model still holds θ_k.

    Attributes:
        step: k.
        lr: η_k, the rate of this update.
        weight_decay: γ (the update is θ_{k+1} = (1 − 2η_kγ)θ_k − η_k g_k without momentum).
        loss: the minibatch (or full-batch) data loss at θ_k, 0-dim, detached.
        grads: g_k, the gradient of that loss (without the 2γθ term), one detached tensor per
            trainable parameter, keyed by the ``nn.Parameter`` (the form
            :func:`noetherflow.exact_step_charges` takes). Do not modify them.
    """

    step: int
    lr: float
    weight_decay: float
    loss: Tensor
    grads: Mapping[nn.Parameter, Tensor]


UpdateHook = Callable[[UpdateInfo], None]
"""``on_update(info)``, called once per update before it is applied."""


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

    ℓ_i is ``loss_fn(model(X[i:i+1]), Y[i:i+1])``. This is the package's one reference
    (ground-truth) estimator, :func:`noetherflow.stats.reference.per_sample_grads_and_losses`,
    the one ``collect_stats(..., estimator="reference")`` uses; it materialises N copies of
    every gradient (``chunk_size`` bounds the vmap width). Models whose samples interact
    (BatchNorm in training mode) have no per-sample gradients: that raises
    :class:`~noetherflow.StatisticsError`; call ``model.eval()`` or use micro-batches.

    Returns:
        name → tensor, one per trainable parameter; each has shape ``[N, *param.shape]``.
    """
    grads, _ = _per_sample_grads_and_losses(model, loss_fn, X, Y, chunk_size=chunk_size)
    return grads


def _per_sample_grads_and_losses(
    model: nn.Module, loss_fn: LossFn, X: Tensor, Y: Tensor, *, chunk_size: int | None
) -> tuple[dict[str, Tensor], Tensor]:
    """The package's one per-sample reference (:mod:`noetherflow.stats.reference`).

    Keyed by the names of the trainable parameters; losses have shape ``[N]``.
    """
    names, params = _trainable(model)
    grads, losses = per_sample_grads_and_losses(
        model,
        params,
        lambda out, y: _check_scalar(loss_fn(out, y)),
        X,
        Y,
        chunk_size=chunk_size,
    )
    return {n: grads[p] for n, p in zip(names, params, strict=True)}, losses


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
    v = check_real(value, name)  # a string or a bool: a TypeError, not float("0.1")
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


def _sampled_loss(
    who: str, model: nn.Module, loss_fn: LossFn, batch: object, step: int, device: Any
) -> Tensor:
    """Mean loss on the minibatch a ``sampler`` returned for ``step`` (checked). 0-dim."""
    if (
        not isinstance(batch, tuple)
        or len(batch) != 2
        or not all(isinstance(t, Tensor) for t in batch)
    ):
        raise ValueError(
            f"{who}: sampler returned {type(batch).__name__} at step {step}; expected a tuple "
            "(X_batch, Y_batch) of tensors."
        )
    xb, yb = batch
    if xb.ndim == 0 or xb.shape[0] == 0 or xb.shape[0] != yb.shape[0]:
        raise ValueError(
            f"{who}: sampler returned shapes {tuple(xb.shape)} and {tuple(yb.shape)} at step "
            f"{step}; expected [S, ...] and [S, ...] with the same S >= 1."
        )
    if xb.device != device:
        raise ValueError(
            f"{who}: sampler returned a batch on {xb.device} at step {step}; the model and "
            f"(X, Y) are on {device}. Draw the batch on that device."
        )
    return _check_scalar(loss_fn(model(xb), yb))


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
    """Run ``steps`` updates.

    ``prepare_step(k, η_k)`` evaluates at θ_k and returns the loss to check, a closure
    applying the update, and extra tensors (gradients) to check.
    """
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
