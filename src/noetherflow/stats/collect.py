"""Plumbing: hooks that capture layer inputs and output-gradients, and ``collect_stats``.

Forward hooks save each layer's input and register a tensor hook on its output (full
backward hooks break after in-place activations). Which layer types are understood is the
registry of :mod:`.registry`; the formulas live in :mod:`.layers`; which statistics each
symmetry family needs is decided by its kernel (:mod:`noetherflow.kernels`), which reads
them through the :class:`~noetherflow.stats.source.GradSource` interface implemented here
for the factors a/g (and by :class:`~noetherflow.stats.source.SampleSource` for per-sample
gradients).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import (
    check_bool,
    check_model_and_set,
    check_positive_int,
    check_timeout,
    fingerprint,
    parse_enum,
)
from noetherflow._errors import StatisticsError, UnsupportedLayerError
from noetherflow._inputs import ModelInputs
from noetherflow.stats.blocks import assemble, stats_from_samples
from noetherflow.stats.contributions import reference_shares
from noetherflow.stats.core import (
    Estimator,
    GradStats,
    Level,
    Reduction,
    check_batch,
    parse_level,
    parse_reduction,
)
from noetherflow.stats.distributed import all_reduce_stats, is_distributed, unwrap_ddp
from noetherflow.stats.factor_source import FactorSource, Record, Unit, _detached, _in_backward
from noetherflow.stats.flattened import regroup, row_order
from noetherflow.stats.fsdp import bind_sharded, check_hooks_only, is_sharded_model, restored_grads
from noetherflow.stats.loss_guard import check_reduction, guard_loss
from noetherflow.stats.matmul_reads import attach_matmul_reads
from noetherflow.stats.microbatch import microbatch_grads
from noetherflow.stats.reference import buffers_kept, check_no_train_batchnorm
from noetherflow.stats.registry import handler_for, registered_layers
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["Capture", "capture", "collect_stats"]


def _forward(model: nn.Module, inp: ModelInputs) -> Any:
    """``model(*args, **kwargs)``; torch's error on the inputs becomes a StatisticsError.

    A TypeError too: a list where a layer takes a tensor fails inside ``F.linear``.
    """
    try:
        return inp(model)
    except (RuntimeError, TypeError) as e:
        raise StatisticsError(inp.forward_error(e, "collect_stats")) from e


def _stamp(syms: SymmetrySet) -> dict[nn.Parameter, tuple[float, float, float]]:
    """The fingerprint of every parameter of ``syms`` (what the statistics were computed at)."""
    params = syms.params()
    return dict(zip(params, fingerprint(params), strict=True))


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
        owners: dict[int, Unit] = {}
        recs: list[Record] = []
        pnames = {id(p): n for n, p in model.named_parameters()}
        needed = {id(p) for p in syms.params()}
        for name, mod in model.named_modules():
            handler = handler_for(mod, name, check=False)
            if handler is None:
                continue
            parts = handler.parts_of(mod)
            roles = [
                (part, role, t)
                for part, wb in parts.items()
                for role, t in zip(("weight", "bias"), wb, strict=True)
                if isinstance(t, nn.Parameter) and id(t) in needed and id(t) not in owners
            ]
            if not roles:
                continue
            handler_for(mod, name)  # raises for a registered but unsupported instance
            rec = Record(mod, name, handler, parts)
            recs.append(rec)
            for part, role, t in roles:
                owners[id(t)] = Unit(rec, part, role)
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
        self._records = recs
        self._extra: list[Any] = []  # the hooks of weights applied by a matmul elsewhere
        self._regroup: tuple[int, bool] | None = None  # (N, batch-major): see .flattened
        self._stats: GradStats | None = None
        self._stamp: dict[nn.Parameter, tuple[float, float, float]] = {}
        # Mean gradients already computed by autograd, so the hooks skip them.
        self._means: dict[nn.Parameter, Tensor] = {}
        self._check_means = False
        # 1: a micro-batch of an accumulated step (merged before Σ is used) may be one sample
        self.min_batch = 2
        # False: no per-sample gradients kept for a coupled solve that will not run
        self.keep_samples = True

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
    def _begin(self, rec: Record) -> bool:
        """A forward call of ``rec``'s layer: counted (False: not captured)."""
        if not torch.is_grad_enabled():
            return False
        if rec.calls and _in_backward():
            # activation checkpointing recomputes the forward during the backward
            # pass; the first call's hooks already see this layer's gradient
            return False
        rec.calls += 1
        if not self._stamp:  # the parameters this batch's gradients belong to
            self._stamp = _stamp(self.syms)
        if rec.calls > 1:
            raise UnsupportedLayerError(
                f"Layer {rec.name!r} ran twice in one forward pass (a shared layer); "
                "estimator='hooks' needs one call per layer. Use estimator='reference'."
            )
        return True

    def _attach(self) -> None:
        det = self.syms.detection  # weights applied by a matmul elsewhere: .matmul_reads
        if det is not None and det.matmul_reads:
            biased = {id(u.rec.module) for u in self._owners.values() if u.role == "bias"}
            recs = [r for r in self._records if id(r.module) not in biased]
            self._extra = attach_matmul_reads(self.model, det.matmul_reads, recs, self._begin)
        for rec in self._records:

            def fwd(
                mod: nn.Module,
                args: tuple[Any, ...],
                kwargs: dict[str, Any],
                out: Any,
                rec: Record = rec,
            ) -> None:
                if not self._begin(rec):
                    return
                outs = out if isinstance(out, tuple) else (out,)
                if rec.handler.call_factors is None:
                    rec.a = args[0].detach()
                else:  # the whole call: its factors are formed in the backward pass
                    memo: dict[int, Tensor] = {}
                    rec.call = (_detached(args, memo), _detached(kwargs, memo))

                def bwd(grad: Tensor, rec: Record = rec) -> None:
                    read = rec.handler.call_factors
                    if read is None:
                        rec.g = grad.detach()
                    else:
                        assert rec.call is not None
                        rec.facs = read(rec.module, *rec.call, grad.detach())
                        rec.call = None

                def side(grad: Tensor, rec: Record = rec) -> None:
                    rec.side_grad = True

                outs[0].register_hook(bwd)
                for o in outs[1:]:
                    if isinstance(o, Tensor) and o.requires_grad:
                        o.register_hook(side)

            # prepend: read the layer's own output, before a user's forward hook rescales or
            # replaces it (the gradient at a replaced output is not the layer's)
            rec.handles.append(
                rec.module.register_forward_hook(fwd, with_kwargs=True, prepend=True)
            )

    def _detach(self) -> None:
        for h in self._extra:
            h.remove()
        self._extra = []
        for rec in self._records:
            for h in rec.handles:
                h.remove()
            rec.handles.clear()

    def reset(self) -> None:
        """Forget the captured batch (hooks stay attached)."""
        for rec in self._records:
            rec.reset()
        self._stats = None
        self._stamp = {}
        self._means = {}
        self._check_means = False

    # -- statistics -------------------------------------------------------------------------
    def batch_rows(self) -> int | None:
        """Dim 0 of the captured layer inputs when they agree (None before a forward)."""
        sizes: set[int] = set()
        for rec in self._records:
            if rec.facs is not None:
                sizes |= {a.shape[0] for a, _ in rec.facs.values()}
            elif isinstance(rec.a, Tensor) and rec.a.dim() > 1:  # the raw input: no unfold
                sizes.add(int(rec.a.shape[0]))
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def stats(self) -> GradStats:
        """Gradient statistics of the captured batch (computed on first access)."""
        if self._stats is None:
            self._stats = self._compute()
        return self._stats

    def _compute(self) -> GradStats:
        unused = [r.name for r in self._records if r.calls == 0]
        if unused:
            raise UnsupportedLayerError(
                f"Layers {unused} never ran their forward inside the capture although a symmetry "
                "acts on their parameters (are the parameters used directly, e.g. w / w.norm()?). "
                "Run the forward and backward inside `with capture(...)`, or use "
                "estimator='reference' or 'microbatch', which work for any use of a parameter."
            )
        missing = [r.name for r in self._records if not r.done()]
        if missing:
            raise StatisticsError(
                f"No captured forward/backward for layers {missing}; run the forward pass and "
                "loss.backward() inside the `with capture(...)` block."
            )
        side = [r.name for r in self._records if r.side_grad]
        if side:
            raise UnsupportedLayerError(
                f"A second output of layers {side} (e.g. the attention weights of "
                "nn.MultiheadAttention) feeds the loss; estimator='hooks' reads the gradient of "
                "the first output only. Use estimator='reference' or 'microbatch', or leave "
                "the second output out of the loss (need_weights=False)."
            )
        facs: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
        sizes: dict[str, int] = {}
        for rec in self._records:
            for part, (a, g) in rec.factors().items():
                if self._regroup is not None:  # batch × tokens flattened: see .flattened
                    a, g = (regroup(t, *self._regroup) for t in (a, g))
                sizes[rec.name] = a.shape[0]
                facs[(id(rec.module), part)] = (a, g)
        if len(set(sizes.values())) > 1:
            raise UnsupportedLayerError(
                f"The layers' inputs disagree on the batch size along dim 0 ({sizes}); "
                "estimator='hooks' reads dim 0 of every layer input as the batch. Use "
                "batch-first layouts (e.g. batch_first=True for PyTorch's transformer layers) "
                "or estimator='reference'."
            )
        n = next(iter(sizes.values()))
        check_batch(n, self.min_batch)
        sc = float(n) if self.reduction is Reduction.MEAN else 1.0
        src = FactorSource(
            n,
            facs,
            self._owners,
            sc,
            self._means,
            self._check_means,
            reduced=self.level is not Level.DIAG,
        )
        st = assemble(
            src,
            self.syms,
            level=self.level,
            estimator=Estimator.HOOKS.value,
            min_n=self.min_batch,
            keep_samples=self.keep_samples,
        )
        src.verify_means()
        st.fingerprint = dict(self._stamp)  # taken in the forward pass
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
    check_model_and_set(model, syms, "capture")
    check_timeout(timeout)
    check_bool(check_finite, "check_finite")
    check_no_train_batchnorm(model, "hooks")
    bind_sharded(unwrap_ddp(model), syms)
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
            pass and accumulates into ``.grad`` like any backward; zero them as usual). Its
            buffers (running statistics) are as they were afterwards, whatever the estimator.
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
            A sample's gradient is its share of the batch loss (times N for a mean): with
            cross-entropy and ``ignore_index`` (padding) the batch mean is over the
            non-ignored tokens, so a sequence with more tokens weighs more; the mean of the
            per-sample gradients is the batch gradient for any loss, and hooks = reference
            (:mod:`noetherflow.stats.contributions`).
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
    check_model_and_set(model, syms, "collect_stats")
    check_timeout(timeout)
    check_bool(check_finite, "check_finite")
    check_bool(check_loss, "check_loss")
    micro_batch_size = check_positive_int(micro_batch_size, "micro_batch_size")
    if chunk_size is not None:
        chunk_size = check_positive_int(chunk_size, "chunk_size", "samples per vmap chunk")
    model = unwrap_ddp(model)
    red = parse_reduction(reduction)
    lev = parse_level(level)
    est = parse_enum(Estimator, estimator, "estimator")
    if len(syms) == 0:
        raise StatisticsError("The symmetry set is empty; there are no statistics to collect.")
    bind_sharded(model, syms)
    check_hooks_only(model, est.value)
    inp = ModelInputs.of(inputs, "collect_stats")
    n = inp.batch_size("collect_stats", split=est is not Estimator.HOOKS)
    check_batch(n)
    _check_devices(model, syms, inp.tensors())
    check_params_of(model, syms, "collect_stats")
    if est is Estimator.HOOKS:
        sharded = is_sharded_model(model)
        with (
            capture(
                model,
                syms,
                reduction=red,
                check_finite=check_finite,
                all_reduce=all_reduce,
                level=lev,
                timeout=timeout,
            ) as cap,
            buffers_kept(model),
        ):  # running statistics (InstanceNorm) as they were
            out = _forward(model, inp)
            loss = guard_loss(loss_fn, targets)(out, targets)
            params = syms.params()
            if sharded:  # FSDP's own backward gathers the weights the hooks' layers need
                with restored_grads(model):
                    loss.backward()
            else:
                grads = torch.autograd.grad(loss, params, allow_unused=True)
        check = check_loss and not _loss_checked(loss_fn)
        if check:
            check_reduction(loss_fn, out, targets, red)
        if not sharded:  # under FSDP the hooks form ḡ themselves (.grad holds shards)
            cap.use_mean_gradients(
                {
                    p: (g.detach() / n if red is Reduction.SUM else g.detach())
                    for p, g in zip(params, grads, strict=True)
                    if g is not None
                },
                check=check,
            )
        rows = cap.batch_rows()
        if rows not in (None, n):
            assert rows is not None
            order = row_order(model, [r.module for r in cap._records], inp, n, rows)
            if order is not None:
                cap._regroup = (n, order)
        if rows not in (None, n) and cap._regroup is None:
            raise UnsupportedLayerError(
                f"collect_stats: the inputs hold a batch of {n} samples, but the layers a "
                f"symmetry acts on read {cap.batch_rows()} rows along dim 0 (batch and tokens "
                "flattened into one axis before them, e.g. x.reshape(B * T, C)); "
                "estimator='hooks' reads dim 0 of every layer input as the batch, so its "
                "per-sample statistics would be per row. Use estimator='reference' or "
                "'microbatch' (any layout), or keep the token axis (x of shape [B, T, C]). "
                "(Rows grouped by sample, batch- or token-major, are regrouped; these are not.)"
            )
        st = cap.stats
        if check and not sharded:  # under FSDP the mean-gradient half of the check did not run
            _mark_loss_checked(loss_fn)
        return st
    params = syms.params()
    if est is Estimator.REFERENCE:
        samples = reference_shares(
            model,
            params,
            guard_loss(loss_fn, targets, scalar=False),
            inp,
            targets,
            red.value,
            chunk_size,
        )
    else:
        samples = microbatch_grads(
            model,
            params,
            guard_loss(loss_fn, targets),
            inp,
            targets,
            micro_batch_size=micro_batch_size,
            reduction=red.value,
        )
    st = stats_from_samples(samples, syms, estimator=est.value)
    st.fingerprint = _stamp(syms)
    if all_reduce or (all_reduce is None and is_distributed()):
        all_reduce_stats(st, syms=syms, timeout=timeout)
    if check_finite:
        st.check_finite()
    return st


