"""PyTorch Lightning callbacks (optional extra): the monitor and the equilibrium teleport.

* :class:`NoetherCallback` runs a :class:`noetherflow.NoetherMonitor` inside ``Trainer.fit``;
* :func:`teleport_callback` (also :meth:`noetherflow.EquilibriumTeleport.lightning_callback`)
  teleports to the noise equilibrium before the forward pass of due steps.

Import it explicitly (``from noetherflow.integrations.lightning import NoetherCallback``);
``import noetherflow`` never imports Lightning. Works with ``lightning`` (2.x) or the older
``pytorch_lightning`` package, automatic optimisation, ``accumulate_grad_batches=1``.

Example::

    syms = nf.SymmetrySet([nf.Rescaling(module.fc1, module.fc2)])
    cb = NoetherCallback(syms, every=10, lr=0.1, batch_size=256, log_dir="runs/x")
    L.Trainer(callbacks=[cb]).fit(module, loader)
    cb.monitor.plot("runs/x/monitor.png")

Hook order per training step: ``on_train_batch_start`` opens ``monitor.track()``,
``on_before_backward`` keeps the loss, ``on_after_backward`` closes the capture and
``on_before_optimizer_step`` records (gradients and parameters still at the same θ).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from noetherflow.monitor import NoetherMonitor
from noetherflow.symmetry.set import SymmetrySet

if TYPE_CHECKING:
    from noetherflow.teleporter import EquilibriumTeleport

__all__ = ["NoetherCallback", "teleport_callback"]


def _callback_base() -> type:
    """Lightning's ``Callback`` class (``lightning`` 2.x or ``pytorch_lightning``), imported now."""
    import importlib

    try:
        mod = importlib.import_module("lightning.pytorch.callbacks")
    except ImportError:  # pragma: no cover - depends on the installed extra
        try:
            mod = importlib.import_module("pytorch_lightning.callbacks")
        except ImportError:
            raise ImportError(
                "noetherflow.integrations.lightning needs PyTorch Lightning: pip install "
                "lightning (or use nf.NoetherMonitor / EquilibriumTeleport.maybe_teleport in your "
                "own loop)."
            ) from None
    return cast(type, mod.Callback)


Callback = _callback_base()


def _default_split(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, list | tuple) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        f"cannot split a batch of type {type(batch).__name__} into (inputs, targets); expected a "
        "2-tuple or 2-list; pass split_batch=lambda batch: (x, y)."
    )


class NoetherCallback(Callback):  # type: ignore[misc,valid-type]
    """Run a :class:`~noetherflow.NoetherMonitor` inside ``Trainer.fit``.

    Args:
        syms: the symmetries, built on the LightningModule's layers.
        split_batch: ``batch → (inputs, targets)``, used for sharpness when no ``probe`` is
            given (default: a 2-tuple batch).
        log_to_lightning: also send the scalar entries of each record to the Lightning
            logger (``pl_module.log_dict``, keys prefixed ``noether/``).
        **monitor_kwargs: keyword arguments of :class:`~noetherflow.NoetherMonitor`
            (``every``, ``lr``, ``batch_size``, ``weight_decay``, ``log_dir``, ...).

    The monitor exists from ``on_train_start`` on, as :attr:`monitor`.
    """

    def __init__(
        self,
        syms: SymmetrySet,
        *,
        split_batch: Callable[[Any], tuple[Any, Any]] = _default_split,
        log_to_lightning: bool = False,
        **monitor_kwargs: Any,
    ) -> None:
        super().__init__()
        self.syms = syms
        self.split_batch = split_batch
        self.log_to_lightning = log_to_lightning
        self.monitor_kwargs = monitor_kwargs
        self.monitor: NoetherMonitor | None = None
        self._stack = contextlib.ExitStack()
        self._loss: Any = None
        self._batch: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if getattr(trainer, "accumulate_grad_batches", 1) != 1:
            raise ValueError(
                "NoetherCallback needs accumulate_grad_batches=1: the statistics are those of "
                "one forward/backward per optimizer step."
            )
        if not getattr(pl_module, "automatic_optimization", True):
            raise ValueError(
                "NoetherCallback supports automatic optimisation only; with manual "
                "optimisation call monitor.track()/monitor.step() in training_step."
            )
        kw = {"total": getattr(trainer, "estimated_stepping_batches", None), **self.monitor_kwargs}
        if not isinstance(kw["total"], int):
            kw["total"] = None
        self.monitor = NoetherMonitor(pl_module, self.syms, **kw)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self.monitor is not None
        self._batch = batch
        self._loss = None
        self._stack.enter_context(self.monitor.track())

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._loss = loss

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._stack.close()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        mon = self.monitor
        assert mon is not None
        self._stack.close()
        x = y = None
        if mon.sharpness is not None and mon.probe is None and mon.due():
            x, y = self.split_batch(self._batch)
        row = mon.step(self._loss, inputs=x, targets=y)
        if row is not None and self.log_to_lightning:
            scalars = {
                f"noether/{k}": float(v) for k, v in row.items() if v.ndim == 0 and k != "step"
            }
            pl_module.log_dict(scalars)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stack.close()
        if self.monitor is not None:
            self.monitor.close()


def teleport_callback(
    teleporter: EquilibriumTeleport, *, split_batch: Callable[[Any], tuple[Any, Any]] | None = None
) -> Any:
    """A Lightning ``Callback`` that calls ``teleporter.maybe_teleport`` before each forward pass.

    Lightning's ``Callback`` is looked up when this is called. The optimizer whose state is
    transformed is ``trainer.optimizers[0]`` unless the teleporter already has one.
    """
    tp = teleporter
    split = split_batch or _default_split

    class EquilibriumTeleportCallback(_callback_base()):  # type: ignore[misc]
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
