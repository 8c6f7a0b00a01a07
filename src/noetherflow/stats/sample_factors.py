"""Per-sample gradients of a linear layer's weight kept as its two factors (the coupled solver).

Sample n's gradient of a weight read by hooks is a sum over its T tokens of outer products,
g_n = L_nᵀ R_n with L_n ``[T, d0]`` along the weight's axis 0 and R_n ``[T, d1]`` along
axis 1 (the layer inputs and output-gradients, in the weight's layout). Where
T·(d0 + d1) < d0·d1 (GPT-2's fused ``c_attn``: 128 · 3,072 against 768 · 2,304) the factors
are the smaller form, and what the coupled solver does with the samples acts on them
exactly, with no ``[N, d0, d1]`` tensor:

* a move of the slice s along axis a (F_s → M F_s, the transport of a rotation, or a
  rescaling's e^{−λ}) multiplies the factor of that axis: X_s → X_s Mᵀ;
* the Gram Σ_n F_{n,s} F_{n,s}ᵀ of that slice is Σ_n X_{n,s}ᵀ (Y_n Y_nᵀ) X_{n,s}, Y the other
  factor: with Y_nᵀ = Q_n R_n (QR), C_n = R_n X_n and the Gram Σ_n C_{n,s}ᵀ C_{n,s};
* the per-index sums of squares along axis a are Σ_n diag(X_nᵀ (Y_n Y_nᵀ) X_n).

The same numbers as the materialised samples to round-off (``tests/test_sample_factors.py``).
:func:`axis_sq` and :func:`dense_of` read either form, :func:`block_grams` and
:func:`left_product_` the factors, so the kernels and
:class:`~noetherflow.stats.source.SampleSource` take a mapping that mixes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import torch
from torch import Tensor

from noetherflow._blas import matmul
from noetherflow._scratch import bmm_

__all__ = [
    "HeldSamples",
    "SampleFactors",
    "axis_sq",
    "block_grams",
    "compresses",
    "dense_of",
    "left_product_",
]


def compresses(t: int, d0: int, d1: int) -> bool:
    """Whether the factors ``[T, d0]``, ``[T, d1]`` are smaller than the ``[d0, d1]`` gradient."""
    return t * (d0 + d1) < d0 * d1


@dataclass
class SampleFactors:
    """N per-sample gradients g_n = L_nᵀ R_n of a 2-D weight, as their factors.

    Attributes:
        left: ``[N, T, d0]``, the factor along the weight's axis 0.
        right: ``[N, T, d1]``, the factor along axis 1.
    """

    left: Tensor
    right: Tensor

    def __post_init__(self) -> None:
        a, b = self.left, self.right
        if a.dim() != 3 or b.dim() != 3 or a.shape[:2] != b.shape[:2]:
            raise ValueError(
                f"SampleFactors: factors of shapes {tuple(a.shape)} and {tuple(b.shape)}; "
                "expected [N, T, d0] and [N, T, d1] with the same N and T."
            )

    @property
    def shape(self) -> torch.Size:
        """``[N, d0, d1]``: the shape of the materialised samples."""
        return torch.Size((self.left.shape[0], self.left.shape[2], self.right.shape[2]))

    @property
    def dtype(self) -> torch.dtype:
        """The factors' dtype."""
        return self.left.dtype

    def factor(self, axis: int) -> Tensor:
        """The factor along the weight's ``axis`` (0 or 1): ``[N, T, d_axis]``."""
        return self.left if axis == 0 else self.right

    def to(self, dtype: torch.dtype) -> SampleFactors:
        """Contiguous copies of the factors in ``dtype``."""
        return SampleFactors(
            self.left.to(dtype, copy=True, memory_format=torch.contiguous_format),
            self.right.to(dtype, copy=True, memory_format=torch.contiguous_format),
        )

    def dense(self) -> Tensor:
        """The samples g_n = L_nᵀ R_n. Has shape ``[N, d0, d1]``."""
        return torch.bmm(self.left.mT, self.right)

    def mean(self) -> Tensor:
        """(1/N) Σ_n g_n: one product over all samples and tokens. Has shape ``[d0, d1]``."""
        n, t = self.left.shape[:2]
        x, y = self.left.reshape(n * t, -1), self.right.reshape(n * t, -1)
        return (x.T @ y) / n

    def mul_(self, other: Tensor) -> SampleFactors:
        """g_n ← g_n ⊙ ``other`` for a factor varying along one axis (a diagonal move).

        ``other`` broadcasts to ``[d0, d1]`` (or ``[1, d0, d1]``) and has more than one
        entry along at most one of the two axes: that axis's factor is scaled.
        """
        lead = other.shape[:-2]
        v = other.reshape(1, -1) if other.dim() < 2 else other.reshape(other.shape[-2:])
        if math.prod(lead) != 1 or (v.shape[0] > 1 and v.shape[1] > 1):
            raise ValueError(
                f"SampleFactors.mul_: a factor of shape {tuple(other.shape)}; expected one that "
                "varies along one axis of the weight only, e.g. [d0, 1] or [1, d1] (a diagonal "
                "move). Solve with noetherflow._sweep_plan.sweep_options(factored=False) "
                "for other moves."
            )
        if v.shape[0] > 1:
            self.left.mul_(v[:, 0].to(self.dtype))
        elif v.shape[1] > 1:
            self.right.mul_(v[0].to(self.dtype))
        else:
            self.right.mul_(v.reshape(()).to(self.dtype))
        return self


