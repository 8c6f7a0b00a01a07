"""The hooks' :class:`~noetherflow.stats.source.GradSource`: statistics from layer factors.

A *unit* is one Linear-like part of a captured layer (the layer itself, or a part of a
composite one such as ``nn.MultiheadAttention``'s ``in_proj`` and ``out_proj``) with its
weight and bias and its factors a/g (:mod:`.registry`); the formulas are :mod:`.layers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from noetherflow._errors import StatisticsError, UnsupportedLayerError
from noetherflow.stats import layers as formulas
from noetherflow.stats.core import axis_sum
from noetherflow.stats.registry import LayerHandler
from noetherflow.stats.sample_factors import SampleFactors, compresses
from noetherflow.stats.source import GradSource

__all__ = ["FactorSource", "MeanGapError", "Record", "Unit"]


class MeanGapError(StatisticsError):
    """autograd's mean gradient is not the mean of the per-sample gradients the hooks saw."""


@dataclass
class Record:
    """What the hooks captured for one layer.

    Its input and output-gradient (or, for a layer whose handler reads the whole call, the
    factors of its parts), and how often it ran.
    """

    module: nn.Module
    name: str
    handler: LayerHandler
    parts: dict[str, tuple[Tensor | None, Tensor | None]]
    a: Tensor | None = None
    g: Tensor | None = None
    call: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    facs: dict[str, tuple[Tensor, Tensor]] | None = None
    calls: int = 0
    side_grad: bool = False  # a second output of the layer fed the loss
    handles: list[Any] = field(default_factory=list)
    precision: torch.dtype | None = None  # the factors' dtype before promotion (bf16 autocast)

    def done(self) -> bool:
        """Whether the backward pass has reached this layer."""
        return self.g is not None or self.facs is not None

    def factors(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{part: (a, g)}`` of the captured batch, in a common dtype of at least float32.

        Under ``torch.autocast`` a layer's input and output-gradient may be bfloat16/float16
        (or differ in dtype); the statistics are squares and sums over the batch, so they are
        formed in float32 (:attr:`precision` keeps the lowest dtype seen, for round-off
        tolerances).
        """
        if self.facs is not None:
            return {k: self._promote(a, g) for k, (a, g) in self.facs.items()}
        assert self.handler.factors is not None and self.a is not None and self.g is not None
        a, g = self._promote(self.a, self.g)
        return {"": self.handler.factors(self.module, a, g)}

    def _promote(self, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        if not (a.is_floating_point() and g.is_floating_point()):
            return a, g
        dt = torch.promote_types(a.dtype, g.dtype)
        low = min((a.dtype, g.dtype), key=lambda t: torch.finfo(t).bits)
        if torch.finfo(dt).bits < 32:
            dt = torch.float32
        if low != dt:
            self.precision = low
        return a.to(dt), g.to(dt)

    def reset(self) -> None:
        """Forget the captured batch."""
        self.a = self.g = None
        self.call = self.facs = None
        self.calls = 0
        self.side_grad = False
        self.precision = None


@dataclass(frozen=True)
class Unit:
    """The part ``part`` of a captured layer, in which the parameter plays ``role``."""

    rec: Record
    part: str
    role: str  # "weight" or "bias"

    @property
    def key(self) -> tuple[int, str]:
        """The key of this part's factors."""
        return (id(self.rec.module), self.part)

    def weight(self) -> Tensor | None:
        """The weight of this part."""
        return self.rec.parts[self.part][0]

    def bias(self) -> Tensor | None:
        """The bias of this part."""
        return self.rec.parts[self.part][1]


class FactorSource(GradSource):
    """Gradient statistics from the captured layer factors (a ``[N, T, I]``, g ``[N, T, O]``).

    Per-sample output-gradients of ℓ_n are ``sc``·g (N·g for a batch-mean loss); the
    formulas apply the factor to their smallest operand.

    ``reduced`` (``level="solve"`` or ``"neuron"``): kernels are told that no per-sample
    gradients are at hand, so that the diagonal statistics are per-neuron sums wherever the
    level allows, as :class:`~noetherflow.stats.source.SampleSource` gives them; the sums of a
    parameter whose per-sample gradients a coupled set keeps anyway are read off those. The
    factors of the front moments (:func:`~noetherflow.stats.layers.front_factors`) are formed
    once per layer and every head's moment is a slice of one batched product.
    """

    def __init__(
        self,
        n: int,
        factors: Mapping[tuple[int, str], tuple[Tensor, Tensor]],
        owners: Mapping[int, Unit],
        sc: float,
        known: Mapping[nn.Parameter, Tensor],
        check_known: bool,
        *,
        reduced: bool = False,
    ) -> None:
        self.n = n
        self._facs, self._owners, self._sc = factors, owners, sc
        self._known, self._check_known = known, check_known
        self._reduced = reduced
        self._samples: dict[nn.Parameter, Tensor] = {}
        # front-moment factors (L, R) per (part, kind), their aligned blocks per (part, kind, d)
        self._front: dict[tuple[tuple[int, str], str], tuple[Tensor, Tensor]] = {}
        self._blocks: dict[tuple[tuple[int, str], str, int], Tensor] = {}
        self._gaps: list[tuple[Unit, Tensor]] = []
        self._checked: set[tuple[int, str]] = set()

    def verify_means(self) -> None:
        """Raise if a known mean disagreed with the hooks' (one device sync for all layers)."""
        if not self._gaps:
            return
        gaps = torch.stack([gp.to(torch.float64) for _, gp in self._gaps]).cpu()
        for (u, _), (diff, scale) in zip(self._gaps, gaps.tolist(), strict=True):
            tol = _PROBE_TOL.get(u.rec.precision or self._facs[u.key][0].dtype, 1e-2)
            if diff > tol * scale and diff > 1e-30:
                name = f"{u.rec.name}.{u.part}" if u.part else u.rec.name
                _raise_mean_gap(name, u.role, self._sc, diff / max(scale, 1e-300))

    def _layer(self, p: nn.Parameter) -> tuple[Record, str, Tensor, Tensor]:
        u = self._owners[id(p)]
        a, g = self._facs[u.key]
        return u.rec, u.role, a, g

    @override
    def has_samples(self, p: nn.Parameter) -> bool:
        return not self._reduced and p in self._samples

    @override
    def samples(self, p: nn.Parameter) -> Tensor:
        if p not in self._samples:
            rec, role, a, g = self._layer(p)
            if role == "weight" and rec.handler.elementwise:
                ps = (g * a).sum(1).mul_(self._sc).reshape(self.n, *p.shape)
            elif role == "weight" and rec.handler.transposed and a.dim() == 3:
                # [N, I, O] straight away: the parameter's layout, contiguous
                ps = formulas.per_sample_weight(a, g, scale=self._sc, transposed=True)
                ps = ps.reshape(self.n, *p.shape)
            elif role == "weight":
                ps = rec.handler.to_param(
                    formulas.per_sample_weight(a, g, scale=self._sc), tuple(p.shape)
                )
            else:
                ps = g.sum(1).mul_(self._sc).reshape(self.n, *p.shape)
            self._samples[p] = ps
        return self._samples[p]

    @override
    def sample_factors(self, p: nn.Parameter) -> SampleFactors | None:
        """A linear weight's samples as (L, R) in its layout, where those are smaller."""
        rec, role, a, g = self._layer(p)
        h = rec.handler
        if role != "weight" or h.elementwise or not h.matrix or a.dim() != 3 or p.dim() != 2:
            return None
        if not compresses(a.shape[1], int(p.shape[0]), int(p.shape[1])):
            return None
        if self._sc != 1.0:  # on the operand with fewer entries, as per_sample_weight does
            a, g = (a * self._sc, g) if a.shape[-1] < g.shape[-1] else (a, g * self._sc)
        return SampleFactors(a, g) if h.transposed else SampleFactors(g, a)

    def _small(self, p: nn.Parameter) -> bool:
        """Per-sample gradients of an elementwise layer are ``[N, O]``: reduce them directly."""
        return self._owners[id(p)].rec.handler.elementwise

    @override
    def mean(self, p: nn.Parameter) -> Tensor:
        if self._small(p):  # per-sample gradients [N, O]: reductions are cheaper than matmuls
            return self.samples(p).mean(0)
        rec, role, a, g = self._layer(p)
        known = self._known.get(p)
        if known is not None:  # autograd's, even with per-sample gradients at hand: no pass
            # one check per part: the weight's when it is known, else the bias's
            u = self._owners[id(p)]
            w = u.weight()
            first = role == "weight" or not (isinstance(w, nn.Parameter) and w in self._known)
            if self._check_known and first and u.key not in self._checked:
                self._checked.add(u.key)
                self._gaps.append((u, _mean_gap(rec, role, a, g, self._sc, known)))
            return known.reshape(p.shape)
        if p in self._samples:  # a reduction is cheaper than a matmul
            return self._samples[p].mean(0)
        if role == "weight":
            return rec.handler.to_param(formulas.weight_mean(a, g, scale=self._sc), tuple(p.shape))
        return formulas.bias_mean(g, scale=self._sc).reshape(p.shape)

    @override
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
        units: dict[tuple[int, str], Unit] = {}
        for p in want:
            u = self._owners[id(p)]
            units.setdefault(u.key, u)
        for key, u in units.items():
            h, w, b = u.rec.handler, u.weight(), u.bias()
            axes = want.get(w, ()) if isinstance(w, nn.Parameter) else ()
            has_b = isinstance(b, nn.Parameter) and b in want
            a, g = self._facs[key]
            if h.elementwise:
                wsum = {ax: axis_sum(self.sq(w), ax) for ax in axes}  # type: ignore[arg-type]
                bs = self.sq(b) if has_b else None  # type: ignore[arg-type]
            elif w in self._samples:  # kept for a coupled set: one pass over them, no matmul
                wsum = {ax: _sample_axis_sq(self._samples[w], ax) for ax in axes}  # type: ignore[index]
                bs = formulas.bias_sq(g, scale=self._sc) if has_b else None
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

    @override
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
        kind = "bias" if role == "bias" else ("row" if h.factor_axis(axis) == 0 else "col")
        part = self._owners[id(p)].key
        lr = self._front.get((part, kind))
        if lr is None:
            lr = self._front[(part, kind)] = formulas.front_factors(a, g, kind, scale=self._sc)
        d = stop - start
        if start % d == 0:  # an aligned block (a head): all of this width at once
            blocks = self._blocks.get((part, kind, d))
            if blocks is None:
                blocks = self._blocks[(part, kind, d)] = formulas.block_moments(*lr, d)
            return blocks[start // d]
        return formulas.sliced_moment(*lr, slice(start, stop))


def _sample_axis_sq(v: Tensor, axis: int) -> Tensor:
    """(1/N) Σ_n g_n ⊙ g_n summed over every axis but ``axis``. Has shape ``[shape[axis]]``.

    ``v``: per-sample gradients ``[N, *shape]``. One fused reduction, no temporary of squares.
    """
    # per sample first (contiguous rows for axis 0), then over the samples: 5x faster than
    # one reduction over the samples and the other axes together
    rest = [k for k in range(1, v.dim()) if k != axis + 1]
    per = torch.linalg.vector_norm(v, dim=rest) if rest else v.abs()
    return per.square_().sum(0).div_(v.shape[0])


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


def _mean_gap(rec: Record, role: str, a: Tensor, g: Tensor, sc: float, known: Tensor) -> Tensor:
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
    raise MeanGapError(
        f"The gradient of loss_fn on layer {name!r} ({role}) is not the "
        f"{'mean' if sc != 1.0 else 'sum'} of per-sample gradients (relative difference "
        f"{gap:.3g}): loss_fn adds a term that is not a per-sample loss, e.g. an L2 penalty, "
        "or the layer's parameter is used elsewhere too. Keep loss_fn the data loss and pass "
        "weight decay as weight_decay=γ to the flow and solver (γ of γ‖θ‖²); pass "
        "check_loss=False to skip this check."
    )


def _in_backward() -> bool:
    """Whether autograd is running a backward pass now (a checkpoint's recompute)."""
    return bool(torch._C._current_graph_task_id() != -1)


def _detached(x: Any, memo: dict[int, Tensor] | None = None) -> Any:
    """``x`` with every tensor in it (tuple, list, dict values) detached.

    Identity is kept: a tensor passed twice (attention's query and key) stays one tensor.
    """
    memo = {} if memo is None else memo
    if isinstance(x, Tensor):
        return memo.setdefault(id(x), x.detach())
    if isinstance(x, tuple | list):
        return type(x)(_detached(v, memo) for v in x)
    if isinstance(x, dict):
        return {k: _detached(v, memo) for k, v in x.items()}
    return x
