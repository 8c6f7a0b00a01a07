"""Learning-rate schedules for the discrete integrators.

Let η denote ``lr`` (the *base* learning rate given to :func:`~noetherflow.train.run_sgd`
and friends) and η_k the learning rate used for the update θ_k → θ_{k+1}, k = 0, 1, ….
A schedule maps (k, η) to η_k. The SGD/SGF clock advances by η_k per step, so the time
reported after k steps is t_k = Σ_{j<k} η_j (docs/concepts/flow.md: t = η·steps
for a constant η).

Built-ins:

* :class:`Constant` — η_k = η.
* :class:`LinearWarmup` — η_k rises linearly from ``start_lr`` (η₀) at k = 0 to η at
  k = ``warmup_steps`` (K) and stays there: η_k = η₀ + (η − η₀)·min(k/K, 1).
* :class:`StepDecay` — η_k = η·γ_s^{#{m ∈ milestones : m ≤ k}} (γ_s = ``gamma``), as
  ``torch.optim.lr_scheduler.MultiStepLR``.
* :class:`GeometricDecay` — η_k = η for the first K − m steps, then a geometric decay from η
  to η_end over the last m = round(f·K) steps (K = ``steps``, f = ``decay_frac``, η_end =
  ``final_lr``): the annealing several reproductions use after a constant phase.
* :class:`LambdaSchedule` — η_k = η·f(k) for a user function f; a plain callable passed as
  ``schedule=`` is wrapped in it (multiplier semantics, as ``torch``'s ``LambdaLR``).

:func:`make_schedule` builds one from a :class:`ScheduleKind` string (for configs), and
:func:`lr_sequence` tabulates η_0 … η_{n−1}.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, TypeAlias

import numpy as np

__all__ = [
    "Constant",
    "GeometricDecay",
    "LambdaSchedule",
    "LinearWarmup",
    "Schedule",
    "ScheduleKind",
    "ScheduleLike",
    "StepDecay",
    "lr_sequence",
    "make_schedule",
    "resolve_schedule",
]


class Schedule(ABC):
    """Interface: ``schedule(step, base_lr)`` returns the learning rate η_k of step k.

    Implementations must return a finite, non-negative float; :func:`resolve_schedule`
    checks this on every call and names the offending step.
    """

    @abstractmethod
    def __call__(self, step: int, base_lr: float) -> float:
        """Return η_k for step ``step`` (k ≥ 0) given the base learning rate η."""


class Constant(Schedule):
    """η_k = η for every step."""

    def __call__(self, step: int, base_lr: float) -> float:
        """η_k of step ``step`` for the base rate η (see the class docstring)."""
        return float(base_lr)

    def __repr__(self) -> str:
        return "Constant()"


class LinearWarmup(Schedule):
    """Linear warm-up over K = ``warmup_steps`` steps from η₀ = ``start_lr`` to η.

    η_k = η₀ + (η − η₀)·k/K for k < K and η_k = η for k ≥ K (so η_0 = η₀, η_K = η).

    Args:
        warmup_steps: K ≥ 1.
        start_lr: η₀ ≥ 0, the absolute learning rate of step 0 (default 0).
    """

    def __init__(self, warmup_steps: int, *, start_lr: float = 0.0) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(
                f"LinearWarmup: warmup_steps={warmup_steps!r}, expected an int >= 1; "
                "use Constant() for no warm-up."
            )
        if not math.isfinite(start_lr) or start_lr < 0:
            raise ValueError(
                f"LinearWarmup: start_lr={start_lr!r}, expected a finite float >= 0 "
                "(the absolute learning rate at step 0)."
            )
        self.warmup_steps = warmup_steps
        self.start_lr = float(start_lr)

    def __call__(self, step: int, base_lr: float) -> float:
        """η_k of step ``step`` for the base rate η (see the class docstring)."""
        if step >= self.warmup_steps:
            return float(base_lr)
        frac = step / self.warmup_steps
        return self.start_lr + (float(base_lr) - self.start_lr) * frac

    def __repr__(self) -> str:
        return f"LinearWarmup(warmup_steps={self.warmup_steps}, start_lr={self.start_lr})"


class StepDecay(Schedule):
    """Piecewise-constant steps: η_k = η·γ_s^{#{m ∈ milestones : m ≤ k}}.

    Args:
        milestones: strictly increasing step indices ≥ 1 at which the rate is multiplied.
        gamma: γ_s > 0, the factor applied at each milestone (default 0.1).
    """

    def __init__(self, milestones: Sequence[int], *, gamma: float = 0.1) -> None:
        ms = list(milestones)
        if any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in ms):
            raise ValueError(
                f"StepDecay: milestones={ms!r}, expected ints >= 1 (step indices at which "
                "the learning rate changes)."
            )
        if any(b <= a for a, b in itertools.pairwise(ms)):
            raise ValueError(
                f"StepDecay: milestones={ms!r} are not strictly increasing; sort them and "
                "remove duplicates."
            )
        if not math.isfinite(gamma) or gamma <= 0:
            raise ValueError(f"StepDecay: gamma={gamma!r}, expected a finite float > 0.")
        self.milestones = tuple(ms)
        self.gamma = float(gamma)

    def __call__(self, step: int, base_lr: float) -> float:
        """η_k of step ``step`` for the base rate η (see the class docstring)."""
        n = sum(1 for m in self.milestones if m <= step)
        return float(base_lr) * self.gamma**n

    def __repr__(self) -> str:
        return f"StepDecay(milestones={list(self.milestones)}, gamma={self.gamma})"


class GeometricDecay(Schedule):
    """Constant η, then a geometric decay to ``final_lr`` over the last ``decay_frac`` of a run.

    Let K = ``steps``, m = round(f·K) with f = ``decay_frac``, and η_end = ``final_lr``.
    η_k = η for k < K − m, and η_{K−m+j} = η·(η_end/η)^{j/(m−1)} for j = 0 … m − 1 (the
    points of ``numpy.geomspace(η, η_end, m)``: the last update uses η_end); η_k = η_end for
    k ≥ K. With m = 0 the schedule is constant.

    Args:
        steps: K ≥ 1, the length of the run.
        decay_frac: f ∈ [0, 1].
        final_lr: η_end > 0, the absolute rate of the last step.
    """

    def __init__(self, steps: int, *, decay_frac: float, final_lr: float) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"GeometricDecay: steps={steps!r}, expected an int >= 1.")
        if not math.isfinite(decay_frac) or not 0.0 <= decay_frac <= 1.0:
            raise ValueError(
                f"GeometricDecay: decay_frac={decay_frac!r}, expected a float in [0, 1] (the "
                "fraction of the run over which the rate decays)."
            )
        if not math.isfinite(final_lr) or final_lr <= 0:
            raise ValueError(
                f"GeometricDecay: final_lr={final_lr!r}, expected a finite float > 0 (the "
                "absolute learning rate of the last step)."
            )
        self.steps = steps
        self.decay_frac = float(decay_frac)
        self.final_lr = float(final_lr)
        self.n_decay = round(self.decay_frac * steps)
        self._table: tuple[float, np.ndarray] | None = None

    def __call__(self, step: int, base_lr: float) -> float:
        """η_k of step ``step`` for the base rate η (see the class docstring)."""
        start = self.steps - self.n_decay
        if self.n_decay == 0 or step < start:
            return float(base_lr)
        if step >= self.steps:
            return self.final_lr
        if self._table is None or self._table[0] != float(base_lr):
            self._table = (float(base_lr), np.geomspace(base_lr, self.final_lr, self.n_decay))
        return float(self._table[1][step - start])

    def __repr__(self) -> str:
        return (
            f"GeometricDecay(steps={self.steps}, decay_frac={self.decay_frac}, "
            f"final_lr={self.final_lr})"
        )


class LambdaSchedule(Schedule):
    """η_k = η·f(k) for a user function ``f(step) -> float`` (a multiplier, as LambdaLR)."""

    def __init__(self, fn: Callable[[int], float]) -> None:
        if not callable(fn):
            raise ValueError(
                f"LambdaSchedule: fn={fn!r} is not callable; pass a function step -> multiplier."
            )
        self.fn = fn

    def __call__(self, step: int, base_lr: float) -> float:
        """η_k of step ``step`` for the base rate η (see the class docstring)."""
        return float(base_lr) * float(self.fn(step))

    def __repr__(self) -> str:
        return f"LambdaSchedule({self.fn!r})"


class ScheduleKind(str, Enum):
    """Names of the built-in schedules, for configs and :func:`make_schedule`."""

    CONSTANT = "constant"
    WARMUP = "warmup"
    STEP = "step"
    GEOMETRIC = "geometric"


ScheduleLike: TypeAlias = Schedule | ScheduleKind | str | Callable[[int], float] | None
"""What ``schedule=`` accepts: a Schedule, a name, a multiplier callable, or None."""


def make_schedule(kind: ScheduleKind | str, **kwargs: Any) -> Schedule:
    """Build a built-in schedule by name.

    ``"constant"`` takes no arguments; ``"warmup"`` takes ``warmup_steps`` and optionally
    ``start_lr``; ``"step"`` takes ``milestones`` and optionally ``gamma``; ``"geometric"``
    takes ``steps``, ``decay_frac`` and ``final_lr`` (:class:`GeometricDecay`).
    """
    try:
        k = ScheduleKind(kind)
    except ValueError:
        options = ", ".join(repr(s.value) for s in ScheduleKind)
        raise ValueError(
            f"make_schedule: unknown kind {kind!r}; expected one of {options}."
        ) from None
    if k is ScheduleKind.CONSTANT:
        if kwargs:
            raise ValueError(f"make_schedule('constant') takes no arguments, got {sorted(kwargs)}.")
        return Constant()
    if k is ScheduleKind.WARMUP:
        return LinearWarmup(**kwargs)
    if k is ScheduleKind.GEOMETRIC:
        return GeometricDecay(**kwargs)
    return StepDecay(**kwargs)


def resolve_schedule(schedule: ScheduleLike, lr: float) -> Callable[[int], float]:
    """Turn ``schedule`` and the base rate η = ``lr`` into a checked function k ↦ η_k.

    ``None`` means constant; a string or :class:`ScheduleKind` names an argument-free
    built-in (only ``"constant"``); a plain callable is a multiplier (:class:`LambdaSchedule`).
    The returned function raises ``ValueError`` if a step's rate is negative or not finite.
    """
    sched: Schedule
    if schedule is None:
        sched = Constant()
    elif isinstance(schedule, Schedule):
        sched = schedule
    elif isinstance(schedule, str):
        sched = make_schedule(schedule)
    elif callable(schedule):
        sched = LambdaSchedule(schedule)
    else:
        raise ValueError(
            f"schedule={schedule!r} is not a Schedule, a schedule name or a callable; pass e.g. "
            "LinearWarmup(100) or lambda step: 0.5 ** (step // 1000)."
        )

    def lr_at(step: int) -> float:
        value = float(sched(step, lr))
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"schedule {sched!r} gave learning rate {value!r} at step {step}; expected a "
                "finite float >= 0. Check the schedule's parameters."
            )
        return value

    return lr_at


def lr_sequence(schedule: ScheduleLike, lr: float, steps: int) -> np.ndarray:
    """Return η_0 … η_{steps−1} as a float64 array. Has shape ``[steps]``."""
    lr_at = resolve_schedule(schedule, lr)
    return np.array([lr_at(k) for k in range(steps)], dtype=np.float64)
