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
* a Lightning callback (:meth:`EquilibriumTeleport.lightning_callback`, defined in
  :mod:`noetherflow.integrations.lightning`, Lightning imported lazily): teleports in
  ``on_train_batch_start``.

Optimizer state: see :mod:`noetherflow.teleportation.optimizer_state` (gradient-like entries are
transported as cotangents, squared-gradient ones scaled under diagonal elements, the rest
reset; every reset is recorded in :attr:`TeleportRecord.reset`). ``optimizer_state="reset"``
drops the state of every parameter the symmetries act on.

The gradient-norm baseline of Zhao et al. (2022) is
:func:`noetherflow.baselines.zhao2022.gradient_norm_teleport`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import (
    check_bool,
    check_decay_type,
    check_instance,
    check_model_and_set,
    check_positive_int,
    check_real,
    parse_enum,
)
from noetherflow._inputs import Probe
from noetherflow.equilibrium import EquilibriumSolution, solve_equilibrium
from noetherflow.kernels.decay import ParamDecay, parse_decay
from noetherflow.kernels.noise import TimeModel
from noetherflow.optim.source import HyperSource
from noetherflow.solve_options import split_options
from noetherflow.stats.collect import check_params_of, collect_stats
from noetherflow.stats.core import Estimator, parse_reduction, with_displacement
from noetherflow.stats.distributed import unwrap_ddp
from noetherflow.stats.fsdp import bind_sharded
from noetherflow.stats.microbatch import check_micro_batch_size
from noetherflow.symmetry.eps import EpsReport, check_tolerance
from noetherflow.symmetry.set import SymmetrySet
from noetherflow.teleportation.apply import teleport
from noetherflow.teleportation.check import CHECKS
from noetherflow.teleportation.eps import solve_within_eps
from noetherflow.teleportation.optimizer_state import (
    OptimizerState,
    preserved,
    transform_optimizer_state,
    transport_,
)

__all__ = ["EquilibriumTeleport", "TeleportRecord", "TeleportingOptimizer"]

# (inputs, targets), or a dict of keyword inputs whose loss needs no targets (a Hugging Face
# batch with labels): statistics on model(**batch), loss_fn(outputs, None)
Batch = tuple[Any, Any] | Mapping[str, Any]


_TIME = "'discrete' (one SGD step, the default) or 'continuous' (SGF)"


