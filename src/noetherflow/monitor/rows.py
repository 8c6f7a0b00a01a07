"""Filling one row: charge-shaped values, distances, conversion to numpy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from noetherflow.kernels import kernel_for
from noetherflow.monitor.distance import DistanceResult
from noetherflow.monitor.options import SharpnessOptions
from noetherflow.stats.core import Reduction
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["put_distance", "put_sharpness", "put_values", "to_numpy"]

Row = dict[str, np.ndarray]


def to_numpy(t: Tensor) -> np.ndarray:
    """A tensor as a float64 numpy array on the CPU."""
    return np.asarray(t.detach().to("cpu", torch.float64).numpy())


def put_values(
    row: Row,
    kind: str,
    vals: Mapping[str, Tensor],
    syms: SymmetrySet,
    keys: Mapping[str, str],
    schema: Mapping[str, tuple[int, ...]],
) -> None:
    """Charge-shaped ``vals`` (per symmetry name) into ``row`` as ``<kind>/<key>``.

    Matrix-valued families (rotations) are written as the kernel's record (the Frobenius
    norm), and as ``<kind>_matrix/<key>`` too when the schema has that key.
    """
    for name, s in syms.items():
        v, key = vals[name].detach(), keys[name]
        k = kernel_for(s)
        if k.matrix_valued:
            row[f"{kind}/{key}"] = to_numpy(k.record(v))
            if f"{kind}_matrix/{key}" in schema:
                row[f"{kind}_matrix/{key}"] = to_numpy(v)
        else:
            row[f"{kind}/{key}"] = to_numpy(v).reshape(schema[f"{kind}/{key}"])


def put_distance(
    row: Row,
    res: DistanceResult,
    syms: SymmetrySet,
    keys: Mapping[str, str],
    schema: Mapping[str, tuple[int, ...]],
) -> None:
    """``distance/<key>``, ``at_infinity/<key>`` and how they were found, from ``res``.

    ``distance_exact`` (1: a converged full solve), ``distance_converged`` (0: provisional,
    a coupled solve spread over records that has not converged yet), ``distance_residual``
    (its largest relative flow; NaN on incremental rows) and ``distance_sweeps``.
    """
    for name in syms.names:
        key = keys[name]
        row[f"distance/{key}"] = to_numpy(res.distance[name]).reshape(schema[f"distance/{key}"])
        row[f"at_infinity/{key}"] = np.asarray(0.0)
    for rep in res.at_infinity:  # each family's kernel marks its part at infinity
        key = keys[rep.name]
        d, count = kernel_for(syms[rep.name]).mark_infinity(res.distance[rep.name], rep)
        row[f"distance/{key}"] = to_numpy(d).reshape(schema[f"distance/{key}"])
        row[f"at_infinity/{key}"] = np.asarray(float(count))
    row["distance_exact"] = np.asarray(1.0 if res.exact else 0.0)
    row["distance_converged"] = np.asarray(1.0 if res.converged else 0.0)
    row["distance_residual"] = np.asarray(float(res.residual))
    row["distance_sweeps"] = np.asarray(float(res.sweeps))


def put_sharpness(
    row: Row,
    sh: SharpnessOptions,
    model: nn.Module,
    loss_fn: Callable[..., Tensor],
    inputs: Any,
    targets: Any,
    reduction: Reduction,
    all_reduce: bool,
) -> None:
    """The Hessian trace (and its standard error) and top eigenvalue on ``inputs``, in ``row``."""
    from noetherflow.sharpness import sharpness as measure

    if inputs is None:  # targets may be None: a loss_fn reading labels among the inputs
        raise ValueError(
            "NoetherMonitor(sharpness=...) needs a batch: pass probe=(x, y) to the monitor or "
            "mon.step(loss, inputs=x, targets=y)."
        )
    res = measure(
        model,
        loss_fn,
        inputs,
        targets,
        n_samples=sh.n_samples,
        max_iter=sh.max_iter,
        tol=sh.tol,
        seed=sh.seed,
        method=sh.method,
        reduction=reduction,
        all_reduce=all_reduce,
    )
    row["sharpness/trace"] = np.asarray(res.trace.value)
    row["sharpness/trace_se"] = np.asarray(res.trace.std_error)
    row["sharpness/top_eigenvalue"] = np.asarray(res.top.value)
