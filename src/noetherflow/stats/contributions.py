"""Exact per-sample gradients of a loss that does not split into per-sample losses.

A batch loss L = ``loss_fn(model(x), y)`` is often not the mean of per-sample losses
``loss_fn(model(x_i), y_i)``: cross-entropy with ``ignore_index`` (padding) and
``reduction="mean"`` is the mean over the non-ignored *tokens* of the batch, with class
weights the weighted mean Σ w_t ℓ_t / Σ w_t over the batch. The per-sample gradient is then
defined by the share of L that flows through sample i's output o_i:

    g_i = c · J_iᵀ ∂L/∂o_i,        c = N (``reduction="mean"``) or 1 (``"sum"``),

with J_i = ∂o_i/∂θ, so that (1/N) Σ_i g_i = ∇L (mean) or Σ_i g_i = ∇L (sum): the batch
gradient, whatever the loss. It is what the hooks estimator measures (the output-gradients
of the batch's own backward pass), and for a loss that is the mean (sum) of per-sample
losses it is the per-sample gradient ∇ℓ_i itself. Two passes: the batch of per-sample
outputs and the cotangents ∂L/∂o_i, then one vector–Jacobian product per sample
(``torch.func``: ``vmap(vjp)``), both with the same random state (dropout draws the same
masks in both). When ``loss_fn`` returns one loss per sample (labels among the keyword
inputs, the loss computed inside the model), L is their mean (sum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch.utils import _pytree as pytree

from noetherflow._errors import StatisticsError
from noetherflow._inputs import ModelInputs
from noetherflow.stats.reference import (
    buffers_kept,
    check_no_train_batchnorm,
    check_targets,
    per_sample_grads,
    stack_rows,
    vmap_cannot_run,
)

__all__ = ["contributions_loop", "per_sample_contributions", "reference_shares"]


def _one_sample(t: Tensor) -> bool:
    """Whether a vmapped output ``[N, 1, ...]`` holds batches of one (not per-sample scalars)."""
    return t.ndim >= 2 and t.shape[1] == 1


def per_sample_contributions(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Any,
    targets: Any,
    *,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> dict[nn.Parameter, Tensor]:
    """g_i = c·J_iᵀ∂L/∂o_i of the module docstring, ``[N, *p.shape]`` per parameter.

    Same inputs as :func:`noetherflow.stats.reference.per_sample_grads` (which this
    equals for a loss that is the mean or sum of per-sample losses).
    """
    check_no_train_batchnorm(model, "reference")
    inp = ModelInputs.of(inputs, "collect_stats")
    n = inp.batch_size("collect_stats")
    check_targets(targets, n, "reference")
    names = {id(p): k for k, p in model.named_parameters()}
    wanted = {names[id(p)]: p for p in params}
    others = {k: p.detach() for k, p in model.named_parameters() if k not in wanted}
    buffers = dict(model.named_buffers())
    dims = inp.in_dims(n)
    detached = {k: p.detach() for k, p in wanted.items()}

    specs: list[Any] = []

    def fwd(pd: dict[str, Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The floating-point tensors of the outputs.

        vmap returns tensors only: a Hugging Face cache object is left out (None in the
        outputs ``loss_fn`` sees).
        """
        xb = ModelInputs(args, kwargs).unsqueezed(dims)
        out = functional_call(model, ({**pd, **others}, buffers), xb.args, xb.kwargs)
        flat, spec = pytree.tree_flatten(out)
        specs.append((spec, [isinstance(t, Tensor) and t.is_floating_point() for t in flat]))
        return [t for t in flat if isinstance(t, Tensor) and t.is_floating_point()]

    devices = sorted({p.device.index or 0 for p in params if p.is_cuda})
    with torch.random.fork_rng(devices=devices):  # pass 2 replays pass 1's random draws
        with torch.no_grad():
            outs = vmap(fwd, in_dims=(None, *dims), randomness="different")(
                detached, inp.args, inp.kwargs
            )
        spec, kept = specs[-1]
        ones = [_one_sample(t) for t in outs]
        live = [
            (t.flatten(0, 1) if o else t).detach().requires_grad_()
            for t, o in zip(outs, ones, strict=True)
        ]
        it = iter(live)
        leaves = [next(it) if k else None for k in kept]
        loss = loss_fn(pytree.tree_unflatten(leaves, spec), targets)
        loss = _batch_loss(loss, n, reduction, model, inp, loss_fn, targets)
        cots = torch.autograd.grad(loss, live, allow_unused=True)
    scale = float(n) if reduction == "mean" else 1.0
    cot = [
        torch.zeros_like(t) if c is None else c.detach() * scale
        for t, c in zip(live, cots, strict=True)
    ]

    def one(args: tuple[Any, ...], kwargs: dict[str, Any], cot_i: list[Tensor]) -> Any:
        pull = vjp(lambda pd: fwd(pd, args, kwargs), detached)[1]
        return pull([c.unsqueeze(0) if o else c for c, o in zip(cot_i, ones, strict=True)])[0]

    g = vmap(one, in_dims=(*dims, 0), chunk_size=chunk_size, randomness="different")(
        inp.args, inp.kwargs, cot
    )
    return {p: g[k] for k, p in wanted.items()}


