"""Any user-given symmetric generator A on a few parameters (small models).

θ ↦ e^{λA}θ with θ the concatenation of the flattened parameters; C = θᵀAθ (paper eq. 6).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn
from typing_extensions import override

from noetherflow import _shard
from noetherflow._errors import SymmetryDefinitionError
from noetherflow.symmetry.base import Family, Symmetry, check_params

__all__ = ["DenseSymmetry"]


class DenseSymmetry(Symmetry):
    """A dense symmetric generator A over the concatenated flattened ``params``.

    Args:
        params: the parameters, flattened and concatenated in this order (P entries in all).
        A: symmetric matrix of shape ``[P, P]``.
        label: optional name shown in tables.
    """

    family: ClassVar[Family] = Family.DENSE

    def __init__(
        self, params: Sequence[nn.Parameter], A: Tensor, *, label: str | None = None
    ) -> None:
        super().__init__(label=label)
        params = list(params)
        check_params(params, "DenseSymmetry")
        n = sum(p.numel() for p in params)
        A = torch.as_tensor(A)
        if A.shape != (n, n):
            raise SymmetryDefinitionError(
                f"DenseSymmetry: shape mismatch: expected A of shape ({n}, {n}) for parameters "
                f"with {n} entries in all, got {tuple(A.shape)}."
            )
        A64 = A.to(torch.float64)
        asym = float((A64 - A64.T).abs().max()) if n else 0.0
        if asym > 1e-10 * max(1.0, float(A64.abs().max())):
            raise SymmetryDefinitionError(
                f"DenseSymmetry: A is not symmetric (max |A − Aᵀ| = {asym:.3g}); exponential "
                "symmetries need a symmetric generator. Pass (A + A.T) / 2 if that is what you "
                "mean."
            )
        self._params = params
        self.A = A64.to(params[0].device)
        self.eigvals, self.eigvecs = torch.linalg.eigh(self.A)

    @property
    @override
    def params(self) -> list[nn.Parameter]:
        return self._params

    @property
    @override
    def size(self) -> int:
        return 1

    def flat(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        """Concatenated flattened values. Has shape ``[P]``."""
        return torch.cat([values[p].reshape(-1) for p in self._params]).to(torch.float64)

    def flat_batched(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        """Per-sample version. Has shape ``[N, P]``."""
        return torch.cat(
            [values[p].reshape(values[p].shape[0], -1) for p in self._params], dim=1
        ).to(torch.float64)

    def expm(self, lam: float) -> Tensor:
        """e^{λA}. Has shape ``[P, P]``."""
        v, q = self.eigvals, self.eigvecs
        return (q * torch.exp(lam * v)) @ q.T

    @override
    def charge_of(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        # a dense A couples every coordinate: FSDP2 shards are gathered whole
        t = self.flat({p: _shard.full(values[p]) for p in self._params})
        return t @ self.A @ t

    @override
    def bilinear_of(
        self, x: Mapping[nn.Parameter, Tensor], y: Mapping[nn.Parameter, Tensor]
    ) -> Tensor:
        tx = self.flat({p: _shard.full(x[p]) for p in self._params})
        ty = self.flat({p: _shard.full(y[p]) for p in self._params})
        return (tx @ self.A @ ty + ty @ self.A @ tx) / 2

    def _write(self, values: Mapping[nn.Parameter, Tensor], flat: Tensor) -> None:
        i = 0
        for p in self._params:
            v = values[p]
            n = p.numel()
            chunk = flat[..., i : i + n]
            v.copy_(chunk.reshape(v.shape).to(v.dtype))
            i += n

    @override
    def act_(self, element: float | Tensor, values: Mapping[nn.Parameter, Tensor]) -> None:
        lam = float(element)
        self._write(values, self.expm(lam) @ self.flat(values))

    @override
    def transport_grads_(
        self, element: float | Tensor, grads: Mapping[nn.Parameter, Tensor]
    ) -> None:
        lam = float(element)
        g = self.flat_batched(grads)
        self._write(grads, g @ self.expm(-lam).T)

    @override
    def random_element(self, scale: float, generator: torch.Generator) -> float:
        norm = float(self.eigvals.abs().max()) or 1.0
        return (
            float(torch.rand((), generator=generator, dtype=torch.float64) * 2 - 1) * scale / norm
        )

    @override
    def identity_element(self) -> float:
        return 0.0

    @override
    def describe(self) -> str:
        n = self.A.shape[0]
        return self.label or f"dense generator ({n}×{n})"
