"""The monitor's one-time notices, and how an L2 penalty found in the loss enters γ."""

from __future__ import annotations

import warnings
from typing import Any

from noetherflow._errors import StatisticsError
from noetherflow.monitor.schema import UNDEFINED

__all__ = [
    "adaptive_notice",
    "batch_size_notice",
    "decay_with_penalty",
    "effective_decay",
    "penalty_notice",
    "undefined_notice",
]


def adaptive_notice(kind: str, distance: bool, adamw: list[str]) -> None:
    """The one notice of a monitor built on an optimizer other than SGD."""
    what = "flows" + (" and distances to the noise equilibrium" if distance else "")
    name = {"adamw": "AdamW", "adam": "Adam"}.get(kind, "an optimizer other than SGD")
    pred = (
        f" AdamW's random-walk equilibrium charge and the distance to it are recorded for "
        f"the scale-invariant symmetries {adamw} (adamw_charge/*, adamw_distance/*, "
        "adamw_noise/*), per param group."
        if adamw
        else ""
    )
    warnings.warn(
        f"NoetherMonitor with {name}: charges and the exact per-step decomposition "
        f"(step_decay/drift/noise) are recorded, but no {what}: they are predictions of SGD's "
        f"noise model, and this update is not an SGD step.{pred} See the docs' optimizer page.",
        UserWarning,
        stacklevel=4,
    )


def batch_size_notice(step: int, declared: int, seen: int) -> None:
    """The one warning that a record step's statistics counted another number of samples.

    S = ``batch_size`` enters the noise term η/S of every flow and distance: a declared S
    other than the samples the step trained on scales that term by seen/declared. Not an
    error: a loop may subsample on purpose, or end an epoch on a smaller batch.
    """
    warnings.warn(
        f"NoetherMonitor(batch_size={declared}): record step {step} counted {seen} samples "
        "in its optimizer step (every mon.track() block since the last step, all processes), "
        f"so the noise term η/S of its flows and distances is {seen / declared:.3g}× that of "
        f"the batch trained on. Pass batch_size={seen}, the samples per optimizer step (the "
        "whole accumulated batch with gradient accumulation, all processes under DDP); for a "
        "last, smaller batch of an epoch use drop_last=True or set mon.batch_size before "
        "mon.step(). Said once.",
        UserWarning,
        stacklevel=5,
    )


def undefined_notice(step: int, code: int) -> None:
    """The one warning for a reason (:data:`~.schema.UNDEFINED`) a row's flows are NaN."""
    warnings.warn(
        f"NoetherMonitor: step {step} is recorded with its flows and distances undefined "
        f"(NaN, row['undefined'] = {code}): {UNDEFINED[code]}. Charges, loss and lr are "
        "recorded; training goes on. Said once per reason."
        + (" Wrap the forward and backward of every step in mon.track()." if code == 4 else ""),
        RuntimeWarning,
        stacklevel=5,
    )


def effective_decay(found: float, gamma: float, from_optimizer: bool) -> float:
    """The γ of the flows when the loss holds an L2 penalty γ_loss‖θ‖² (``found``).

    With the optimizer's γ (or none declared) the penalty adds to it (SGD's step on the loss
    with γ_loss‖θ‖² is the step with weight decay γ + γ_loss). A declared ``weight_decay=γ``
    is the paper's convention, the γ‖θ‖² in the loss: a penalty of that γ is that term; any
    other is refused.
    """
    if not found:
        return gamma
    if from_optimizer or gamma == 0:
        return gamma + found
    if abs(found - gamma) > 2e-2 * gamma:
        raise StatisticsError(
            f"NoetherMonitor(weight_decay={gamma!r}): the loss holds an L2 penalty γ‖θ‖² with "
            f"γ = {found:.6g}, not the declared weight_decay. Pass weight_decay={found:.6g} (γ "
            "of the γ‖θ‖² in the loss, plus any decay the optimizer applies), or drop the "
            "penalty from the loss."
        )
    return gamma


def decay_with_penalty(decay: Any, gamma: float, found: float) -> Any:
    """The flows' ``weight_decay=`` with an L2 penalty of the loss (γ_loss = ``found``).

    ``decay``: the source's γ (a float, a dict parameter → γ of per-group decay, or a
    per-parameter mapping given by hand); ``gamma``: :func:`effective_decay` of the one γ.
    Per-group decay gets γ_loss added to every parameter; a mapping by hand with a penalty
    is refused (which γ the penalty is part of is not known).
    """
    if isinstance(decay, dict):
        return {p: g + found for p, g in decay.items()}
    if isinstance(decay, float | int):
        return gamma
    if found:
        raise StatisticsError(
            "NoetherMonitor: the loss holds an L2 penalty γ‖θ‖² and weight_decay= is a "
            "per-parameter mapping; put the penalty into the mapping (γ per parameter of the "
            "γ‖θ‖² in the loss) and drop it from the loss."
        )
    return decay


def penalty_notice(found: float, from_optimizer: bool, gamma: float) -> None:
    """The one notice that an L2 penalty in the loss is treated as weight decay."""
    if not from_optimizer and gamma:
        return  # the declared γ‖θ‖² itself: nothing to say
    src = "the optimizer's weight decay" if from_optimizer else "weight_decay=0"
    warnings.warn(
        f"NoetherMonitor: the loss holds an L2 penalty γ‖θ‖² with γ = {found:.6g} (the "
        "backpropagated gradient minus the per-sample gradients' mean is 2γθ); it is treated "
        f"as weight decay, added to {src} in the flows, distances and the recorded "
        "weight_decay. Said once.",
        UserWarning,
        stacklevel=5,
    )
