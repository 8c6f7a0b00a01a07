"""PyTorch Lightning callbacks (optional extra): the monitor and the equilibrium teleport.

* :class:`NoetherCallback` runs a :class:`noetherflow.NoetherMonitor` inside ``Trainer.fit``;
* :func:`teleport_callback` (also :meth:`noetherflow.EquilibriumTeleport.lightning_callback`)
  teleports to the noise equilibrium before the forward pass of due steps.

Import it explicitly (``from noetherflow.integrations.lightning import NoetherCallback``);
``import noetherflow`` never imports Lightning. Works with ``lightning`` (2.x) or the older
``pytorch_lightning`` package, automatic optimisation; with ``accumulate_grad_batches=k``
each micro-batch is one ``monitor.track()`` block and the record is that of the whole
accumulated step (batch size × k). When the trainer has a logger the records go to it at
Lightning's own step, and the monitor opens no TensorBoard writer of its own (one stream;
pass ``logging=nf.LogOptions(tensorboard=True)`` for a second one under ``log_dir``).

Example:
    >>> import torch, lightning as L
    >>> import noetherflow as nf
    >>> from noetherflow.integrations.lightning import NoetherCallback
    >>> class Net(L.LightningModule):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    ...     def forward(self, x):
    ...         return self.fc2(torch.relu(self.fc1(x)))
    ...     def training_step(self, batch, i):
    ...         return torch.nn.functional.mse_loss(self(batch[0]), batch[1])
    ...     def configure_optimizers(self):
    ...         return torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=0.01)
    >>> data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    >>> loader = torch.utils.data.DataLoader(data, batch_size=16)
    >>> module = Net()
    >>> syms = nf.SymmetrySet([nf.Rescaling(module.fc1, module.fc2)])
    >>> cb = NoetherCallback(syms, every=2, logging=nf.LogOptions(log_dir="runs/x"))  # η, γ, S
    >>> trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_progress_bar=False,
    ...                     enable_checkpointing=False, enable_model_summary=False)
    >>> trainer.fit(module, loader)
    >>> h = cb.monitor.history
    >>> h["step"], h["lr"], h["weight_decay"]  # γ is SGD's weight_decay / 2
    (array([0, 2]), array([0.05, 0.05]), array([0.005, 0.005]))
    >>> fig = cb.monitor.plot("runs/x/monitor.png")

Hook order per training step: ``on_train_batch_start`` opens ``monitor.track()``,
``on_before_backward`` keeps the loss, ``on_after_backward`` closes the capture and
``on_before_optimizer_step`` records (gradients and parameters still at the same θ).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from noetherflow._inputs import ModelInputs
from noetherflow.integrations._options import check_callback_options
from noetherflow.monitor import NoetherMonitor
from noetherflow.monitor.options import take_options
from noetherflow.symmetry.set import SymmetrySet

if TYPE_CHECKING:
    from noetherflow.teleportation.tool import EquilibriumTeleport

__all__ = ["NoetherCallback", "default_split", "teleport_callback"]


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


def default_split(batch: Any, labels_key: str = "labels") -> tuple[Any, Any]:
    """The default ``batch → (inputs, targets)`` of the callbacks.

    * a 2-tuple or 2-list ``(x, y)``: ``x``, ``y``;
    * a mapping (a ``dict``, a Hugging Face ``BatchEncoding``): the targets are
      ``batch[labels_key]`` and the inputs every other entry, as keyword inputs
      (``model(**inputs)``, :class:`~noetherflow._inputs.ModelInputs`).

    Raises:
        KeyError: a mapping without ``labels_key``.
        ValueError: any other batch.
    """
    if isinstance(batch, Mapping):
        if labels_key not in batch:
            raise KeyError(
                f"the batch is a {type(batch).__name__} with keys {list(batch)}, but no labels "
                f"key {labels_key!r}; expected the targets under that key. Pass the callback "
                "labels_key='<your key>', or split_batch=lambda batch: (inputs, targets)."
            )
        inputs = {k: v for k, v in batch.items() if k != labels_key}
        return ModelInputs.of(inputs, "the Lightning callback"), batch[labels_key]
    if isinstance(batch, list | tuple) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        f"cannot split a batch of type {type(batch).__name__} into (inputs, targets); expected a "
        "2-tuple or 2-list, or a dict with a labels key; pass split_batch=lambda batch: (x, y)."
    )


class NoetherCallback(Callback):  # type: ignore[misc,valid-type]
    """Run a :class:`~noetherflow.NoetherMonitor` inside ``Trainer.fit``.

    What the monitor needs is read from the trainer at ``on_train_start`` unless given:

    * η and γ from the trainer's optimizer (``trainer.optimizers``, exactly one; re-read at
      every record so schedulers are followed; γ = SGD weight_decay / 2; any optimizer the
      monitor takes: SGD with or without momentum, Adam, AdamW);
    * the batch size S from the training ``DataLoader`` (``batch_size`` × ``world_size`` ×
      ``accumulate_grad_batches``, the global batch of one optimizer step); a clear error
      when it cannot be read. On record steps the samples of the step's batches (dim 0 of
      their inputs, × ``world_size``) are S, so that an epoch's last, smaller batch gets its
      own S (as the Hugging Face callback counts them);
    * the GradScaler of ``precision="16-mixed"``, whose scale is divided out.

    The monitor's own progress bar is off while Lightning shows one (two rich live displays
    break the terminal at teardown); records go to every ``trainer.loggers`` as flat scalars
    (``noether/flow/<key>/max_abs`` …, see :func:`noetherflow.monitor.flat_record`).

    Args:
        syms: the symmetries, built on the LightningModule's layers.
        split_batch: ``batch → (inputs, targets)``, used for sharpness when no ``probe`` is
            given and for ``estimator="microbatch"``/``"reference"`` (default:
            :func:`default_split`: a 2-tuple, or a dict / ``BatchEncoding`` whose labels are
            under ``labels_key`` and whose other entries are the keyword inputs).
        labels_key: the key of the targets in a dict batch (default ``"labels"``).
        log_to_lightning: send each record to the trainer's loggers; default: when the trainer
            has a logger.
        **monitor_kwargs: keyword arguments of :class:`~noetherflow.NoetherMonitor`
            (``every``, ``logging``, ``estimator``, ...; ``lr``/``weight_decay``/``optimizer``
            and ``batch_size`` override what is read from the trainer).

    The monitor exists from ``on_train_start`` on, as :attr:`monitor`.
    """

    def __init__(
        self,
        syms: SymmetrySet,
        *,
        split_batch: Callable[[Any], tuple[Any, Any]] | None = None,
        labels_key: str = "labels",
        log_to_lightning: bool | None = None,
        **monitor_kwargs: Any,
    ) -> None:
        super().__init__()
        self.syms = syms
        self.split_batch = split_batch or _splitter(labels_key)
        self.log_to_lightning = log_to_lightning
        self.monitor_kwargs = dict(monitor_kwargs)
        self.distance, self.log_options = take_options(self.monitor_kwargs, "NoetherCallback")
        every = self.monitor_kwargs.get("every", 10)
        check_callback_options("NoetherCallback", syms, every, self.monitor_kwargs)
        self.monitor: NoetherMonitor | None = None
        self._stack = contextlib.ExitStack()
        self._losses: list[Any] = []
        self._batch: Any = None
        self._samples = 0  # of this step's batches, counted on record steps
        self._world = 1
        self._count = False  # S is read from the trainer: count each record step's samples

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Build the monitor from the trainer: optimizer, global batch size, loggers."""
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        est = self.monitor_kwargs.get("estimator", "hooks")
        if accumulate != 1 and est != "hooks":
            raise ValueError(
                f"NoetherCallback(estimator={est!r}) with accumulate_grad_batches={accumulate}: "
                "the batch estimators see one micro-batch; use the default estimator='hooks' "
                "(each micro-batch is captured and merged into the step's statistics)."
            )
        if not getattr(pl_module, "automatic_optimization", True):
            raise ValueError(
                "NoetherCallback supports automatic optimisation only; with manual "
                "optimisation call monitor.track()/monitor.step() in training_step."
            )
        kw = dict(self.monitor_kwargs)
        opts = self.log_options
        if opts.total is None:
            total = getattr(trainer, "estimated_stepping_batches", None)
            opts = replace(opts, total=total if isinstance(total, int) else None)
        if getattr(trainer, "progress_bar_callback", None) is not None:
            if opts.progress:
                warnings.warn(
                    "NoetherCallback(logging=LogOptions(progress=True)): the progress bar is "
                    "ignored: Lightning shows its own progress bar and rich allows one live "
                    "display at a time.",
                    UserWarning,
                    stacklevel=2,
                )
            opts = replace(opts, progress=False)
        if "lr" not in kw and "optimizer" not in kw:
            kw["optimizer"] = _the_optimizer(trainer)
        self._world = int(getattr(trainer, "world_size", 1) or 1)
        self._count = "batch_size" not in kw
        if self._count:
            kw["batch_size"] = _global_batch_size(trainer) * accumulate
        plugin = getattr(getattr(trainer, "strategy", None), "precision_plugin", None)
        scaler = getattr(plugin, "scaler", None)
        if scaler is not None:  # precision="16-mixed": the loss is scaled
            kw.setdefault("grad_scaler", scaler)
        log = self.log_to_lightning
        loggers = list(getattr(trainer, "loggers", None) or [])
        to_lightning = bool(log or (log is None and loggers))
        if to_lightning and loggers and opts.tensorboard is None:
            # one TensorBoard stream: Lightning's logger gets the records at its own step
            opts = replace(opts, tensorboard=False)
        self.monitor = NoetherMonitor(
            pl_module, self.syms, distance=self.distance, logging=opts, **kw
        )
        if to_lightning:
            if not loggers:
                raise ValueError(
                    "NoetherCallback(log_to_lightning=True) but the trainer has no logger; pass "
                    "Trainer(logger=...) or log_to_lightning=False."
                )
            self.monitor.on_record(_to_loggers(trainer))

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Open the statistics capture for this step's forward and backward."""
        assert self.monitor is not None
        self._batch = batch
        if self._count and self.monitor.due():
            self._samples += _samples_of(batch, self.split_batch)
        self._stack.close()
        self._stack.enter_context(self.monitor.track())  # one block per micro-batch

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """Keep the loss for the record (accumulation: each micro-batch's, already / k)."""
        self._losses.append(loss)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """Close the statistics capture."""
        self._stack.close()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Record when due, with gradients and parameters still at the same θ."""
        mon = self.monitor
        assert mon is not None
        self._stack.close()
        x = y = None
        needs_batch = mon.estimator.value != "hooks" or (
            mon.sharpness is not None and mon.probe is None
        )
        if needs_batch and mon.due():
            x, y = self.split_batch(self._batch)
        losses, self._losses = self._losses, []
        loss = losses[0] if len(losses) == 1 else sum(float(v.detach()) for v in losses) or None
        if self._samples:  # this step's samples, all processes (equal batches per rank)
            mon.batch_size = self._samples * self._world
        self._samples = 0
        mon.step(loss, inputs=x, targets=y)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the monitor (flushes its files)."""
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close the monitor when training raises."""
        self._close()

    def _close(self) -> None:
        self._stack.close()
        if self.monitor is not None:
            self.monitor.close()


def _samples_of(batch: Any, split: Callable[[Any], tuple[Any, Any]]) -> int:
    """Dim 0 of the batch's inputs, or 0 where the batch cannot be read (S left as read)."""
    try:
        inputs, _ = split(batch)
        return ModelInputs.of(inputs, "NoetherCallback").batch_size("NoetherCallback")
    except (KeyError, TypeError, ValueError):
        return 0


