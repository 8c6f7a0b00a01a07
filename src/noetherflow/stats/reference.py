"""Ground truth: exact per-sample gradients with torch.func (functional_call + vmap(grad))."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from noetherflow._errors import StatisticsError

__all__ = ["per_sample_grads"]

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def check_no_train_batchnorm(model: nn.Module, estimator: str) -> None:
    for name, m in model.named_modules():
        if isinstance(m, _BN) and m.training:
            raise StatisticsError(
                f"Module {name!r} is BatchNorm in training mode: it couples the samples of a "
                f"batch, so per-sample gradients are undefined and estimator={estimator!r} "
                "cannot be used. Use estimator='microbatch' (statistics of micro-batch "
                "gradients) or put the model in eval mode."
            )


def per_sample_grads(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Tensor | tuple[Tensor, ...],
    targets: Any,
    *,
    chunk_size: int | None = None,
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients of ℓ_n = ``loss_fn(model(x_n), y_n)`` on a batch of one.

    Returns one tensor ``[N, *p.shape]`` per parameter in ``params``. Works for any model
    without cross-sample coupling (no BatchNorm in training mode).
    """
    check_no_train_batchnorm(model, "reference")
    names = {id(p): n for n, p in model.named_parameters()}
    wanted = {names[id(p)]: p for p in params}
    others = {n: p.detach() for n, p in model.named_parameters() if n not in wanted}
    buffers = dict(model.named_buffers())
    xs = inputs if isinstance(inputs, tuple) else (inputs,)

    def one(pd: dict[str, Tensor], x: tuple[Tensor, ...], y: Any) -> Tensor:
        xb = tuple(v.unsqueeze(0) for v in x)
        yb = y.unsqueeze(0) if isinstance(y, Tensor) else y
        out = functional_call(model, ({**pd, **others}, buffers), xb)
        return loss_fn(out, yb)

    detached = {k: p.detach() for k, p in wanted.items()}
    g = vmap(grad(one), in_dims=(None, 0, 0), chunk_size=chunk_size)(detached, xs, targets)
    if not isinstance(targets, Tensor):  # pragma: no cover - defensive
        raise StatisticsError("targets must be a tensor with the batch on dim 0.")
    return {p: g[k] for k, p in wanted.items()}
