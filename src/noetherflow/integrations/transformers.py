"""A ``transformers.Trainer`` callback that runs :class:`noetherflow.NoetherMonitor`.

Example (nothing else in the Trainer changes)::

    from noetherflow.integrations.transformers import NoetherTrainerCallback

    cb = NoetherTrainerCallback(every=10)            # any NoetherMonitor option too
    Trainer(model, args, train_dataset=ds, callbacks=[cb]).train()
    cb.monitor.history                               # the records, keyed as in the monitor

What the callback does, per Trainer hook:

* ``on_train_begin``: finds the symmetries on the first training batch (without its labels;
  the random state is restored) unless ``syms=`` was given, and builds the monitor on the
  Trainer's optimizer (accelerate's ``AcceleratedOptimizer`` unwrapped), so η and the
  decay are read from its param groups at every record (warmup from lr = 0 included:
  those records are marked undefined, see :data:`noetherflow.monitor.schema.UNDEFINED`).
* every micro-batch of a record step runs inside its own ``monitor.track()`` (opened at
  ``on_step_begin``/``on_substep_end``): gradient accumulation is merged into the statistics
  of the whole step (:mod:`noetherflow.monitor.accumulation`), whether the Trainer
  normalises by ``num_items_in_batch`` or divides by the accumulation steps.
* the loss: a forward hook on the model reads ``outputs.loss`` of each micro-batch; the
  step's loss is their sum when the Trainer passed ``num_items_in_batch`` (each is already a
  share of the step's mean) and their mean otherwise. A model that returns no loss (a
  custom ``compute_loss``) leaves ``loss`` NaN, with one warning.
* ``on_pre_optimizer_step`` (after clipping, before ``optimizer.step()``): ``monitor.step``,
  with the flows' batch size the sequences of the step (× the world size).
* every record's scalars (:func:`noetherflow.flat_record`, prefixed ``noether/``) are
  appended to ``state.log_history`` at the Trainer's ``global_step``. The Trainer calls its
  reporters (``report_to``: TensorBoard, W&B, …) before the callbacks given to it; put the
  callback first with :meth:`NoetherTrainerCallback.attach` and the next ``on_log`` carries
  the last record to them (``logging_steps = every`` logs it at its own step).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from noetherflow.integrations._options import check_callback_options
from noetherflow.monitor import NoetherMonitor
from noetherflow.monitor.history import flat_record
from noetherflow.monitor.options import take_options
from noetherflow.symmetry.set import SymmetrySet

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the optional dependency
    raise ImportError(
        "noetherflow.integrations.transformers needs the `transformers` package; install it "
        "with `pip install transformers`."
    ) from exc

__all__ = ["NoetherTrainerCallback"]

PREFIX = "noether/"


class NoetherTrainerCallback(TrainerCallback):
    """Monitor a ``transformers.Trainer`` run (see the module docstring).

    Args:
        syms: the symmetries to watch (default: ``nf.find_symmetries`` on the first batch).
        every: record every this many optimizer steps.
        **monitor_options: any other :class:`noetherflow.NoetherMonitor` keyword (``lr``,
            ``optimizer`` and ``batch_size`` are the Trainer's and cannot be given).
    """

    def __init__(
        self, syms: SymmetrySet | None = None, *, every: int = 10, **monitor_options: Any
    ) -> None:
        taken = sorted({"lr", "optimizer", "batch_size", "weight_decay"} & set(monitor_options))
        if taken:
            raise TypeError(
                f"NoetherTrainerCallback: {taken} are read from the Trainer (its optimizer and "
                "TrainingArguments); drop them."
            )
        est = monitor_options.get("estimator", "hooks")
        if est != "hooks":
            raise ValueError(
                f"NoetherTrainerCallback(estimator={est!r}): the Trainer does not hand its "
                "batches to callbacks, so the statistics come from its own backward passes: "
                "estimator='hooks' (the default). For a model the hooks cannot read (BatchNorm "
                "in training mode), run NoetherMonitor in your own loop with mon.step(loss, "
                "inputs=x, targets=y)."
            )
        self.options = dict(monitor_options)
        self.distance, self.log_options = take_options(self.options, "NoetherTrainerCallback")
        who = "NoetherTrainerCallback"
        self.syms = syms
        self.every = check_callback_options(who, syms, every, self.options, optional=True)
        self.monitor: NoetherMonitor | None = None
        self._stack = contextlib.ExitStack()
        self._losses: list[float] = []
        self._summed = False
        self._samples = 0
        self._pending: dict[str, float] | None = None
        self._handles: list[Any] = []
        self._world = 1
        self._warned_loss = False

    def attach(self, trainer: Any) -> NoetherTrainerCallback:
        """Put this callback first in ``trainer``'s callbacks, before its reporters."""
        cbs = trainer.callback_handler.callbacks
        if self in cbs:
            cbs.remove(self)
        cbs.insert(0, self)
        return self

    # -- set-up -----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """Find the symmetries (unless given) and build the monitor on the Trainer's optimizer."""
        model: nn.Module = kw["model"]
        optimizer = kw.get("optimizer")
        if self.syms is None:
            self.syms = _find(model, kw.get("train_dataloader"))
        self._world = int(getattr(args, "world_size", 1) or 1)
        batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * self._world
        # fp16: accelerate's optimizer wrapper holds the GradScaler that scales every gradient
        self.options.setdefault("grad_scaler", getattr(optimizer, "scaler", None))
        log = self.log_options
        if log.progress is None:  # the Trainer shows its own progress bar
            log = replace(log, progress=False)
        self.monitor = NoetherMonitor(
            model,
            self.syms,
            every=self.every,
            optimizer=optimizer,
            batch_size=batch,
            distance=self.distance,
            logging=log,
            **self.options,
        )
        self._handles = [
            model.register_forward_pre_hook(self._count, with_kwargs=True),
            model.register_forward_hook(self._keep_loss, with_kwargs=True),
        ]

    def _count(self, mod: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if torch.is_grad_enabled() and mod.training:
            first = kwargs.get("input_ids", args[0] if args else None)
            if isinstance(first, torch.Tensor):
                self._samples += int(first.shape[0])

    def _keep_loss(self, mod: nn.Module, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        if not (torch.is_grad_enabled() and mod.training):
            return
        loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
        if isinstance(loss, torch.Tensor):
            self._losses.append(float(loss.detach().float().mean()))
            self._summed = kwargs.get("num_items_in_batch") is not None

    # -- one step -------------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """Open the first micro-batch's capture of a record step."""
        self._losses, self._samples = [], 0
        self._open()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """A micro-batch ended (gradient accumulation): open the next one's capture."""
        self._stack.close()
        self._open()

    def _open(self) -> None:
        assert self.monitor is not None
        if self.monitor.due():
            self._stack.enter_context(self.monitor.track())

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """Record (when due) after the last backward and before ``optimizer.step()``."""
        mon = self.monitor
        assert mon is not None
        self._stack.close()
        loss: float | None = None
        if self._losses:
            total = sum(self._losses)
            loss = total if self._summed else total / len(self._losses)
        elif mon.due() and not self._warned_loss:
            self._warned_loss = True
            warnings.warn(
                "NoetherTrainerCallback: the model returned no `loss` (a custom compute_loss or "
                "label smoother); the records' loss is NaN. The statistics do not need it.",
                UserWarning,
                stacklevel=2,
            )
        if self._samples:
            mon.batch_size = self._samples * self._world
        row = mon.step(loss)
        if row is not None:
            flat = {PREFIX + k: v for k, v in flat_record(row).items() if k != "step"}
            self._pending = flat
            state.log_history.append({**flat, "step": state.global_step})

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        """Hand the last record to the callbacks after this one (reporters: :meth:`attach`)."""
        if self._pending is not None and isinstance(logs, dict):
            logs.update({k: v for k, v in self._pending.items() if math.isfinite(v)})
            self._pending = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """Close the capture, remove the hooks, close the monitor (history stays)."""
        self._stack.close()
        for h in self._handles:
            h.remove()
        self._handles = []
        if self.monitor is not None:
            self.monitor.close()


def _find(model: nn.Module, loader: Any) -> SymmetrySet:
    """``nf.find_symmetries`` on the first batch (labels dropped; random state kept)."""
    from noetherflow.symmetry.detect import find_symmetries

    if loader is None:
        raise ValueError(
            "NoetherTrainerCallback: the Trainer gave no train_dataloader to find the "
            "symmetries on; pass NoetherTrainerCallback(syms=nf.find_symmetries(model, batch))."
        )
    with torch.random.fork_rng():
        batch = next(iter(loader))
    if isinstance(batch, dict):
        dev = next(model.parameters()).device
        batch = {
            k: v.to(dev) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()
            if k not in ("labels", "label", "num_items_in_batch")
        }
    was = model.training
    model.eval()
    try:
        with torch.random.fork_rng():
            return find_symmetries(model, batch)
    finally:
        model.train(was)
