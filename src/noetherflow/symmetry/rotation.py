"""Double rotation: ℓ(U G, G^{-1} W) = ℓ(U, W) (paper §5.1, eq. 10).

Two linear maps with nothing element-wise between them: factorised layers, attention
W_Q·W_Kᵀ and W_O·W_V per head.

Each side is a matrix with the hidden axis d first ("d-front"): W_f = W̃ ``[d, m]`` (the first
map, its bias folded in as a column) and U_f = Uᵀ ``[d, n]``. A group element is an invertible
``[d, d]`` matrix G acting as W_f → G^{-1} W_f, U_f → Gᵀ U_f. For symmetric B the generator
G = e^{ρB} gives the charge C_B = Tr[B(UᵀU − WWᵀ)]; all of them together are the matrix charge
UᵀU − W̃W̃ᵀ = U_f U_fᵀ − W_f W_fᵀ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn
from typing_extensions import override

from noetherflow import _shard
from noetherflow._errors import SymmetryDefinitionError
from noetherflow._threads import one_thread
from noetherflow.symmetry.base import Family, Slab, Symmetry, check_params

__all__ = ["Block", "DoubleRotation"]


@dataclass(frozen=True, eq=False)
class Block:
    """A slice ``[start, stop)`` of ``param`` along ``axis``: the hidden axis of one side."""

    param: nn.Parameter
    axis: int
    start: int
    stop: int

    @property
    def d(self) -> int:
        """The hidden width d = ``stop − start``."""
        return self.stop - self.start

    def front(self, value: Tensor) -> Tensor:
        """The d-front matrix view of ``value`` (shape of ``param``). Has shape ``[d, m]``."""
        v = value.movedim(self.axis, 0)[self.start : self.stop]
        return v.reshape(self.d, math.prod(v.shape[1:]))  # explicit m: an empty FSDP shard

    def front_batched(self, value: Tensor) -> Tensor:
        """Per-sample version: ``[N, *param.shape]`` → ``[N, d, m]``."""
        v = value.movedim(self.axis + 1, 1)[:, self.start : self.stop]
        return v.reshape(value.shape[0], self.d, -1)

    def write_front_(self, value: Tensor, new: Tensor) -> None:
        """Write a d-front matrix back into ``value`` in place."""
        v = value.movedim(self.axis, 0)[self.start : self.stop]
        v.copy_(new.reshape(v.shape))

    def write_front_batched_(self, value: Tensor, new: Tensor) -> None:
        """Per-sample version of :meth:`write_front_`: ``new`` is ``[N, d, m]``."""
        v = value.movedim(self.axis + 1, 1)[:, self.start : self.stop]
        v.copy_(new.reshape(v.shape))


def _stacked(blocks: Sequence[Block], values: Mapping[nn.Parameter, Tensor]) -> Tensor:
    """The d-front matrices of blocks of one layout (same parameter, axis and d). ``[H, d, m]``.

    A view when the blocks tile a range in order (the heads of a fused projection).
    """
    b0, h = blocks[0], len(blocks)
    v = values[b0.param].movedim(b0.axis, 0)
    starts = [b.start for b in blocks]
    if starts == list(range(starts[0], starts[0] + h * b0.d, b0.d)):
        f = v[starts[0] : starts[0] + h * b0.d]
    else:
        rows = torch.cat([torch.arange(b.start, b.stop) for b in blocks]).to(v.device)
        f = v.index_select(0, rows)
    return f.reshape(h, b0.d, math.prod(v.shape[1:]))


def _layout(s: DoubleRotation) -> tuple[Any, ...]:
    return tuple((id(b.param), b.axis, b.d) for b in s.w_blocks), tuple(
        (id(b.param), b.axis, b.d) for b in s.u_blocks
    )


def _batched_forms(
    syms: Sequence[Symmetry],
    x: Mapping[nn.Parameter, Tensor],
    y: Mapping[nn.Parameter, Tensor] | None,
) -> list[Tensor]:
    """Per rotation: U_xU_xᵀ − W_xW_xᵀ (``y`` None), else ½(U_xU_yᵀ + U_yU_xᵀ) − ½(W…).

    Rotations of one layout are one ``bmm`` per block (Σ over blocks of the fronts' products
    equals the product of the concatenated fronts); sharded values go one at a time.
    """
    rots = cast("list[DoubleRotation]", list(syms))
    out: dict[int, Tensor] = {}
    groups: dict[tuple[Any, ...], list[int]] = {}
    vals = [x] if y is None else [x, y]
    for i, s in enumerate(rots):
        if any(_shard.is_sharded(v[p]) for v in vals for p in s.params):
            out[i] = s.charge_of(x) if y is None else s.bilinear_of(x, y)
        else:
            groups.setdefault(_layout(s), []).append(i)
    for idx in groups.values():
        members = [rots[i] for i in idx]
        m: Tensor | None = None
        for sign, side in ((1.0, "u_blocks"), (-1.0, "w_blocks")):
            for j in range(len(getattr(members[0], side))):
                blocks = [getattr(s, side)[j] for s in members]
                fx = _stacked(blocks, x)
                fy = fx if y is None else _stacked(blocks, y)
                g = torch.bmm(fx, fy.transpose(1, 2))
                m = sign * g if m is None else m + sign * g  # ±1.0 · g is exact
        assert m is not None
        if y is not None:
            m = (m + m.transpose(1, 2)) / 2
        for k, i in enumerate(idx):
            out[i] = m[k]
    return [out[i] for i in range(len(rots))]


def _check_block(b: Block, d: int | None) -> int:
    if not 0 <= b.axis < b.param.dim():
        raise SymmetryDefinitionError(
            f"DoubleRotation: axis {b.axis} is out of range for a parameter of shape "
            f"{tuple(b.param.shape)}."
        )
    if not 0 <= b.start < b.stop <= b.param.shape[b.axis]:
        raise SymmetryDefinitionError(
            f"DoubleRotation: slice [{b.start}, {b.stop}) does not fit axis {b.axis} of size "
            f"{b.param.shape[b.axis]}."
        )
    if d is not None and b.d != d:
        raise SymmetryDefinitionError(
            f"DoubleRotation: layers do not chain: hidden sizes {d} and {b.d} differ; expected "
            "the first map's output size to equal the second map's input size."
        )
    return b.d


class DoubleRotation(Symmetry):
    """U·W = (U G)(G^{-1} W) for every invertible G.

    Args:
        first: a dense linear layer of the layer registry (``nn.Linear``, HF ``Conv1D``, one
            registered with ``noetherflow.stats.register_layer``) computing the hidden
            vector (W ``[d, d_in]`` or ``[d_in, d]``; its bias rotates with it).
        second: such a layer reading it (U ``[d_out, d]`` or ``[d, d_out]``; its bias is
            untouched).
        label: optional name shown in tables.

    For slices of parameters (attention heads, packed projections) use
    :meth:`DoubleRotation.from_blocks`.
    """

    family: ClassVar[Family] = Family.ROTATION
    signature_is_generator: ClassVar[bool] = True

    @override
    def acted_axes(self) -> list[tuple[nn.Parameter, int | None]]:
        return [(b.param, b.axis) for b in [*self.w_blocks, *self.u_blocks]]

    def __init__(self, first: nn.Module, second: nn.Module, *, label: str | None = None) -> None:
        from noetherflow.symmetry.rescaling import linear_layer

        s1 = linear_layer(first, "DoubleRotation", "first", dense=True)
        s2 = linear_layer(second, "DoubleRotation", "second", dense=True)
        w1: nn.Parameter = first.weight  # type: ignore[assignment]
        w2: nn.Parameter = second.weight  # type: ignore[assignment]
        d = w1.shape[s1.w_out]
        if w2.shape[s2.w_in] != d:
            raise SymmetryDefinitionError(
                f"DoubleRotation: layers do not chain: first has {d} outputs, second expects "
                f"{w2.shape[s2.w_in]} inputs; expected equal sizes."
            )
        w_blocks = [Block(w1, s1.w_out, 0, d)]
        bias = getattr(first, "bias", None)
        if isinstance(bias, nn.Parameter):
            w_blocks.append(Block(bias, 0, 0, d))
        self._init(w_blocks, [Block(w2, s2.w_in, 0, d)], label)

    @classmethod
    def from_blocks(
        cls, w_blocks: Sequence[Block], u_blocks: Sequence[Block], *, label: str | None = None
    ) -> DoubleRotation:
        """A double rotation between arbitrary slices.

        ``w_blocks`` are transformed by G^{-1} (the map applied first), ``u_blocks`` by Gᵀ,
        each along its hidden ``axis``. Example, head h of a query/key pair with head size k:
        ``from_blocks([Block(Wk, 0, h*k, (h+1)*k)], [Block(Wq, 0, h*k, (h+1)*k)])``.
        """
        self = cls.__new__(cls)
        self._init(list(w_blocks), list(u_blocks), label)
        return self

    def _init(self, w_blocks: list[Block], u_blocks: list[Block], label: str | None) -> None:
        Symmetry.__init__(self, label=label)
        if not w_blocks or not u_blocks:
            raise SymmetryDefinitionError("DoubleRotation: each side needs at least one block.")
        d: int | None = None
        for b in [*w_blocks, *u_blocks]:
            d = _check_block(b, d)
        assert d is not None
        self.d = d
        self.w_blocks = w_blocks
        self.u_blocks = u_blocks
        params: list[nn.Parameter] = []
        for b in [*w_blocks, *u_blocks]:
            if not any(b.param is p for p in params):
                params.append(b.param)
        check_params(params, "DoubleRotation")
        self._params = params

    @property
    @override
    def params(self) -> list[nn.Parameter]:
        return self._params

    @property
    @override
    def size(self) -> int:
        return self.d

    @staticmethod
    def side(blocks: Sequence[Block], values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        """The d-front matrix of one side. Has shape ``[d, m]``."""
        return torch.cat([b.front(values[b.param]) for b in blocks], dim=1)

    @override
    def charge_of(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        if any(_shard.is_sharded(values[p]) for p in self._params):
            return self._sharded_charge(values)
        uf = self.side(self.u_blocks, values)
        wf = self.side(self.w_blocks, values)
        return uf @ uf.T - wf @ wf.T

    @override
    def bilinear_of(
        self, x: Mapping[nn.Parameter, Tensor], y: Mapping[nn.Parameter, Tensor]
    ) -> Tensor:
        if any(_shard.is_sharded(v[p]) for v in (x, y) for p in self._params):
            return super().bilinear_of(x, y)
        m = self.side(self.u_blocks, x) @ self.side(self.u_blocks, y).T
        m = m - self.side(self.w_blocks, x) @ self.side(self.w_blocks, y).T
        return (m + m.T) / 2  # ½(U_xU_yᵀ + U_yU_xᵀ) − ½(W_xW_yᵀ + W_yW_xᵀ)

    @classmethod
    @override
    def charges_of(
        cls, syms: Sequence[Symmetry], values: Mapping[nn.Parameter, Tensor]
    ) -> list[Tensor]:
        """UᵀU − WWᵀ of each rotation, one batched product per block.

        Rotations with the same layout on the same tensors (the heads of an attention) are
        batched together.
        """
        return _batched_forms(syms, values, None)

    @classmethod
    @override
    def bilinears_of(
        cls,
        syms: Sequence[Symmetry],
        x: Mapping[nn.Parameter, Tensor],
        y: Mapping[nn.Parameter, Tensor],
    ) -> list[Tensor]:
        """The symmetrised bilinear forms of :meth:`bilinear_of`, batched as :meth:`charges_of`."""
        return _batched_forms(syms, x, y)

    def _sharded_charge(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        """UᵀU − WWᵀ of values sharded by FSDP2: a sum over shards where the hidden axis is whole.

        A side whose hidden axis is not the sharded dim (e.g. the second layer's input
        columns under ``Shard(0)``) contributes its local Gram matrix, all-reduced; a side
        sharded along the hidden axis itself (the first layer's rows) is gathered whole: its
        Gram matrix pairs rows that live on different ranks.
        """
        local = {p: _shard.local_slice(values[p]) for p in self._params}
        whole = {p: _shard.full(values[p]) for p in self._whole(local)}
        v0 = values[self._params[0]]
        exact = torch.zeros(self.d, self.d, dtype=v0.dtype, device=v0.device)
        partial = torch.zeros_like(exact)
        group = None
        for sign, blocks in ((1.0, self.u_blocks), (-1.0, self.w_blocks)):
            for b in blocks:
                ls = local[b.param]
                if b.param in whole or ls.group is None:
                    f = b.front(whole.get(b.param, ls.local))
                    exact += sign * (f @ f.T)
                elif ls.local.numel() > 0:
                    f = b.front(ls.local)
                    partial += sign * (f @ f.T)
                group = ls.group if ls.group is not None else group
        return _shard.sum_over_shards(partial, group) + exact

    def _whole(self, local: Mapping[nn.Parameter, _shard.LocalSlice]) -> list[nn.Parameter]:
        """Sharded parameters that must be gathered: those split along a hidden axis."""
        out = []
        for p, ls in local.items():
            axes = {b.axis for b in (*self.w_blocks, *self.u_blocks) if b.param is p}
            # the same answer on every rank (a gather is a collective): never by shard size
            if ls.group is not None and ls.dim in axes:
                out.append(p)
        return out

    @override
    def apply_(self, element: Any) -> None:
        """W_f → G⁻¹W_f, U_f → GᵀU_f; an FSDP2 shard in place where its hidden axis is whole.

        A parameter sharded along its hidden axis is gathered, moved and its shard written back.
        """
        if not any(_shard.is_sharded(p) for p in self._params):
            super().apply_(element)
            return
        with torch.no_grad():
            local = {p: _shard.local_slice(p.data) for p in self._params}
            gathered = self._whole(local)
            values = {p: ls.local for p, ls in local.items()}
            values.update({p: _shard.full(p.detach()).clone() for p in gathered})
            self.act_(element, values)
            for p in gathered:
                _shard.write_local(p.data, values[p])

    @staticmethod
    def _act(blocks: Sequence[Block], mat: Tensor, values: Mapping[nn.Parameter, Tensor]) -> None:
        for b in blocks:
            v = values[b.param]
            b.write_front_(v, mat.to(v.dtype) @ b.front(v))

    @staticmethod
    def _act_batched(
        blocks: Sequence[Block], mat: Tensor, values: Mapping[nn.Parameter, Tensor]
    ) -> None:
        for b in blocks:
            v = values[b.param]
            b.write_front_batched_(v, mat.to(v.dtype) @ b.front_batched(v))

    def _check_g(self, g: Tensor) -> Tensor:
        g = torch.as_tensor(g)
        if g.shape != (self.d, self.d):
            raise ValueError(
                f"Shape mismatch: expected a group element G of shape ({self.d}, {self.d}) for "
                f"{self.describe()}, got {tuple(g.shape)}."
            )
        return g

    @override
    def act_(self, element: Tensor, values: Mapping[nn.Parameter, Tensor]) -> None:
        g = self._check_g(element).to(torch.float64)
        with one_thread():  # d×d products: see noetherflow._threads
            ginv = torch.linalg.inv(g)
            self._act(self.w_blocks, ginv, values)
            self._act(self.u_blocks, g.T, values)

    @override
    def transport_grads_(self, element: Tensor, grads: Mapping[nn.Parameter, Tensor]) -> None:
        # W_f → G^{-1}W_f makes ∇W_f → Gᵀ∇W_f; U_f → GᵀU_f makes ∇U_f → G^{-1}∇U_f.
        g = self._check_g(element).to(torch.float64)
        with one_thread():
            ginv = torch.linalg.inv(g)
            self._act_batched(self.w_blocks, g.T, grads)
            self._act_batched(self.u_blocks, ginv, grads)

    @override
    def random_element(self, scale: float, generator: torch.Generator) -> Tensor:
        b = torch.randn(self.d, self.d, generator=generator, dtype=torch.float64)
        with one_thread():
            b = (b + b.T) / 2
            b = b / torch.linalg.matrix_norm(b, ord=2) * scale
            return torch.linalg.matrix_exp(b).to(self._params[0].device)

    @override
    def identity_element(self) -> Tensor:
        return torch.eye(self.d, dtype=torch.float64, device=self._params[0].device)

    @override
    def describe(self) -> str:
        return self.label or f"double rotation (d={self.d})"

    def covered_slabs(self, p: Tensor) -> list[Slab]:
        """The hidden slices of ``p`` on either side."""
        return [(b.axis, b.start, b.stop) for b in [*self.w_blocks, *self.u_blocks] if b.param is p]

    def signature(self, names: Mapping[int, str]) -> tuple[Any, ...]:
        """``("rotation", W-side blocks, U-side blocks)``.

        Each block is ``(param name, axis, start, stop)``.
        """

        def blocks(bs: Sequence[Block]) -> tuple[tuple[Any, ...], ...]:
            return tuple((names[id(b.param)], b.axis, b.start, b.stop) for b in bs)

        return ("rotation", blocks(self.w_blocks), blocks(self.u_blocks))
