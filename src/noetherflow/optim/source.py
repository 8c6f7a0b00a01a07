"""η and γ of the flows, given by hand or read from a ``torch.optim`` optimizer at each use.

:class:`HyperSource` is what :class:`noetherflow.NoetherMonitor`,
:class:`noetherflow.EquilibriumTeleport` and the Lightning callback hold instead of loose
``lr``/``weight_decay`` numbers:

* explicit: ``lr=η, weight_decay=γ`` (γ of γ‖θ‖² in the loss, the paper's convention);
* from an optimizer: ``optimizer=opt``; :meth:`HyperSource.current` reads the param groups
  every time it is called, so learning-rate schedules are followed.

Supported optimizers: ``torch.optim.SGD`` (heavy-ball or Nesterov momentum β, any
dampening d < 1, not ``maximize``); with ``adaptive=True`` (the monitor) also any other
optimizer, whose settings :meth:`HyperSource.adam` reads. SGD's ``weight_decay=w`` adds w·θ
to the gradient, i.e. the gradient of (w/2)‖θ‖²: γ = w/2. Momentum enters the flows through
:meth:`HyperSource.momentum_kwargs` (``NoiseModel.create(momentum=β, nesterov=...,
dampening=d)``: the
effective coefficients, exact for the stationary point when ⟨vᵀA∇L⟩ = 0). Adam, AdamW and
other optimizers are refused here: their update is not a gradient step, so they have no
(κ, c_mean, c_second) noise model (issue #18; ``noetherflow.optim`` has the AdamW analysis).

Param groups: only the groups holding the watched parameters matter. They must agree on lr,
momentum, Nesterov and dampening (the flows have one η), otherwise the source refuses with
the groups and their values; their weight decay may differ (a no-decay group of biases and
norm weights): :meth:`HyperSource.decay` then gives γ per parameter, which the flows and
solvers take as ``weight_decay=`` (docs/concepts/flow.md, per-parameter weight decay).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import check_decay_type, check_real
from noetherflow.kernels.decay import ParamDecay, parse_decay
from noetherflow.optim.groups import groups_holding, unwrap

__all__ = ["AdamSettings", "HyperSource", "adam_settings", "sgd_hyperparameters"]

_LATER = (
    "noetherflow's noise model covers SGD (with or without momentum); the update of Adam/AdamW "
    "and other optimizers is not a gradient step, so there is no flow or equilibrium distance "
    "for it (see noetherflow.optim for the AdamW analysis, issue #18)"
)


def is_adaptive(optimizer: Any) -> bool:
    """Whether ``optimizer`` (unwrapped) is a ``torch.optim`` optimizer other than ``SGD``."""
    opt = unwrap(optimizer)
    return isinstance(opt, torch.optim.Optimizer) and not isinstance(opt, torch.optim.SGD)


@dataclass(frozen=True)
class AdamSettings:
    """The settings of the Adam/AdamW param groups that hold the watched parameters.

    Attributes:
        kind: ``"adamw"`` (decoupled decay: ``AdamW``, or ``Adam(decoupled_weight_decay=True)``),
            ``"adam"`` (coupled L2 through the preconditioner), or ``"other"`` (any other
            ``torch.optim`` optimizer: only lr and weight_decay are read, the rest is 0).
        lr, weight_decay: η and the optimizer's own λ (decoupled for ``"adamw"``); the
            largest λ when the groups differ in weight decay (``mixed_decay``).
        beta1, beta2, eps, amsgrad: as in ``torch.optim.Adam``.
    """

    kind: str
    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    amsgrad: bool
    mixed_decay: bool = False


def adam_settings(
    optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter], *, owner: str
) -> AdamSettings:
    """:class:`AdamSettings` of the groups of an optimizer holding ``params``.

    The groups must agree on everything but the weight decay, which may differ per group
    (AdamW's decoupled λ acts per parameter, θ ← (1 − ηλ)θ): ``weight_decay`` is then the
    largest λ and ``mixed_decay`` True (per-symmetry values: call with its parameters).
    """
    values = set()
    decays = set()
    for g in groups_holding(optimizer, params, owner):
        if g.maximize:
            raise ValueError(
                f"{owner}(optimizer=...): param group {g.index} has maximize=True; expected "
                "minimisation (maximize=False)."
            )
        b1, b2 = g.betas or (0.0, 0.0)
        decays.add(g.weight_decay)
        values.add((g.kind, g.lr, b1, b2, g.eps or 0.0, g.amsgrad))
    if len(values) > 1:
        raise ValueError(
            f"{owner}(optimizer=...): the watched parameters lie in param groups with different "
            f"settings (kind, lr, betas, eps, amsgrad) {sorted(values)}; a charge mixes its "
            "parameters, so the records need one setting (weight decay may differ). Watch "
            "symmetries whose parameters share these settings."
        )
    kind, lr, b1, b2, eps, ams = values.pop()
    return AdamSettings(kind, lr, max(decays), b1, b2, eps, ams, len(decays) > 1)


def sgd_hyperparameters(
    optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter], *, owner: str
) -> tuple[float, float]:
    """(η, γ) of the param groups of ``optimizer`` that hold ``params``; γ = weight_decay / 2.

    Raises ``ValueError`` naming ``owner`` when the optimizer is not SGD, when the
    parameters are not in the optimizer, or when their groups disagree on lr/weight decay.
    """
    lr, wd, _, _, _ = sgd_settings(optimizer, params, owner=owner)
    return lr, largest(wd)


def largest(decay: float | dict[nn.Parameter, float]) -> float:
    """The largest γ of a per-parameter decay (the γ itself for one value)."""
    return max(decay.values()) if isinstance(decay, dict) else decay


def sgd_settings(
    optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter], *, owner: str
) -> tuple[float, float | dict[nn.Parameter, float], float, bool, float]:
    """(η, γ, β, nesterov, d) of the param groups holding ``params`` (:func:`sgd_hyperparameters`).

    d is the dampening (0 without momentum, where PyTorch ignores it). γ = weight_decay / 2,
    one float when the groups agree, else a dict parameter → γ over ``params`` (per-group
    decay). Also raises for dampening ≥ 1 and when the groups disagree on lr, momentum,
    Nesterov or dampening.
    """
    params = list(params)
    optimizer = unwrap(optimizer)
    name = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.SGD):
        raise ValueError(
            f"{owner}(optimizer=...) got a {name}; {_LATER}. Pass lr=η and weight_decay=γ "
            "explicitly instead of optimizer= (for SGD with momentum β, the effective lr is "
            "η/(1 − β))."
        )
    groups = groups_holding(optimizer, params, owner)
    for g in groups:
        if not 0.0 <= g.dampening < 1.0:
            raise ValueError(
                f"{owner}(optimizer=...): param group {g.index} of the SGD has "
                f"dampening={g.dampening!r}; expected 0 <= dampening < 1 (with d = 1 "
                "the buffer never takes a gradient after the first step). Lower dampening."
            )
        if g.maximize:
            raise ValueError(
                f"{owner}(optimizer=...): param group {g.index} has maximize=True; expected "
                "gradient descent (maximize=False)."
            )
    values = {(g.lr, g.momentum, g.nesterov, g.dampening) for g in groups}
    if len(values) > 1:
        seen = ", ".join(
            f"group {g.index}: lr={g.lr!r}, weight_decay={g.weight_decay!r}, "
            f"momentum={g.momentum!r}, nesterov={g.nesterov!r}, dampening={g.dampening!r}"
            for g in groups
        )
        raise ValueError(
            f"{owner}(optimizer=...): the watched parameters lie in param groups with different "
            f"lr, momentum, nesterov or dampening ({seen}); the flows have one η and one "
            "momentum (weight decay may differ between groups). Watch symmetries whose "
            "parameters share these settings, or pass lr= and weight_decay= explicitly."
        )
    lr, beta, nesterov, d = values.pop()
    wanted = {id(p) for p in params}
    decay = {p: g.weight_decay / 2.0 for g in groups for p in g.params if id(p) in wanted}
    gammas = set(decay.values())
    return lr, (gammas.pop() if len(gammas) == 1 else decay), beta, nesterov, d


@dataclass
class HyperSource:
    """Where η and γ come from: explicit numbers or an optimizer read at every call.

    Args:
        owner: the class name, for error messages.
        lr, weight_decay: explicit η and γ (γ‖θ‖² convention); ``weight_decay`` defaults to 0.
        optimizer: read η, γ from its param groups instead (see :func:`sgd_hyperparameters`).
        params: the parameters whose groups are read.
        adaptive: also accept other optimizers than ``SGD`` (then :meth:`current` gives η and
            the optimizer's own weight decay λ, and :meth:`adam` its settings).
        zero_lr: accept η = 0 read from the optimizer or set later (a warmup from 0, a
            schedule that reaches 0): the monitor records such steps with its flows marked
            undefined instead of stopping training. ``lr=0`` given at construction is refused.
    """

    owner: str
    lr: float | None
    weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay | None
    optimizer: torch.optim.Optimizer | None
    params: tuple[nn.Parameter, ...]
    adaptive: bool = False
    zero_lr: bool = False

    @classmethod
    def create(
        cls,
        owner: str,
        *,
        lr: float | None,
        weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay | None,
        optimizer: torch.optim.Optimizer | None,
        params: Iterable[nn.Parameter],
        adaptive: bool = False,
        zero_lr: bool = False,
    ) -> HyperSource:
        """Check that exactly one source is given; read the optimizer once to fail early."""
        if optimizer is not None:
            given = [
                f"{n}={v!r}"
                for n, v in (("lr", lr), ("weight_decay", weight_decay))
                if v is not None
            ]
            if given:
                raise ValueError(
                    f"{owner}: both optimizer= and {', '.join(given)} were given; the "
                    "hyper-parameters are read from the optimizer's param groups when it is "
                    "passed. Drop " + " and ".join(g.split("=")[0] + "=" for g in given) + " (or "
                    "drop optimizer= to set them by hand)."
                )
        elif lr is None:
            raise ValueError(
                f"{owner}: the learning rate is missing; pass optimizer=opt (η and γ are then "
                "read from its param groups at every record) or lr=η (and weight_decay=γ)."
            )
        if lr is not None:
            lr = check_real(lr, "lr", "the learning rate η")
        check_decay_type(weight_decay)
        adam = adaptive and is_adaptive(optimizer)
        # η = 0 is a step of a schedule (an optimizer's warmup, mon.lr set later), not a
        # learning rate to build on: refused when given by hand at construction
        explicit_zero = optimizer is None and lr is not None and float(lr) == 0
        src = cls(owner, lr, weight_decay, optimizer, tuple(params), adam, zero_lr)
        if explicit_zero:
            src.zero_lr = False
            try:
                src.current()
            finally:
                src.zero_lr = zero_lr
        src.current()
        return src

    @property
    def from_optimizer(self) -> bool:
        """Whether the values are read from an optimizer."""
        return self.optimizer is not None

    @property
    def kind(self) -> str:
        """``"sgd"`` (explicit values or SGD), ``"adam"``, ``"adamw"`` or ``"other"``."""
        return self.adam().kind if self.adaptive else "sgd"

    def adam(self, params: Iterable[nn.Parameter] | None = None) -> AdamSettings:
        """The optimizer's settings now (``adaptive`` sources of a non-SGD optimizer only).

        ``params``: the groups of these parameters only (default: all watched ones), e.g.
        one symmetry's, whose λ is then its own.
        """
        assert self.adaptive and self.optimizer is not None
        ps = self.params if params is None else params
        return adam_settings(self.optimizer, ps, owner=self.owner)

    def current(self) -> tuple[float, float]:
        """(η, γ) now: the explicit values, or those of the optimizer's param groups.

        For an Adam/AdamW (``adaptive``): η and the optimizer's own weight decay λ. Groups with
        different weight decay give their largest γ here (the per-parameter values:
        :meth:`decay`).
        """
        if self.adaptive:
            a = self.adam()
            lr, gamma = a.lr, a.weight_decay
        elif self.optimizer is not None:
            lr, gamma = sgd_hyperparameters(self.optimizer, self.params, owner=self.owner)
        else:
            assert self.lr is not None
            dec = parse_decay(0.0 if self.weight_decay is None else self.weight_decay)
            lr = float(self.lr)
            gamma = max(dec.values(), default=0.0) if isinstance(dec, ParamDecay) else dec
        if not (math.isfinite(lr) and (lr > 0 or (self.zero_lr and lr == 0))):
            hint = (
                " The optimizer's lr is 0 now (a warmup from 0?): pass lr=η, the learning rate "
                "whose equilibrium is sought (e.g. the warmup's peak), with the optimizer for "
                "its state."
                if lr == 0 and self.optimizer is not None
                else ""
            )
            raise ValueError(
                f"{self.owner}: lr={lr!r} must be a positive finite learning rate η.{hint}"
            )
        if not (math.isfinite(gamma) and gamma >= 0):
            raise ValueError(
                f"{self.owner}: weight_decay={gamma!r} must be a finite γ >= 0 (γ of γ‖θ‖²; "
                "torch.optim.SGD(weight_decay=w) is γ = w/2)."
            )
        return lr, gamma

    def decay(self) -> float | dict[nn.Parameter, float] | ParamDecay:
        """γ for the flows' ``weight_decay=``: one float, or γ per parameter of ``params``.

        A dict only when the optimizer's param groups holding the watched parameters have
        different weight decay (e.g. a no-decay group); explicit values give a float.
        """
        if self.optimizer is not None and not self.adaptive:
            _, wd, _, _, _ = sgd_settings(self.optimizer, self.params, owner=self.owner)
            return wd
        if self.optimizer is None and self.weight_decay is not None:
            dec = parse_decay(self.weight_decay)
            if isinstance(dec, ParamDecay):
                return dec
        return self.current()[1]

    def momentum_kwargs(self) -> dict[str, Any]:
        """``momentum=β, nesterov=..., dampening=d`` for the flows/solver.

        The optimizer's settings, or plain SGD's when there is no optimizer.
        """
        if self.optimizer is None:
            return {"momentum": 0.0, "nesterov": False, "dampening": 0.0}
        if self.adaptive:
            raise RuntimeError(
                f"{self.owner}: an Adam/AdamW optimizer has no SGD noise model (no momentum "
                "keywords); the flows and distances are not computed for it."
            )
        _, _, beta, nesterov, d = sgd_settings(self.optimizer, self.params, owner=self.owner)
        return {"momentum": beta, "nesterov": nesterov, "dampening": d}

    def displacement(self) -> dict[nn.Parameter, Tensor] | None:
        """The momentum displacement v = −η·buffer of SGD with momentum (None otherwise).

        For the cross term c_cross·vᵀA∇L of the flows and solvers; read after ``backward``
        and before ``step``.
        """
        if self.optimizer is None or self.adaptive:
            return None
        opt = unwrap(self.optimizer)
        if not isinstance(opt, torch.optim.SGD):
            return None
        from noetherflow.optim.momentum import momentum_displacement

        return momentum_displacement(opt, self.params) or None

    def set(self, name: str, value: float) -> None:
        """Set ``lr`` or ``weight_decay`` by hand (refused when they come from an optimizer)."""
        if self.optimizer is not None:
            raise AttributeError(
                f"{self.owner}.{name} is read from the optimizer given as optimizer=; change "
                "the optimizer's param_groups (or use a torch.optim.lr_scheduler) instead of "
                f"setting {name}={value!r}."
            )
        if name == "lr":
            value = check_real(value, "lr", "the learning rate η")
        else:
            check_decay_type(value)
        old = getattr(self, name)
        setattr(self, name, value)
        try:
            self.current()
        except ValueError:
            setattr(self, name, old)
            raise
