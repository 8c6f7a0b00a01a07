"""Ground truth: exact per-sample gradients with torch.func (functional_call + vmap(grad))."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from noetherflow._checks import batch_statistics
from noetherflow._errors import StatisticsError, UnsupportedLayerError
from noetherflow._inputs import ModelInputs

__all__ = ["per_sample_grads", "per_sample_grads_and_losses"]


def check_no_train_batchnorm(model: nn.Module, estimator: str) -> None:
    """Refuse a model with a BatchNorm that normalises by the batch (:func:`batch_statistics`)."""
    for name, m in model.named_modules():
        if batch_statistics(m) is None:
            continue
        what, fix = (
            ("in training mode", "put the model in eval mode")
            if m.training
            else ("without running statistics", "keep track_running_stats=True")
        )
        raise UnsupportedLayerError(
            f"Module {name!r} is BatchNorm {what}: it normalises by the statistics of the "
            f"batch, which couple its samples, so per-sample gradients are undefined and "
            f"estimator={estimator!r} cannot be used. Use estimator='microbatch' (statistics of "
            f"micro-batch gradients) or {fix}."
        )


def check_targets(targets: Any, n: int, estimator: str) -> None:
    """``targets`` is a tensor with ``n`` samples on dim 0, or None (loss from the outputs)."""
    if targets is None:
        return
    if not isinstance(targets, Tensor) or targets.ndim == 0 or targets.shape[0] != n:
        got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
        raise StatisticsError(
            f"estimator={estimator!r} splits the batch into samples, but targets is {got}; "
            f"expected a tensor with the {n} samples of the inputs on dim 0, or None when "
            "loss_fn computes the loss from the outputs alone (e.g. labels passed in the "
            "keyword inputs and loss_fn=lambda out, _: out.loss)."
        )


def per_sample_grads_and_losses(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Any,
    targets: Any,
    *,
    chunk_size: int | None = None,
) -> tuple[dict[nn.Parameter, Tensor], Tensor]:
    """Per-sample gradients and losses of ℓ_n = ``loss_fn(model(x_n), y_n)`` (a batch of one).

    The package's one per-sample reference (``torch.func``: ``functional_call`` +
    ``vmap(grad_and_value)``): ``collect_stats(..., estimator="reference")`` and the SGF
    integrator :func:`noetherflow.train.run_sgf` both use it. Parameters not in ``params``
    and the buffers are held fixed.

    ``inputs``: a tensor, a tuple of positional inputs or a dict of keyword inputs (see
    :class:`noetherflow._inputs.ModelInputs`: tensors whose dim 0 is the batch size are split
    into samples, others passed unchanged). Integer inputs (token ids) need no gradient.
    ``targets``: a tensor with the samples on dim 0, or None (``loss_fn(outputs, None)``).
    Random operations (dropout in training mode) draw independently for every sample, as in
    a batched forward pass (``vmap(randomness="different")``). A model that branches on the
    values of its inputs, which ``vmap`` cannot run (Hugging Face models given an
    ``attention_mask`` check whether it masks anything), gets the same exact per-sample
    gradients from a loop of N backward passes on batches of one.

    Returns ``(grads, losses)``: one tensor ``[N, *p.shape]`` per parameter in ``params`` and
    the per-sample losses ``[N]``. Works for any model without cross-sample coupling (no
    BatchNorm in training mode).
    """
    check_no_train_batchnorm(model, "reference")
    inp = ModelInputs.of(inputs, "collect_stats")
    n = inp.batch_size("collect_stats")
    check_targets(targets, n, "reference")
    names = {id(p): k for k, p in model.named_parameters()}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise StatisticsError(
            f"params[{missing[0]}] is not a parameter of the model; pass parameters from "
            "model.parameters()."
        )
    wanted = {names[id(p)]: p for p in params}
    others = {k: p.detach() for k, p in model.named_parameters() if k not in wanted}
    buffers = dict(model.named_buffers())
    dims = inp.in_dims(n)

    def one(pd: dict[str, Tensor], args: tuple[Any, ...], kwargs: dict[str, Any], y: Any) -> Tensor:
        xb = ModelInputs(args, kwargs).unsqueezed(dims)
        yb = y.unsqueeze(0) if isinstance(y, Tensor) else y
        out = functional_call(model, ({**pd, **others}, buffers), xb.args, xb.kwargs)
        return loss_fn(out, yb)

    detached = {k: p.detach() for k, p in wanted.items()}
    in_dims = (None, dims[0], dims[1], None if targets is None else 0)
    try:
        g, losses = vmap(
            grad_and_value(one), in_dims=in_dims, chunk_size=chunk_size, randomness="different"
        )(detached, inp.args, inp.kwargs, targets)
    except RuntimeError as exc:
        hint = inp.dtype_hint(exc)
        if hint is not None:
            raise StatisticsError(f"collect_stats(estimator='reference'): {hint}") from exc
        if not vmap_cannot_run(exc):
            raise
        return _loop(model, params, loss_fn, inp, targets, n)
    return {p: g[k] for k, p in wanted.items()}, losses


def per_sample_grads(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Any,
    targets: Any,
    *,
    chunk_size: int | None = None,
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients ``[N, *p.shape]`` (:func:`per_sample_grads_and_losses`, no losses)."""
    grads, _ = per_sample_grads_and_losses(
        model, params, loss_fn, inputs, targets, chunk_size=chunk_size
    )
    return grads


def vmap_cannot_run(exc: RuntimeError) -> bool:
    """Whether ``exc`` says vmap cannot run a model whose per-sample gradients exist.

    vmap's error for ``.item()``/``bool()`` on a batched tensor (data-dependent control
    flow), or its refusal of running statistics updated in place (a training-mode
    InstanceNorm with ``track_running_stats`` normalises each sample by its own statistics
    but updates shared buffers): a loop of single-sample passes gives the same gradients.
    """
    msg = str(exc)
    return any(
        m in msg
        for m in (
            "data-dependent control flow",
            "calling .item() on a Tensor",
            "will be updated in place",
        )
    )


def _loop(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inp: ModelInputs,
    targets: Any,
    n: int,
) -> tuple[dict[nn.Parameter, Tensor], Tensor]:
    """Per-sample gradients ``[N, *p.shape]`` and losses ``[N]``, one backward per sample."""
    rows: list[Sequence[Tensor | None]] = []
    losses: list[Tensor] = []
    with buffers_kept(model):
        for i in range(n):
            out = inp.slice(i, i + 1, n)(model)
            loss = loss_fn(out, None if targets is None else targets[i : i + 1])
            rows.append(torch.autograd.grad(loss, params, allow_unused=True))
            losses.append(loss.detach().reshape(()))
    return stack_rows(params, rows), torch.stack(losses)


@contextmanager
def buffers_kept(model: nn.Module) -> Iterator[None]:
    """The model's buffers (BatchNorm running statistics) put back as they were on exit."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)


def stack_rows(
    params: Sequence[nn.Parameter], rows: Sequence[Sequence[Tensor | None]]
) -> dict[nn.Parameter, Tensor]:
    """Per-sample gradients ``[N, *p.shape]`` from one row of gradients per sample.

    A ``None`` (a parameter the sample's loss does not reach) is a zero gradient.
    """

    def grad(p: nn.Parameter, g: Tensor | None) -> Tensor:
        return torch.zeros_like(p) if g is None else g.detach()

    return {p: torch.stack([grad(p, r[j]) for r in rows]) for j, p in enumerate(params)}
