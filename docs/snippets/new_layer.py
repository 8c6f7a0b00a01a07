"""A new layer type in one file: a linear layer stored ``[in, out]``, registered once.

The one ``register_layer`` call is all ``noetherflow`` needs: the hooks read the layer's
factors, and ``find_symmetries`` knows its weight layout, so it is found, hooked, solved and
teleported (``tests/test_extending.py``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.stats.registry import linear_factors


# --8<-- [start:layer]
class TransposedLinear(nn.Module):
    """y = x W + b with W ``[in, out]``."""

    def __init__(self, n_in: int, n_out: int, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out, dtype=dtype) / math.sqrt(n_in))
        self.bias = nn.Parameter(torch.randn(n_out, dtype=dtype) * 0.1)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


nf.register_layer(TransposedLinear, nf.LayerHandler(linear_factors, transposed=True))
# --8<-- [end:layer]
