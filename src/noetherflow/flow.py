"""Noether charges and their flows (paper eqs. 5–9): the family-agnostic driver.

Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay`` (γ‖θ‖² in the loss). Both time
models have the form  flow = −κ·C + Tr[A·M]  (:class:`NoiseModel`); each symmetry family's
noise term Tr[A·M] is computed by its kernel (:mod:`noetherflow.kernels`):

* ``time="continuous"`` (SGF, Itô, σ² = η/(2S)):  dC/dt = −4γC + (η/S)·Tr[ΣA].
  The paper's eq. (7) writes σ²Tr[ΣA]; Itô's lemma applied to its eq. (1) gives
  2σ²Tr[ΣA] = (η/S)Tr[ΣA], which is what we use (checked against simulation).
* ``time="discrete"`` (one SGD step, expectation over a batch drawn with replacement):
  E[ΔC] = −κC + η²Tr[A(∇L∇Lᵀ + Σ/S)],  κ = 4ηγ(1−ηγ).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow import _shard
from noetherflow._checks import (
    check_decay_type,
    check_finite_number,
    check_instance,
    check_stats_cover,
)
from noetherflow._deprecate import is_old_model_call, warn_model
from noetherflow.kernels import kernel_for
from noetherflow.kernels.decay import ParamDecay, decay_cross, parse_decay
from noetherflow.kernels.noise import NoiseModel, TimeModel, check_decay, resolve_noise
from noetherflow.stats.core import GradStats, with_displacement
from noetherflow.symmetry.base import Symmetry, charges_of_all
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "NoiseModel",
    "TimeModel",
    "charges",
    "exact_step_charges",
    "noether_flow",
    "symmetry_flow",
]


def charges(
    syms: SymmetrySet | nn.Module | None, legacy: SymmetrySet | None = None
) -> dict[str, Tensor]:
    """Noether charges C = θᵀAθ (eq. 6), one entry per symmetry: ``charges(syms)``.

    Diagonal families give one charge per generator (``[num_generators]``), a rotation the
    ``[d, d]`` matrix UᵀU − WWᵀ, a dense symmetry a scalar. The old form
    ``charges(model, syms)`` still works (the model was never used) and warns.
    """
    if is_old_model_call(syms, legacy, SymmetrySet):
        warn_model("charges", "charges(syms)")
        syms = legacy
    if not isinstance(syms, SymmetrySet):
        raise TypeError(f"charges(syms) takes a SymmetrySet, got {type(syms).__name__}.")
    _shard.check_current(syms.params(), "charge")
    with torch.no_grad():  # each family's members at once (an attention's heads: one bmm)
        values = {p: p.detach() for p in syms.params()}
        return dict(zip(syms.names, charges_of_all(list(syms), values), strict=True))


def symmetry_flow(
    s: Symmetry, stats: GradStats, nm: NoiseModel, charge: Tensor | None = None
) -> Tensor:
    """The flow −κC + Tr[A M] of one symmetry (shape of its charge; C may be passed in)."""
    c = s.charge() if charge is None else charge
    return kernel_for(s).flow(s, stats, nm, c)


def noether_flow(
    syms: SymmetrySet | nn.Module | None,
    stats: GradStats | SymmetrySet,
    noise: NoiseModel | GradStats | None = None,
    *,
    lr: float | None = None,
    batch_size: int | None = None,
    weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay | None = None,
    time: str | TimeModel | None = None,
    charges: Mapping[str, Tensor] | None = None,
    momentum: float | None = None,
    nesterov: bool | None = None,
    dampening: float | None = None,
    displacement: Any = None,
) -> dict[str, Tensor]:
    """The noise-driven flow of every charge (eq. 7 in our convention, docs/concepts/flow.md).

    Call as ``noether_flow(syms, stats, noise)`` with a :class:`NoiseModel`, or
    ``noether_flow(syms, stats, lr=η, batch_size=S, weight_decay=γ, time=...)``.
    ``time="continuous"`` gives dC/dt = −4γC + (η/S)Tr[ΣA]; ``time="discrete"`` gives the
    expected change per SGD step, −κC + η²Tr[A(∇L∇Lᵀ + Σ/S)]. Shapes follow :func:`charges`;
    pass ``charges`` (from :func:`charges`) to reuse them instead of recomputing.
    ``momentum=β`` (and ``nesterov``, ``dampening``) use SGD-with-momentum's effective
    coefficients (:meth:`NoiseModel.create`; β = 0 is plain SGD exactly), and
    ``displacement`` its cross term c_cross·vᵀA∇L: the ``torch.optim.SGD`` whose momentum
    buffers to read (after ``backward``, before ``step``), or a mapping parameter → v =
    −lr·buffer. Without it the term is 0, exact only when ⟨vᵀA∇L⟩ = 0 (on a normalised net at
    β = 0.9 it is 5–7% of the noise term; docs/concepts/optimizers.md). The old
    form ``noether_flow(model, syms, stats, ...)`` still works and warns.
    """
    args: tuple[Any, Any, Any] = (syms, stats, noise)
    if is_old_model_call(syms, stats, SymmetrySet):
        warn_model("noether_flow", "noether_flow(syms, stats, noise)")
        args = (stats, noise, None)
    syms, stats, noise = args
    if not isinstance(syms, SymmetrySet) or not isinstance(stats, GradStats):
        raise TypeError(
            "noether_flow(syms, stats, noise): expected a SymmetrySet and GradStats, got "
            f"{type(syms).__name__} and {type(stats).__name__}."
        )
    check_stats_cover(syms.params(), stats, "noether_flow")
    if noise is not None and not isinstance(noise, NoiseModel):
        raise TypeError(
            f"noether_flow: noise is a {type(noise).__name__}; expected a NoiseModel, e.g. "
            "nf.NoiseModel.create(lr=..., batch_size=...)."
        )
    check_decay_type(weight_decay)  # parse_decay would read "0.1" as 0.1
    nm = resolve_noise(
        noise,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        time=time,
        who="noether_flow",
        momentum=momentum,
        nesterov=nesterov,
        dampening=dampening,
    )
    check_decay(nm, syms, "noether_flow")
    stats = with_displacement(stats, displacement, syms.params(), "noether_flow", nm.momentum)
    if charges is not None:
        lacking = [n for n in syms.names if not isinstance(charges, Mapping) or n not in charges]
        if lacking:
            raise TypeError(
                f"noether_flow: charges has no entry for {lacking} ({type(charges).__name__}); "
                "expected None or the mapping name → charge of every symmetry, nf.charges(syms)."
            )
    return {
        name: symmetry_flow(s, stats, nm, None if charges is None else charges[name])
        for name, s in syms.items()
    }


def _check_grads(syms: SymmetrySet, grads: Mapping[nn.Parameter, Tensor]) -> None:
    """Every parameter of ``syms`` has a gradient of its own shape in ``grads``."""
    for p in syms.params():
        name = repr(syms.param_names.get(id(p), f"of shape {tuple(p.shape)}"))
        g = grads.get(p) if isinstance(grads, Mapping) else None
        if g is None:
            raise ValueError(
                f"exact_step_charges: grads has no gradient for {name}; expected a mapping "
                "parameter → gradient for every parameter of the symmetries, e.g. "
                "{p: p.grad for p in syms.params()} after loss.backward()."
            )
        if not isinstance(g, Tensor) or g.shape != p.shape:
            got = f"shape {tuple(g.shape)}" if isinstance(g, Tensor) else type(g).__name__
            raise ValueError(
                f"exact_step_charges: the gradient of {name} has {got}; expected a tensor of "
                f"the parameter's shape {tuple(p.shape)}."
            )


def exact_step_charges(
    syms: SymmetrySet,
    grads: Mapping[nn.Parameter, Tensor],
    *,
    lr: float,
    weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay = 0.0,
) -> dict[str, Tensor]:
    """Predicted charges after one plain SGD step with minibatch gradient ``grads``.

    For θ' = (1 − 2ηγ)θ − ηg (g the gradient of the data loss),
    C(θ') = (1 − 2ηγ)²C(θ) + η² gᵀAg exactly, because θᵀAg = 0 by symmetry (paper eqs. 96–97).
    With a γ per parameter (``weight_decay`` a mapping; docs/concepts/flow.md, eq. PD2),
    θ' = Kθ − ηg with K = I − 2ηΓ and C(θ') = θᵀKAKθ + 4η²θᵀΓAg + η²gᵀAg exactly (the
    cross term no longer vanishes). Call before the step, compare with :func:`charges` after
    it. Momentum breaks the identity.
    """
    check_instance(syms, SymmetrySet, "exact_step_charges: syms", "a SymmetrySet")
    lr = check_finite_number(lr, "lr", "the learning rate η")
    check_decay_type(weight_decay)
    dec = parse_decay(weight_decay)
    if isinstance(dec, ParamDecay):
        dec.check_covers(syms.params(), "exact_step_charges")
    _check_grads(syms, grads)
    out = {}
    for name, s in syms.items():
        g = {p: grads[p].detach() for p in s.params}
        gq = s.charge_of(g)
        if not isinstance(dec, ParamDecay):
            out[name] = (1 - 2 * lr * dec) ** 2 * s.charge() + lr**2 * gq
            continue
        theta = {p: p.detach() for p in s.params}
        gam = {p: dec.of(p) for p in s.params}
        kt = s.charge_of({p: (1 - 2 * lr * gam[p]) * theta[p] for p in s.params})
        out[name] = kt + 4 * lr**2 * decay_cross(s, theta, g, gam) + lr**2 * gq
    return out
