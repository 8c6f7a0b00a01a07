"""Plumbing: hooks that capture layer inputs and output-gradients, and ``collect_stats``.

Forward hooks save each layer's input and register a tensor hook on its output (full
backward hooks break after in-place activations). Which layer types are understood is the
registry of :mod:`.registry`; the formulas live in :mod:`.layers`; which statistics each
symmetry family needs is decided by its kernel (:mod:`noetherflow.kernels`), which reads
them through the :class:`~noetherflow.kernels.base.GradSource` interface implemented here
for the factors a/g (and by :class:`~noetherflow.kernels.base.SampleSource` for per-sample
gradients).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import parse_enum
from noetherflow._errors import StatisticsError, UnsupportedLayerError
from noetherflow._inputs import ModelInputs
from noetherflow.kernels.base import GradSource, assemble
from noetherflow.stats import layers as formulas
from noetherflow.stats.core import (
    Estimator,
    GradStats,
    Level,
    Reduction,
    axis_sum,
    check_batch,
    parse_level,
    parse_reduction,
)
from noetherflow.stats.distributed import all_reduce_stats, is_distributed, unwrap_ddp
from noetherflow.stats.fsdp import check_not_sharded
from noetherflow.stats.microbatch import microbatch_grads
from noetherflow.stats.reference import check_no_train_batchnorm, per_sample_grads
from noetherflow.stats.registry import LayerHandler, handler_for, registered_layers
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["Capture", "capture", "collect_stats"]


@dataclass
class _Record:
    module: nn.Module
    name: str
    handler: LayerHandler
    a: Tensor | None = None
    g: Tensor | None = None
    calls: int = 0
    handles: list[Any] = field(default_factory=list)


class _FactorSource(GradSource):
    """Gradient statistics from the captured layer factors (a ``[N, T, I]``, g ``[N, T, O]``).

    Per-sample output-gradients of ℓ_n are ``sc``·g (N·g for a batch-mean loss); the
    formulas apply the factor to their smallest operand.
    """

    def __init__(
        self,
        n: int,
        factors: Mapping[int, tuple[Tensor, Tensor]],
        owners: Mapping[int, tuple[_Record, str]],
        sc: float,
        known: Mapping[nn.Parameter, Tensor],
        check_known: bool,
    ) -> None:
        self.n = n
        self._facs, self._owners, self._sc = factors, owners, sc
        self._known, self._check_known = known, check_known
        self._samples: dict[nn.Parameter, Tensor] = {}
        self._gaps: list[tuple[_Record, str, Tensor]] = []
        self._checked: set[int] = set()

    def verify_means(self) -> None:
        """Raise if a known mean disagreed with the hooks' (one device sync for all layers)."""
        if not self._gaps:
            return
        gaps = torch.stack([gp.to(torch.float64) for _, _, gp in self._gaps]).cpu()
        for (rec, role, _), (diff, scale) in zip(self._gaps, gaps.tolist(), strict=True):
            tol = _PROBE_TOL.get(self._facs[id(rec.module)][0].dtype, 1e-2)
            if diff > tol * scale and diff > 1e-30:
                _raise_mean_gap(rec.name, role, self._sc, diff / max(scale, 1e-300))

    def _layer(self, p: nn.Parameter) -> tuple[_Record, str, Tensor, Tensor]:
        rec, role = self._owners[id(p)]
        a, g = self._facs[id(rec.module)]
        return rec, role, a, g

    def has_samples(self, p: nn.Parameter) -> bool:
        return p in self._samples

    def samples(self, p: nn.Parameter) -> Tensor:
        if p not in self._samples:
            rec, role, a, g = self._layer(p)
            if role == "weight" and rec.handler.elementwise:
                ps = (g * a).sum(1).mul_(self._sc).reshape(self.n, *p.shape)
            elif role == "weight":
                ps = rec.handler.to_param(
                    formulas.per_sample_weight(a, g, scale=self._sc), tuple(p.shape)
                )
            else:
                ps = g.sum(1).mul_(self._sc).reshape(self.n, *p.shape)
            self._samples[p] = ps
        return self._samples[p]

    def _small(self, p: nn.Parameter) -> bool:
        """Per-sample gradients of an elementwise layer are ``[N, O]``: reduce them directly."""
        return self._owners[id(p)][0].handler.elementwise

    def mean(self, p: nn.Parameter) -> Tensor:
        if p in self._samples or self._small(p):  # reductions are cheaper than matmuls
            return self.samples(p).mean(0)
        rec, role, a, g = self._layer(p)
        known = self._known.get(p)
        if known is not None:
            # one check per layer: the weight's when it is known, else the bias's
            w = getattr(rec.module, "weight", None)
            first = role == "weight" or not (isinstance(w, nn.Parameter) and w in self._known)
            if self._check_known and first and id(rec.module) not in self._checked:
                self._checked.add(id(rec.module))
                self._gaps.append((rec, role, _mean_gap(rec, role, a, g, self._sc, known)))
            return known.reshape(p.shape)
        if role == "weight":
            return rec.handler.to_param(formulas.weight_mean(a, g, scale=self._sc), tuple(p.shape))
        return formulas.bias_mean(g, scale=self._sc).reshape(p.shape)

    def sq(self, p: nn.Parameter) -> Tensor:
        if p in self._samples or self._small(p):
            return self.samples(p).square().mean(0)
        rec, role, a, g = self._layer(p)
        if role == "weight":
            return rec.handler.to_param(formulas.weight_sq(a, g, scale=self._sc), tuple(p.shape))
        return formulas.bias_sq(g, scale=self._sc).reshape(p.shape)

    def axis_sq(
        self, want: Mapping[nn.Parameter, tuple[int, ...]]
    ) -> dict[tuple[nn.Parameter, int], Tensor]:
        """Per-neuron sums, layer by layer (the squares of a and g formed once per layer)."""
        out: dict[tuple[nn.Parameter, int], Tensor] = {}
        layers: dict[int, _Record] = {}
        for p in want:
            rec, _ = self._owners[id(p)]
            layers.setdefault(id(rec.module), rec)
        for rec in layers.values():
            mod, h = rec.module, rec.handler
            w, b = getattr(mod, "weight", None), getattr(mod, "bias", None)
            axes = want.get(w, ()) if isinstance(w, nn.Parameter) else ()
            has_b = isinstance(b, nn.Parameter) and b in want
            a, g = self._facs[id(mod)]
            if h.elementwise:
                wsum = {ax: axis_sum(self.sq(w), ax) for ax in axes}  # type: ignore[arg-type]
                bs = self.sq(b) if has_b else None  # type: ignore[arg-type]
            elif h.matrix:
                fac = tuple(h.factor_axis(ax) for ax in axes)
                ws, bs = formulas.neuron_sums(a, g, fac, bias=has_b, scale=self._sc)
                wsum = {ax: ws[h.factor_axis(ax)] for ax in axes}
            else:  # the factor's input axis mixes channels and kernel taps
                assert isinstance(w, nn.Parameter)
                full = h.to_param(formulas.weight_sq(a, g, scale=self._sc), tuple(w.shape))
                wsum = {ax: axis_sum(full, ax) for ax in axes}
                bs = formulas.bias_sq(g, scale=self._sc) if has_b else None
            for ax, v in wsum.items():
                out[(w, ax)] = v  # type: ignore[index]
            if bs is not None:
                out[(b, 0)] = bs  # type: ignore[index]
        return out

    def front_moment(self, p: nn.Parameter, axis: int, start: int, stop: int) -> Tensor:
        rec, role, a, g = self._layer(p)
        h = rec.handler
        if h.elementwise:
            v = self.samples(p)
            f = v.movedim(axis + 1, 1)[:, start:stop].reshape(v.shape[0], stop - start, -1)
            return torch.einsum("ndm,nem->de", f, f) / f.shape[0]
        if not h.matrix:
            raise UnsupportedLayerError(
                f"estimator='hooks' computes rotation statistics for Linear-like layers only; "
                f"{rec.name!r} is {type(rec.module).__name__}. Use estimator='reference'."
            )
        sl = slice(start, stop)
        if role == "bias":
            return formulas.row_moment(a, g, sl, bias=True, scale=self._sc)
        if h.factor_axis(axis) == 0:
            return formulas.row_moment(a, g, sl, scale=self._sc)
        return formulas.col_moment(a, g, sl, scale=self._sc)