def contributions_loop(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Any,
    targets: Any,
    *,
    reduction: str = "mean",
) -> dict[nn.Parameter, Tensor]:
    """:func:`per_sample_contributions` without ``vmap``: the same shares, sample by sample.

    For models that ``vmap`` cannot run (control flow on input values, e.g. Hugging Face's
    attention-mask checks). Each sample's forward alone gives o_i (as ``vmap`` would); the
    outputs stacked over the batch (a scalar per sample, e.g. a loss computed inside the
    model, becomes ``[N]``) go through ``loss_fn`` once for the cotangents ∂L/∂o_i; then
    g_i = c·J_iᵀ∂L/∂o_i by one backward per sample. Dropout draws each sample's masks once
    (the same in both halves): the shares are exact in any mode.
    """
    inp = ModelInputs.of(inputs, "collect_stats")
    n = inp.batch_size("collect_stats")
    with buffers_kept(model):
        per: list[list[Any]] = []
        spec: Any = None
        for i in range(n):
            flat, spec = pytree.tree_flatten(inp.slice(i, i + 1, n)(model))
            per.append(flat)
        kept = [isinstance(t, Tensor) and t.is_floating_point() for t in per[0]]
        live: list[Tensor] = []
        for j, k in enumerate(kept):
            if k:
                col = [f[j] for f in per]
                whole = torch.stack(col) if col[0].ndim == 0 else torch.cat(col, 0)
                live.append(whole.detach().requires_grad_())
        it = iter(live)
        out = pytree.tree_unflatten([next(it) if k else None for k in kept], spec)
        loss = _batch_loss(loss_fn(out, targets), n, reduction, model, inp, loss_fn, targets)
        cots = torch.autograd.grad(loss, live, allow_unused=True)
        scale = float(n) if reduction == "mean" else 1.0
        rows = []
        for i, flat in enumerate(per):
            outs = [t for t, k in zip(flat, kept, strict=True) if k]
            pairs = [
                (o, (c[i] if o.ndim == 0 else c[i : i + 1]).detach() * scale)
                for o, c in zip(outs, cots, strict=True)
                if c is not None and o.requires_grad
            ]
            rows.append(
                torch.autograd.grad(
                    [o for o, _ in pairs], params, [c for _, c in pairs], allow_unused=True
                )
            )
    return stack_rows(params, rows)


def _batch_loss(
    loss: Tensor,
    n: int,
    reduction: str,
    model: nn.Module,
    inp: ModelInputs,
    loss_fn: Any,
    targets: Any,
) -> Tensor:
    """The batch loss L from ``loss_fn``'s value.

    One loss per sample (``[N]``, computed inside the model) is checked
    (:func:`check_in_model_loss`) and reduced by ``reduction``.
    """
    if loss.ndim == 1 and loss.shape[0] == n:
        check_in_model_loss(model, inp, loss_fn, targets, loss, reduction)
        return loss.mean() if reduction == "mean" else loss.sum()
    return loss


def check_in_model_loss(
    model: nn.Module,
    inp: ModelInputs,
    loss_fn: Any,
    targets: Any,
    per_sample: Tensor,
    reduction: str,
) -> None:
    """Refuse a loss computed inside the model that is not the mean (sum) of per-sample losses.

    ``per_sample``: ``[N]`` losses of the samples run alone. Cross-entropy with padding
    (``ignore_index``) inside a Hugging Face model is a mean over the batch's tokens, so each
    sample's share cannot be read from its own loss; the shares need the logits. Checked
    against the batch's own loss (one forward), in eval mode or without dropout (random masks
    would differ between the two).
    """
    if model.training and any(
        isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()
    ):
        return
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        whole = loss_fn(inp(model), targets)
    want = per_sample.mean() if reduction == "mean" else per_sample.sum()
    if isinstance(whole, Tensor) and whole.numel() == 1:
        a, b = float(whole.detach()), float(want.detach())
        if abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-30):
            raise StatisticsError(
                f"reference estimator: the loss computed inside the model is not the {reduction} "
                f"of the samples' own losses (batch {a:.6g}, {reduction} of per-sample "
                f"{b:.6g}), e.g. cross-entropy over padded tokens (ignore_index) averaged over "
                "the batch's tokens: each sample's share is undefined from its own loss. Pass "
                "the labels as targets with a loss_fn on the logits (e.g. lambda out, y: "
                "F.cross_entropy(out.logits[:, :-1].flatten(0, 1), y[:, 1:].flatten(), "
                "ignore_index=-100)), or use estimator='hooks'."
            )


def reference_shares(
    model: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[Any, Any], Tensor],
    inp: ModelInputs,
    targets: Any,
    reduction: str,
    chunk_size: int | None,
) -> dict[nn.Parameter, Tensor]:
    """The reference per-sample gradients: each sample's share of the batch loss.

    :func:`per_sample_contributions` (the batch gradient is
    their mean for any loss, e.g. cross-entropy with ``ignore_index`` or class weights); a
    model that branches on its inputs' values (which ``vmap`` cannot run, e.g. Hugging Face's
    attention-mask checks) or updates running statistics (a training-mode InstanceNorm with
    ``track_running_stats``) gets the same shares from a loop, one backward per sample
    (:func:`contributions_loop`). ``reduction``: ``"mean"`` or ``"sum"``.
    """
    try:
        return per_sample_contributions(
            model, params, loss_fn, inp, targets, reduction=reduction, chunk_size=chunk_size
        )
    except RuntimeError as exc:  # the loop, or the dtype hint of the per-sample reference
        if inp.dtype_hint(exc) is not None:
            return per_sample_grads(model, params, loss_fn, inp, targets, chunk_size=chunk_size)
        if not vmap_cannot_run(exc):
            raise
    # vmap cannot run the model: the same shares, one backward per sample
    return contributions_loop(model, params, loss_fn, inp, targets, reduction=reduction)
