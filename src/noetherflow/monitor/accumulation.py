"""The hook capture of one monitored step: its micro-batches, their merge, and the loss checks.

One ``with mon.track():`` block is one forward and backward pass (a micro-batch). A step may
run k of them before ``mon.step()`` (gradient accumulation): their statistics are merged by
:func:`noetherflow.stats.accumulate.merge_accumulated` into those of the whole step, exactly
the statistics of the same data in one batch when the loop backpropagates ``loss_j / k``.

Each block also checks what it backpropagated against what its hooks saw. The gradient the
block's backward brings to each watched parameter (read by a tensor hook on the parameter,
so that ``zero_grad`` or a later gradient clipping do not change it) must be the mean of the
hooks' per-sample gradients. When it is not, the difference d is fitted by an L2 penalty of
the loss, d = 2γ_loss·θ (one γ_loss for all watched parameters): the penalty is then
treated as weight decay (:class:`LossPenalty`); any other difference is refused with an
error that says what to change. A loss that sums over the batch under
``reduction="mean"`` is caught from the loss's autograd graph (:func:`check_loss_reduction`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._errors import StatisticsError
from noetherflow.monitor.guards import monitor_advice, refuse_accumulation
from noetherflow.stats.accumulate import merge_accumulated, rescaled
from noetherflow.stats.collect import Capture, capture
from noetherflow.stats.core import GradStats, Reduction
from noetherflow.stats.distributed import is_distributed
from noetherflow.stats.factor_source import MeanGapError
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["LossPenalty", "StepCapture", "check_loss_reduction", "fit_l2_penalty"]

_FIT_TOL = {torch.float64: 1e-9, torch.float32: 1e-4}


@dataclass
class LossPenalty:
    """γ_loss of an L2 term γ_loss‖θ‖² found in the loss of a step (summed over its blocks)."""

    gamma: float = 0.0


def fit_l2_penalty(
    known: dict[nn.Parameter, Tensor],
    hooks: dict[nn.Parameter, Tensor],
    where: str,
    tol: float | None = None,
) -> float:
    """γ with ``known − hooks = 2γ·θ`` for every parameter (one γ), or a clear error.

    ``known``: autograd's gradient of the block per parameter; ``hooks``: the mean of the
    per-sample gradients the hooks saw; ``tol``: their relative round-off (default by
    dtype). Raises ``StatisticsError`` when the difference is not proportional to θ with one
    coefficient for all parameters.
    """
    gammas: list[float] = []
    for p, g in known.items():
        d = (g - hooks[p]).to(torch.float64)
        theta = p.detach().to(torch.float64)
        tol = _FIT_TOL.get(g.dtype, 3e-2) if tol is None else tol
        size = float(torch.linalg.vector_norm(g.to(torch.float64))) + float(
            torch.linalg.vector_norm(hooks[p].to(torch.float64))
        )
        dn = float(torch.linalg.vector_norm(d))
        if dn <= tol * size:
            gammas.append(0.0)
            continue
        tt = float(theta.square().sum())
        gam = float((d * theta).sum()) / (2 * tt) if tt > 0 else 0.0
        resid = float(torch.linalg.vector_norm(d - 2 * gam * theta))
        if tt == 0 or resid > max(1e-3 * dn, tol * size):
            raise StatisticsError(
                f"{where}: the gradient backpropagated inside `with mon.track():` is not the "
                "mean of the per-sample gradients the hooks saw, nor that plus an L2 penalty "
                f"(a parameter of shape {tuple(p.shape)}: relative difference "
                f"{dn / max(size, 1e-300):.3g}). The loss has a term that is not a per-sample "
                "data loss (an auxiliary loss on the parameters), or the parameter is also "
                "used outside its layer. Backpropagate the data loss (plus at most γ‖θ‖²) "
                "inside mon.track(), or use estimator='reference' with loss_fn the data loss."
            )
        gammas.append(gam)
    lo, hi = min(gammas), max(gammas)
    if hi - lo > 2e-2 * max(abs(hi), 1e-300):
        raise StatisticsError(
            f"{where}: the loss holds an L2 penalty γ‖θ‖² with different γ on the watched "
            f"parameters (from {lo:.6g} to {hi:.6g}); the monitor treats a penalty in the loss "
            "as one weight decay γ. Put the decay into the optimizer's param groups "
            "(torch.optim.SGD(weight_decay=2γ)) instead of the loss."
        )
    return hi


def check_loss_reduction(loss: Any, reduction: Reduction, n: int, where: str) -> None:
    """Refuse a loss whose autograd graph sums over the batch under ``reduction="mean"``.

    Reads the last node of the graph only: a built-in loss with ``reduction="sum"`` (its
    saved reduction), or ``.sum()`` of a tensor whose dim 0 has the ``n`` samples. Anything
    else (a sum divided by a count, a mean, a loss plus a penalty) passes.
    """
    if reduction is not Reduction.MEAN or not isinstance(loss, Tensor) or loss.grad_fn is None:
        return
    node = loss.grad_fn
    red = getattr(node, "_saved_reduction", None)
    summed = red == 2
    if type(node).__name__ == "SumBackward0":
        sizes: tuple[int, ...] = tuple(getattr(node, "_saved_self_sym_sizes", ()))
        summed = len(sizes) > 0 and int(sizes[0]) == n and n > 1
    if summed:
        raise StatisticsError(
            f"{where}: the loss sums over the batch ({type(node).__name__}"
            f"{', reduction=sum' if red == 2 else ''}) but reduction='mean' (the default) was "
            "passed; the per-sample gradients would be B times too large and the flows B² "
            "times. Pass NoetherMonitor(..., reduction='sum'), or use the batch mean "
            "(reduction='mean' in the loss, .mean() instead of .sum())."
        )


@dataclass
class StepCapture:
    """The blocks of one step: their statistics and the L2 penalty found in their loss."""

    model: nn.Module
    syms: SymmetrySet
    reduction: Reduction
    grad_scaler: Any = None  # torch.amp.GradScaler of an fp16 run: its scale is divided out
    parts: list[GradStats] = field(default_factory=list)
    penalty: LossPenalty = field(default_factory=LossPenalty)
    is_open: bool = False  # a block is running: a nested one is a mistake

    def reset(self) -> None:
        """Forget the blocks (after a record)."""
        self.parts = []
        self.penalty = LossPenalty()

    @property
    def tracked(self) -> bool:
        """Whether a block ran since the last reset."""
        return bool(self.parts)

    def merged(self) -> GradStats:
        """The statistics of the whole step (``StatisticsError`` when under 2 samples).

        With a ``grad_scaler`` (enabled), divided by its current scale: the loss it scaled
        made every gradient, and so the penalty fitted from them, that many times larger.
        """
        st = merge_accumulated(self.parts, self.reduction)
        sc = self.grad_scaler
        if sc is not None and sc.is_enabled():
            scale = float(sc.get_scale())
            self.penalty.gamma /= scale
            return rescaled(st, 1.0 / scale)
        return st

    @contextlib.contextmanager
    def block(self, level: str, keep_samples: bool = True) -> Iterator[Capture]:
        """One micro-batch: the hooks, and autograd's gradient increment to check them by.

        ``keep_samples=False``: no per-sample gradients for a coupled solve (none will run on
        these statistics; forming them costs more than the flows' own statistics).
        """
        if self.is_open:
            raise StatisticsError(
                "mon.track() was entered inside another mon.track(); expected one "
                "`with mon.track():` per forward and backward pass (one per micro-batch with "
                "gradient accumulation), each closed before the next is opened."
            )
        params = self.syms.params()
        # Not under DDP: its averaged .grad weights ranks equally, not samples.
        use_grad = not is_distributed()
        known: dict[nn.Parameter, Tensor] = {}
        handles = []
        if use_grad:  # the gradient each backward brings to p (not .grad: zero_grad, clipping)
            for p in params:

                def keep(g: Tensor, p: nn.Parameter = p) -> None:
                    known[p] = g.detach().clone() if p not in known else known[p] + g.detach()

                handles.append(p.register_hook(keep))
        try:
            with (
                monitor_advice(),
                refuse_accumulation(self.model),
                capture(
                    self.model,
                    self.syms,
                    reduction=self.reduction,
                    check_finite=False,
                    all_reduce=False,
                    level=level,
                ) as cap,
            ):
                cap.min_batch = 1
                cap.keep_samples = keep_samples
                self.is_open = True
                yield cap
        finally:
            self.is_open = False
            for h in handles:
                h.remove()
        with monitor_advice():
            self.parts.append(self._stats(cap, known))

    def _stats(self, cap: Capture, known: dict[nn.Parameter, Tensor]) -> GradStats:
        if not known or len(known) < len(self.syms.params()):
            return cap.stats  # no backward through .grad (autograd.grad): the hooks' own mean
        if self.reduction is Reduction.SUM:  # ḡ = ∇(Σℓ)/n
            n = _batch_of(cap)
            known = {p: v / n for p, v in known.items()}
        cap.use_mean_gradients(known, check=True)
        try:
            return cap.stats
        except MeanGapError:
            pass
        cap.use_mean_gradients({}, check=False)
        st = cap.stats
        low = any(r.precision is not None for r in cap._records)  # bf16/fp16 factors
        gamma = fit_l2_penalty(known, st.mean, "NoetherMonitor", 3e-2 if low else None)
        self.penalty.gamma += gamma
        return st


def _batch_of(cap: Capture) -> int:
    for rec in cap._records:
        for a, _ in rec.factors().values():
            return int(a.shape[0])
    raise StatisticsError("NoetherMonitor: no layer ran inside mon.track().")
