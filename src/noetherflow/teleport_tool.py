"""Teleport to the noise equilibrium during training: a warmup replacement to be measured.

The paper's account of warmup (§5.3, Fig. 4): from a Kaiming start, SGD noise slowly moves
the parameters along the symmetry orbits to a flatter noise equilibrium, after which a large
learning rate is stable. :class:`EquilibriumTeleport` takes the model there in one
function-preserving step: it collects the gradient statistics on a batch, solves the joint
equilibrium (:func:`~noetherflow.solve_equilibrium`: all diagonal symmetries jointly by
Newton, rotation pairs by their closed-form geometric mean, chains by sweeps) and applies it
(:func:`~noetherflow.teleport`). Whether that replaces warmup is an empirical question; the
experiments ``teleport-fig4``, ``teleport-mlp`` and ``teleport-cnn`` measure it.

Three ways to use it:

* a plain loop: call :meth:`EquilibriumTeleport.maybe_teleport` once per step, before the
  forward pass;
* a ``torch.optim`` wrapper (:meth:`EquilibriumTeleport.wrap`): ``opt.step(batch=(x, y))``
  teleports when due, then steps;
* a Lightning callback (:meth:`EquilibriumTeleport.lightning_callback`, Lightning imported
  lazily): teleports in ``on_train_batch_start``.

Optimizer state. A teleport T moves θ → Tθ. Gradient-like state (SGD momentum, Adam's first
moment, ``.grad``) is a cotangent: the gradient at Tθ is T^{-T}∇ℓ(θ) (paper eqs. 34–37), so
with ``optimizer_state="transform"`` (default) it is transported with the same group element
(``Symmetry.transport_grads_``), which keeps the optimizer's trajectory exactly equivalent
for SGD with momentum. Adam's second moments are averages of squared gradients: under a
diagonal element each coordinate's g² scales by e^{−2a·λ}, so they are transformed exactly;
under a rotation or a dense generator they do not transform covariantly (the square of a
rotated vector is not the rotated square), so the whole optimizer state of those parameters
is reset (dropped: the optimizer re-initialises it, with its own bias correction). Unknown
state entries shaped like the parameter are also reset. Every reset is recorded in
:attr:`TeleportRecord.reset`. ``optimizer_state="reset"`` drops the state of every parameter
the symmetries act on.

Also here: :func:`gradient_norm_teleport`, the baseline of Zhao et al. (2022), "Symmetry
teleportation for accelerated optimization": a few steps of gradient ascent on ‖∇L‖² over
the group element of the diagonal symmetries.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow.equilibrium import EquilibriumSolution, solve_equilibrium
from noetherflow.stats.collect import collect_stats
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry
from noetherflow.symmetry.set import SymmetrySet
from noetherflow.teleport import teleport

__all__ = [
    "EquilibriumTeleport",
    "GradNormTeleportResult",
    "OptimizerState",
    "TeleportRecord",
    "TeleportingOptimizer",
    "gradient_norm_teleport",
    "transform_optimizer_state",
]

Batch = tuple[Any, Any]

# Optimizer state entries: gradient-like (cotangent) and squared-gradient-like ones.
_COTANGENT = ("momentum_buffer", "exp_avg", "grad_avg")
_SQUARED = ("exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum")


class OptimizerState(str, Enum):
    """What a teleport does to the optimizer state of the parameters it moves."""

    TRANSFORM = "transform"
    RESET = "reset"


@dataclass(frozen=True)
class TeleportRecord:
    """One teleport.

    Attributes:
        step: the value of the step counter when it happened.
        max_distance: the largest distance to equilibrium moved (|λ| or ‖log GGᵀ‖).
        converged: solver status.
        at_infinity: names of symmetries (partly) at infinity, left unmoved there.
        seconds: wall time of statistics + solve + transport.
        reset: names of parameters whose optimizer state was reset (not transformed).
    """

    step: int
    max_distance: float
    converged: bool
    at_infinity: tuple[str, ...]
    seconds: float
    reset: tuple[str, ...] = ()


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _transport(sym: Symmetry, element: Any, tensors: Mapping[nn.Parameter, Tensor]) -> None:
    """Cotangent transport of single tensors (not per-sample batches), in place."""
    full = {}
    for p in sym.params:
        t = tensors.get(p)
        full[p] = (torch.zeros_like(p) if t is None else t).detach().unsqueeze(0).clone()
    sym.transport_grads_(element, full)
    with torch.no_grad():
        for p, t in tensors.items():
            t.copy_(full[p][0])


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
    mode = OptimizerState(mode)
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
        if not sym.is_diagonal:
            squared = [p for p in live if any(k in optimizer.state[p] for k in _SQUARED)]
            for p in squared:
                drop(p)
            live = [p for p in live if id(p) not in reset]
        for key in _COTANGENT:
            ts = {p: optimizer.state[p][key] for p in live if key in optimizer.state[p]}
            if ts:
                _transport(sym, element, ts)
        for key in _SQUARED:
            ts = {p: optimizer.state[p][key] for p in live if key in optimizer.state[p]}
            if ts:  # diagonal only here: g² → e^{−2s} g²
                _transport(sym, element, ts)
                _transport(sym, element, ts)
    return list(reset.values())


@contextlib.contextmanager
def _preserved(model: nn.Module) -> Iterator[None]:
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


class EquilibriumTeleport:
    """Teleport a model to its SGD noise equilibrium at the start and/or every ``every`` steps.

    Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay`` (γ‖θ‖² added to the loss, as
    in the paper; ``torch.optim.SGD(weight_decay=w)`` is γ = w/2). The equilibrium is the one
    of SGD at these hyperparameters: pass the learning rate you intend to train at (for warmup
    replacement, the peak one), and for SGD with momentum β the effective η/(1 − β). Each
    teleport collects statistics on the given batch (treated as the data distribution),
    solves with :func:`~noetherflow.solve_equilibrium` (``time`` model, default discrete:
    one SGD step, M = η²(∇L∇Lᵀ + Σ/S)), and moves the parameters in place. The model's
    function is unchanged (exactly, up to round-off, except for normalisation eps).

    Args:
        model: the model; ``syms`` must be built on its parameters.
        syms: the symmetries, e.g. from :func:`noetherflow.find_symmetries`.
        loss_fn: ``loss_fn(outputs, targets)`` → batch mean (or sum, with ``reduction``).
        lr, batch_size, weight_decay: η, S, γ of the SGD whose equilibrium is sought.
        every: teleport every ``every`` calls of :meth:`maybe_teleport` (None: never again).
        at_start: teleport at the first call.
        time: ``"discrete"`` or ``"continuous"`` (see :mod:`noetherflow.flow`).
        estimator, micro_batch_size, reduction: passed to
            :func:`~noetherflow.collect_stats`. Models with BatchNorm in training mode need
            ``estimator="microbatch"`` and ``micro_batch_size >= 2``.
        optimizer: optional; its state is kept consistent (see ``optimizer_state``).
        optimizer_state: ``"transform"`` (default) or ``"reset"``; see the module docstring.
        solver_kwargs: extra keyword arguments of :func:`~noetherflow.solve_equilibrium`.

    Attributes:
        history: one :class:`TeleportRecord` per teleport.
        steps_seen: calls of :meth:`maybe_teleport` so far.

    Example:
        >>> import torch, noetherflow as nf
        >>> from noetherflow.teleport_tool import EquilibriumTeleport
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Sequential(
        ...     torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
        ... ).double()
        >>> x, y = torch.randn(64, 4, dtype=torch.float64), torch.randint(0, 3, (64,))
        >>> loss_fn = torch.nn.functional.cross_entropy
        >>> syms = nf.find_symmetries(net, x)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
        >>> tp = EquilibriumTeleport(net, syms, loss_fn, lr=0.5 / (1 - 0.9), batch_size=16,
        ...                          every=50, optimizer=opt)
        >>> for step in range(100):
        ...     xb, yb = x[step % 4 * 16 :][:16], y[step % 4 * 16 :][:16]
        ...     _ = tp.maybe_teleport(xb, yb)  # before the forward pass
        ...     opt.zero_grad()
        ...     loss_fn(net(xb), yb).backward()
        ...     opt.step()
        >>> [r.step for r in tp.history]
        [0, 50]
        >>> before = net(x).detach()
        >>> sol = tp.teleport(x, y)  # one more, unconditionally: the function is unchanged
        >>> bool(torch.allclose(net(x), before, rtol=0, atol=1e-10))
        True
    """

    def __init__(
        self,
        model: nn.Module,
        syms: SymmetrySet,
        loss_fn: Callable[[Any, Any], Tensor],
        *,
        lr: float,
        batch_size: int,
        weight_decay: float = 0.0,
        every: int | None = None,
        at_start: bool = True,
        time: str = "discrete",
        estimator: str = "hooks",
        micro_batch_size: int = 1,
        reduction: str = "mean",
        optimizer: torch.optim.Optimizer | None = None,
        optimizer_state: OptimizerState | str = OptimizerState.TRANSFORM,
        solver_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if every is not None and int(every) < 1:
            raise ValueError(f"every={every!r}; expected a positive int or None (never again).")
        if len(syms) == 0:
            raise ValueError(
                "EquilibriumTeleport: the symmetry set is empty, there is nothing to teleport "
                "along; build it with nf.find_symmetries(model, example_inputs)."
            )
        self.model = model
        self.syms = syms
        self.loss_fn = loss_fn
        self.lr, self.batch_size, self.weight_decay = (
            float(lr),
            int(batch_size),
            float(weight_decay),
        )
        self.every = None if every is None else int(every)
        self.at_start = bool(at_start)
        self.time = time
        self.estimator = estimator
        self.micro_batch_size = int(micro_batch_size)
        self.reduction = reduction
        self.optimizer = optimizer
        self.optimizer_state = OptimizerState(optimizer_state)
        self.solver_kwargs = dict(solver_kwargs or {})
        self.history: list[TeleportRecord] = []
        self.steps_seen = 0
        self._names = _names(model)

    # -- scheduling -------------------------------------------------------------------------
    def due(self, step: int | None = None) -> bool:
        """Whether a teleport is due at ``step`` (default: the next call of maybe_teleport)."""
        k = self.steps_seen if step is None else int(step)
        if k == 0:
            return self.at_start
        return self.every is not None and k % self.every == 0

    def maybe_teleport(self, inputs: Any, targets: Any) -> EquilibriumSolution | None:
        """Call once per training step, before the forward pass; teleports when due."""
        out = self.teleport(inputs, targets) if self.due() else None
        self.steps_seen += 1
        return out

    @property
    def overhead_s(self) -> float:
        """Total wall time spent teleporting so far."""
        return sum(r.seconds for r in self.history)

    # -- the teleport -----------------------------------------------------------------------
    def solve(self, inputs: Any, targets: Any) -> EquilibriumSolution:
        """Statistics on the batch and the equilibrium; the model is not moved."""
        with _preserved(self.model):
            stats = collect_stats(
                self.model,
                self.syms,
                self.loss_fn,
                inputs,
                targets,
                reduction=self.reduction,
                estimator=self.estimator,
                micro_batch_size=self.micro_batch_size,
                level="solve",
            )
        return solve_equilibrium(
            self.model,
            self.syms,
            stats,
            lr=self.lr,
            batch_size=self.batch_size,
            weight_decay=self.weight_decay,
            time=self.time,
            **self.solver_kwargs,
        )

    def teleport(self, inputs: Any, targets: Any) -> EquilibriumSolution:
        """Teleport now (whatever the schedule): solve, move, transport ``.grad`` and state."""
        t0 = time.perf_counter()
        sol = self.solve(inputs, targets)
        teleport(self.model, sol)
        # .grad, if any, was computed at the old point: its value at the new one is T^{-T}g.
        for i, element in sol.steps:
            sym = self.syms[i]
            gs = {p: p.grad for p in sym.params if p.grad is not None}
            if gs:
                _transport(sym, element, gs)
        reset: list[nn.Parameter] = []
        if self.optimizer is not None:
            reset = transform_optimizer_state(self.optimizer, sol, mode=self.optimizer_state)
        self.history.append(
            TeleportRecord(
                step=self.steps_seen,
                max_distance=sol.max_distance(),
                converged=sol.converged,
                at_infinity=tuple(r.name for r in sol.at_infinity),
                seconds=time.perf_counter() - t0,
                reset=tuple(self._names.get(id(p), str(tuple(p.shape))) for p in reset),
            )
        )
        return sol

    # -- integrations -----------------------------------------------------------------------
    def wrap(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        batches: Iterable[Batch] | Callable[[], Batch] | None = None,
    ) -> TeleportingOptimizer:
        """A ``torch.optim`` wrapper that teleports when due and keeps its state consistent."""
        self.optimizer = optimizer
        return TeleportingOptimizer(optimizer, self, batches=batches)

    def lightning_callback(self, *, split_batch: Callable[[Any], Batch] | None = None) -> Any:
        """A Lightning ``Callback`` teleporting in ``on_train_batch_start`` (before forward).

        Lightning (``lightning`` 2.x or ``pytorch_lightning``) is imported here, not before.
        The optimizer whose state is transformed is ``trainer.optimizers[0]`` unless one was
        given to this object.
        """
        try:
            from lightning.pytorch.callbacks import Callback
        except ImportError:
            try:
                from pytorch_lightning.callbacks import Callback
            except ImportError:
                raise ImportError(
                    "EquilibriumTeleport.lightning_callback needs PyTorch Lightning: pip install "
                    "lightning (or call maybe_teleport in your own loop)."
                ) from None
        tp = self
        split = split_batch or _default_split

        class EquilibriumTeleportCallback(Callback):
            """Teleports to the noise equilibrium when due, before the step's forward pass."""

            teleporter = tp

            def on_train_batch_start(
                self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
            ) -> None:
                if tp.optimizer is None:
                    opts = getattr(trainer, "optimizers", None) or []
                    if opts:
                        tp.optimizer = opts[0]
                x, y = split(batch)
                tp.maybe_teleport(x, y)

        return EquilibriumTeleportCallback()


