"""Noether charges and their flows (paper eqs. 5–9; DESIGN §2).

Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay`` (γ‖θ‖² in the loss). Both time
models have the form  flow = −κ·C + Tr[A·M]  with M built from the gradient statistics:

* ``time="continuous"`` (SGF, Itô, σ² = η/(2S)):  dC/dt = −4γC + (η/S)·Tr[ΣA].
  The paper's eq. (7) writes σ²Tr[ΣA]; Itô's lemma applied to its eq. (1) gives
  2σ²Tr[ΣA] = (η/S)Tr[ΣA], which is what we use (checked against simulation).
* ``time="discrete"`` (one SGD step, expectation over a batch drawn with replacement):
  E[ΔC] = −κC + η²Tr[A(∇L∇Lᵀ + Σ/S)],  κ = 4ηγ(1−ηγ).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import torch
from torch import Tensor, nn

from noetherflow.stats.core import GradStats, axis_sum
from noetherflow.symmetry.base import DiagonalSymmetry, Symmetry
from noetherflow.symmetry.dense import DenseSymmetry
from noetherflow.symmetry.rotation import DoubleRotation
from noetherflow.symmetry.set import SymmetrySet

__all__ = [
    "NoiseModel",
    "TimeModel",
    "charges",
    "exact_step_charges",
    "noether_flow",
]


class TimeModel(str, Enum):
    """Continuous (SGF) or discrete (SGD step) time, DESIGN §2."""

    CONTINUOUS = "continuous"
    DISCRETE = "discrete"


@dataclass(frozen=True)
class NoiseModel:
    """flow = −κ C + Tr[A M],  M = c_mean·ḡḡᵀ + c_second·E[ggᵀ]."""

    kappa: float
    c_mean: float
    c_second: float

    @classmethod
    def create(
        cls, *, lr: float, batch_size: int, weight_decay: float = 0.0, time: str = "continuous"
    ) -> NoiseModel:
        """Coefficients of the time model. See the module docstring for the formulas."""
        _check_hyper(lr, batch_size, weight_decay)
        try:
            tm = TimeModel(time)
        except ValueError:
            raise ValueError(
                f"time={time!r} is not supported; expected 'continuous' or 'discrete'."
            ) from None
        eta, s, gam = float(lr), float(batch_size), float(weight_decay)
        if tm is TimeModel.CONTINUOUS:
            # M = (η/S)·Σ = (η/S)(E[ggᵀ] − ḡḡᵀ)
            return cls(kappa=4 * gam, c_mean=-eta / s, c_second=eta / s)
        # M = η²(ḡḡᵀ + Σ/S) = η²((1 − 1/S) ḡḡᵀ + E[ggᵀ]/S)
        return cls(
            kappa=4 * eta * gam * (1 - eta * gam), c_mean=eta**2 * (1 - 1 / s), c_second=eta**2 / s
        )

    def diag(self, mean: Tensor, sq: Tensor) -> Tensor:
        """Per-coordinate M_kk from ḡ and E[g²] (same shapes)."""
        return self.c_mean * mean.square() + self.c_second * sq

    def matrix(self, mean_outer: Tensor, second: Tensor) -> Tensor:
        """M from ḡḡᵀ-type and E[ggᵀ]-type matrices."""
        return self.c_mean * mean_outer + self.c_second * second


def _check_hyper(lr: float, batch_size: int, weight_decay: float) -> None:
    if not (lr > 0 and torch.isfinite(torch.tensor(float(lr)))):
        raise ValueError(f"lr={lr!r} must be a positive finite learning rate η.")
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(
            f"batch_size={batch_size!r} must be a positive integer S (the SGD batch size)."
        )
    if weight_decay < 0:
        raise ValueError(
            f"weight_decay={weight_decay!r} must be >= 0 (γ of γ‖θ‖²; "
            "decoupled decay λ maps to γ = λ/2)."
        )


def charges(model: nn.Module | None, syms: SymmetrySet) -> dict[str, Tensor]:
    """Noether charges C = θᵀAθ (eq. 6), one entry per symmetry.

    Diagonal families give one charge per generator (``[num_generators]``), a rotation the
    ``[d, d]`` matrix UᵀU − WWᵀ, a dense symmetry a scalar. ``model`` is accepted for symmetry
    with the other calls and is not used.
    """
    return {name: s.charge() for name, s in syms.items()}


def _param_values(s: Symmetry) -> dict[nn.Parameter, Tensor]:
    return {p: p.detach() for p in s.params}


def symmetry_flow(
    s: Symmetry, stats: GradStats, nm: NoiseModel, charge: Tensor | None = None
) -> Tensor:
    """The flow −κC + Tr[A M] of one symmetry (shape of its charge; C may be passed in)."""
    vals = _param_values(s)
    c = s.charge_of(vals) if charge is None else charge
    if isinstance(s, DiagonalSymmetry):
        return -nm.kappa * c + diag_noise(s, stats, nm)
    if isinstance(s, DoubleRotation):
        mw, mu = rotation_noise(s, stats, nm)
        return -nm.kappa * c + (mu - mw)
    if isinstance(s, DenseSymmetry):
        gbar = s.flat(stats.mean)
        mm = nm.matrix(torch.outer(gbar, gbar), stats.dense[s])
        return -nm.kappa * c + (s.A * mm).sum()
    raise TypeError(f"unknown symmetry type {type(s).__name__}")


def diag_noise(s: DiagonalSymmetry, stats: GradStats, nm: NoiseModel) -> Tensor:
    """Tr[A_j M] = Σ_k a_kj M_kk per generator j, from per-axis sums of the statistics. ``[J]``."""
    out = torch.zeros(s.num_generators, dtype=torch.float64, device=s.params[0].device)
    for t in s.terms():
        mean = stats.mean[t.param]
        msq = axis_sum(mean.square(), t.axis)
        m = nm.c_mean * msq + nm.c_second * stats.axis_sq(t.param, t.axis)
        out += t.sign * m.to(torch.float64).reshape(t.num_generators, t.block).sum(1)
    return out


def rotation_noise(s: DoubleRotation, stats: GradStats, nm: NoiseModel) -> tuple[Tensor, Tensor]:
    """(M_W, M_U) of DESIGN §2.1 scaled by the time model, each ``[d, d]``."""
    sw, su = stats.side[s]
    gw = DoubleRotation.side(s.w_blocks, stats.mean)
    gu = DoubleRotation.side(s.u_blocks, stats.mean)
    return nm.matrix(gw @ gw.T, sw), nm.matrix(gu @ gu.T, su)


def noether_flow(
    model: nn.Module | None,
    syms: SymmetrySet,
    stats: GradStats,
    *,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    time: str = "continuous",
    charges: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """The noise-driven flow of every charge (eq. 7 in our convention; DESIGN §2).

    ``time="continuous"`` gives dC/dt = −4γC + (η/S)Tr[ΣA]; ``time="discrete"`` gives the
    expected change per SGD step, −κC + η²Tr[A(∇L∇Lᵀ + Σ/S)]. Shapes follow :func:`charges`;
    pass ``charges`` (from :func:`charges`) to reuse them instead of recomputing.
    """
    nm = NoiseModel.create(lr=lr, batch_size=batch_size, weight_decay=weight_decay, time=time)
    return {
        name: symmetry_flow(s, stats, nm, None if charges is None else charges[name])
        for name, s in syms.items()
    }


def exact_step_charges(
    syms: SymmetrySet,
    grads: Mapping[nn.Parameter, Tensor],
    *,
    lr: float,
    weight_decay: float = 0.0,
) -> dict[str, Tensor]:
    """Predicted charges after one plain SGD step with minibatch gradient ``grads``.

    For θ' = (1 − 2ηγ)θ − ηg (g the gradient of the data loss),
    C(θ') = (1 − 2ηγ)²C(θ) + η² gᵀAg exactly, because θᵀAg = 0 by symmetry (DESIGN §2).
    Call before the step, compare with :func:`charges` after it. Momentum breaks the identity.
    """
    out = {}
    for name, s in syms.items():
        c = s.charge()
        gq = s.charge_of({p: grads[p].detach() for p in s.params})
        out[name] = (1 - 2 * lr * weight_decay) ** 2 * c + lr**2 * gq
    return out
