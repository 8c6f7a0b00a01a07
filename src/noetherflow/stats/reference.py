"""Ground truth: exact per-sample gradients with torch.func (functional_call + vmap(grad))."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from noetherflow._errors import StatisticsError

__all__ = ["per_sample_grads", "per_sample_grads_and_losses"]

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


def per_sample_grads_and_losses(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Tensor | tuple[Tensor, ...],
    targets: Any,
    *,
    chunk_size: int | None = None,
) -> tuple[dict[nn.Parameter, Tensor], Tensor]:
    """Per-sample gradients and losses of ℓ_n = ``loss_fn(model(x_n), y_n)`` (a batch of one).

    The package's one per-sample reference (``torch.func``: ``functional_call`` +
    ``vmap(grad_and_value)``): ``collect_stats(..., estimator="reference")`` and the SGF
    integrator :func:`noetherflow.train.run_sgf` both use it. Parameters not in ``params``
    and the buffers are held fixed.

    Args:
        model: any module without cross-sample coupling (no BatchNorm in training mode).
        params: the parameters to differentiate (a subset of ``model.parameters()``).
        loss_fn: ``loss_fn(outputs, targets)`` → 0-dim loss of one sample.
        inputs: the batch, samples along dim 0 (a tensor or a tuple of tensors).
        targets: tensor with the batch on dim 0.
        chunk_size: vmap chunk size (bounds the memory of the N gradient copies).

    Returns:
        ``(grads, losses)``: one tensor of shape ``[N, *p.shape]`` per parameter of
        ``params``, and the per-sample losses, shape ``[N]``.
    """
    check_no_train_batchnorm(model, "reference")
    if not isinstance(targets, Tensor):
        raise StatisticsError(
            f"targets is a {type(targets).__name__}; expected a tensor with the batch on dim 0."
        )
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise StatisticsError(
            f"params[{missing[0]}] is not a parameter of the model; pass parameters from "
            "model.parameters()."
        )
    wanted = {names[id(p)]: p for p in params}
    others = {n: p.detach() for n, p in model.named_parameters() if n not in wanted}
    buffers = dict(model.named_buffers())
    xs = inputs if isinstance(inputs, tuple) else (inputs,)

    def one(pd: dict[str, Tensor], x: tuple[Tensor, ...], y: Tensor) -> Tensor:
        xb = tuple(v.unsqueeze(0) for v in x)
        out = functional_call(model, ({**pd, **others}, buffers), xb)
        return loss_fn(out, y.unsqueeze(0))

    detached = {k: p.detach() for k, p in wanted.items()}
    fn = vmap(grad_and_value(one), in_dims=(None, 0, 0), chunk_size=chunk_size)
    g, losses = fn(detached, xs, targets)
    return {p: g[k] for k, p in wanted.items()}, losses


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

    Returns one tensor ``[N, *p.shape]`` per parameter in ``params``
    (:func:`per_sample_grads_and_losses` without the losses). Works for any model without
    cross-sample coupling (no BatchNorm in training mode).
    """
    grads, _ = per_sample_grads_and_losses(
        model, params, loss_fn, inputs, targets, chunk_size=chunk_size
    )
    return grads