_PROBE_TOL = {torch.float64: 1e-8, torch.float32: 1e-3}
_PROBES: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}


def _probe(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A fixed random vector ``[size]`` (cached): the projection of the mean check."""
    key = (size, dtype, device)
    if key not in _PROBES:
        gen = torch.Generator(device="cpu").manual_seed(0)
        v = torch.randn(size, generator=gen, dtype=torch.float64)
        _PROBES[key] = v.to(device=device, dtype=dtype)
    return _PROBES[key]


def _mean_gap(rec: _Record, role: str, a: Tensor, g: Tensor, sc: float, known: Tensor) -> Tensor:
    """(‖auto − hooks‖, round-off scale) of a random projection of the mean gradient. ``[2]``.

    autograd's mean gradient and the hooks' differ when ``loss_fn`` adds a term that is not
    a per-sample loss (an L2 penalty, an auxiliary loss on the parameters): the hooks do not
    see it. The scale is that of the per-sample projections (1/N)Σ_n|p_n| (not of their mean,
    which cancels at a minimum). The projection costs O(N·T·(I+O) + O·I), no matmul over the
    batch.
    """
    n = a.shape[0]
    if role == "weight":
        v = _probe(a.shape[-1], a.dtype, a.device)
        # per-sample projections / scale; grouped factors [N, T, G, ·] give [N, G·O]
        per = (g * (a @ v).unsqueeze(-1)).sum(1).reshape(n, -1)
        auto = rec.handler.to_matrix(known) @ v
    else:
        per = g.sum(1).reshape(n, -1)
        auto = known.reshape(-1)
    c = sc / n
    hook = per.sum(0).mul_(c)
    return torch.stack(
        [
            torch.linalg.vector_norm(auto - hook),
            torch.linalg.vector_norm(per.abs().sum(0).mul_(c)) + torch.linalg.vector_norm(auto),
        ]
    )


def _raise_mean_gap(name: str, role: str, sc: float, gap: float) -> None:
    raise StatisticsError(
        f"The gradient of loss_fn on layer {name!r} ({role}) is not the "
        f"{'mean' if sc != 1.0 else 'sum'} of per-sample gradients (relative difference "
        f"{gap:.3g}): loss_fn adds a term that is not a per-sample loss, e.g. an L2 penalty, "
        "or the layer's parameter is used elsewhere too. Keep loss_fn the data loss and pass "
        "weight decay as weight_decay=γ to the flow and solver (γ of γ‖θ‖²); pass "
        "check_loss=False to skip this check."
    )


def _forward(model: nn.Module, inp: ModelInputs) -> Any:
    """``model(*args, **kwargs)``; a torch dtype error on the inputs becomes a StatisticsError."""
    try:
        return inp(model)
    except RuntimeError as e:
        hint = inp.dtype_hint(e)
        if hint is None:
            raise
        raise StatisticsError(f"The model's forward failed ({e}): {hint}") from e


def _guard_loss(
    loss_fn: Callable[[Any, Any], Tensor], targets: Any
) -> Callable[[Any, Any], Tensor]:
    """``loss_fn``; with ``targets=None``, its failure becomes an error saying what to pass."""
    if targets is not None:
        return loss_fn

    def call(out: Any, y: Any) -> Tensor:
        try:
            return loss_fn(out, y)
        except (TypeError, AttributeError, IndexError) as exc:
            raise StatisticsError(
                f"loss_fn(outputs, None) failed with {type(exc).__name__}: {exc}. targets=None "
                "means that loss_fn computes the loss from the outputs alone (e.g. "
                "loss_fn=lambda out, _: out.loss with labels among the keyword inputs); "
                "otherwise pass the targets."
            ) from exc

    return call


def _check_reduction(loss_fn: Any, out: Any, targets: Any, red: Reduction) -> None:
    """Refuse a ``loss_fn`` whose reduction is not the declared one (sum declared as mean).

    For a per-sample loss ℓ, ``loss_fn`` on samples {0, 1} is (ℓ₀+ℓ₁)/2 (mean) or ℓ₀+ℓ₁
    (sum); three evaluations on the outputs (no forward pass) tell which. Skipped when the
    outputs or targets are not batched tensors or ℓ₀ + ℓ₁ = 0 (cannot tell).
    """
    if not (isinstance(out, Tensor) and isinstance(targets, Tensor)):
        return
    if out.ndim == 0 or out.shape[0] < 2 or targets.ndim == 0 or targets.shape[0] != out.shape[0]:
        return
    with torch.no_grad():
        o, t = out.detach(), targets.detach()
        vals = [float(loss_fn(o[i:j], t[i:j])) for i, j in ((0, 1), (1, 2), (0, 2))]
    l0, l1, l01 = vals
    tot = l0 + l1
    if not all(map(math.isfinite, vals)) or abs(tot) <= 1e-12 * (abs(l0) + abs(l1) + 1e-300):
        return
    want, other = (tot / 2, tot) if red is Reduction.MEAN else (tot, tot / 2)
    tol = 1e-4 * abs(tot)
    if abs(l01 - want) > tol and abs(l01 - other) <= tol:
        declared = red.value
        actual = "sum" if declared == "mean" else "mean"
        raise StatisticsError(
            f"loss_fn reduces the batch by {actual!r} but reduction={declared!r} was passed "
            f"(loss_fn on two samples = {l01:.6g}; their {declared} = {want:.6g}, their "
            f"{actual} = {other:.6g}). Pass reduction={actual!r}, or make loss_fn return the "
            f"batch {declared}; pass check_loss=False to skip this check."
        )


_CHECKED_LOSSES: weakref.WeakSet[Any] = weakref.WeakSet()


def _loss_checked(loss_fn: Any) -> bool:
    try:
        return loss_fn in _CHECKED_LOSSES
    except TypeError:  # not weakly referenceable / hashable: check every time
        return False


def _mark_loss_checked(loss_fn: Any) -> None:
    with contextlib.suppress(TypeError):
        _CHECKED_LOSSES.add(loss_fn)


class Capture:
    """Context object of :func:`capture`: its ``stats`` are ready after the backward pass."""

    def __init__(
        self,
        model: nn.Module,
        syms: SymmetrySet,
        reduction: Reduction,
        check_finite: bool,
        all_reduce: bool | None = None,
        level: Level = Level.DIAG,
        timeout: float | timedelta | None = None,
    ):
        self.level = level
        self.model = model
        self.syms = syms
        self.reduction = reduction
        self.check_finite = check_finite
        self.timeout = timeout
        self.all_reduce = is_distributed() if all_reduce is None else all_reduce
        owners: dict[int, tuple[_Record, str]] = {}
        recs: dict[int, _Record] = {}
        pnames = {id(p): n for n, p in model.named_parameters()}
        needed = {id(p) for p in syms.params()}
        for name, mod in model.named_modules():
            roles = [
                r
                for r in ("weight", "bias")
                if isinstance(getattr(mod, r, None), nn.Parameter) and id(getattr(mod, r)) in needed
            ]
            if not roles:
                continue
            handler = handler_for(mod, name)  # raises for a registered but unsupported instance
            if handler is None:
                continue
            rec = recs.setdefault(id(mod), _Record(mod, name, handler))
            for role in roles:
                owners[id(getattr(mod, role))] = (rec, role)
        bad = [pnames.get(id(p), str(tuple(p.shape))) for p in syms.params() if id(p) not in owners]
        if bad:
            kinds = ", ".join(c.__name__ for c in registered_layers())
            raise UnsupportedLayerError(
                f"estimator='hooks' supports weights and biases of the registered layer types "
                f"({kinds}); these symmetry parameters are not: {bad}. Use "
                "estimator='reference' (torch.func, exact) or estimator='microbatch' (any "
                "model), or register the layer type with noetherflow.stats.register_layer."
            )
        self._owners = owners
        self._records = list(recs.values())
        self._stats: GradStats | None = None
        # Mean gradients already computed by autograd, so the hooks skip them.
        self._means: dict[nn.Parameter, Tensor] = {}
        self._check_means = False

    def use_mean_gradients(
        self, means: Mapping[nn.Parameter, Tensor], *, check: bool = True
    ) -> None:
        """Use autograd's mean gradients (e.g. ``.grad`` of a batch-mean loss) for ḡ.

        Saves one matmul per layer. With ``check``, each is compared (by a cheap random
        projection) with the mean the hooks see, which catches a ``loss_fn`` that is not the
        mean (or sum) of per-sample losses, e.g. one with an L2 penalty.
        """
        self._means = dict(means)
        self._check_means = check
        self._stats = None

    # -- hooks ------------------------------------------------------------------------------
    def _attach(self) -> None:
        for rec in self._records:

            def fwd(mod: nn.Module, args: tuple[Any, ...], out: Tensor, rec: _Record = rec) -> None:
                if not torch.is_grad_enabled():
                    return
                rec.calls += 1
                if rec.calls > 1:
                    raise UnsupportedLayerError(
                        f"Layer {rec.name!r} ran twice in one forward pass (a shared layer); "
                        "estimator='hooks' needs one call per layer. Use estimator='reference'."
                    )
                rec.a = args[0].detach()

                def bwd(grad: Tensor, rec: _Record = rec) -> None:
                    rec.g = grad.detach()

                out.register_hook(bwd)

            rec.handles.append(rec.module.register_forward_hook(fwd))

    def _detach(self) -> None:
        for rec in self._records:
            for h in rec.handles:
                h.remove()
            rec.handles.clear()

    def reset(self) -> None:
        """Forget the captured batch (hooks stay attached)."""
        for rec in self._records:
            rec.a = rec.g = None
            rec.calls = 0
        self._stats = None
        self._means = {}
        self._check_means = False

    # -- statistics -------------------------------------------------------------------------
    @property
    def stats(self) -> GradStats:
        """Gradient statistics of the captured batch (computed on first access)."""
        if self._stats is None:
            self._stats = self._compute()
        return self._stats

    def _compute(self) -> GradStats:
        unused = [r.name for r in self._records if r.a is None and r.g is None]
        if unused:
            raise UnsupportedLayerError(
                f"Layers {unused} never ran their forward inside the capture although a symmetry "
                "acts on their parameters (are the parameters used directly, e.g. w / w.norm()?). "
                "Run the forward and backward inside `with capture(...)`, or use "
                "estimator='reference' or 'microbatch', which work for any use of a parameter."
            )
        missing = [r.name for r in self._records if r.a is None or r.g is None]
        if missing:
            raise StatisticsError(
                f"No captured forward/backward for layers {missing}; run the forward pass and "
                "loss.backward() inside the `with capture(...)` block."
            )
        facs: dict[int, tuple[Tensor, Tensor]] = {}
        n = 0
        for rec in self._records:
            assert rec.a is not None and rec.g is not None
            a, g = rec.handler.factors(rec.module, rec.a, rec.g)
            n = a.shape[0]
            facs[id(rec.module)] = (a, g)
        check_batch(n)
        sc = float(n) if self.reduction is Reduction.MEAN else 1.0
        src = _FactorSource(n, facs, self._owners, sc, self._means, self._check_means)
        st = assemble(src, self.syms, level=self.level, estimator=Estimator.HOOKS.value)
        src.verify_means()
        if self.all_reduce:
            all_reduce_stats(st, syms=self.syms, timeout=self.timeout)
        if self.check_finite:
            st.check_finite()
        return st


@contextlib.contextmanager
def capture(
    model: nn.Module,
    syms: SymmetrySet,
    *,
    reduction: str | Reduction = "mean",
    check_finite: bool = True,
    all_reduce: bool | None = None,
    level: str | Level = "diag",
    timeout: float | timedelta | None = None,
) -> Iterator[Capture]:
    """Ride on the caller's own forward/backward pass and collect gradient statistics.

    ``reduction`` says whether the loss is the batch mean or the sum of per-sample losses.
    Only the registered layer types (``nn.Linear``, ``nn.Conv1d/2d``, and any added with
    :func:`noetherflow.stats.register_layer`) are captured; the batch is dim 0.
    ``level`` is as in :func:`collect_stats` (``'neuron'`` for flows only, ``'solve'`` for the
    solver, ``'diag'`` for per-coordinate E[g²] of every parameter).
    ``all_reduce`` (default: whether ``torch.distributed`` is initialised) combines the
    statistics of all ranks into those of the global batch (:mod:`.distributed`); every rank
    must then read ``stats``, and a rank that does not is reported after ``timeout``
    seconds (default :data:`noetherflow.stats.distributed.DEFAULT_TIMEOUT`).

    Example:
        >>> import torch, noetherflow as nf
        >>> _ = torch.manual_seed(0)
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> net = net.double()
        >>> x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
        >>> loss_fn = torch.nn.functional.mse_loss
        >>> syms = nf.find_symmetries(net, x)
        >>> with nf.capture(net, syms, reduction="mean") as cap:
        ...     loss_fn(net(x), y).backward()
        >>> stats = cap.stats
        >>> stats.n
        16

        The same statistics as the per-sample (torch.func) reference:

        >>> ref = nf.collect_stats(net, syms, loss_fn, x, y, estimator="reference")
        >>> flow, flow_ref = (nf.noether_flow(syms, s, lr=0.1, batch_size=4) for s in (stats, ref))
        >>> all(torch.allclose(flow[k], flow_ref[k], rtol=1e-10, atol=0) for k in flow)
        True
    """
    check_no_train_batchnorm(model, "hooks")
    check_not_sharded([*syms.params(), *model.parameters()], _names(model), "capture")
    cap = Capture(
        model,
        syms,
        parse_reduction(reduction),
        check_finite,
        all_reduce,
        level=parse_level(level),
        timeout=timeout,
    )
    cap._attach()
    try:
        yield cap
    finally:
        cap._detach()


def collect_stats(
    model: nn.Module,
    syms: SymmetrySet,
    loss_fn: Callable[[Any, Any], Tensor],
    inputs: Any,
    targets: Any,
    *,
    reduction: str | Reduction = "mean",
    estimator: str | Estimator = "hooks",
    micro_batch_size: int = 1,
    check_finite: bool = True,
    chunk_size: int | None = None,
    all_reduce: bool | None = None,
    level: str | Level = "diag",
    check_loss: bool = True,
    timeout: float | timedelta | None = None,
) -> GradStats:
    """Per-sample gradient statistics of ``syms`` over one batch (treated as the data distribution).

    Args:
        model: the model; its parameters are not changed and ``.grad`` is left untouched
            for ``estimator='reference'``/``'microbatch'`` (``'hooks'`` runs one backward
            pass and accumulates into ``.grad`` like any backward; zero them as usual).
        syms: the symmetries whose statistics are needed.
        loss_fn: ``loss_fn(outputs, targets)`` → batch mean (``reduction='mean'``) or sum
            of per-sample losses. Only the data loss: pass weight decay to the flow/solver.
        inputs: the batch, samples along dim 0: a tensor, a tuple of positional inputs, or a
            dict of keyword inputs (``model(**inputs)``, e.g. a Hugging Face batch
            ``{"input_ids": ids, "attention_mask": mask}``). Integer inputs (token ids) are
            fine with every estimator. ``'reference'``/``'microbatch'`` split every tensor
            whose dim 0 is the batch size (that of the first input tensor) and pass tensors
            with dim 0 of length 1 and non-tensors unchanged to every sample.
        targets: the targets, samples along dim 0, passed as ``loss_fn(outputs, targets)``;
            or None when the loss comes from the outputs alone (labels among the keyword
            inputs, ``loss_fn=lambda out, _: out.loss``).
        reduction: ``'mean'`` or ``'sum'``, how ``loss_fn`` combines the per-sample losses.
        estimator: ``'hooks'`` (fast, registered layer types), ``'reference'`` (torch.func,
            exact, any model without BatchNorm in training mode), ``'microbatch'`` (any model).
        micro_batch_size: micro-batch size m of the ``'microbatch'`` estimator.
        check_finite: raise on NaN/Inf statistics.
        chunk_size: vmap chunk size of the ``'reference'`` estimator (memory bound).
        level: ``'diag'`` keeps E[g²] per coordinate of every parameter; ``'solve'`` keeps
            it per coordinate only for parameters whose two axes both carry generators (a
            weight between two rescaled layers) and per-neuron sums elsewhere, which is
            exactly what :func:`solve_equilibrium` needs; ``'neuron'`` keeps only per-neuron
            sums (enough for :func:`noether_flow`, and for the solver when no parameter has
            generators along two axes). With ``'hooks'``, a per-coordinate E[g²] costs one
            matmul per layer and a per-neuron sum O(N·d).
        all_reduce: combine the statistics of all ``torch.distributed`` ranks into those of
            the global batch (uneven batches allowed); default: whether a process group is
            initialised. ``model`` may be wrapped in ``DistributedDataParallel``.
        check_loss: with ``'hooks'``, check that autograd's gradient of ``loss_fn`` is the
            mean (or sum) of the per-sample gradients the hooks see (a random projection,
            O(N·d)); it is not when ``loss_fn`` holds an L2 penalty. A penalty is a property
            of the loss function, not of the batch, so each ``loss_fn`` object is checked on
            its first batch only (loss functions that cannot be weakly referenced, e.g.
            bound methods, on every batch).
        timeout: seconds a rank waits for the others in the DDP reduction before raising.
    """
    model = unwrap_ddp(model)
    red = parse_reduction(reduction)
    lev = parse_level(level)
    est = parse_enum(Estimator, estimator, "estimator")
    if len(syms) == 0:
        raise StatisticsError("The symmetry set is empty; there are no statistics to collect.")
    check_not_sharded([*syms.params(), *model.parameters()], _names(model), "collect_stats")
    inp = ModelInputs.of(inputs, "collect_stats")
    n = inp.batch_size("collect_stats", split=est is not Estimator.HOOKS)
    check_batch(n)
    _check_devices(model, syms, inp.tensors())
    if est is Estimator.HOOKS:
        with capture(
            model,
            syms,
            reduction=red,
            check_finite=check_finite,
            all_reduce=all_reduce,
            level=lev,
            timeout=timeout,
        ) as cap:
            out = _forward(model, inp)
            loss = _guard_loss(loss_fn, targets)(out, targets)
            params = syms.params()
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        check = check_loss and not _loss_checked(loss_fn)
        if check:
            _check_reduction(loss_fn, out, targets, red)
        cap.use_mean_gradients(
            {
                p: (g.detach() / n if red is Reduction.SUM else g.detach())
                for p, g in zip(params, grads, strict=True)
                if g is not None
            },
            check=check,
        )
        st = cap.stats
        if check:
            _mark_loss_checked(loss_fn)
        return st
    params = syms.params()
    if est is Estimator.REFERENCE:
        samples = per_sample_grads(
            model, params, _guard_loss(loss_fn, targets), inp, targets, chunk_size=chunk_size
        )
    else:
        samples = microbatch_grads(
            model,
            params,
            _guard_loss(loss_fn, targets),
            inp,
            targets,
            micro_batch_size=micro_batch_size,
            reduction=red.value,
        )
    from noetherflow.kernels.base import stats_from_samples

    st = stats_from_samples(samples, syms, estimator=est.value)
    if all_reduce or (all_reduce is None and is_distributed()):
        all_reduce_stats(st, syms=syms, timeout=timeout)
    if check_finite:
        st.check_finite()
    return st


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _check_devices(model: nn.Module, syms: SymmetrySet, xs: list[Tensor]) -> None:
    ps = syms.params()
    devs = {p.device for p in ps} | {x.device for x in xs if isinstance(x, Tensor)}
    if len(devs) > 1:
        raise StatisticsError(
            f"Inputs and parameters are on different devices {sorted(map(str, devs))}; expected "
            "one device. Move the batch with x.to(next(model.parameters()).device)."
        )
    fl = {x.dtype for x in xs if isinstance(x, Tensor) and x.is_floating_point()}
    pd = {p.dtype for p in ps}
    if fl and fl != pd:
        raise StatisticsError(
            f"Inputs have dtype {sorted(map(str, fl))} but parameters {sorted(map(str, pd))}; "
            "expected one dtype. Convert with x.to(dtype) or model.to(dtype)."
        )
