"""The baseline of Zhao et al. (2022), "Symmetry teleportation for accelerated optimization".

A few steps of gradient ascent on ‖∇L‖² over the group element of the diagonal symmetries;
compared with :class:`noetherflow.EquilibriumTeleport` in the ``teleport-*`` experiments.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import (
    check_instance,
    check_model_and_set,
    check_nonnegative_int,
    check_positive,
)
from noetherflow._errors import NonFiniteGradientError
from noetherflow._inputs import ModelInputs
from noetherflow.equilibrium import EquilibriumSolution
from noetherflow.kernels import kernel_for
from noetherflow.symmetry.set import SymmetrySet
from noetherflow.teleportation.optimizer_state import preserved, transform_optimizer_state

__all__ = ["GradNormTeleportResult", "gradient_norm_teleport"]


@dataclass(frozen=True)
class GradNormTeleportResult:
    """Outcome of :func:`gradient_norm_teleport`: ‖∇L‖² before/after and the element used."""

    grad_norm_sq_before: float
    grad_norm_sq_after: float
    elements: dict[str, Tensor] = field(default_factory=dict)
    seconds: float = 0.0


def gradient_norm_teleport(
    model: nn.Module,
    syms: SymmetrySet,
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Any,
    targets: Any,
    *,
    steps: int = 10,
    step_size: float = 0.05,
    optimizer: torch.optim.Optimizer | None = None,
) -> GradNormTeleportResult:
    """Symmetry teleportation of Zhao et al. (2022): ascend ‖∇L‖² over the group element.

    Over λ of every diagonal symmetry in ``syms`` (rotations and dense symmetries are left
    alone), ``steps`` steps of normalised gradient ascent on ‖∇_θL(e^{a·λ}θ)‖², the data loss
    on the given batch: λ ← λ + ``step_size``·∇_λ/‖∇_λ‖_∞ (each step moves every generator by at
    most ``step_size``; Zhao et al. use plain gradient ascent with a step size — ours is
    normalised so that one setting fits models whose ‖∇L‖² differ by orders of magnitude, and
    the total move is bounded, ``|λ| ≤ steps·step_size``, since ‖∇L‖² of a scale-invariant
    layer grows without bound as its norm shrinks). The result is applied in place; the
    function is preserved (a symmetry). ``.grad``, if set, is transported like
    :meth:`EquilibriumTeleport.teleport` does; with ``optimizer`` its state is made consistent
    as in :func:`transform_optimizer_state`. BatchNorm buffers are restored after the search
    and then moved with the parameters (so that the eval-mode function is kept too).

    Raises:
        ValueError: ``steps`` not an integer ≥ 0 or ``step_size`` not a finite number > 0.
        NonFiniteGradientError: the ascent met a NaN/Inf (the model is left unchanged).
    """
    t0 = time.perf_counter()
    check_model_and_set(model, syms, "gradient_norm_teleport")
    if optimizer is not None:
        check_instance(
            optimizer,
            torch.optim.Optimizer,
            "gradient_norm_teleport: optimizer",
            "a torch.optim optimizer or None",
        )
    inp = ModelInputs.of(inputs, "gradient_norm_teleport")
    inp.batch_size("gradient_norm_teleport", split=False)  # at least one batched tensor
    steps = check_nonnegative_int(steps, "steps", "the number of ascent steps")
    step_size = check_positive(step_size, "step_size", "the largest move of a generator per step")
    diag = syms.diagonal()
    if not diag:
        raise ValueError("gradient_norm_teleport acts on diagonal symmetries; syms has none.")
    names = syms.names
    params = syms.params()
    base = {p: p.detach().clone() for p in params}
    lams = [torch.zeros(s.num_generators, dtype=torch.float64, requires_grad=True) for _, s in diag]

    def grad_norm_sq(with_graph: bool) -> Tensor:
        scale: dict[int, Tensor] = {}
        for (_, s), lam in zip(diag, lams, strict=True):
            for t in s.terms():
                e = t.expand(lam)
                scale[id(t.param)] = scale[id(t.param)] + e if id(t.param) in scale else e
        moved: dict[str, Tensor] = {}
        for n, p in model.named_parameters():
            if id(p) in scale:
                moved[n] = base[p] * torch.exp(scale[id(p)]).to(p.dtype)
            else:
                moved[n] = p.detach().clone().requires_grad_(p.requires_grad)
        wrt = [v for v in moved.values() if v.requires_grad]
        try:
            out = torch.func.functional_call(model, moved, inp.args, inp.kwargs)
        except RuntimeError as e:
            raise ValueError(inp.forward_error(e, "gradient_norm_teleport")) from e
        gs = torch.autograd.grad(loss_fn(out, targets), wrt, create_graph=with_graph)
        total = torch.zeros((), dtype=torch.float64)
        for g in gs:
            total = total + g.to(torch.float64).square().sum()
        return total

    with preserved(model):
        before = float(grad_norm_sq(False).detach())
        if not math.isfinite(before):
            raise NonFiniteGradientError(
                f"gradient_norm_teleport: ‖∇L‖² = {before} on this batch; expected a finite "
                "loss and gradient. The model is unchanged; check the batch and the model for "
                "NaN/Inf."
            )
        for _ in range(steps):
            val = grad_norm_sq(True)
            grads = torch.autograd.grad(val, lams)
            gmax = max(float(g.abs().max()) for g in grads)
            if not math.isfinite(gmax) or gmax == 0.0:
                break
            with torch.no_grad():
                for lam, g in zip(lams, grads, strict=True):
                    lam += step_size * g / gmax
        steps_out = [(i, lam.detach().clone()) for (i, _), lam in zip(diag, lams, strict=True)]
    bad = [names[i] for i, lam in steps_out if not bool(torch.isfinite(lam).all())]
    if bad:  # nothing has moved yet
        raise NonFiniteGradientError(
            f"gradient_norm_teleport: the group element of {bad} is NaN/Inf (‖∇L‖² = {before:.3g} "
            "at the start); expected a finite loss and gradient on this batch. The model is "
            "unchanged; check the batch and the model for NaN/Inf."
        )
    for i, lam in steps_out:  # outside `preserved`: BatchNorm running statistics move too
        syms[i].apply_(lam)
    base = {p: p.detach().clone() for p in params}
    for lam in lams:
        lam.data.zero_()
    with preserved(model):
        after = float(grad_norm_sq(False).detach())
    for i, lam in steps_out:  # .grad was computed at the old point
        gs = {p: p.grad for p in syms[i].params if p.grad is not None}
        if gs:
            kernel_for(syms[i]).transport_(syms[i], lam, gs)
    if optimizer is not None:
        sol = EquilibriumSolution(syms=syms, steps=steps_out, elements={}, distance={})
        transform_optimizer_state(optimizer, sol)
    return GradNormTeleportResult(
        grad_norm_sq_before=before,
        grad_norm_sq_after=after,
        elements={names[i]: lam for i, lam in steps_out},
        seconds=time.perf_counter() - t0,
    )
