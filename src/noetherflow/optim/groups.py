"""The one reader of a ``torch.optim`` optimizer's param groups.

Every part that needs an optimizer's settings (the noise descriptions of
:mod:`noetherflow.optim.hyper`, the monitor's and teleporter's
:class:`~noetherflow.optim.source.HyperSource`, :class:`~noetherflow.optim.StepRecorder`, the
momentum cross term) reads them through :func:`read_groups`, so that a wrapper, a default or a
PyTorch rule (dampening is ignored without momentum; ``Adam(decoupled_weight_decay=True)`` is
AdamW) is handled once. The values are the optimizer's own (λ as given, not γ = λ/2): the
conventions of the noise models are applied by the readers that build them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["ParamGroup", "groups_holding", "read_groups", "unwrap"]


def unwrap(optimizer: Any) -> Any:
    """The innermost ``torch.optim`` optimizer of a wrapper (itself when not wrapped).

    TeleportingOptimizer, LightningOptimizer and accelerate's AcceleratedOptimizer (itself a
    ``torch.optim.Optimizer`` subclass whose param_groups are the wrapped optimizer's) hold
    the real one as ``.optimizer``.
    """
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer) and inner is not optimizer:
        return unwrap(inner)
    return optimizer


@dataclass(frozen=True)
class ParamGroup:
    """One param group's settings, as the optimizer applies them.

    Attributes:
        index: the group's index in ``optimizer.param_groups``.
        kind: ``"sgd"``, ``"adamw"`` (``AdamW`` or ``Adam(decoupled_weight_decay=True)``),
            ``"adam"`` (coupled L2 through the preconditioner) or ``"other"``.
        lr: η.
        weight_decay: the optimizer's λ as given (SGD's coupled λ is γ = λ/2 of γ‖θ‖²).
        momentum: SGD's β (0 without momentum), β₁ for Adam(W), 0 otherwise.
        nesterov: SGD's Nesterov flag.
        dampening: SGD's d, 0 without momentum (where PyTorch ignores it).
        betas, eps: the group's ``betas`` and ``eps`` when it has them, else ``None``.
        amsgrad, maximize: as in ``torch.optim``.
        params: the group's parameters.
    """

    index: int
    kind: str
    lr: float
    weight_decay: float
    momentum: float
    nesterov: bool
    dampening: float
    betas: tuple[float, float] | None
    eps: float | None
    amsgrad: bool
    maximize: bool
    params: tuple[nn.Parameter, ...] = field(repr=False)

    @property
    def shrink(self) -> float:
        """The decay factor k of θ → kθ applied inside the step (1 − ηλ), else 1.

        SGD's coupled L2 and AdamW's decoupled λ act on θ directly; Adam's coupled L2 goes
        through the preconditioner (and another optimizer is unknown): k = 1 there.
        """
        if self.kind in ("sgd", "adamw"):
            return 1.0 - self.lr * self.weight_decay
        return 1.0


def _family(opt: torch.optim.Optimizer) -> str:
    if isinstance(opt, torch.optim.SGD):
        return "sgd"
    if isinstance(opt, torch.optim.AdamW):
        return "adamw"
    if isinstance(opt, torch.optim.Adam):
        return "adam"
    return "other"


def _read(index: int, g: Mapping[str, Any], family: str) -> ParamGroup:
    betas = g.get("betas")
    b = None if betas is None else (float(betas[0]), float(betas[1]))
    sgd = family == "sgd"
    mom = float(g.get("momentum", 0.0)) if sgd else (0.0 if b is None else b[0])
    kind = family
    if family == "adam" and bool(g.get("decoupled_weight_decay", False)):
        kind = "adamw"
    return ParamGroup(
        index=index,
        kind=kind,
        lr=float(g["lr"]),
        weight_decay=float(g.get("weight_decay", 0.0)),
        momentum=mom,
        nesterov=sgd and bool(g.get("nesterov", False)),
        # PyTorch ignores dampening without momentum (no buffer)
        dampening=float(g.get("dampening", 0.0)) if sgd and mom != 0.0 else 0.0,
        betas=b,
        eps=None if g.get("eps") is None else float(g["eps"]),
        amsgrad=bool(g.get("amsgrad", False)),
        maximize=bool(g.get("maximize", False)),
        params=tuple(g["params"]),
    )


def read_groups(optimizer: Any) -> list[ParamGroup]:
    """One :class:`ParamGroup` per param group of ``optimizer`` (unwrapped), read now.

    Read at every use, so learning-rate schedules are followed.
    """
    opt = unwrap(optimizer)
    family = _family(opt)
    return [_read(k, g, family) for k, g in enumerate(opt.param_groups)]


def groups_holding(optimizer: Any, params: Iterable[nn.Parameter], owner: str) -> list[ParamGroup]:
    """The param groups holding ``params``; raises naming ``owner`` if some are in none."""
    wanted = {id(p) for p in params}
    groups = [g for g in read_groups(optimizer) if wanted & {id(p) for p in g.params}]
    found = {id(p) for g in groups for p in g.params} & wanted
    if len(found) < len(wanted):
        raise ValueError(
            f"{owner}(optimizer=...): {len(wanted) - len(found)} of the {len(wanted)} parameters "
            "the symmetries act on are not in the optimizer's param groups; pass the optimizer "
            "that trains this model."
        )
    return groups
