"""Why a charge moved in one optimizer step: the exact decomposition for any update.

For any update θ' = θ + Δθ and a symmetry generator A, C(θ') = C(θ) + 2θᵀAΔθ + ΔθᵀAΔθ
exactly. Split the update into the weight-decay part and the rest, Δθ = Δ_d + Δ_r, where
every ``torch.optim`` optimizer's decay is a shrink Δ_d = (k − 1)θ (coupled L2 in ``SGD``:
k = 1 − η·λ; decoupled in ``AdamW``: k = 1 − η·λ). With θ_d = kθ the decayed point,

    C(θ') − C(θ) = [C(θ_d) − C(θ)]  +  2 θ_dᵀAΔ_r  +  Δ_rᵀAΔ_r
                 =      decay       +     drift    +    noise

exactly (the identity of the bilinear form; no approximation). decay = (k² − 1)C. For plain
SGD Δ_r = −ηg and the drift is zero by symmetry (θᵀA g = 0), which is the exact identity of
paper eqs. 96–97; with momentum the drift is 2kβ·θᵀAv, for Adam(W) it is whatever the
preconditioner makes of θᵀA·(update) — neither is zero in general.

Bilinear forms come from :meth:`Symmetry.bilinear_of`: the polarisation of any family's
``charge_of``, xᵀAy = ¼[Q(x + y) − Q(x − y)], by default, so this works for every family, a
rotation's matrix charge included (then xᵀAy is the symmetrised matrix form); the built-in
families give it directly (one product).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import check_instance
from noetherflow._threads import one_thread
from noetherflow.optim.groups import read_groups
from noetherflow.symmetry.base import Symmetry, unique_params
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "StepDecomposition",
    "StepRecorder",
    "bilinear_charge",
    "decompose_step",
]

Values = Mapping[nn.Parameter, Tensor]


def bilinear_charge(sym: Symmetry, x: Values, y: Values) -> Tensor:
    """xᵀAy for the symmetry's generator(s) (:meth:`Symmetry.bilinear_of`). Charge's shape."""
    return sym.bilinear_of(x, y)


@dataclass(frozen=True)
class StepDecomposition:
    """One step's change of a charge, split exactly (module docstring). Charge-shaped tensors.

    ``before + decay + drift + noise == after`` to round-off.
    """

    before: Tensor
    after: Tensor
    decay: Tensor
    drift: Tensor
    noise: Tensor

    @property
    def residual(self) -> Tensor:
        """After − (before + decay + drift + noise): zero up to round-off."""
        return self.after - (self.before + self.decay + self.drift + self.noise)


def decompose_step(
    sym: Symmetry, before: Values, after: Values, shrink: float | Mapping[nn.Parameter, float]
) -> StepDecomposition:
    """Decompose C(after) − C(before) into decay, drift and noise parts (module docstring).

    Args:
        sym: any symmetry.
        before: the symmetry's parameter tensors θ before the step (``sym.params`` keys).
        after: the same tensors θ' after the step.
        shrink: the decay factor k per parameter (or one for all), θ_d = kθ; 1 when there is
            no separable decay (e.g. Adam's coupled L2 goes through the preconditioner).
    """
    ks = {p: float(shrink[p] if isinstance(shrink, Mapping) else shrink) for p in sym.params}
    decayed = {p: ks[p] * before[p] for p in sym.params}
    rest = {p: after[p] - decayed[p] for p in sym.params}
    return _decompose(sym, before, decayed, rest, after, ks)


def _decompose(
    sym: Symmetry,
    before: Values,
    decayed: Values,
    rest: Values,
    after: Values,
    ks: Mapping[nn.Parameter, float],
) -> StepDecomposition:
    """:func:`decompose_step` from θ, θ_d = kθ, θ' − θ_d, θ' and k (each ``sym.params`` keys).

    One k for all of the symmetry's parameters: decay = (k² − 1)C(θ), no charge of θ_d (and
    no cancellation of C(θ_d) − C(θ) when k is near 1); drift = 2θ_dᵀAΔ_r directly
    (:meth:`Symmetry.bilinear_of`).
    """
    theta = {p: before[p] for p in sym.params}
    decayed = {p: decayed[p] for p in sym.params}
    rest = {p: rest[p] for p in sym.params}
    c0 = sym.charge_of(theta)
    shrinks = {ks[p] for p in sym.params}
    if len(shrinks) == 1:
        k = shrinks.pop()
        decay = (k * k - 1.0) * c0
    else:
        decay = sym.charge_of(decayed) - c0
    return StepDecomposition(
        before=c0,
        after=sym.charge_of({p: after[p] for p in sym.params}),
        decay=decay,
        drift=2 * sym.bilinear_of(decayed, rest),
        noise=sym.charge_of(rest),
    )


class StepRecorder:
    """Records :func:`decompose_step` for every symmetry around ``optimizer.step()``.

    Call :meth:`before_step` just before ``optimizer.step()`` and :meth:`after_step` right
    after; it reads the decay factor of each parameter from the optimizer's param groups
    (``SGD``: k = 1 − lr·weight_decay, coupled L2 applied to θ in this step; ``AdamW`` and
    ``Adam(decoupled_weight_decay=True)``: k = 1 − lr·weight_decay; ``Adam`` with weight
    decay: k = 1, its L2 term passes through the preconditioner and is part of the rest; any
    other ``torch.optim`` optimizer: k = 1, its whole update is the rest). The decomposition
    is exact for every optimizer; only the split of decay from the rest depends on k.

    Example:
        >>> import torch, noetherflow as nf
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Sequential(
        ...     torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        ... ).double()
        >>> x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
        >>> syms = nf.find_symmetries(net, x)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1, weight_decay=0.01)
        >>> rec = nf.StepRecorder(dict(syms.items()), opt)
        >>> torch.nn.functional.mse_loss(net(x), y).backward()
        >>> rec.before_step()
        >>> opt.step()
        >>> parts = rec.after_step()[syms.names[0]]
        >>> bool(parts.residual.abs().max() < 1e-12)  # after = before + decay + drift + noise
        True
        >>> bool(parts.drift.abs().max() < 1e-12)  # plain SGD: no drift, θᵀA g = 0
        True
    """

    def __init__(self, syms: Mapping[str, Symmetry], optimizer: torch.optim.Optimizer) -> None:
        check_instance(
            syms,
            (SymmetrySet, Mapping),
            "StepRecorder: syms",
            "a SymmetrySet (or a mapping name → Symmetry)",
        )
        check_instance(
            optimizer, torch.optim.Optimizer, "StepRecorder: optimizer", "a torch.optim optimizer"
        )
        self.syms = dict(syms)
        self.optimizer = optimizer
        self._snap: dict[nn.Parameter, Tensor] | None = None
        self._k: dict[nn.Parameter, float] = {}
        self.last: dict[str, StepDecomposition] | None = None
        self._handles: list[Any] = []

    def attach(self, when: Callable[[], bool] | None = None) -> StepRecorder:
        """Record ``optimizer.step()`` through the optimizer's step hooks.

        After each recorded step, :attr:`last` holds its decomposition per symmetry. With
        ``when``, only the steps for which ``when()`` is true at the start of the step are
        recorded (a snapshot of the parameters costs a copy of them). :meth:`detach` removes
        the hooks. Returns ``self``.
        """

        def pre(*_: Any) -> None:
            if when is None or when():
                self.before_step()

        if not self._handles:
            self._handles = [
                self.optimizer.register_step_pre_hook(pre),
                self.optimizer.register_step_post_hook(lambda *_: self._record_last()),
            ]
        return self

    def detach(self) -> None:
        """Remove the hooks of :meth:`attach` (nothing happens if not attached)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _record_last(self) -> None:
        if self._snap is not None:
            self.last = self.after_step()

    def _shrinks(self) -> dict[nn.Parameter, float]:
        out: dict[nn.Parameter, float] = {}
        for g in read_groups(self.optimizer):  # read at each step: schedules are followed
            k = g.shrink
            if g.dampening and g.params:
                # SGD puts the decay term into the buffer with weight (1 − d), except on the
                # buffer's first step (PyTorch starts it undampened).
                first = self.optimizer.state.get(g.params[0], {})
                if first.get("momentum_buffer") is not None:
                    k = 1.0 - g.lr * (1.0 - g.dampening) * g.weight_decay
            for p in g.params:
                out[p] = k
        return out

    def before_step(self) -> None:
        """Snapshot the parameters (and the decay factors) before ``optimizer.step()``."""
        # each parameter once: a fused projection is shared by tens of symmetries
        self._snap = {p: p.detach().clone() for p in unique_params(self.syms.values())}
        self._k = self._shrinks()

    def after_step(self) -> dict[str, StepDecomposition]:
        """The decomposition of the step just taken, per symmetry."""
        if self._snap is None:
            raise RuntimeError(
                "StepRecorder.after_step() called without before_step(); call before_step() "
                "just before optimizer.step()."
            )
        snap, self._snap = self._snap, None
        for name, s in self.syms.items():
            missing = [tuple(p.shape) for p in s.params if p not in self._k]
            if missing:
                raise ValueError(
                    f"symmetry {name!r}: parameters of shapes {missing} are not in the optimizer; "
                    "expected every parameter of the symmetry in one of its param groups."
                )
        # θ_d = kθ and θ' − θ_d once per parameter, shared by every symmetry acting on it
        after = {p: p.detach() for p in snap}
        decayed = {p: float(self._k[p]) * snap[p] for p in snap}
        rest = {p: after[p] - decayed[p] for p in snap}
        # one small form per symmetry (a head's d × d): on one thread, see noetherflow._threads
        with one_thread():
            return {
                name: _decompose(s, snap, decayed, rest, after, self._k)
                for name, s in self.syms.items()
            }