def _the_optimizer(trainer: Any) -> Any:
    opts = list(getattr(trainer, "optimizers", None) or [])
    if len(opts) != 1:
        raise ValueError(
            f"NoetherCallback reads lr and weight decay from the trainer's optimizer, but there "
            f"are {len(opts)}; pass NoetherCallback(syms, lr=..., weight_decay=...) or "
            "optimizer=... for the one that trains the symmetries' parameters."
        )
    return opts[0]


def _global_batch_size(trainer: Any) -> int:
    """Per-step batch size of the training DataLoader times the number of processes."""
    dl = getattr(trainer, "train_dataloader", None)
    if isinstance(dl, dict) and len(dl) == 1:
        dl = next(iter(dl.values()))
    elif isinstance(dl, list | tuple) and len(dl) == 1:
        dl = dl[0]
    bs = getattr(dl, "batch_size", None)
    if bs is None:
        bs = getattr(getattr(dl, "batch_sampler", None), "batch_size", None)
    if not isinstance(bs, int) or bs < 1:
        raise ValueError(
            f"NoetherCallback could not read the batch size from the training dataloader "
            f"({type(dl).__name__}, batch_size={bs!r}); pass NoetherCallback(syms, "
            "batch_size=S) with S the number of samples in one optimizer step (all processes)."
        )
    return bs * int(getattr(trainer, "world_size", 1) or 1)