def check_params_of(model: nn.Module, syms: SymmetrySet, where: str) -> None:
    """Raise unless every parameter of ``syms`` is a parameter of ``model`` (by identity).

    A set found on another model (a copy, a re-created model) would otherwise have its
    statistics read from parameters the forward pass never touches: zero gradients, no error.
    """
    own = {id(p) for p in unwrap_ddp(model).parameters()}
    for name, sym in syms.items():
        foreign = [p for p in sym.params if id(p) not in own]
        if foreign:
            raise StatisticsError(
                f"{where}: symmetry {name!r} acts on a parameter of shape "
                f"{tuple(foreign[0].shape)} that is not a parameter of this model (the set was "
                "found on another model, e.g. before copy.deepcopy or on a re-created model). "
                "Call nf.find_symmetries(model, x) on the model whose statistics you collect."
            )
        frozen = [p for p in sym.params if not p.requires_grad]
        if frozen:
            pname = syms.param_names.get(id(frozen[0]))
            what = repr(pname) if pname else f"of shape {tuple(frozen[0].shape)}"
            raise StatisticsError(
                f"{where}: symmetry {name!r} acts on parameter {what}, which is frozen "
                "(requires_grad=False, set after the symmetries were found): SGD does not move "
                "it, so the charge has no noise-driven flow and no gradient to read. Call "
                "nf.find_symmetries(model, x) after freezing (it leaves frozen parameters out), "
                "or unfreeze the parameter."
            )


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