# per-sample gradients in either form: ``[N, *shape]`` or a linear layer's factors
HeldSamples: TypeAlias = Tensor | SampleFactors


def _slices(x: Tensor, starts: Sequence[int], d: int) -> Tensor:
    """The slices ``[start, start + d)`` of the last axis of ``x`` ``[P, k]``: ``[B, P, d]``."""
    first = starts[0]
    if all(s == first + i * d for i, s in enumerate(starts)):  # consecutive: one view
        return x[:, first : first + len(starts) * d].unflatten(1, (len(starts), d)).transpose(0, 1)
    return torch.stack([x[:, s : s + d] for s in starts])


def _other_root(f: SampleFactors, axis: int) -> Tensor:
    """R_n with R_nᵀ R_n = Y_n Y_nᵀ, Y the factor of the other axis. ``[N, min(T, d), T]``."""
    y = f.factor(1 - axis)
    return torch.linalg.qr(y.mT, mode="r")[1]


def block_grams(v: SampleFactors, axis: int, starts: Sequence[int], d: int) -> Tensor:
    """Σ_n F_{n,s} F_{n,s}ᵀ for the slices s = ``[start, start + d)`` along ``axis`` (0 or 1).

    F_{n,s}: sample n's slice moved to the front, ``[d, m]``. Has shape ``[B, d, d]``.
    """
    c = matmul(_other_root(v, axis), v.factor(axis))  # [N, r, d_axis]
    y = _slices(c.reshape(-1, c.shape[-1]), starts, d)  # [B, N·r, d]
    return matmul(y.mT, y)


def axis_sq(v: Tensor | SampleFactors, axis: int) -> Tensor:
    """Σ_n Σ over the other axes of g_n², per index along ``axis``. Has shape ``[shape[axis]]``."""
    if isinstance(v, SampleFactors):
        x, y = v.factor(axis), v.factor(1 - axis)
        k = matmul(y, y.mT)  # [N, T, T]
        return (x * matmul(k, x)).sum((0, 1))
    rest = [k for k in range(v.dim()) if k != axis + 1]
    return torch.linalg.vector_norm(v, dim=rest).square()


def left_product_(v: SampleFactors, axis: int, starts: Sequence[int], mats: Tensor) -> None:
    """F_{n,s} → M_s F_{n,s} for each slice s (``mats`` ``[B, d, d]``), on the factors, in place.

    The slice's columns of the factor along ``axis`` become X_s M_sᵀ.
    """
    x = v.factor(axis)
    d = mats.shape[-1]
    flat = x.view(-1, x.shape[-1])
    first = starts[0]
    if all(s == first + i * d for i, s in enumerate(starts)):
        y = flat[:, first : first + len(starts) * d].unflatten(1, (len(starts), d))  # [P, B, d]
        bmm_(y.transpose(0, 1), mats.mT.to(x.dtype), "factors.left")  # [B, P, d]
        return
    for s, m in zip(starts, mats, strict=True):
        flat[:, s : s + d] = flat[:, s : s + d] @ m.T.to(x.dtype)


def dense_of(v: Tensor | SampleFactors) -> Tensor:
    """The materialised samples ``[N, *shape]`` of either form."""
    return v.dense() if isinstance(v, SampleFactors) else v
