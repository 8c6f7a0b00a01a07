"""Keep optimizer state, ``.grad`` and buffers consistent with a teleport.

A teleport T moves θ → Tθ. Gradient-like state (SGD momentum, Adam's first moment, ``.grad``)
is a cotangent: the gradient at Tθ is T^{-T}∇ℓ(θ) (paper eqs. 34–37), so it is transported
with the same group element (``Symmetry.transport_grads_``). The SGD momentum buffer is
b = Σ_k β^k(∇ℓ(θ_{t−k}) + λθ_{t−k}); T^{-T} maps its gradient part to the gradients at the
transported points Tθ_{t−k} (its decay part would move like θ; the two laws agree when T is
orthogonal). For an orthogonal T (T^{-T} = T) the transport keeps the SGD-with-momentum
trajectory exactly equivariant, θ_t ↦ Tθ_t (tested); for any other T no transport can:
even plain SGD gives Tθ − ηT^{-T}∇ℓ ≠ T(θ − η∇ℓ) — SGD's path depends on the point of the
orbit, which is what the noise equilibrium is about. For the diagonal families the
cotangent transport keeps the cross term θᵀA·b unchanged. Adam's second moments are averages of
squared gradients: under a diagonal element each coordinate's g² scales by e^{−2a·λ}, so they
are transformed exactly; under a rotation or a dense generator they do not transform
covariantly (the square of a rotated vector is not the rotated square), so the whole
optimizer state of those parameters is reset (dropped: the optimizer re-initialises it, with
its own bias correction). Unknown state entries shaped like the parameter are also reset.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow import _shard
from noetherflow._checks import parse_enum
from noetherflow.equilibrium import EquilibriumSolution
from noetherflow.kernels import kernel_for
from noetherflow.symmetry.base import Symmetry

__all__ = ["OptimizerState", "transform_optimizer_state"]

# Optimizer state entries: gradient-like (cotangent) and squared-gradient-like ones.
_COTANGENT = ("momentum_buffer", "exp_avg", "grad_avg")
_SQUARED = ("exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum")


class OptimizerState(str, Enum):
    """What a teleport does to the optimizer state of the parameters it moves."""

    TRANSFORM = "transform"
    RESET = "reset"


def transport_(
    sym: Symmetry, element: Any, tensors: Mapping[nn.Parameter, Tensor], *, squared: bool = False
) -> bool:
    """The kernel's transport of single tensors (not per-sample batches), in place.

    FSDP2 shards (``.grad``, optimizer state of a sharded parameter) are gathered whole,
    transported and written back shard by shard: a teleport happens once per many steps,
    and the state is gradient-sized like the statistics. Returns the kernel's answer
    (False: no exact law, nothing changed).
    """
    if not any(_shard.is_sharded(t) for t in tensors.values()):
        return kernel_for(sym).transport_(sym, element, tensors, squared=squared)
    whole = {p: _shard.full(t.detach()).clone() for p, t in tensors.items()}
    done = kernel_for(sym).transport_(sym, element, whole, squared=squared)
    if done:
        with torch.no_grad():
            for p, t in tensors.items():
                _shard.write_local(t, whole[p])
    return done


def transform_optimizer_state(
    optimizer: torch.optim.Optimizer,
    solution: EquilibriumSolution,
    *,
    mode: OptimizerState | str = OptimizerState.TRANSFORM,
) -> list[nn.Parameter]:
    """Make ``optimizer``'s state consistent with parameters moved by ``solution``.

    Call it right after :func:`noetherflow.teleport` (or with the same solution). Gradient-like
    entries (``momentum_buffer``, ``exp_avg``, ``grad_avg``) are transported as cotangents
    (T^{-T}); squared-gradient entries (``exp_avg_sq``, ``max_exp_avg_sq``, ``square_avg``,
    ``sum``) are scaled by e^{−2a·λ} under diagonal elements; under rotations and dense
    elements, and for unknown parameter-shaped entries, the parameter's whole state is reset.

    Returns:
        The parameters whose state was reset.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"transform_optimizer_state: optimizer is a {type(optimizer).__name__}; expected the "
            "torch.optim optimizer that trains the teleported parameters."
        )
    mode = parse_enum(OptimizerState, mode, "mode", "'transform' or 'reset'")
    syms = solution.syms
    reset: dict[int, nn.Parameter] = {}

    def drop(p: nn.Parameter) -> None:
        if p in optimizer.state:
            del optimizer.state[p]
            reset[id(p)] = p

    if mode is OptimizerState.RESET:
        for p in syms.params():
            drop(p)
        return list(reset.values())
    for i, element in solution.steps:
        sym = syms[i]
        live = [p for p in sym.params if p in optimizer.state and id(p) not in reset]
        for p in live:
            unknown = [
                k
                for k, v in optimizer.state[p].items()
                if isinstance(v, Tensor)
                and v.shape == p.shape
                and k not in _COTANGENT
                and k not in _SQUARED
            ]
            if unknown:
                drop(p)
        live = [p for p in live if id(p) not in reset]
        for key in _SQUARED:  # g² moves exactly only under a diagonal element: else reset
            # (optimizer.state is a defaultdict: never index a dropped parameter again)
            live = [p for p in live if id(p) not in reset]
            ts = {p: optimizer.state[p][key] for p in live if key in optimizer.state[p]}
            if ts and not transport_(sym, element, ts, squared=True):
                for p in ts:
                    drop(p)
        live = [p for p in live if id(p) not in reset]
        for key in _COTANGENT:
            ts = {p: optimizer.state[p][key] for p in live if key in optimizer.state[p]}
            if ts:
                transport_(sym, element, ts)
    return list(reset.values())


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Keep ``.grad`` and buffers (BatchNorm running statistics) as they were."""
    grads = {p: (None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()}
    bufs = {n: b.detach().clone() for n, b in model.named_buffers()}
    try:
        yield
    finally:
        with torch.no_grad():
            for p, g in grads.items():
                p.grad = g
            named = dict(model.named_buffers())
            for n, b in bufs.items():
                named[n].copy_(b)
