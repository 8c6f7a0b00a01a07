"""What the optimizer's own step did to the charges, and AdamW's equilibrium prediction.

* The exact decomposition C(θ') = C(θ) + decay + drift + noise of :mod:`noetherflow.optim.
  decompose`, for the optimizer step that leads to a record step (the one step before it:
  a snapshot of the parameters costs a copy of them, so the other steps are left alone). Its
  ``after`` is that row's charge, so the parts say why the charge is what it is now. Any
  ``torch.optim`` optimizer.
* With ``AdamW`` (decoupled λ > 0), for scale-invariant symmetries: the random-walk
  equilibrium charge C* of :func:`noetherflow.optim.adamw_equilibrium_charge` (eq. A2) from
  the measured nᵀAn, n = g/(√v̂ + ε) the normalised update direction of this step (g the
  batch gradient in ``.grad``, v̂ Adam's bias-corrected second moment including g), with the
  η, λ, β₁ of the symmetry's own param group; and the distance to it, |λ| = ½|ln(C*/C)|
  (:func:`scale_distance`). One record is one sample of nᵀAn: average the rows over a
  stationary window for E[nᵀAn] (and C* of the average for the distance).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow.monitor.rows import Row, put_values, to_numpy
from noetherflow.monitor.schema import STEP_PARTS
from noetherflow.optim.adam import adamw_equilibrium_charge
from noetherflow.optim.decompose import StepDecomposition, StepRecorder
from noetherflow.optim.source import AdamSettings
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["StepLog", "adam_direction", "scale_distance", "unwrap_optimizer"]


def scale_distance(charge: np.ndarray, target: np.ndarray) -> np.ndarray:
    """|λ| of the rescaling θ → e^λ θ that takes the charge C = ‖θ‖² to ``target``.

    C(e^λ θ) = e^{2λ} C, so λ = ½ ln(C*/C): the distance to AdamW's predicted equilibrium
    charge C* in the units of the monitor's ``distance/*`` (the group parameter). NaN where
    C or C* is not positive. Same shape as ``charge``.
    """
    c, t = np.asarray(charge, dtype=np.float64), np.asarray(target, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 0.5 * np.abs(np.log(t / c))
    return np.where((c > 0) & (t > 0), out, np.nan)


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The ``torch.optim`` optimizer inside a wrapper (TeleportingOptimizer, Lightning's)."""
    inner = getattr(optimizer, "optimizer", None)  # also accelerate's AcceleratedOptimizer
    if isinstance(inner, torch.optim.Optimizer) and inner is not optimizer:
        return unwrap_optimizer(inner)
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def adam_direction(p: nn.Parameter, state: Mapping[str, Any], a: AdamSettings) -> Tensor | None:
    """N = g/(√v̂ + ε) of Adam's coming step for ``p`` (``None`` without a gradient).

    v̂ = (β₂v + (1 − β₂)g²)/(1 − β₂ᵗ) with t the coming step's count, as ``torch.optim.Adam``
    computes it (the running maximum with ``amsgrad``). Has the shape of ``p``.
    """
    if p.grad is None:
        return None
    g = p.grad.detach().to(torch.float64)
    if a.kind == "adam" and a.weight_decay:
        g = g + a.weight_decay * p.detach().to(torch.float64)  # Adam's coupled L2
    v = state.get("exp_avg_sq")
    t = float(state.get("step", 0)) + 1
    v_new = (1 - a.beta2) * g.square()
    if v is not None:
        v_new = v_new + a.beta2 * v.detach().to(torch.float64)
    if a.amsgrad and state.get("max_exp_avg_sq") is not None:
        v_new = torch.maximum(v_new, state["max_exp_avg_sq"].detach().to(torch.float64))
    denom = (v_new / (1 - a.beta2**t)).sqrt() + a.eps
    return g / denom


class StepLog:
    """The ``step_*`` and ``adamw_*`` entries of the monitor's rows.

    Args:
        syms, keys: the symmetries and their history keys.
        optimizer: the optimizer (``None``: nothing is recorded).
        due: whether the coming optimizer step leads to a record step.
        adam: the optimizer's Adam settings (read at each record), or ``None``.
    """

    def __init__(
        self,
        syms: SymmetrySet,
        keys: Mapping[str, str],
        optimizer: Any,
        due: Callable[[], bool],
        adam: Callable[..., AdamSettings] | None = None,
    ) -> None:
        self.syms, self.keys = syms, keys
        self.optimizer = unwrap_optimizer(optimizer)
        self.recorder: StepRecorder | None = None
        if self.optimizer is not None:
            self.recorder = StepRecorder(dict(syms.items()), self.optimizer).attach(due)
        self._adam = adam
        self._written: dict[str, StepDecomposition] | None = None
        self.adamw_names = [n for n, s in syms.items() if s.scale_invariant] if adam else []

    @property
    def active(self) -> bool:
        """Whether the step decomposition is recorded (an optimizer was given)."""
        return self.recorder is not None

    @property
    def last(self) -> dict[str, StepDecomposition] | None:
        """The decomposition of the last recorded optimizer step."""
        return None if self.recorder is None else self.recorder.last

    def put(self, row: Row, schema: Mapping[str, tuple[int, ...]]) -> None:
        """The step decomposition (if a new one is there) and AdamW's prediction into ``row``."""
        last = self.last
        if last is not None and last is not self._written:
            self._written = last
            for part in STEP_PARTS:
                vals = {name: getattr(d, part) for name, d in last.items()}
                put_values(row, f"step_{part}", vals, self.syms, self.keys, schema)
        if self._adam is not None and self.adamw_names:
            self._put_adamw(row, self._adam())

    def _put_adamw(self, row: Row, a_all: AdamSettings) -> None:
        assert self.optimizer is not None and self._adam is not None
        for name in self.adamw_names:
            s = self.syms[name]
            # λ of this symmetry's own param group (no-decay groups differ from the rest)
            a = self._adam(s.params) if a_all.mixed_decay else a_all
            ok = (
                a.kind == "adamw"
                and not a.mixed_decay
                and a.weight_decay > 0
                and a.lr * a.weight_decay < 2
            )
            dirs = {p: adam_direction(p, self.optimizer.state.get(p, {}), a) for p in s.params}
            if any(d is None for d in dirs.values()):
                continue  # no gradient at this record: NaN
            noise = s.charge_of({p: d for p, d in dirs.items() if d is not None})
            key = self.keys[name]
            row[f"adamw_noise/{key}"] = to_numpy(noise).reshape(row[f"adamw_noise/{key}"].shape)
            if ok:
                c = adamw_equilibrium_charge(
                    noise, lr=a.lr, weight_decay=a.weight_decay, beta1=a.beta1
                )
                shape = row[f"adamw_charge/{key}"].shape
                row[f"adamw_charge/{key}"] = star = np.asarray(to_numpy(c)).reshape(shape)
                row[f"adamw_distance/{key}"] = scale_distance(row[f"charge/{key}"], star)

    def close(self) -> None:
        """Remove the optimizer hooks."""
        if self.recorder is not None:
            self.recorder.detach()
