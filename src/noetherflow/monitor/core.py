"""The training-loop API of the monitor: :class:`NoetherMonitor` (see :mod:`noetherflow.monitor`).

Under ``torch.distributed`` the statistics (and the loss) are all-reduced to those of the
global batch; every rank must call ``track``/``step`` together. Call ``step`` *before*
``optimizer.step()``: charges, flows and statistics then refer to the same θ.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow._checks import check_bool, check_model_and_set, check_positive_int
from noetherflow._threads import one_thread
from noetherflow.flow import charges, noether_flow
from noetherflow.kernels.noise import NoiseModel, check_decay
from noetherflow.monitor.accumulation import StepCapture, check_loss_reduction
from noetherflow.monitor.display import ProgressDisplay, is_terminal
from noetherflow.monitor.distance import DistanceTracker
from noetherflow.monitor.guards import loss_tensor, monitor_advice
from noetherflow.monitor.history import (
    CSV_NAME,
    JSONL_NAME,
    CsvSink,
    JsonlSink,
    Outputs,
    TensorBoardSink,
    open_tensorboard,
    stack_rows,
    symmetry_keys,
    write_meta,
)
from noetherflow.monitor.notices import (
    adaptive_notice,
    batch_size_notice,
    decay_with_penalty,
    effective_decay,
    penalty_notice,
    undefined_notice,
)
from noetherflow.monitor.options import (
    DistanceMode,
    DistanceOptions,
    LogOptions,
    SharpnessOptions,
    monitor_options,
    multiple,
)
from noetherflow.monitor.rows import put_distance, put_sharpness, put_values
from noetherflow.monitor.schema import UNDEFINED, build_schema
from noetherflow.monitor.steps import StepLog
from noetherflow.optim.decompose import StepDecomposition
from noetherflow.optim.source import HyperSource
from noetherflow.plotting import plot_history
from noetherflow.stats.collect import Capture, check_params_of, collect_stats
from noetherflow.stats.core import (
    Estimator,
    GradStats,
    Reduction,
    SmallBatchError,
    parse_reduction,
    with_displacement,
)
from noetherflow.stats.distributed import (
    all_reduce_mean,
    all_reduce_stats,
    is_distributed,
    unwrap_ddp,
)
from noetherflow.stats.fsdp import bind_sharded
from noetherflow.stats.microbatch import check_micro_batch_size
from noetherflow.stats.reference import check_no_train_batchnorm
from noetherflow.symmetry.set import SymmetrySet
from noetherflow.teleportation.optimizer_state import preserved

__all__ = ["NoetherMonitor"]


class NoetherMonitor:
    """Record charges, flows, equilibrium distances (and sharpness) during training.

    Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay`` (γ‖θ‖² in the loss); they fix
    the flows and the equilibrium exactly as in :func:`noetherflow.noether_flow`. Either pass
    ``optimizer=opt``: η and γ are then read from its param groups at every record (schedules
    are followed; ``torch.optim.SGD(weight_decay=w)`` is γ = w/2), or pass ``lr`` (and
    ``weight_decay``) by hand and change ``mon.lr`` when a schedule changes the learning rate.
    The values used are recorded as ``lr`` and ``weight_decay`` (γ) in every row.

    Example:
        >>> import torch, noetherflow as nf
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
        >>> syms = nf.find_symmetries(net, x)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1, weight_decay=1e-3)
        >>> mon = nf.NoetherMonitor(net, syms, every=10, optimizer=opt, batch_size=64,
        ...                         logging=nf.LogOptions(log_dir="runs/x"))
        >>> for step in range(30):
        ...     with mon.track():  # hooks only on record steps
        ...         loss = torch.nn.functional.cross_entropy(net(x), y)
        ...         loss.backward()
        ...     _ = mon.step(loss)  # before opt.step(): same θ as the statistics
        ...     opt.step(); opt.zero_grad()
        >>> mon.close()
        >>> nf.load_history("runs/x")["weight_decay"]  # the γ used: SGD's weight_decay / 2
        array([0.0005, 0.0005, 0.0005])
        >>> fig = mon.plot("runs/x/monitor.png")

    Args:
        model: the model (may be wrapped in ``DistributedDataParallel``).
        syms: the symmetries to watch. History keys use each symmetry's ASCII key
            (:attr:`keys`, e.g. ``flow/rescaling.fc1_to_fc2``), the names only for display.
        every: record every this many calls of :meth:`step`, starting with the first.
        lr, batch_size, weight_decay, time: η, S, γ and the time model of the flows. S is
            the samples of one optimizer step (the accumulated batch, all processes); a
            record whose statistics count another number is warned about once.
        optimizer: read η and γ from this optimizer's param groups at every record instead of
            ``lr``/``weight_decay`` (passing both is an error). ``SGD`` (with or without
            momentum; with it the flows and distances include the cross term of its buffers)
            gets flows and distances; ``Adam``/``AdamW`` get charges, the step
            decomposition and, for AdamW on scale-invariant symmetries, the random-walk
            prediction ``adamw_charge/*`` and the distance to it ``adamw_distance/*`` (their
            update is not an SGD step: no flow or distance, said once when the monitor is
            built). An lr of 0 (a warmup from 0) gives rows with flows and distances NaN
            and ``undefined`` = 1 (:data:`~noetherflow.monitor.schema.UNDEFINED`). With any
            optimizer the exact decomposition of the step before each record is recorded
            (``step_*``, :attr:`last_step`). SGD param groups that differ in weight decay
            only (no-decay groups) give γ per parameter (docs/concepts/flow.md);
            ``weight_decay`` by hand may be such a mapping too. The row's ``weight_decay`` is
            then the largest γ.
        reduction: whether the training loss is the batch ``"mean"`` or ``"sum"``.
        distance: record the distance to the equilibrium: ``True`` (the defaults of
            :class:`~noetherflow.DistanceOptions`: every 10·``every`` steps, tracked between
            full solves), a :class:`~noetherflow.DistanceOptions`, or ``False`` (no distance
            columns).
        logging: where to write: a :class:`~noetherflow.LogOptions` (history files in
            ``log_dir``, TensorBoard, the progress bar); default: in memory only, a progress
            bar when stdout is a terminal.
        momentum_cross: with ``optimizer=torch.optim.SGD(momentum=β)``, include the cross term
            c_cross·vᵀA∇L of its buffers in the flows and distances (default; exact). False
            drops it (the ⟨vᵀA∇L⟩ = 0 approximation, docs/concepts/optimizers.md).
        full_matrices: also record the ``[d, d]`` matrix charges and flows of rotations.
        sharpness: ``True`` or :class:`SharpnessOptions` to record the Hessian trace and top
            eigenvalue; needs ``loss_fn`` and a batch (``probe`` or ``step(inputs=, targets=)``).
        estimator: how the gradient statistics are obtained. ``"hooks"`` (default): from the
            loop's own forward/backward inside :meth:`track` (Linear/Conv layers, no
            BatchNorm in training mode). ``"microbatch"`` (any model, BatchNorm in training
            mode included) and ``"reference"`` (torch.func, exact, no BatchNorm in training
            mode): computed in :meth:`step` on the batch passed as ``step(loss, inputs=x,
            targets=y)``, with ``loss_fn``; ``.grad`` and buffers are left as they were.
        micro_batch_size: micro-batch size m of ``estimator="microbatch"`` (≥ 2 with
            BatchNorm in training mode; it must divide the batch into at least 2 parts).
        loss_fn: ``loss_fn(outputs, targets)``, for sharpness and the non-hook estimators.
        probe: a fixed ``(inputs, targets)`` batch on which sharpness is measured.
        grad_scaler: the ``torch.amp.GradScaler`` of an fp16 run (its scale multiplies every
            gradient the hooks see; the statistics are divided by it). The integrations pass
            it themselves.
        all_reduce: combine the statistics of all ranks; default: whether ``torch.distributed``
            is initialised.
        **old: the loose spellings of before the option objects, still accepted as the
            fields they name, with a :class:`FutureWarning` naming the new spelling:
            ``distance_every``, ``distance_mode``, ``solve_every``,
            ``distance_tol``, ``distance_sweeps``, ``solver_options`` (→ ``DistanceOptions``:
            every, mode, solve_every, tol, sweeps, solver) and ``log_dir``, ``formats``,
            ``tensorboard``, ``progress``, ``total`` (→ ``LogOptions``). Beside the option
            object they belong to, or unknown, they are a ``TypeError`` naming the field.
    """

    def __init__(
        self,
        model: nn.Module,
        syms: SymmetrySet,
        *,
        every: int = 10,
        lr: float | None = None,
        batch_size: int,
        weight_decay: float | Mapping[nn.Parameter, float] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        time: str = "continuous",
        reduction: str | Reduction = "mean",
        distance: bool | DistanceOptions = True,
        logging: LogOptions | None = None,
        full_matrices: bool = False,
        sharpness: bool | SharpnessOptions = False,
        estimator: str = "hooks",
        micro_batch_size: int = 1,
        loss_fn: Callable[[Any, Any], Tensor] | None = None,
        probe: tuple[Any, Any] | None = None,
        all_reduce: bool | None = None,
        momentum_cross: bool = True,
        grad_scaler: Any = None,
        **old: Any,
    ) -> None:
        check_model_and_set(model, syms, "NoetherMonitor")
        dist, log = monitor_options(distance, logging, old)
        if int(every) != every or every < 1:
            raise ValueError(f"every={every!r} must be a positive integer (steps between records).")
        bind_sharded(unwrap_ddp(model), syms)  # a set found before fully_shard: its new params
        check_params_of(model, syms, "NoetherMonitor")  # before the optimizer's own checks
        self._hyper = HyperSource.create(
            "NoetherMonitor",
            lr=lr,
            weight_decay=weight_decay,
            optimizer=optimizer,
            params=syms.params(),
            adaptive=True,
            zero_lr=True,
        )
        lr0, _ = self._hyper.current()
        self.sgd = not self._hyper.adaptive  # flows and distances need SGD's noise model
        if self.sgd:
            # per-group weight decay: γ per parameter (checked against the symmetries here);
            # η = 0 (a warmup from 0) is recorded as undefined, the settings checked with η = 1
            check_decay(
                NoiseModel.create(
                    lr=lr0 if lr0 > 0 else 1.0,
                    batch_size=batch_size,
                    weight_decay=self._hyper.decay(),
                    time=time,
                    **self._hyper.momentum_kwargs(),
                ),
                syms,
                "NoetherMonitor",
            )
        if len(syms) == 0:
            raise ValueError("The symmetry set is empty; there is nothing to monitor.")
        self.model, self.syms = model, syms
        self.momentum_cross = check_bool(momentum_cross, "momentum_cross")
        self.every = int(every)
        self.batch_size, self.time = batch_size, time
        self.reduction = parse_reduction(reduction)
        self.distance = dist is not None and self.sgd
        self._distance = self._tracker(dist or DistanceOptions())
        self.full_matrices = full_matrices
        self.sharpness: SharpnessOptions | None = (
            SharpnessOptions() if sharpness is True else (sharpness or None)
        )
        if self.sharpness is not None:
            multiple("sharpness.every", self.sharpness.every, self.every)
            if loss_fn is None:
                raise ValueError(
                    "sharpness needs loss_fn: pass NoetherMonitor(..., loss_fn=loss_fn) (and "
                    "probe=(x, y) or mon.step(loss, inputs=x, targets=y))."
                )
        self.loss_fn, self.probe = loss_fn, probe
        try:
            self.estimator = Estimator(estimator)
        except ValueError:
            raise ValueError(
                f"estimator={estimator!r} is not supported; expected one of "
                f"{[e.value for e in Estimator]}."
            ) from None
        self.micro_batch_size = check_positive_int(
            micro_batch_size, "micro_batch_size", "samples per micro-batch"
        )
        if self.estimator is not Estimator.HOOKS and loss_fn is None:
            raise ValueError(
                f"estimator={self.estimator.value!r} computes the statistics from the batch and "
                "needs loss_fn: pass NoetherMonitor(..., loss_fn=loss_fn) and call "
                "mon.step(loss, inputs=x, targets=y)."
            )
        if self.estimator is Estimator.MICROBATCH:  # here, not at the first record
            check_micro_batch_size(unwrap_ddp(model), self.micro_batch_size)
        if self.estimator is Estimator.HOOKS:
            with monitor_advice():
                check_no_train_batchnorm(unwrap_ddp(model), "hooks")
                Capture(unwrap_ddp(model), syms, Reduction.MEAN, check_finite=False)
        self.all_reduce = is_distributed() if all_reduce is None else all_reduce
        self.rank = torch.distributed.get_rank() if is_distributed() else 0
        self.is_writer = self.rank == 0

        self._step = 0
        self._closed_at: int | None = None  # the step count at close(): no more records
        self._capture = StepCapture(self.model, syms, self.reduction, grad_scaler)
        self._warned: set[int] = set()
        self._rows: list[dict[str, np.ndarray]] = []
        self._t0 = _now()
        self.keys: dict[str, str] = symmetry_keys(syms.names)
        adamw = self.sgd is False and self._hyper.kind == "adamw"
        self._steps = StepLog(
            syms, self.keys, optimizer, self.due, self._hyper.adam if adamw else None
        )
        self.schema = build_schema(
            syms,
            self.keys,
            full_matrices=full_matrices,
            flows=self.sgd,
            distance=self.distance,
            sharpness=self.sharpness is not None,
            steps=self._steps.active,
            adamw=self._steps.adamw_names,
        )
        if not self.sgd:
            adaptive_notice(self._hyper.kind, dist is not None, self._steps.adamw_names)
        self._open_outputs(log)

    def _tracker(self, dist: DistanceOptions) -> DistanceTracker:
        """The distance tracker of ``dist`` (its cadence checked against ``every``)."""
        default = 10 * self.every if dist.every is None else dist.every
        self.distance_every = multiple("distance_every", default, self.every)
        every = 10 * self.distance_every if dist.solve_every is None else dist.solve_every
        solver: dict[str, Any] = {} if dist.solver is None else {"options": dist.solver}
        if not dist.warm_start:
            solver["init"] = None
        self.solver_options = solver
        return DistanceTracker(
            self.syms,
            mode=DistanceMode(dist.mode),
            solve_every=multiple("solve_every", every, self.distance_every),
            tol=float(dist.tol),
            solver_options=solver,
            sweeps=dist.sweeps,
        )

    def _open_outputs(self, log: LogOptions) -> None:
        """The history files, TensorBoard and the progress bar of ``log`` (writer rank)."""
        self.log_dir = Path(log.log_dir) if log.log_dir is not None else None
        self.formats = tuple(log.formats)
        self._out = Outputs()
        if self.log_dir is not None and self.is_writer:
            self._init_files()
        tb = open_tensorboard(log.tensorboard, self.log_dir) if self.is_writer else None
        if tb is not None:
            self._out.sinks.append(TensorBoardSink(tb))
        self._progress: ProgressDisplay | None = None
        progress = log.progress if log.progress is not None else is_terminal()
        if self.is_writer and progress:
            self._progress = ProgressDisplay(log.total)

    # -- hyper-parameters -----------------------------------------------------------------
    @property
    def lr(self) -> float:
        """η used by the next record (read from the optimizer when one was given)."""
        return self._hyper.current()[0]

    @lr.setter
    def lr(self, value: float) -> None:
        self._hyper.set("lr", value)

    @property
    def solve_every(self) -> int:
        """Steps between full equilibrium solves (``DistanceOptions(mode="track")``)."""
        return self._distance.solve_every

    @property
    def weight_decay(self) -> float:
        """γ (of γ‖θ‖²) used by the next record (from the optimizer: its weight_decay / 2)."""
        return self._hyper.current()[1]

    @weight_decay.setter
    def weight_decay(self, value: float) -> None:
        self._hyper.set("weight_decay", value)

    # -- the training-loop API ------------------------------------------------------------
    @property
    def step_count(self) -> int:
        """Number of :meth:`step` calls so far (the index of the next step)."""
        return self._step

    def due(self, step: int | None = None) -> bool:
        """Whether ``step`` (default: the next one) is a record step."""
        return (self._step if step is None else step) % self.every == 0

    def track(self) -> contextlib.AbstractContextManager[Any]:
        """Context for one forward and backward pass (hooks on record steps only).

        Gradient accumulation: one ``with mon.track():`` per micro-batch, k of them before
        one :meth:`step` (the loop backpropagating ``loss_j / k``); the record is that of the
        whole accumulated batch (:mod:`noetherflow.monitor.accumulation`; pass
        ``batch_size`` = the accumulated batch). Several forward/backward passes inside one
        ``track`` are refused with an error naming it.
        """
        self._refuse_closed("track")
        if not self.due() or self.estimator is not Estimator.HOOKS or not self.sgd:
            return contextlib.nullcontext()
        return self._capture.block(self._level(), keep_samples=self._solves_coupled(self._step))

    def _level(self) -> str:
        # Per-coordinate statistics only when the solver runs at this step; flows need less.
        return self._level_at(self._step)

    def _solves_coupled(self, i: int) -> bool:
        """Whether record ``i`` runs the coupled solver (the one reader of per-sample gradients)."""
        return self.distance and i % self.distance_every == 0 and self._distance.solves_coupled

    def step(
        self,
        loss: Tensor | float | None = None,
        *,
        inputs: Any = None,
        targets: Any = None,
    ) -> dict[str, np.ndarray] | None:
        """Count one training step; on record steps compute and write a row and return it.

        Call after ``loss.backward()`` and before ``optimizer.step()``. ``inputs``/``targets``
        are the batch: used for sharpness when no ``probe`` batch was given, and for the
        statistics with ``estimator="microbatch"``/``"reference"``.
        """
        self._refuse_closed("step")
        i = self._step
        self._step += 1
        row = None
        if self.due(i):
            try:
                row = self._record(i, loss, inputs, targets)
            finally:
                self._capture.reset()
            self._rows.append(row)
            if self.is_writer:
                self._write(row)
        self._capture.reset()
        if self._progress is not None:
            self._progress.advance(row)
        return row

    # -- one record -----------------------------------------------------------------------
    def _record(self, i: int, loss: Any, inputs: Any, targets: Any) -> dict[str, np.ndarray]:
        t_start = _now()
        row = {k: np.full(shape, np.nan) for k, shape in self.schema.items()}
        row["step"] = np.asarray(i, dtype=np.int64)
        stats, undefined = self._step_stats(i, inputs, targets)
        n_local = 1
        if stats is not None:
            n_local = stats.n
            if self.all_reduce:
                all_reduce_stats(stats)
            if self.estimator is Estimator.HOOKS:
                check_loss_reduction(loss, self.reduction, n_local, "NoetherMonitor")
            self._check_batch_size(i, stats)
        if loss is not None:
            lt = loss_tensor(loss)
            if self.all_reduce:
                lt = all_reduce_mean(lt.to(torch.float64), n_local)
            row["loss"] = np.asarray(float(lt))

        lr, gamma = self._hyper.current()
        gamma = self._with_penalty(gamma)
        row["lr"], row["weight_decay"] = np.asarray(lr), np.asarray(gamma)
        with one_thread():  # one small form per symmetry: see noetherflow._threads
            ch = charges(self.syms)
        put_values(row, "charge", ch, self.syms, self.keys, self.schema)
        self._steps.put(row, self.schema)
        if stats is not None and not undefined:
            undefined = 1 if lr == 0 else (0 if stats.all_finite() else 3)
        if self.sgd:
            row["undefined"] = np.asarray(float(undefined))
            if undefined:
                self._warn_undefined(i, undefined)
                stats = None
        if stats is not None:
            # SGD with momentum: the buffers give the cross term c_cross·vᵀA∇L
            noise = self._noise_kwargs(lr, gamma)
            disp = self._hyper.displacement() if self.momentum_cross else None
            stats = with_displacement(
                stats, disp, self.syms.params(), "NoetherMonitor", noise["momentum"]
            )
            # one noise model per record: η and γ reach the flows and the tracker only in it
            nm = NoiseModel.create(**noise)
            with one_thread():
                fl = noether_flow(self.syms, stats, nm, charges=ch)
            put_values(row, "flow", fl, self.syms, self.keys, self.schema)
            if self.distance and i % self.distance_every == 0:
                res = self._distance.measure(i, stats, nm)
                put_distance(row, res, self.syms, self.keys, self.schema)
        sh = self.sharpness
        if sh is not None and i % (sh.every or self.every) == 0:
            if self.probe is not None:
                inputs, targets = self.probe
            assert self.loss_fn is not None
            put_sharpness(
                row, sh, self.model, self.loss_fn, inputs, targets, self.reduction, self.all_reduce
            )
        row["time"] = np.asarray(_now() - self._t0)
        row["monitor_time"] = np.asarray(_now() - t_start)
        return row

    def _step_stats(self, i: int, inputs: Any, targets: Any) -> tuple[GradStats | None, int]:
        """The statistics of this step and, when there are none, the ``undefined`` code."""
        if not self.sgd:
            return None, 0  # Adam/AdamW: no noise model, so no statistics are needed
        try:
            if self.estimator is not Estimator.HOOKS:
                return self._batch_stats(inputs, targets), 0
            if self._capture.tracked:
                return self._capture.merged(), 0
        except SmallBatchError:
            return None, 2
        return None, 4

    def _with_penalty(self, gamma: float) -> float:
        """γ plus an L2 penalty found in the loss of this step (see ``.accumulation``)."""
        found = self._capture.penalty.gamma
        if found and -1 not in self._warned:
            self._warned.add(-1)
            penalty_notice(found, self._hyper.from_optimizer, gamma)
        return effective_decay(found, gamma, self._hyper.from_optimizer)

    def _check_batch_size(self, i: int, stats: GradStats) -> None:
        """Warn once when the step's samples differ from ``batch_size`` (S of η/S)."""
        if self.all_reduce is False and is_distributed():
            return  # this rank's samples only: the global count is not known here
        # the micro-batch estimator's samples are its micro-batches of m samples each
        m = self.micro_batch_size if self.estimator is Estimator.MICROBATCH else 1
        seen = stats.n * m
        if seen != self.batch_size and -2 not in self._warned:
            self._warned.add(-2)
            batch_size_notice(i, int(self.batch_size), seen)

    def _warn_undefined(self, i: int, code: int) -> None:
        if code not in self._warned:  # one warning per reason
            self._warned.add(code)
            undefined_notice(i, code)

    def _batch_stats(self, inputs: Any, targets: Any) -> GradStats:
        """Statistics of the given batch with a non-hook estimator (``.grad``, buffers kept).

        The global random state is restored afterwards: the estimator's own forward passes
        (dropout) must not change the masks of the training run.
        """
        if inputs is None:  # targets may be None: labels inside a dict of keyword inputs
            raise ValueError(
                f"NoetherMonitor(estimator={self.estimator.value!r}) computes the statistics "
                f"from the batch: call mon.step(loss, inputs=x, targets=y) (step {self._step - 1} "
                "is a record step)."
            )
        assert self.loss_fn is not None
        devices = sorted({p.device.index or 0 for p in self.syms.params() if p.is_cuda})
        with preserved(unwrap_ddp(self.model)), torch.random.fork_rng(devices=devices):
            return collect_stats(
                self.model,
                self.syms,
                self.loss_fn,
                inputs,
                targets,
                reduction=self.reduction,
                estimator=self.estimator,
                micro_batch_size=self.micro_batch_size,
                check_finite=False,
                all_reduce=False,
                level=self._level_at(self._step - 1),
            )

    def _level_at(self, i: int) -> str:
        return "solve" if self.distance and i % self.distance_every == 0 else "neuron"

    def _noise_kwargs(self, lr: float, gamma: float) -> dict[str, Any]:
        """The noise model's keywords; ``gamma``: the one γ with any L2 penalty of the loss."""
        decay = decay_with_penalty(self._hyper.decay(), gamma, self._capture.penalty.gamma)
        return {
            "lr": lr,
            "batch_size": self.batch_size,
            "weight_decay": decay,
            "time": self.time,
            **self._hyper.momentum_kwargs(),
        }

    # -- outputs --------------------------------------------------------------------------
    @property
    def history(self) -> dict[str, np.ndarray]:
        """Every recorded key → ``[records, *shape]`` (``step`` int64, the rest float64)."""
        return stack_rows(self._rows, self.schema)

    def _init_files(self) -> None:
        assert self.log_dir is not None
        meta = {
            "every": self.every,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "weight_decay": self.weight_decay,
            "hyperparameters_from": "optimizer" if self._hyper.from_optimizer else "arguments",
            "time": self.time,
            "reduction": self.reduction.value,
            "symmetries": self.syms.names,
            "keys": self.keys,
            "estimator": self.estimator.value,
            "optimizer": self._hyper.kind if self._hyper.from_optimizer else None,
            "distance_every": self.distance_every if self.distance else None,
            "distance_mode": self._distance.mode.value if self.distance else None,
            "solve_every": self.solve_every if self.distance else None,
            "schema": {k: list(v) for k, v in self.schema.items()},
            "undefined_codes": {str(k): v for k, v in UNDEFINED.items()},
            "world_size": torch.distributed.get_world_size() if is_distributed() else 1,
        }
        write_meta(self.log_dir, meta)
        if "csv" in self.formats:
            self._out.sinks.append(CsvSink(self.log_dir / CSV_NAME, self.schema))
        if "jsonl" in self.formats:
            self._out.sinks.append(JsonlSink(self.log_dir / JSONL_NAME, self.schema))

    def _write(self, row: Mapping[str, np.ndarray]) -> None:
        self._out.write(row, int(row["step"]))

    def on_record(
        self, callback: Callable[[dict[str, float]], Any]
    ) -> Callable[[dict[str, float]], Any]:
        """Call ``callback(record)`` at every record, on the writing rank (rank 0).

        ``record`` is a flat ``dict`` of floats with ASCII keys (see
        :func:`flat_record`): ``step``, ``loss``, ``lr``,
        ``charge/<key>``, ``flow/<key>/max_abs`` …, ``summary/max_abs_flow`` — ready for any
        scalar logger (``wandb.log``, ``mlflow.log_metrics``, a CSV writer). Returns
        ``callback``, so it can be used as a decorator.
        """
        if not callable(callback):
            raise TypeError(
                f"on_record expects a callable taking a dict of floats, got {callback!r}."
            )
        if self.is_writer:
            self._out.callbacks.append(callback)
        return callback

    def _refuse_closed(self, what: str) -> None:
        if self._closed_at is not None:  # the sinks are gone
            raise ValueError(
                f"NoetherMonitor.{what}(): the monitor was closed (mon.close() after "
                f"{self._closed_at} steps), so its files would miss further records. Call "
                "close() after training; to go on, build a new NoetherMonitor (mon.history "
                "keeps the records so far)."
            )

    def close(self) -> None:
        """Stop the progress bar, flush/close TensorBoard; after it no more track() or step()."""
        self._closed_at = self._step if self._closed_at is None else self._closed_at
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._out.close()
        self._steps.close()

    @property
    def last_step(self) -> dict[str, StepDecomposition] | None:
        """The exact decomposition of the last recorded ``optimizer.step()`` (``optimizer=``).

        The steps recorded are those that lead to a record step (with ``every=1``, every
        step). Per symmetry: before + decay + drift (2θ_dᵀAΔ_r) + noise = the charge after the
        step (:mod:`noetherflow.optim.decompose`); ``None`` before the first such step. The
        parts are written into the next row as ``step_decay/*``, ``step_drift/*``,
        ``step_noise/*``.
        """
        return self._steps.last

    def __enter__(self) -> NoetherMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def plot(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        kinds: Sequence[str] = (
            "loss",
            "charge",
            "flow",
            "distance",
            "step_drift",
            "step_noise",
            "adamw_charge",
            "sharpness",
        ),
        max_lines: int = 8,
        top_k: int = 8,
    ) -> Any:
        """A matplotlib figure with one panel per kind of quantity; saved to ``path`` if given.

        Symmetries are named by their pretty names; see :func:`noetherflow.plotting.
        plot_history` for ``max_lines`` (vector entries) and ``top_k`` (named lines per panel).
        """
        if not self._rows:
            msg = f"{self._step} steps so far, a record every={self.every} steps from step 0"
            raise ValueError(f"NoetherMonitor.plot(): no records yet ({msg}); step first.")
        names = {k: n for n, k in self.keys.items()}
        return plot_history(
            self.history, path, kinds=kinds, max_lines=max_lines, top_k=top_k, labels=names
        )

    def __repr__(self) -> str:
        return (
            f"NoetherMonitor({len(self.syms)} symmetries, every={self.every}, "
            f"{len(self._rows)} records, step {self._step})"
        )


# -- helpers ------------------------------------------------------------------------------
def _now() -> float:
    return time.perf_counter()
