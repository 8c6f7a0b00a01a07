"""``mon.on_record`` callbacks for Weights & Biases and MLflow that pass the step as a step.

A record (:func:`noetherflow.flat_record`) holds its ``step`` among the scalars; handing it
to ``wandb.log(record)`` logs ``step`` as a metric against W&B's own step counter, and to
``mlflow.log_metrics(record)`` at step 0. These callbacks take the step out:

* :func:`wandb_on_record`: the metrics under ``prefix`` plus ``<prefix>step``, declared once
  as their step axis (``run.define_metric(prefix + "*", step_metric=prefix + "step")``), so
  they are plotted at the monitor's step whatever else the run logs with ``wandb.log`` (an
  explicit ``step=`` would have to increase across every ``wandb.log`` call of the run);
* :func:`mlflow_on_record`: ``log_metrics(metrics, step=step)``.

Non-finite values (NaN: not measured at this record; ±inf: a distance at infinity) are left
out, as the Lightning callback does. Neither package is imported until the callback is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["mlflow_on_record", "wandb_on_record"]

Record = Mapping[str, float]


def _split(record: Record, prefix: str) -> tuple[int, dict[str, float]]:
    """(step, finite metrics under ``prefix``) of a flat record."""
    step = int(record["step"])
    metrics = {prefix + k: float(v) for k, v in record.items() if k != "step" and math.isfinite(v)}
    return step, metrics


def wandb_on_record(run: Any = None, *, prefix: str = "noether/") -> Callable[[Record], None]:
    """A callback for ``mon.on_record``: each record to W&B at the monitor's step.

    ``run``: a ``wandb`` run (default: the current ``wandb.run``; call ``wandb.init`` first).
    """
    if run is None:
        import wandb

        run = wandb.run
        if run is None:
            raise ValueError(
                "wandb_on_record: no W&B run; call wandb.init(...) first or pass run=."
            )
    run.define_metric(prefix + "step")
    run.define_metric(prefix + "*", step_metric=prefix + "step")

    def log(record: Record) -> None:
        step, metrics = _split(record, prefix)
        run.log({**metrics, prefix + "step": step})

    return log


def mlflow_on_record(client: Any = None, *, prefix: str = "noether/") -> Callable[[Record], None]:
    """A callback for ``mon.on_record``: ``log_metrics(metrics, step=step)`` of each record.

    ``client``: anything with ``log_metrics(metrics, step=)`` (default: the ``mlflow``
    module, which logs to the active run).
    """
    if client is None:
        import mlflow

        client = mlflow

    def log(record: Record) -> None:
        step, metrics = _split(record, prefix)
        client.log_metrics(metrics, step=step)

    return log
