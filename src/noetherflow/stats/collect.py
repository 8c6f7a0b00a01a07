"""Plumbing: hooks that capture layer inputs and output-gradients, and ``collect_stats``.

Forward hooks save each layer's input and register a tensor hook on its output (full
backward hooks break after in-place activations). The math lives in :mod:`.layers`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from noetherflow._errors import StatisticsError, UnsupportedLayerError
from noetherflow.stats import layers as L
from noetherflow.stats.core import (
    Estimator,
    GradStats,
    Level,
    Reduction,
    axis_sum,
    check_batch,
    needs_samples,
    parse_reduction,
    stats_from_samples,
)
from noetherflow.stats.distributed import all_reduce_stats, is_distributed, unwrap_ddp
from noetherflow.stats.microbatch import microbatch_grads
from noetherflow.stats.reference import check_no_train_batchnorm, per_sample_grads
from noetherflow.symmetry.base import DiagonalSymmetry
from noetherflow.symmetry.dense import DenseSymmetry
from noetherflow.symmetry.rotation import Block, DoubleRotation
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["Capture", "capture", "collect_stats"]

_SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)


@dataclass
class _Record:
    module: nn.Module
    name: str
    a: Tensor | None = None
    g: Tensor | None = None
    calls: int = 0
    handles: list[Any] = field(default_factory=list)


def _factors(rec: _Record) -> tuple[Tensor, Tensor]:
    """Layer input and output-gradient as ``[N, T, I]`` and ``[N, T, O]`` (I includes conv taps)."""
    assert rec.a is not None and rec.g is not None
    m, a, g = rec.module, rec.a, rec.g
    n = a.shape[0]
    if isinstance(m, nn.Linear):
        return a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])
    assert isinstance(m, nn.Conv1d | nn.Conv2d)
    if isinstance(m.padding, str) or m.padding_mode != "zeros":
        raise UnsupportedLayerError(
            f"Layer {rec.name!r}: padding={m.padding!r}, padding_mode={m.padding_mode!r} is not "
            "supported by estimator='hooks'; use estimator='reference' or 'microbatch'."
        )
    if isinstance(m, nn.Conv1d):
        a, g = a.unsqueeze(2), g.unsqueeze(2)
        ks = (1, m.kernel_size[0])
        st, pd, dl = (1, m.stride[0]), (0, int(m.padding[0])), (1, m.dilation[0])
    else:
        ks = (m.kernel_size[0], m.kernel_size[1])
        st, dl = (m.stride[0], m.stride[1]), (m.dilation[0], m.dilation[1])
        pd = (int(m.padding[0]), int(m.padding[1]))
    cols = F.unfold(a, ks, dilation=dl, padding=pd, stride=st)  # [N, I*k, T]
    return cols.transpose(1, 2), g.reshape(n, g.shape[1], -1).transpose(1, 2)


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
    ):
        self.level = level
        self.model, self.syms, self.reduction, self.check_finite = (
            model,
            syms,
            reduction,
            check_finite,
        )
        self.all_reduce = is_distributed() if all_reduce is None else all_reduce
        owners: dict[int, tuple[_Record, str]] = {}
        recs: dict[int, _Record] = {}
        named = dict(model.named_modules())
        pnames = {id(p): n for n, p in model.named_parameters()}
        for name, mod in named.items():
            for role in ("weight", "bias"):
                p = getattr(mod, role, None) if isinstance(mod, nn.Module) else None
                if isinstance(p, nn.Parameter):
                    if isinstance(mod, _SUPPORTED) and getattr(mod, "groups", 1) == 1:
                        rec = recs.setdefault(id(mod), _Record(mod, name))
                        owners[id(p)] = (rec, role)
        bad = [pnames.get(id(p), str(tuple(p.shape))) for p in syms.params() if id(p) not in owners]
        if bad:
            raise UnsupportedLayerError(
                f"estimator='hooks' supports weights and biases of nn.Linear and nn.Conv1d/2d "
                f"(groups=1); these symmetry parameters are not: {bad}. Use "
                "estimator='reference' (torch.func, exact) or estimator='microbatch' (any model)."
            )
        self._owners = owners
        needed = {id(p) for p in syms.params()}
        self._records = [
            r
            for r in recs.values()
            if any(
                id(getattr(r.module, role)) in needed
                for role in ("weight", "bias")
                if getattr(r.module, role, None) is not None
            )
        ]
        self._stats: GradStats | None = None
        # Mean gradients already computed by autograd (collect_stats), so hooks skip them.
        self._means: dict[nn.Parameter, Tensor] = {}

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
        for rec in self._records:
            rec.a = rec.g = None
            rec.calls = 0
        self._stats = None
        self._means = {}

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
        n = None
        for rec in self._records:
            a, g = _factors(rec)
            n = a.shape[0]
            facs[id(rec.module)] = (a, g)
        assert n is not None
        check_batch(n)
        # Per-sample output-gradients of ℓ_n are scale·g: N·g for a batch-mean loss. The
        # formulas apply the factor to their smallest operand.
        sc = float(n) if self.reduction is Reduction.MEAN else 1.0
        syms = self.syms
        st = GradStats(n=n, estimator=Estimator.HOOKS.value)
        keep = needs_samples(syms)
        # Parameters whose E[g²] is kept as per-neuron sums (the rest: per coordinate).
        want = {} if self.level is Level.DIAG else self._axes_wanted(keep)
        if self.level is Level.SOLVE:  # the solver needs full grids only where two axes meet
            want = {p: ax for p, ax in want.items() if len(ax) == 1}
        if want:
            st.sq_axis = self._neuron_sums(facs, sc, want)
        for s in syms:
            for p in s.params:
                rec, role = self._owners[id(p)]
                a, g = facs[id(rec.module)]
                shape = p.shape
                if (id(p) in keep or isinstance(s, DenseSymmetry)) and p not in st.samples:
                    ps = (
                        L.per_sample_weight(a, g, scale=sc)
                        if role == "weight"
                        else g.sum(1).mul_(sc)
                    )
                    st.samples[p] = ps.reshape(n, *shape)
                if p in st.samples:  # already materialised: reductions are cheaper than matmuls
                    st.mean.setdefault(p, st.samples[p].mean(0))
                    if s.is_diagonal:
                        st.sq.setdefault(p, st.samples[p].square().mean(0))
                    continue
                if p not in st.mean:
                    known = self._means.get(p)
                    if known is None:
                        known = (
                            L.weight_mean(a, g, scale=sc)
                            if role == "weight"
                            else L.bias_mean(g, scale=sc)
                        )
                    st.mean[p] = known.reshape(shape)
                if not s.is_diagonal:
                    continue
                if p not in want and self.level is not Level.NEURON and p not in st.sq:
                    sq = L.weight_sq(a, g, scale=sc) if role == "weight" else L.bias_sq(g, scale=sc)
                    st.sq[p] = sq.reshape(shape)
            if isinstance(s, DoubleRotation):
                st.side[s] = (self._side(s.w_blocks, facs, sc), self._side(s.u_blocks, facs, sc))
            elif isinstance(s, DenseSymmetry):
                f = s.flat_batched(st.samples)
                st.dense[s] = f.T @ f / n
        if self.all_reduce:
            all_reduce_stats(st)
        if self.check_finite:
            st.check_finite()
        return st

    def _axes_wanted(self, skip: set[int]) -> dict[nn.Parameter, tuple[int, ...]]:
        """Per parameter of a diagonal symmetry, the axes its generators act along.

        Parameters in ``skip`` keep per-sample gradients, whose squares give every statistic.
        """
        want: dict[nn.Parameter, tuple[int, ...]] = {}
        for s in self.syms:
            if isinstance(s, DiagonalSymmetry):
                for t in s.terms():
                    have = want.get(t.param, ())
                    if id(t.param) not in skip and t.axis not in have:
                        want[t.param] = (*have, t.axis)
        return want

    def _neuron_sums(
        self,
        facs: dict[int, tuple[Tensor, Tensor]],
        sc: float,
        want: dict[nn.Parameter, tuple[int, ...]],
    ) -> dict[tuple[nn.Parameter, int], Tensor]:
        """Per-neuron sums of E[g²] along the axes in ``want``, computed layer by layer."""
        out: dict[tuple[nn.Parameter, int], Tensor] = {}
        for rec in self._records:
            mod = rec.module
            w, b = getattr(mod, "weight", None), getattr(mod, "bias", None)
            axes = want.get(w, ()) if isinstance(w, nn.Parameter) else ()
            has_b = isinstance(b, nn.Parameter) and b in want
            if not axes and not has_b:
                continue
            a, g = facs[id(mod)]
            if isinstance(mod, nn.Linear):
                ws, bs = L.neuron_sums(a, g, axes, bias=has_b, scale=sc)
            else:  # conv: the factor's input axis mixes channels and kernel taps
                full = L.weight_sq(a, g, scale=sc).reshape(mod.weight.shape)  # type: ignore[arg-type]
                ws = {ax: axis_sum(full, ax) for ax in axes}
                bs = L.bias_sq(g, scale=sc) if has_b else None
            for ax, v in ws.items():
                out[(w, ax)] = v  # type: ignore[index]
            if bs is not None:
                out[(b, 0)] = bs  # type: ignore[index]
        return out

    def _side(
        self, blocks: list[Block], facs: dict[int, tuple[Tensor, Tensor]], sc: float
    ) -> Tensor:
        out: Tensor | None = None
        for b in blocks:
            rec, role = self._owners[id(b.param)]
            if not isinstance(rec.module, nn.Linear):
                raise UnsupportedLayerError(
                    f"estimator='hooks' computes rotation statistics for nn.Linear only; "
                    f"{rec.name!r} is {type(rec.module).__name__}. Use estimator='reference'."
                )
            a, g = facs[id(rec.module)]
            sl = slice(b.start, b.stop)
            if role == "bias":
                m = L.row_moment(a, g, sl, bias=True, scale=sc)
            elif b.axis == 0:
                m = L.row_moment(a, g, sl, scale=sc)
            else:
                m = L.col_moment(a, g, sl, scale=sc)
            out = m if out is None else out + m
        assert out is not None
        return out


def _level(level: str | Level) -> Level:
    try:
        return Level(level)
    except ValueError:
        raise ValueError(
            f"level={level!r} is not supported; expected 'diag' (per-coordinate E[g²] of every "
            "parameter), 'solve' (what solve_equilibrium needs, cheaper) or 'neuron' "
            "(per-neuron sums: flows only, cheapest)."
        ) from None


@contextlib.contextmanager
def capture(
    model: nn.Module,
    syms: SymmetrySet,
    *,
    reduction: str | Reduction = "mean",
    check_finite: bool = True,
    all_reduce: bool | None = None,
    level: str | Level = "diag",
) -> Iterator[Capture]:
    """Ride on the caller's own forward/backward pass and collect gradient statistics.

    Example::

        with nf.capture(model, syms, reduction="mean") as cap:
            loss_fn(model(x), y).backward()
        stats = cap.stats

    ``reduction`` says whether the loss is the batch mean or the sum of per-sample losses.
    Only ``nn.Linear`` and ``nn.Conv1d/2d`` layers are captured; the batch is dim 0.
    ``level`` is as in :func:`collect_stats` (``'neuron'`` for flows only, ``'solve'`` for the
    solver, ``'diag'`` for per-coordinate E[g²] of every parameter).
    ``all_reduce`` (default: whether ``torch.distributed`` is initialised) combines the
    statistics of all ranks into those of the global batch (:mod:`.distributed`); every rank
    must then read ``stats``.
    """
    check_no_train_batchnorm(model, "hooks")
    cap = Capture(
        model, syms, parse_reduction(reduction), check_finite, all_reduce, level=_level(level)
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
    inputs: Tensor | tuple[Tensor, ...],
    targets: Tensor,
    *,
    reduction: str | Reduction = "mean",
    estimator: str | Estimator = "hooks",
    micro_batch_size: int = 1,
    check_finite: bool = True,
    chunk_size: int | None = None,
    all_reduce: bool | None = None,
    level: str | Level = "diag",
) -> GradStats:
    """Per-sample gradient statistics of ``syms`` over one batch (treated as the data distribution).

    Args:
        model: the model; its parameters are not changed and ``.grad`` is left untouched
            for ``estimator='reference'``/``'microbatch'`` (``'hooks'`` runs one backward
            pass and accumulates into ``.grad`` like any backward; zero them as usual).
        syms: the symmetries whose statistics are needed.
        loss_fn: ``loss_fn(outputs, targets)`` → batch mean (``reduction='mean'``) or sum
            of per-sample losses.
        inputs, targets: the batch, samples along dim 0.
        estimator: ``'hooks'`` (fast, Linear/Conv), ``'reference'`` (torch.func, exact, any
            model without BatchNorm in training mode), ``'microbatch'`` (any model).
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
    """
    model = unwrap_ddp(model)
    red = parse_reduction(reduction)
    level = _level(level)
    try:
        est = Estimator(estimator)
    except ValueError:
        raise ValueError(
            f"estimator={estimator!r} is not supported; expected one of "
            f"{[e.value for e in Estimator]}."
        ) from None
    if len(syms) == 0:
        raise StatisticsError("The symmetry set is empty; there are no statistics to collect.")
    xs = inputs if isinstance(inputs, tuple) else (inputs,)
    check_batch(xs[0].shape[0])
    _check_devices(model, syms, xs)
    if est is Estimator.HOOKS:
        with capture(
            model,
            syms,
            reduction=red,
            check_finite=check_finite,
            all_reduce=all_reduce,
            level=level,
        ) as cap:
            loss = loss_fn(model(*xs), targets)
            params = syms.params()
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        n = xs[0].shape[0]
        cap._means = {
            p: (g.detach() / n if red is Reduction.SUM else g.detach())
            for p, g in zip(params, grads, strict=True)
            if g is not None
        }
        return cap.stats
    params = syms.params()
    if est is Estimator.REFERENCE:
        samples = per_sample_grads(model, params, loss_fn, inputs, targets, chunk_size=chunk_size)
    else:
        samples = microbatch_grads(
            model,
            params,
            loss_fn,
            inputs,
            targets,
            micro_batch_size=micro_batch_size,
            reduction=red.value,
        )
    st = stats_from_samples(samples, syms, estimator=est.value)
    if all_reduce or (all_reduce is None and is_distributed()):
        all_reduce_stats(st)
    if check_finite:
        st.check_finite()
    return st


def _check_devices(model: nn.Module, syms: SymmetrySet, xs: tuple[Tensor, ...]) -> None:
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
