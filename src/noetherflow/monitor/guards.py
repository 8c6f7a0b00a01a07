"""Guards around the monitor's hook capture: accumulation refused, estimator advice added."""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow._errors import StatisticsError, UnsupportedLayerError

__all__ = ["loss_tensor", "monitor_advice", "refuse_accumulation"]

_HOW = (
    " With NoetherMonitor: pass estimator='microbatch' (any model, BatchNorm in training mode "
    "included; micro_batch_size >= 2 there) or estimator='reference', with loss_fn=loss_fn, "
    "and call mon.step(loss, inputs=x, targets=y)."
)


def loss_tensor(loss: object) -> Tensor:
    """``mon.step``'s loss as a detached one-element tensor (float64 when a number was given)."""
    if isinstance(loss, Tensor) and loss.numel() == 1:
        return loss.detach()
    if isinstance(loss, numbers.Real) and not isinstance(loss, bool | np.bool_):
        return torch.tensor(float(loss), dtype=torch.float64)
    what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else repr(loss)
    raise TypeError(
        f"NoetherMonitor.step(loss): got {what:.80}; expected the batch loss, a one-element "
        "tensor or a number (or None: the row's loss is then NaN)."
    )


@contextlib.contextmanager
def monitor_advice() -> Iterator[None]:
    """Add how to choose the estimator *of the monitor* to the statistics' own errors."""
    try:
        yield
    except (StatisticsError, UnsupportedLayerError) as e:
        if "estimator=" in str(e) and _HOW not in str(e):
            raise type(e)(f"{e}{_HOW}") from e
        raise


@contextlib.contextmanager
def refuse_accumulation(model: nn.Module) -> Iterator[None]:
    """Raise a clear error when a second forward pass follows a backward pass in one track()."""
    state = {"forwards": 0, "backward": False}

    def mark(_: Tensor) -> None:
        state["backward"] = True

    def pre(mod: nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            return
        if state["forwards"] and state["backward"]:
            raise StatisticsError(
                "NoetherMonitor: a second forward pass ran after a backward pass inside one "
                "`with mon.track():` — gradient accumulation. Put each micro-batch's forward "
                "and backward in its own `with mon.track():` block, k blocks before one "
                "mon.step(), with NoetherMonitor(batch_size=) the whole accumulated batch: "
                "the record is then that of the accumulated batch, exactly."
            )
        state["forwards"] += 1

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        if torch.is_grad_enabled() and not state["backward"]:
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(mark)
                    break

    handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _tensors(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for o in out for t in _tensors(o)]
    return []
