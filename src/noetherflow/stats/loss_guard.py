"""Checks of a user's ``loss_fn``: what it returns, and the reduction it was declared with."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from noetherflow._errors import StatisticsError
from noetherflow.stats.core import Reduction

__all__ = ["check_reduction", "guard_loss"]


def guard_loss(
    loss_fn: Callable[[Any, Any], Tensor], targets: Any, *, scalar: bool = True
) -> Callable[[Any, Any], Tensor]:
    """``loss_fn``; a type error inside it becomes an error naming the targets and the fix.

    ``scalar``: the value is backpropagated as is, so it must be one number (the reference
    estimator also takes the ``[N]`` losses a model computes inside itself).
    """
    if not callable(loss_fn):
        raise TypeError(
            f"collect_stats: loss_fn is a {type(loss_fn).__name__}; expected a callable "
            "loss_fn(outputs, targets) -> scalar tensor, e.g. nn.MSELoss() or F.cross_entropy."
        )

    def call(out: Any, y: Any) -> Tensor:
        try:
            loss = loss_fn(out, y)
        except (TypeError, AttributeError, IndexError, RuntimeError) as exc:
            if targets is None:
                raise StatisticsError(
                    f"loss_fn(outputs, None) failed with {type(exc).__name__}: {exc}. "
                    "targets=None means that loss_fn computes the loss from the outputs alone "
                    "(e.g. loss_fn=lambda out, _: out.loss with labels among the keyword "
                    "inputs); otherwise pass the targets."
                ) from exc
            raise StatisticsError(
                f"loss_fn(outputs, targets) failed with {type(exc).__name__}: {exc}; the "
                f"outputs are {_what(out)} and the targets {_what(y)}. Expected what loss_fn "
                "takes: usually tensors with the samples along dim 0."
            ) from exc
        return _scalar_loss(loss) if scalar else loss

    return call


def _scalar_loss(loss: Any) -> Tensor:
    """``loss`` if it is a one-element tensor; else an error naming what came back and the fix."""
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss
    if isinstance(loss, Tensor):
        fix = (
            "A per-sample vector: pass a loss that reduces the batch, e.g. "
            "nn.CrossEntropyLoss() instead of reduction='none' (or loss.mean() / loss.sum() "
            "with reduction='sum')."
        )
    elif loss is None:
        fix = (
            "A Hugging Face model's out.loss is None when no labels reach the model: with "
            "the labels given as targets (a split dict batch), compute the loss from "
            "out.logits and the targets, or keep the labels among the keyword inputs."
        )
    else:
        fix = "Return the loss tensor itself (not .item(), a tuple or the model's output object)."
    raise StatisticsError(
        f"loss_fn returned {_what(loss)}; expected a scalar tensor, the batch mean "
        f"(reduction='mean') or sum (reduction='sum') of the per-sample losses. {fix}"
    )


def _what(v: Any) -> str:
    if isinstance(v, Tensor):
        return f"a tensor of shape {tuple(v.shape)} ({str(v.dtype).removeprefix('torch.')})"
    return f"a {type(v).__name__}"


def check_reduction(loss_fn: Any, out: Any, targets: Any, red: Reduction) -> None:
    """Refuse a ``loss_fn`` whose reduction is not the declared one (sum declared as mean).

    For a per-sample loss ℓ, ``loss_fn`` on samples {0, 1} is (ℓ₀+ℓ₁)/2 (mean) or ℓ₀+ℓ₁
    (sum); three evaluations on the outputs (no forward pass) tell which. Skipped when the
    outputs or targets are not batched tensors or ℓ₀ + ℓ₁ = 0 (cannot tell).
    """
    if not (isinstance(out, Tensor) and isinstance(targets, Tensor)):
        return
    if out.ndim == 0 or out.shape[0] < 2 or targets.ndim == 0 or targets.shape[0] != out.shape[0]:
        return
    with torch.no_grad():
        o, t = out.detach(), targets.detach()
        vals = [float(loss_fn(o[i:j], t[i:j])) for i, j in ((0, 1), (1, 2), (0, 2))]
    l0, l1, l01 = vals
    tot = l0 + l1
    if not all(map(math.isfinite, vals)) or abs(tot) <= 1e-12 * (abs(l0) + abs(l1) + 1e-300):
        return
    want, other = (tot / 2, tot) if red is Reduction.MEAN else (tot, tot / 2)
    tol = 1e-4 * abs(tot)
    if abs(l01 - want) > tol and abs(l01 - other) <= tol:
        declared = red.value
        actual = "sum" if declared == "mean" else "mean"
        raise StatisticsError(
            f"loss_fn reduces the batch by {actual!r} but reduction={declared!r} was passed "
            f"(loss_fn on two samples = {l01:.6g}; their {declared} = {want:.6g}, their "
            f"{actual} = {other:.6g}). Pass reduction={actual!r}, or make loss_fn return the "
            f"batch {declared}; pass check_loss=False to skip this check."
        )