def _default_split(batch: Any) -> Batch:
    if isinstance(batch, list | tuple) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        "EquilibriumTeleport: cannot split the batch into (inputs, targets); pass "
        "split_batch=lambda batch: (x, y)."
    )


class TeleportingOptimizer:
    """Wraps a ``torch.optim.Optimizer``: ``step()`` teleports when due, then steps.

    The batch for the statistics is ``step(batch=(x, y))`` or, when not given, the next item
    of ``batches`` (an iterable, cycled, or a callable). The gradients already in ``.grad``
    were computed at the old point and are transported with the teleport, so the step that
    follows is the step SGD would take from the teleported point. Other attributes
    (``param_groups``, ``state``, ``zero_grad``, ``state_dict`` …) are the wrapped
    optimizer's; learning-rate schedulers take ``wrapper.optimizer``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        teleporter: EquilibriumTeleport,
        *,
        batches: Iterable[Batch] | Callable[[], Batch] | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.teleporter = teleporter
        teleporter.optimizer = optimizer
        self._source: Callable[[], Batch] | None
        if batches is None or callable(batches):
            self._source = batches
        else:
            it = itertools.cycle(batches)
            self._source = lambda: next(it)

    def step(self, closure: Callable[[], Any] | None = None, *, batch: Batch | None = None) -> Any:
        """Teleport when due (statistics on ``batch``), transform the state, then step."""
        tp = self.teleporter
        if tp.due():
            if batch is None:
                if self._source is None:
                    raise ValueError(
                        f"A teleport is due at step {tp.steps_seen} but no batch was given; "
                        "call step(batch=(x, y)) or wrap(optimizer, batches=loader)."
                    )
                batch = self._source()
            tp.teleport(*batch)
        tp.steps_seen += 1
        return self.optimizer.step(closure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


# --------------------------------------------------------------------------------------------
# Baseline: Zhao et al. (2022), teleport to maximise the gradient norm
# --------------------------------------------------------------------------------------------


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
    as in :func:`transform_optimizer_state`. BatchNorm buffers are restored after the search.
    """
    t0 = time.perf_counter()
    diag = [(i, s) for i, s in enumerate(syms) if isinstance(s, DiagonalSymmetry)]
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
        out = torch.func.functional_call(model, moved, (inputs,))
        gs = torch.autograd.grad(loss_fn(out, targets), wrt, create_graph=with_graph)
        total = torch.zeros((), dtype=torch.float64)
        for g in gs:
            total = total + g.to(torch.float64).square().sum()
        return total

    with _preserved(model):
        before = float(grad_norm_sq(False).detach())
        for _ in range(int(steps)):
            val = grad_norm_sq(True)
            grads = torch.autograd.grad(val, lams)
            gmax = max(float(g.abs().max()) for g in grads)
            if not math.isfinite(gmax) or gmax == 0.0:
                break
            with torch.no_grad():
                for lam, g in zip(lams, grads, strict=True):
                    lam += step_size * g / gmax
        steps_out = [(i, lam.detach().clone()) for (i, _), lam in zip(diag, lams, strict=True)]
        for i, lam in steps_out:
            syms[i].apply_(lam)
        base = {p: p.detach().clone() for p in params}
        for lam in lams:
            lam.data.zero_()
        after = float(grad_norm_sq(False).detach())
    for i, lam in steps_out:  # .grad was computed at the old point
        gs = {p: p.grad for p in syms[i].params if p.grad is not None}
        if gs:
            _transport(syms[i], lam, gs)
    if optimizer is not None:
        sol = EquilibriumSolution(syms=syms, steps=steps_out, elements={}, distance={})
        transform_optimizer_state(optimizer, sol)
    return GradNormTeleportResult(
        grad_norm_sq_before=before,
        grad_norm_sq_after=after,
        elements={names[i]: lam for i, lam in steps_out},
        seconds=time.perf_counter() - t0,
    )
