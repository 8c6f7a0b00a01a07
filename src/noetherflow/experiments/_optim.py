"""Shared machinery of ``optim-sgdm`` and ``optim-adamw``: digits, two small networks, the
stationary-window measurements and the predictions of :mod:`noetherflow.optim`.

Networks (float64, on the standardised 8×8 digits, cross-entropy, batches of S drawn with
replacement):

* ``norm``: Linear(64 → H, no bias) → LayerNorm(H, no affine, eps 1e-12) → ReLU →
  Linear(H → 10). The first weight is scale invariant (one charge ‖W₁‖²).
* ``relu``: Linear(64 → H) → ReLU → Linear(H → 10). Per-neuron rescaling (H charges).

Per-sample gradients of the whole data set (torch.func) every ``every`` steps give the
conditional expectations E[G | θ] = (1 − 1/S)∇LᵀA∇L + E_i[∇ℓ_iᵀA∇ℓ_i]/S and, with the
momentum buffer v, E[H | θ, v] = vᵀA∇L; their window averages enter the predictions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

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
        m = nn.Sequential(
            nn.Linear(64, hidden, bias=False),
            nn.LayerNorm(hidden, eps=1e-12, elementwise_affine=False),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        ).to(DT)
        sym: DiagonalSymmetry = nf.ScaleInvariance([m[0].weight], label="W1 (LayerNorm)")
    elif kind == "relu":
        m = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(DT)
        sym = nf.Rescaling(m[0], m[2], label="hidden neurons")
    else:
        raise ValueError(f"network kind {kind!r} is not one of 'norm', 'relu'.")
    with torch.no_grad():
        for p in m[0].parameters():
            p.mul_(init_scale)
    return m, sym


def per_sample_fn(m: nn.Module) -> Callable[[Tensor, Tensor], dict[str, Tensor]]:
    """Per-sample gradients of the cross-entropy for every sample: ``{name: [N, *shape]}``."""

    def loss_one(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        out = functional_call(m, p, (xi[None],))
        return nn.functional.cross_entropy(out, yi[None])

    fn = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def call(x: Tensor, y: Tensor) -> dict[str, Tensor]:
        with torch.no_grad():
            return fn({k: v.detach() for k, v in m.named_parameters()}, x, y)

    return call


@dataclass
class Window:
    """Stationary-window averages and a thinned trajectory of one run."""

    charge: list[Tensor]
    noise: list[Tensor]  # E[G | θ]
    cross: list[Tensor]  # E[H | θ, v] (0 without momentum)
    traj_steps: list[int]
    traj: list[float]
    extra: dict[str, list[Tensor]]

    def mean(self, name: str) -> Tensor:
        return torch.stack(getattr(self, name) if hasattr(self, name) else self.extra[name]).mean(0)


def conditional_moments(
    sym: DiagonalSymmetry,
    m: nn.Module,
    grads: dict[str, Tensor],
    batch_size: int,
    v: dict[nn.Parameter, Tensor] | None,
) -> tuple[Tensor, Tensor]:
    """(E[G | θ], E[H | θ, v]) per generator from per-sample gradients of the whole data set."""
    params = dict(m.named_parameters())
    mean = {params[k]: g.mean(0) for k, g in grads.items()}
    sq = {params[k]: g.square().mean(0) for k, g in grads.items()}
    s = batch_size
    gq = sym.weighted_sum({p: mean[p].square() for p in sym.params}) * (1 - 1 / s)
    noise = gq + sym.weighted_sum({p: sq[p] for p in sym.params}) / s
    if v is None:
        return noise, torch.zeros_like(noise)
    return noise, sym.weighted_sum({p: v[p] * mean[p] for p in sym.params})


def finite(values: list[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def rel(measured: Tensor, predicted: Tensor) -> float:
    """‖measured − predicted‖₂ / ‖predicted‖₂ (a scalar charge: |m/p − 1|)."""
    return float((measured - predicted).norm() / predicted.norm())


def summarise(values: list[float]) -> dict[str, Any]:
    return {"max": max(values), "mean": float(np.mean(values)), "n": len(values)}
