"""Shared machinery of ``optim-sgdm`` and ``optim-adamw``: digits, two small networks, the
stationary-window measurements and the predictions of :mod:`noetherflow.optim`.

Networks (float64, on the standardised 8×8 digits, cross-entropy, batches of S drawn with
replacement):

* ``norm``: Linear(64 → H, no bias) → LayerNorm(H, no affine, eps 1e-12) → ReLU →
  Linear(H → 10). The first weight is scale invariant (one charge ‖W₁‖²).
* ``relu``: Linear(64 → H) → ReLU → Linear(H → 10). Per-neuron rescaling (H charges).

The library's hook statistics of the whole data set (``collect_stats``, one
forward/backward) every ``every`` steps give the conditional expectations
E[G | θ] = (1 − 1/S)∇LᵀA∇L + E_i[∇ℓ_iᵀA∇ℓ_i]/S and, with the momentum buffer v,
E[H | θ, v] = vᵀA∇L; their window averages enter the predictions.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.experiments._data import load_digits_data
from noetherflow.symmetry.base import DiagonalSymmetry

DT = torch.float64


def digits() -> tuple[Tensor, Tensor]:
    """Standardised digits (per-pixel mean 0, std 1 where nonzero). ``[N, 64]``, ``[N]``."""
    data = load_digits_data()
    x = data.x - data.x.mean(0)
    sd = data.x.std(0)
    x = x / np.where(sd > 0, sd, 1.0)
    return torch.tensor(x, dtype=DT), torch.tensor(data.labels, dtype=torch.long)


def build(
    kind: str, hidden: int, seed: int, init_scale: float
) -> tuple[nn.Module, DiagonalSymmetry]:
    """The ``norm`` or ``relu`` network and its symmetry; first layer init × ``init_scale``."""
    torch.manual_seed(seed)
    if kind == "norm":
        first = nn.Linear(64, hidden, bias=False)
        m = nn.Sequential(
            first,
            nn.LayerNorm(hidden, eps=1e-12, elementwise_affine=False),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        ).to(DT)
        w1 = cast(nn.Parameter, first.weight)
        sym: DiagonalSymmetry = nf.ScaleInvariance([w1], label="W1 (LayerNorm)")
    elif kind == "relu":
        m = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(DT)
        sym = nf.Rescaling(m[0], m[2], label="hidden neurons")
    else:
        raise ValueError(f"network kind {kind!r} is not one of 'norm', 'relu'.")
    with torch.no_grad():
        for p in m[0].parameters():
            p.mul_(init_scale)
    return m, sym


def library_moments(
    sym: DiagonalSymmetry,
    m: nn.Module,
    x: Tensor,
    y: Tensor,
    batch_size: int,
    v: dict[nn.Parameter, Tensor] | None,
) -> tuple[Tensor, Tensor]:
    """(E[G | θ], E[H | θ, v]) per generator, from the library's hook statistics.

    ``collect_stats`` (one forward/backward over the data set) gives ḡ and E[g²];
    ``noether_flow`` at η = 1, γ = 0 (discrete time) is exactly E[G | θ].
    """
    syms = nf.SymmetrySet([sym])
    stats = nf.collect_stats(m, syms, nn.functional.cross_entropy, x, y, level="neuron")
    for p in m.parameters():
        p.grad = None
    # The discrete flow at η = 1, γ = 0 is Tr[A((1 − 1/S)∇L∇Lᵀ + E[ggᵀ]/S)] = E[G | θ].
    (noise,) = nf.noether_flow(
        syms, stats, lr=1.0, batch_size=batch_size, weight_decay=0.0, time="discrete"
    ).values()
    if v is None:
        return noise, torch.zeros_like(noise)
    return noise, sym.weighted_sum({p: v[p] * stats.mean[p] for p in sym.params})


def rel(measured: Tensor, predicted: Tensor) -> float:
    """‖measured − predicted‖₂ / ‖predicted‖₂ (a scalar charge: |m/p − 1|)."""
    return float((measured - predicted).norm() / predicted.norm())
