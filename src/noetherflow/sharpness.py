"""Sharpness of the loss: Hutchinson trace and top eigenvalue of the Hessian (torch.func).

Let H = ∇²L(θ) be the Hessian of the batch loss ``loss_fn(model(x), y)`` with respect to the
parameters. Nothing here forms H; every quantity uses Hessian-vector products

    Hv = ∂/∂ε ∇L(θ + εv) |_{ε=0}

computed by forward-over-reverse differentiation (``torch.func.jvp`` of ``torch.func.grad``
over ``torch.func.functional_call``), or reverse-over-reverse (``method="rev-rev"``, a
``torch.func.vjp`` of the gradient); ``method="auto"`` (default) tries the first and falls
back to the second where some layer has no forward-mode rule.

* :func:`hessian_trace` — Hutchinson: Tr H = E[vᵀHv] for Rademacher v (entries ±1); the
  estimate is the mean over ``n_samples`` vectors, with its standard error.
* :func:`top_eigenvalue` — power iteration v ← Hv/‖Hv‖ until the Rayleigh quotient vᵀHv
  changes by less than ``tol`` (relative). It finds the eigenvalue of largest *magnitude*,
  which is the top eigenvalue near a minimum (H ⪰ 0) and on the edge of stability.
* :func:`hessian` — the dense Hessian, ground truth for small models (tests).

Under ``torch.distributed`` with ``all_reduce=True`` the Hessian-vector products of all ranks
are combined (weighted by their batch sizes for ``reduction="mean"``), so every rank measures
the Hessian of the global batch loss; the random vectors come from a seeded generator and are
the same on every rank.

Buffers are passed as copies and norm layers in training mode normalise by batch statistics
without updating their running statistics, so the model is left unchanged. Dropout makes the
loss random — use ``model.eval()`` (or no dropout) for a deterministic Hessian.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp, vmap

from noetherflow._checks import parse_enum
from noetherflow._inputs import ModelInputs
from noetherflow._shard import refuse_sharded
from noetherflow.stats.core import Reduction, parse_reduction
from noetherflow.stats.distributed import is_distributed, unwrap_ddp

__all__ = [
    "EigenEstimate",
    "HVPMethod",
    "Sharpness",
    "TraceEstimate",
    "hessian",
    "hessian_trace",
    "hvp",
    "sharpness",
    "top_eigenvalue",
]

LossFn = Callable[[Any, Any], Tensor]


class HVPMethod(str, Enum):
    """How Hessian-vector products are differentiated."""

    AUTO = "auto"  # fwd-rev, falling back to rev-rev where a layer lacks forward-mode rules
    FWD_REV = "fwd-rev"  # jvp of grad: one forward-mode pass over the backward (fastest)
    REV_REV = "rev-rev"  # vjp of grad: double backward (any layer with a double-backward rule)


@dataclass(frozen=True)
class TraceEstimate:
    """Hutchinson estimate of Tr H: ``value`` ± ``std_error`` from ``n_samples`` vectors."""

    value: float
    std_error: float
    n_samples: int

    def __float__(self) -> float:
        return self.value


@dataclass(frozen=True)
class EigenEstimate:
    """Power-iteration estimate of the eigenvalue of H of largest magnitude.

    ``vector`` is the flat unit eigenvector estimate, ``[P]`` over the parameters in the
    order of ``model.named_parameters()`` (those requiring gradients).
    """

    value: float
    vector: Tensor
    iterations: int
    converged: bool

    def __float__(self) -> float:
        return self.value


@dataclass(frozen=True)
class Sharpness:
    """Both sharpness measures of one batch."""

    trace: TraceEstimate
    top: EigenEstimate


class _Problem:
    """The batch loss as a function of a flat parameter vector ``[P]``."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        inputs: Tensor | tuple[Tensor, ...] | Mapping[str, Any],
        targets: Any,
        params: Sequence[nn.Parameter] | None,
        reduction: Reduction,
        all_reduce: bool,
    ) -> None:
        model = unwrap_ddp(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if params is not None:
            wanted = {id(p) for p in params}
            named = [(n, p) for n, p in named if id(p) in wanted]
            if len(named) != len(wanted):
                raise ValueError(
                    f"Got {len(wanted)} parameters but only {len(named)} belong to the model; "
                    "pass parameters of this model (e.g. list(model.parameters()))."
                )
        if not named:
            raise ValueError("The model has no parameters that require gradients.")
        self.model = model
        self.loss_fn = loss_fn
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.theta = torch.cat([p.detach().reshape(-1) for _, p in named])
        chosen = set(self.names)
        self.others = {n: p.detach() for n, p in model.named_parameters() if n not in chosen}
        self.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        self.inp = ModelInputs.of(inputs, "sharpness")  # keyword inputs too (a dict batch)
        self.targets = targets
        self.n = self.inp.batch_size("sharpness", split=False)
        self.reduction = reduction
        self.all_reduce = all_reduce
        self.fwd_ok = True

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        parts = torch.split(flat, self.sizes)
        return {n: t.view(s) for n, t, s in zip(self.names, parts, self.shapes, strict=True)}

    def loss(self, flat: Tensor) -> Tensor:
        out = functional_call(
            self.model,
            ({**self.unflatten(flat), **self.others}, self.buffers),
            self.inp.args,
            self.inp.kwargs,
        )
        return self.loss_fn(out, self.targets)

    def hvp_local(self, v: Tensor, method: HVPMethod) -> Tensor:
        with _no_running_stats(self.model):
            if method is HVPMethod.AUTO:
                if self.fwd_ok:
                    try:
                        return self._hvp(v, HVPMethod.FWD_REV)
                    except (RuntimeError, NotImplementedError):
                        self.fwd_ok = False  # no forward-mode rule somewhere: double backward
                return self._hvp(v, HVPMethod.REV_REV)
            return self._hvp(v, method)

    def _hvp(self, v: Tensor, method: HVPMethod) -> Tensor:
        g = grad(self.loss)
        if method is HVPMethod.FWD_REV:
            return jvp(g, (self.theta,), (v,))[1]
        pull = vjp(g, self.theta)[1]
        (hv,) = pull(v)  # H is symmetric, so vᵀH = (Hv)ᵀ
        return hv

    def combine(self, hv: Tensor) -> Tensor:
        """The global-batch product from the local ones (weighted mean over ranks)."""
        if not self.all_reduce:
            return hv
        lead = hv.shape[:-1]
        if self.reduction is Reduction.MEAN:
            buf = torch.cat([hv.reshape(-1) * self.n, hv.new_tensor([float(self.n)])])
            dist.all_reduce(buf)
            return (buf[:-1] / buf[-1]).view(*lead, -1)
        out = hv.clone()
        dist.all_reduce(out)
        return out


def _problem(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: Tensor | tuple[Tensor, ...] | Mapping[str, Any],
    targets: Any,
    params: Sequence[nn.Parameter] | None,
    reduction: str | Reduction,
    all_reduce: bool | None,
) -> _Problem:
    refuse_sharded(
        model,
        "sharpness (Hessian-vector products)",
        "they differentiate the loss twice with the parameters as inputs, which FSDP gathers "
        "only inside its own forward and backward. Measure sharpness on an unsharded copy.",
    )
    red = parse_reduction(reduction)
    ar = is_distributed() if all_reduce is None else bool(all_reduce)
    return _Problem(model, loss_fn, inputs, targets, params, red, ar)


@contextlib.contextmanager
def _no_running_stats(model: nn.Module) -> Iterator[None]:
    """Norm layers in training mode normalise by batch statistics without updating buffers."""
    mods = [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.training and m.track_running_stats
    ]
    for m in mods:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in mods:
            m.track_running_stats = True


def _method(method: str | HVPMethod) -> HVPMethod:
    return parse_enum(
        HVPMethod,
        method,
        "method",
        "'auto', 'fwd-rev' or 'rev-rev' (use 'rev-rev' when a layer has no forward-mode "
        "derivative)",
    )


def _batched(prob: _Problem, vs: Tensor, method: HVPMethod, chunk_size: int) -> Tensor:
    """H v for each row of ``vs`` ``[k, P]`` → ``[k, P]`` (local, then combined over ranks)."""
    if chunk_size <= 1:
        out = torch.stack([prob.hvp_local(v, method) for v in vs])
    else:
        out = vmap(lambda v: prob.hvp_local(v, method), chunk_size=chunk_size)(vs)
    return prob.combine(out)


def hvp(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: Tensor | tuple[Tensor, ...] | Mapping[str, Any],
    targets: Any,
    vector: Tensor,
    *,
    params: Sequence[nn.Parameter] | None = None,
    method: str | HVPMethod = "auto",
    reduction: str | Reduction = "mean",
    all_reduce: bool | None = None,
) -> Tensor:
    """The Hessian-vector product Hv for a flat ``vector`` ``[P]``; returns ``[P]``.

    ``params`` (default: every parameter requiring gradients) fixes the coordinates, flattened
    in the order of ``model.named_parameters()``. ``reduction`` matters only with
    ``all_reduce``: ``"mean"`` weights the ranks by batch size, ``"sum"`` adds them.
    """
    if not isinstance(vector, Tensor):
        raise TypeError(
            f"hvp: vector is a {type(vector).__name__}; expected a flat tensor of the "
            "parameters' size (torch.cat([p.reshape(-1) for p in params]))."
        )
    prob = _problem(model, loss_fn, inputs, targets, params, reduction, all_reduce)
    v = vector.to(prob.theta).reshape(-1)
    if v.numel() != prob.theta.numel():
        raise ValueError(
            f"Shape mismatch: expected a flat vector of {prob.theta.numel()} entries (the "
            f"parameters {prob.names}), got {tuple(vector.shape)}."
        )
    return prob.combine(prob.hvp_local(v, _method(method)))


def hessian(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: Tensor | tuple[Tensor, ...] | Mapping[str, Any],
    targets: Any,
    *,
    params: Sequence[nn.Parameter] | None = None,
) -> Tensor:
    """The dense Hessian ``[P, P]`` (``torch.func.hessian``); for small models and tests only."""
    prob = _problem(model, loss_fn, inputs, targets, params, "mean", False)
    h: Tensor = torch.func.hessian(prob.loss)(prob.theta)
    return h


def _rademacher(k: int, p: int, seed: int, like: Tensor) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    v = torch.randint(0, 2, (k, p), generator=gen, dtype=torch.int8).to(like.dtype) * 2 - 1
    return v.to(like.device)


def hessian_trace(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: Tensor | tuple[Tensor, ...] | Mapping[str, Any],
    targets: Any,
    *,
    n_samples: int = 10,
    seed: int = 0,
    params: Sequence[nn.Parameter] | None = None,
    method: str | HVPMethod = "auto",
    chunk_size: int = 1,
    reduction: str | Reduction = "mean",
    all_reduce: bool | None = None,
) -> TraceEstimate:
    """Hutchinson estimate of Tr ∇²L with ``n_samples`` Rademacher vectors drawn from ``seed``.

    Tr H = E[vᵀHv] when E[vvᵀ] = I; with Rademacher v the variance per sample is
    2 Σ_{i≠j} H_ij² (no diagonal contribution). ``chunk_size > 1`` vectorises that many
    products with ``torch.func.vmap`` (faster, more memory).

    Example:
        Least squares ``L = mean (w·x + b − y)²`` has ``Tr H = 2 (E‖x‖² + 1)``:

        >>> import torch, noetherflow as nf
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Linear(4, 1).double()
        >>> x = torch.randn(256, 4, dtype=torch.float64)
        >>> y = torch.randn(256, 1, dtype=torch.float64)
        >>> est = nf.hessian_trace(net, torch.nn.functional.mse_loss, x, y, n_samples=50)
        >>> exact = 2 * (float(x.square().sum(1).mean()) + 1)
        >>> abs(est.value - exact) < 4 * est.std_error
        True
    """
    if n_samples < 1:
        raise ValueError(f"n_samples={n_samples} must be >= 1.")
    prob = _problem(model, loss_fn, inputs, targets, params, reduction, all_reduce)
    meth = _method(method)
    vals: list[Tensor] = []
    step = max(1, chunk_size)
    for start in range(0, n_samples, step):
        k = min(step, n_samples - start)
        # one generator stream per chunk: the vectors depend on (seed, n_samples), not chunking
        vs = torch.cat(
            [
                _rademacher(1, prob.theta.numel(), seed * 1_000_003 + start + i, prob.theta)
                for i in range(k)
            ]
        )
        hv = _batched(prob, vs, meth, chunk_size)
        vals.append((vs * hv).sum(-1).to(torch.float64))
    q = torch.cat(vals)
    se = float(q.std(unbiased=True) / math.sqrt(n_samples)) if n_samples > 1 else math.nan
    return TraceEstimate(float(q.mean()), se, n_samples)


def top_eigenvalue(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: Tensor | tuple[Tensor, ...] | Mapping[str, Any],
    targets: Any,
    *,
    max_iter: int = 100,
    tol: float = 1e-6,
    seed: int = 0,
    params: Sequence[nn.Parameter] | None = None,
    method: str | HVPMethod = "auto",
    reduction: str | Reduction = "mean",
    all_reduce: bool | None = None,
) -> EigenEstimate:
    """Eigenvalue of ∇²L of largest magnitude, by power iteration from a seeded random start.

    Stops when the Rayleigh quotient λ_k = v_kᵀHv_k satisfies |λ_k − λ_{k−1}| ≤ tol·|λ_k|, or
    after ``max_iter`` products (then ``converged=False``). Convergence is geometric with
    ratio |λ₂/λ₁|, so nearly degenerate top eigenvalues need a looser ``tol``.
    """
    if max_iter < 1:
        raise ValueError(f"max_iter={max_iter} must be >= 1.")
    prob = _problem(model, loss_fn, inputs, targets, params, reduction, all_reduce)
    meth = _method(method)
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(prob.theta.numel(), generator=gen, dtype=torch.float64)
    v = (v / v.norm()).to(prob.theta)
    lam_prev = math.nan
    lam = 0.0
    for it in range(1, max_iter + 1):
        hv = prob.combine(prob.hvp_local(v, meth))
        lam = float((v * hv).sum())
        norm = hv.norm()
        if not torch.isfinite(norm) or float(norm) == 0.0:
            return EigenEstimate(lam, v, it, bool(float(norm) == 0.0))
        v = hv / norm
        if it > 1 and abs(lam - lam_prev) <= tol * abs(lam):
            return EigenEstimate(lam, v, it, True)
        lam_prev = lam
    return EigenEstimate(lam, v, max_iter, False)


def sharpness(
    model: nn.Module,
    loss_fn: LossFn,
    inputs: Tensor | tuple[Tensor, ...] | Mapping[str, Any],
    targets: Any,
    *,
    n_samples: int = 10,
    max_iter: int = 20,
    tol: float = 1e-3,
    seed: int = 0,
    params: Sequence[nn.Parameter] | None = None,
    method: str | HVPMethod = "auto",
    reduction: str | Reduction = "mean",
    all_reduce: bool | None = None,
) -> Sharpness:
    """Hutchinson trace and top eigenvalue of the Hessian on one batch (monitor defaults)."""
    kw: dict[str, Any] = dict(
        params=params, method=method, reduction=reduction, all_reduce=all_reduce, seed=seed
    )
    tr = hessian_trace(model, loss_fn, inputs, targets, n_samples=n_samples, **kw)
    top = top_eigenvalue(model, loss_fn, inputs, targets, max_iter=max_iter, tol=tol, **kw)
    return Sharpness(tr, top)