def lightning_step(trainer: Any, default: int) -> int:
    """The step Lightning logs ``self.log`` metrics at (its optimizer steps so far)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    step = getattr(loop, "_batches_that_stepped", None)
    if not isinstance(step, int):
        step = getattr(trainer, "global_step", None)
    return step if isinstance(step, int) else default


def _to_loggers(trainer: Any) -> Callable[[dict[str, float]], None]:
    def log(record: dict[str, float]) -> None:
        metrics = {f"noether/{k}": v for k, v in record.items() if k != "step" and math.isfinite(v)}
        step = lightning_step(trainer, int(record["step"]))
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=step)

    return log


def _splitter(labels_key: str) -> Callable[[Any], tuple[Any, Any]]:
    if not isinstance(labels_key, str):
        raise TypeError(
            f"labels_key={labels_key!r} is a {type(labels_key).__name__}; expected the string "
            "key of the targets in a dict batch, e.g. 'labels'."
        )
    return functools.partial(default_split, labels_key=labels_key)


def teleport_callback(
    teleporter: EquilibriumTeleport,
    *,
    split_batch: Callable[[Any], tuple[Any, Any]] | None = None,
    labels_key: str = "labels",
) -> Any:
    """A Lightning ``Callback`` that calls ``teleporter.maybe_teleport`` before each forward pass.

    Lightning's ``Callback`` is looked up when this is called. The optimizer whose state is
    transformed is ``trainer.optimizers[0]`` unless the teleporter already has one. The batch
    is split by ``split_batch`` (default: :func:`default_split` with ``labels_key``: a 2-tuple,
    or a dict whose other entries are the keyword inputs).
    """
    tp = teleporter
    split = split_batch or _splitter(labels_key)

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