def _split(batch: Batch) -> tuple[Any, Any]:
    if isinstance(batch, Mapping):
        return batch, None
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError(
        f"TeleportingOptimizer: a batch is a {type(batch).__name__}; expected (inputs, targets) "
        "or a dict of keyword inputs (model(**batch), loss_fn(outputs, None))."
    )


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
        eps: with ``eps_tolerance``, what :func:`~noetherflow.solve_within_eps` clipped,
            re-solved and measured; else None.
    """

    step: int
    max_distance: float
    converged: bool
    at_infinity: tuple[str, ...]
    seconds: float
    reset: tuple[str, ...] = ()
    eps: EpsReport | None = None


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


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
        lr, batch_size, weight_decay: η, S, γ of the SGD whose equilibrium is sought. When
            ``lr`` is not given, η and γ are read from ``optimizer`` (or the optimizer that
            :meth:`wrap` or the Lightning callback attaches) at every teleport:
            ``torch.optim.SGD(lr=η, weight_decay=w, momentum=β, nesterov=..., dampening=d)``
            is η, γ = w/2 and SGD-with-momentum's effective noise model with the cross term
            of its momentum buffers (the exact stationary point, docs/concepts/optimizers.md);
            Adam-type optimizers are refused (no gradient-step noise model). Param groups
            with different weight decay (a no-decay group) give γ per parameter;
            ``weight_decay`` may be such a mapping (:class:`~noetherflow.ParamDecay`) too.
            With both ``lr`` and ``optimizer`` given, ``lr``/``weight_decay`` are the target
            (e.g. the peak learning rate a warmup has not reached yet) and the optimizer is
            used for its state only; ``weight_decay`` without ``lr`` is an error.
        every: teleport every ``every`` calls of :meth:`maybe_teleport` (None: never again).
        at_start: teleport at the first call.
        time: ``"discrete"`` or ``"continuous"`` (see :mod:`noetherflow.flow`).
        estimator, micro_batch_size, reduction: passed to
            :func:`~noetherflow.collect_stats`. Models with BatchNorm in training mode need
            ``estimator="microbatch"`` and ``micro_batch_size >= 2``.
        optimizer: optional; its state is kept consistent (see ``optimizer_state``), and
            without ``lr`` its param groups give η and γ.
        optimizer_state: ``"transform"`` (default) or ``"reset"``; see the module docstring.
        solver_kwargs: extra keyword arguments of :func:`~noetherflow.solve_equilibrium`:
            the fields of :class:`~noetherflow.SolveOptions` (or ``options=`` one) and
            ``init``.
        eps_tolerance: None (default), or τ: keep scale invariances before a normalisation
            inside the region where its eps changes the outputs by at most τ, clipping them
            and re-solving the generators coupled to them
            (:func:`~noetherflow.solve_within_eps`, on the teleport's batch); the report is
            :attr:`TeleportRecord.eps`. Without it such generators move to their equilibrium
            however far, and eps may change the function.
        check: after every teleport the outputs on the teleport's batch are compared
            (:func:`noetherflow.teleport`): ``"raise"`` (default: undo and raise
            :class:`~noetherflow.FunctionChangedError`), ``"warn"`` or ``"off"``.
        momentum_cross: with an SGD with momentum, solve with the cross term c_cross·vᵀA∇L
            of its buffers (default; exact). False drops it (the ⟨vᵀA∇L⟩ = 0
            approximation, docs/concepts/optimizers.md).

    Attributes:
        history: one :class:`TeleportRecord` per teleport.
        steps_seen: calls of :meth:`maybe_teleport` so far.

    Example:
        >>> import torch, noetherflow as nf
        >>> from noetherflow.teleportation.tool import EquilibriumTeleport
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
        lr: float | None = None,
        batch_size: int,
        weight_decay: float | Mapping[nn.Parameter, float] | ParamDecay | None = None,
        every: int | None = None,
        at_start: bool = True,
        time: str = "discrete",
        estimator: str = "hooks",
        micro_batch_size: int = 1,
        reduction: str = "mean",
        optimizer: torch.optim.Optimizer | None = None,
        optimizer_state: OptimizerState | str = OptimizerState.TRANSFORM,
        solver_kwargs: Mapping[str, Any] | None = None,
        eps_tolerance: float | None = None,
        momentum_cross: bool = True,
        check: str = "raise",
    ) -> None:
        check_model_and_set(model, syms, "EquilibriumTeleport")
        if not callable(loss_fn):
            raise TypeError(
                f"EquilibriumTeleport: loss_fn is a {type(loss_fn).__name__}; expected a "
                "callable loss_fn(outputs, targets), e.g. nn.CrossEntropyLoss()."
            )
        if every is not None:
            check_positive_int(every, "every", "teleport every N steps, or None: never again")
        if len(syms) == 0:
            raise ValueError(
                "EquilibriumTeleport: the symmetry set is empty, there is nothing to teleport "
                "along; build it with nf.find_symmetries(model, example_inputs)."
            )
        bind_sharded(unwrap_ddp(model), syms)  # a set found before fully_shard: its new params
        check_params_of(model, syms, "EquilibriumTeleport")
        self.model = model
        self.syms = syms
        self.loss_fn = loss_fn
        if lr is None and weight_decay is not None:
            raise ValueError(
                f"EquilibriumTeleport: weight_decay={weight_decay!r} was given without lr; set "
                "both by hand (lr=η, weight_decay=γ) or neither (both read from the optimizer)."
            )
        self._lr_arg = None if lr is None else check_real(lr, "lr", "the learning rate η")
        check_decay_type(weight_decay)
        self._wd_arg = None if weight_decay is None else parse_decay(weight_decay)
        self.batch_size = check_positive_int(batch_size, "batch_size", "the SGD batch size S")
        self.every = None if every is None else int(every)
        self.at_start = bool(at_start)
        self.time = parse_enum(TimeModel, time, "time", _TIME).value
        try:
            self.estimator = Estimator(estimator).value
        except ValueError:
            raise ValueError(
                f"EquilibriumTeleport: estimator={estimator!r} is not supported; expected one of "
                f"{[e.value for e in Estimator]} ('microbatch' with micro_batch_size >= 2 for "
                "BatchNorm in training mode)."
            ) from None
        self.micro_batch_size = check_positive_int(
            micro_batch_size, "micro_batch_size", "samples per micro-batch"
        )
        if self.estimator == Estimator.MICROBATCH.value:  # not at the first teleport
            check_micro_batch_size(unwrap_ddp(model), self.micro_batch_size)
        self.reduction = parse_reduction(reduction).value
        self.optimizer = optimizer
        self.optimizer_state = parse_enum(
            OptimizerState,
            optimizer_state,
            "optimizer_state",
            "'transform' (momentum and Adam moments moved with the parameters) or 'reset'",
        )
        # the solver's own options as one object (SolveOptions fields or options=...)
        self.solver_kwargs, self.solve_options = split_options(
            solver_kwargs or {}, "EquilibriumTeleport(solver_kwargs=...)"
        )
        if eps_tolerance is not None:
            check_tolerance(eps_tolerance, "EquilibriumTeleport(eps_tolerance=...)")
        self.eps_tolerance = None if eps_tolerance is None else float(eps_tolerance)
        self.momentum_cross = check_bool(momentum_cross, "momentum_cross")
        if check not in CHECKS:
            raise ValueError(
                f"EquilibriumTeleport: check={check!r}; expected one of {list(CHECKS)}."
            )
        self.check = check
        self._eps_report: EpsReport | None = None
        self.history: list[TeleportRecord] = []
        self.steps_seen = 0
        self._names = _names(model)
        if self._lr_arg is not None or optimizer is not None:
            self.hyperparameters()  # fail early on a bad value or an unsupported optimizer

    # -- hyper-parameters -------------------------------------------------------------------
    def hyperparameters(self) -> tuple[float, float]:
        """(η, γ) of the next teleport: the ``lr``/``weight_decay`` given, or the optimizer's."""
        return self._source().current()

    def _source(self) -> HyperSource:
        if self._lr_arg is not None:
            src = HyperSource.create(
                "EquilibriumTeleport",
                lr=self._lr_arg,
                weight_decay=self._wd_arg,
                optimizer=None,
                params=(),
            )
        elif self.optimizer is not None:
            src = HyperSource.create(
                "EquilibriumTeleport",
                lr=None,
                weight_decay=None,
                optimizer=self.optimizer,
                params=self.syms.params(),
            )
        else:
            raise ValueError(
                "EquilibriumTeleport: no learning rate: pass lr=η (and weight_decay=γ), or an "
                "optimizer (optimizer=opt, tp.wrap(opt) or the Lightning callback) whose param "
                "groups give η and γ."
            )
        return src

    @property
    def lr(self) -> float:
        """η of the next teleport."""
        return self.hyperparameters()[0]

    @property
    def weight_decay(self) -> float:
        """γ (of γ‖θ‖²) of the next teleport."""
        return self.hyperparameters()[1]

    # -- scheduling -------------------------------------------------------------------------
    def due(self, step: int | None = None) -> bool:
        """Whether a teleport is due at ``step`` (default: the next call of maybe_teleport)."""
        k = self.steps_seen if step is None else int(step)
        if k == 0:
            return self.at_start
        return self.every is not None and k % self.every == 0

    def maybe_teleport(self, inputs: Any, targets: Any = None) -> EquilibriumSolution | None:
        """Call once per training step, before the forward pass; teleports when due."""
        out = self.teleport(inputs, targets) if self.due() else None
        self.steps_seen += 1
        return out

    @property
    def overhead_s(self) -> float:
        """Total wall time spent teleporting so far."""
        return sum(r.seconds for r in self.history)

    # -- the teleport -----------------------------------------------------------------------
    def solve(self, inputs: Any, targets: Any = None) -> EquilibriumSolution:
        """Statistics on the batch and the equilibrium; the model is not moved.

        ``inputs``/``targets`` as in :func:`~noetherflow.collect_stats`: a tensor, a tuple or
        a dict of keyword inputs; targets None when ``loss_fn`` needs none (labels inside a
        Hugging Face batch: ``tp.solve(batch)`` with ``loss_fn=lambda out, _: out.loss``).
        """
        lr, _ = self.hyperparameters()
        with preserved(self.model):
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
        kwargs: dict[str, Any] = {
            "lr": lr,
            "batch_size": self.batch_size,
            "weight_decay": self._source().decay(),  # per parameter where groups differ
            "time": self.time,
            **self.solver_kwargs,
            **self._source().momentum_kwargs(),
            "options": self.solve_options,
        }
        # SGD with momentum: the buffers give the cross term c_cross·vᵀA∇L (not when the
        # teleport resets them: the model then continues with v = 0)
        keep = self.momentum_cross and self.optimizer_state is not OptimizerState.RESET
        disp = self._source().displacement() if keep else None
        stats = with_displacement(
            stats, disp, self.syms.params(), "EquilibriumTeleport", kwargs["momentum"]
        )
        self._eps_report = None
        if self.eps_tolerance is None:
            return solve_equilibrium(self.syms, stats, **kwargs)
        sol, self._eps_report = solve_within_eps(
            self.model, self.syms, stats, inputs, tolerance=self.eps_tolerance, **kwargs
        )
        return sol

    def teleport(self, inputs: Any, targets: Any = None) -> EquilibriumSolution:
        """Teleport now (whatever the schedule): solve, move, transport ``.grad`` and state."""
        t0 = time.perf_counter()
        sol = self.solve(inputs, targets)
        teleport(self.model, sol, probe=Probe.of(inputs, "EquilibriumTeleport"), check=self.check)
        # .grad, if any, was computed at the old point: its value at the new one is T^{-T}g.
        for i, element in sol.steps:
            sym = self.syms[i]
            gs = {p: p.grad for p in sym.params if p.grad is not None}
            if gs:
                transport_(sym, element, gs)
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
                eps=self._eps_report,
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
        check_instance(
            optimizer,
            torch.optim.Optimizer,
            "EquilibriumTeleport.wrap: optimizer",
            "a torch.optim.Optimizer built on the model's parameters",
        )
        self.optimizer = optimizer
        return TeleportingOptimizer(optimizer, self, batches=batches)

    def lightning_callback(
        self,
        *,
        split_batch: Callable[[Any], tuple[Any, Any]] | None = None,
        labels_key: str = "labels",
    ) -> Any:
        """A Lightning ``Callback`` teleporting in ``on_train_batch_start`` (before forward).

        Lightning (``lightning`` 2.x or ``pytorch_lightning``) is imported here, not before;
        see :func:`noetherflow.integrations.lightning.teleport_callback` (a dict batch: the
        targets under ``labels_key``, the other entries keyword inputs). The optimizer whose
        state is transformed is ``trainer.optimizers[0]`` unless one was given to this object.
        """
        from noetherflow.integrations.lightning import teleport_callback

        return teleport_callback(self, split_batch=split_batch, labels_key=labels_key)


class TeleportingOptimizer:
    """Wraps a ``torch.optim.Optimizer``: ``step()`` teleports when due, then steps.

    The batch for the statistics is ``step(batch=(x, y))`` or, when not given, the next item
    of ``batches`` (an iterable, cycled, or a callable). A batch that is a dict is passed as
    keyword inputs with no targets (``model(**batch)``, ``loss_fn(outputs, None)``: a
    Hugging Face batch holding its ``labels``). The gradients already in ``.grad``
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
            tp.teleport(*_split(batch))
        tp.steps_seen += 1
        return self.optimizer.step(closure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)
