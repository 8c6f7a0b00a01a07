"""Read a ``torch.optim`` optimizer's hyper-parameters as noise descriptions, per param group.

Conventions (docs/concepts/flow.md): weight decay in the noise models is γ of γ‖θ‖² in the loss, so
PyTorch's coupled L2 ``SGD(weight_decay=λ)`` (gradient + λθ) is γ = λ/2. ``AdamW``'s
decoupled λ (θ ← (1 − ηλ)θ before the Adam update) is its own decay term, ``decoupled_decay``;
``Adam(weight_decay=λ)`` adds λθ to the gradient *before* the preconditioner, so its decay
is not a shrink of θ and is reported as ``coupled_l2`` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from noetherflow.optim.groups import ParamGroup, read_groups, unwrap
from noetherflow.optim.momentum import EffectiveNoise, momentum_noise

__all__ = [
    "GroupNoise",
    "decay_for_params",
    "from_optimizer",
    "group_for_params",
    "optimizer_kind",
]

KINDS = ("sgd", "adam", "adamw")


def optimizer_kind(opt: torch.optim.Optimizer) -> str:
    """``"sgd"``, ``"adam"`` or ``"adamw"``; a clear error for any other optimizer."""
    if isinstance(opt, torch.optim.AdamW):
        return "adamw"
    if isinstance(opt, torch.optim.Adam):
        return "adam"
    if isinstance(opt, torch.optim.SGD):
        return "sgd"
    raise TypeError(
        f"optimizer {type(opt).__name__} is not supported; expected torch.optim.SGD, Adam or "
        "AdamW. For another optimizer, record the exact per-step decomposition "
        "(StepRecorder), which works for any update."
    )


@dataclass(frozen=True)
class GroupNoise:
    """The noise description of one param group.

    Attributes:
        index: the param group's index.
        kind: ``"sgd"``, ``"adam"`` or ``"adamw"``.
        lr, momentum, nesterov: η, β (β₁ for Adam), Nesterov.
        dampening: SGD's dampening d (0 without momentum, where PyTorch ignores it); the
            noise model is then the heavy ball with η(1 − d).
        weight_decay: γ of γ‖θ‖² (SGD's coupled λ/2); 0 for Adam(W).
        decoupled_decay: AdamW's λ (θ ← (1 − ηλ)θ); 0 otherwise.
        coupled_l2: Adam's coupled λ (through the preconditioner); 0 otherwise.
        betas, eps: Adam's (β₁, β₂) and ε; ``None`` for SGD.
        noise: the effective noise model (SGD, SGD with momentum); ``None`` for Adam(W),
            whose update is not a gradient step (see ``noetherflow.optim.adam``).
        params: the group's parameters.
    """

    index: int
    kind: str
    lr: float
    batch_size: int
    momentum: float
    nesterov: bool
    weight_decay: float
    decoupled_decay: float
    coupled_l2: float
    betas: tuple[float, float] | None
    eps: float | None
    noise: EffectiveNoise | None
    params: tuple[nn.Parameter, ...] = field(repr=False)
    dampening: float = 0.0

    def settings(self) -> tuple[object, ...]:
        """Every setting that shapes the noise (for comparing groups)."""
        return (
            self.kind,
            self.lr,
            self.momentum,
            self.nesterov,
            self.dampening,
            self.weight_decay,
            self.decoupled_decay,
            self.coupled_l2,
            self.betas,
            self.eps,
        )


def _group(pg: ParamGroup, batch_size: int, time: str) -> GroupNoise:
    i = pg.index
    if pg.maximize:
        raise ValueError(
            f"param group {i}: maximize=True is not supported; the noise equilibrium is for "
            "minimisation. Negate the loss instead."
        )
    if pg.kind == "sgd":
        try:
            noise = momentum_noise(
                lr=pg.lr,
                batch_size=batch_size,
                weight_decay=pg.weight_decay / 2,
                momentum=pg.momentum,
                nesterov=pg.nesterov,
                time=time,
                dampening=pg.dampening,
            )
        except ValueError as e:
            raise ValueError(f"param group {i}: {e}") from None
        return GroupNoise(
            i,
            "sgd",
            pg.lr,
            batch_size,
            pg.momentum,
            pg.nesterov,
            pg.weight_decay / 2,
            0.0,
            0.0,
            None,
            None,
            noise,
            pg.params,
            pg.dampening,
        )
    assert pg.betas is not None and pg.eps is not None
    decoupled = pg.kind == "adamw"
    return GroupNoise(
        i,
        pg.kind,
        pg.lr,
        batch_size,
        pg.betas[0],
        False,
        0.0,
        pg.weight_decay if decoupled else 0.0,
        0.0 if decoupled else pg.weight_decay,
        pg.betas,
        pg.eps,
        None,
        pg.params,
    )


def from_optimizer(
    opt: torch.optim.Optimizer, batch_size: int, *, time: str = "discrete"
) -> list[GroupNoise]:
    """One :class:`GroupNoise` per param group of ``opt`` (``SGD``, ``Adam`` or ``AdamW``).

    Let η, β, λ denote a group's ``lr``, ``momentum`` and ``weight_decay``. ``SGD`` gives
    γ = λ/2 and the effective noise model of :func:`~noetherflow.optim.momentum.momentum_noise`
    (β = 0: today's ``NoiseModel.create``; dampening d: the heavy ball with η(1 − d));
    ``AdamW`` (or ``Adam(decoupled_weight_decay=True)``) gives its decoupled λ; ``Adam`` its
    coupled L2. Raises for maximize=True, dampening ≥ 1, or another optimizer.
    """
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(
            f"batch_size={batch_size!r} must be a positive integer S (the batch size)."
        )
    optimizer_kind(unwrap(opt))  # refuses another optimizer
    return [_group(pg, int(batch_size), time) for pg in read_groups(opt)]


def group_for_params(groups: Sequence[GroupNoise], params: Iterable[nn.Parameter]) -> GroupNoise:
    """The one group's description that applies to ``params`` (e.g. a symmetry's parameters).

    A charge mixes its parameters, so they must all be updated with the same settings;
    raises if they span groups whose settings differ, or if one is in no group.
    """
    where: dict[int, GroupNoise] = {}
    for gr in groups:
        for p in gr.params:
            where[id(p)] = gr
    found: list[GroupNoise] = []
    for p in params:
        if id(p) not in where:
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} is in no param group of the optimizer; "
                "expected every parameter of the symmetry to be optimised."
            )
        found.append(where[id(p)])
    first = found[0]
    for gr in found[1:]:
        if gr.settings() != first.settings():
            if _but_decay(gr) == _but_decay(first):
                raise ValueError(
                    f"the parameters span param groups {first.index} and {gr.index} that differ "
                    f"in weight decay only ({_decay(first)} vs {_decay(gr)}): one group's "
                    "description does not apply. Use decay_for_params(groups, params) for the "
                    "decay of each parameter, or NoiseModel.from_optimizer(opt, S, "
                    "per_group=False) for the flows and solvers (docs/concepts/flow.md, "
                    "per-parameter weight decay)."
                )
            raise ValueError(
                f"the parameters span param groups {first.index} and {gr.index} with different "
                f"settings {first.settings()} vs {gr.settings()}; a charge mixes its parameters, "
                "so its equilibrium needs one setting. Put them in one group (or give the groups "
                "the same lr, momentum and weight decay)."
            )
    return first


def _decay(g: GroupNoise) -> float:
    return g.decoupled_decay if g.kind == "adamw" else g.weight_decay or g.coupled_l2


def _but_decay(g: GroupNoise) -> tuple[object, ...]:
    """The settings that are not weight decay (the noise model, built from it, left out)."""
    return (g.kind, g.lr, g.momentum, g.nesterov, g.dampening, g.betas, g.eps)


def decay_for_params(
    groups: Sequence[GroupNoise], params: Iterable[nn.Parameter]
) -> dict[nn.Parameter, float]:
    """Each parameter's decay from its group: γ (SGD, γ = λ/2), AdamW's decoupled λ, Adam's L2.

    For groups that differ in weight decay only (a no-decay group of biases and norm
    weights): SGD's γ per parameter is what ``weight_decay=`` of the flows and solvers takes
    (docs/concepts/flow.md); AdamW's λ per parameter is the decay of
    :func:`~noetherflow.optim.adamw_equilibrium_charge` for a symmetry whose parameters share
    it. Raises if a parameter is in no group or the groups are of different kinds.
    """
    where = {id(p): gr for gr in groups for p in gr.params}
    out: dict[nn.Parameter, float] = {}
    kinds = set()
    for p in params:
        gr = where.get(id(p))
        if gr is None:
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} is in no param group of the optimizer; "
                "expected every parameter of the symmetry to be optimised."
            )
        kinds.add(gr.kind)
        out[p] = _decay(gr)
    if len(kinds) > 1:
        raise ValueError(
            f"decay_for_params: the parameters lie in groups of kinds {sorted(kinds)}; their "
            "decays are not one kind of number (γ of SGD, AdamW's decoupled λ, Adam's L2)."
        )
    return out
