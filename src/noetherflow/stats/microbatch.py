"""Any model, BatchNorm included: statistics from micro-batch gradients (k backward passes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import batch_statistics
from noetherflow._errors import StatisticsError
from noetherflow._inputs import ModelInputs
from noetherflow.stats.reference import check_targets

__all__ = ["check_micro_batch_size", "microbatch_grads"]


def check_micro_batch_size(model: nn.Module, micro_batch_size: int) -> None:
    """Refuse micro-batches of one sample on a model that normalises by the batch.

    A training-mode BatchNorm (:func:`~noetherflow._checks.batch_statistics`) has no batch
    statistics on one sample. Checked where the estimator runs and, earlier, where a monitor
    or a teleporter is built with ``estimator="microbatch"``.
    """
    if micro_batch_size != 1:
        return
    coupled = next((n for n, mod in model.named_modules() if batch_statistics(mod)), None)
    if coupled is not None:
        raise StatisticsError(
            f"micro_batch_size=1 with BatchNorm in training mode (module {coupled!r}): a "
            "micro-batch of one has no batch statistics. Pass micro_batch_size >= 2."
        )


def microbatch_grads(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Any,
    targets: Any,
    *,
    micro_batch_size: int = 1,
    reduction: str = "mean",
) -> dict[nn.Parameter, Tensor]:
    """Pseudo per-sample gradients from micro-batches of size m.

    With ĝ_j the gradient of the mean loss of micro-batch j and ḡ their mean, returns
    p_j = ḡ + √m (ĝ_j − ḡ): the p_j have mean ḡ and covariance m·Cov(ĝ), which estimates the
    per-sample Σ (Cov(ĝ) = Σ/m for independent samples). With m = 1 the p_j are exactly the
    per-sample gradients. Under BatchNorm in training mode the micro-batch is the sample unit
    and the estimate includes its coupling; running statistics are restored afterwards.

    ``inputs``: a tensor, a tuple of positional inputs or a dict of keyword inputs (tensors
    whose dim 0 is the batch size are sliced, others passed unchanged; see
    :class:`noetherflow._inputs.ModelInputs`); ``targets``: a tensor with the samples on dim 0,
    or None (``loss_fn(outputs, None)``, e.g. labels among the keyword inputs).
    """
    inp = ModelInputs.of(inputs, "collect_stats")
    n = inp.batch_size("collect_stats")
    check_targets(targets, n, "microbatch")
    m = micro_batch_size
    if m < 1 or n % m != 0 or n // m < 2:
        raise StatisticsError(
            f"micro_batch_size={m} does not split a batch of {n} into at least 2 equal "
            "micro-batches; pass a divisor of the batch size that is at most half of it."
        )
    check_micro_batch_size(model, m)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    grads: list[tuple[Tensor, ...]] = []
    try:
        for s in range(0, n, m):
            try:
                out = inp.slice(s, s + m, n)(model)
            except RuntimeError as exc:
                hint = inp.dtype_hint(exc)
                if hint is None:
                    raise
                raise StatisticsError(f"collect_stats(estimator='microbatch'): {hint}") from exc
            loss = loss_fn(out, None if targets is None else targets[s : s + m])
            if reduction == "sum":
                loss = loss / m
            grads.append(torch.autograd.grad(loss, params, allow_unused=True))
    finally:
        bufs = {k for k, _ in model.named_buffers()}
        model.load_state_dict({k: v for k, v in saved.items() if k in bufs}, strict=False)
    out_d: dict[nn.Parameter, Tensor] = {}
    for i, p in enumerate(params):
        stack = torch.stack(
            [g[i] if g[i] is not None else torch.zeros_like(p) for g in grads]
        ).detach()
        mean = stack.mean(0, keepdim=True)
        out_d[p] = mean + (m**0.5) * (stack - mean)
    return out_d
