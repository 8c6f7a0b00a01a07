"""The dense kernel: any user-given symmetric generator A on a few parameters.

Statistics: E[ggᵀ] over the concatenated parameters, ``[P, P]`` (per-sample gradients are
materialised, so this is for small models). Noise term: Tr[A M]. Solve: the flow along the
orbit e^{λA}θ is strictly monotone in λ (paper Thm 4.3): bracket, then Brent's method.
Distance: |λ*|.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from scipy.optimize import brentq
from torch import Tensor, nn
from typing_extensions import override

from noetherflow._errors import StatisticsError
from noetherflow.kernels.base import (
    GradSource,
    GroupSolve,
    InfinityReport,
    Kernel,
    StepOptions,
    register_kernel,
)
from noetherflow.kernels.noise import NoiseModel, TimeModel, cross_values
from noetherflow.stats.core import GradStats, Level, StatsBlock
from noetherflow.symmetry.base import Symmetry
from noetherflow.symmetry.dense import DenseSymmetry

__all__ = ["DenseKernel", "DenseStats"]

_LAM_MAX = 40.0  # |λ|·max|μ| beyond which the equilibrium is taken to be at infinity


@dataclass
class DenseStats(StatsBlock):
    """Per dense symmetry, E[g gᵀ] over its concatenated parameters, ``[P, P]``."""

    key: ClassVar[str] = "dense"
    dense: dict[Symmetry, Tensor] = field(default_factory=dict)

    @override
    def second_moment_params(self) -> set[int]:
        return {id(p) for s in self.dense for p in s.params}


def _block(stats: GradStats) -> DenseStats:
    b = stats.block(DenseStats.key)
    if not isinstance(b, DenseStats):
        raise StatisticsError(
            "These statistics hold no block for dense symmetries; collect them with "
            "nf.collect_stats for the same symmetry set."
        )
    return b


def _moment(
    s: DenseSymmetry, stats: GradStats, nm: NoiseModel, gbar: Tensor, second: Tensor
) -> Tensor:
    """M = c_mean·ḡḡᵀ + c_second·E[ggᵀ] (+ c_cross·sym(vḡᵀ) with a displacement). ``[n, n]``."""
    v = cross_values(stats, nm, s.params)
    cross = None if v is None else torch.outer(s.flat(v).to(gbar), gbar)
    return nm.matrix(torch.outer(gbar, gbar), second, cross)


def _solve_dense(
    s: DenseSymmetry, values: Mapping[nn.Parameter, Tensor], stats: GradStats, nm: NoiseModel
) -> tuple[float, int, float]:
    """λ* of the monotone flow along e^{λA}; returns (λ*, sign if at infinity else 0, residual)."""
    mu, q = s.eigvals.cpu(), s.eigvecs.cpu()
    th = q.T @ s.flat(values).cpu()
    gbar = s.flat(stats.mean).cpu()
    mm = _moment(s, stats, nm, gbar, _block(stats).dense[s].to(torch.float64).cpu())
    mt = torch.einsum("ij,ik,kj->j", q, mm, q).clamp(min=0).numpy()
    c = (nm.kappa * th.square()).numpy()
    mun = mu.numpy()

    def dF(lam: float) -> float:  # = −flow, increasing in λ
        return float(np.sum(mun * (c * np.exp(2 * lam * mun) - mt * np.exp(-2 * lam * mun))))

    scale = float(np.sum(np.abs(mun) * (c + mt))) or 1.0
    f0 = dF(0.0)
    if abs(f0) <= 1e-14 * scale:
        return 0.0, 0, abs(f0) / scale
    limit = _LAM_MAX / max(float(np.abs(mun).max()), 1e-300)
    step = 1.0 / max(float(np.abs(mun).max()), 1e-300)
    direction = -1.0 if f0 > 0 else 1.0
    lo = 0.0
    hi = direction * step
    while np.sign(dF(hi)) == np.sign(f0):
        lo = hi
        hi *= 2
        if abs(hi) > limit:
            return 0.0, int(direction), 1.0
    root = brentq(dF, min(lo, hi), max(lo, hi), xtol=1e-14, rtol=1e-14, maxiter=500)
    return float(root), 0, abs(dF(root)) / scale


def _gamma_vec(s: DenseSymmetry, gamma: Mapping[nn.Parameter, float]) -> Tensor:
    """γ_k per coordinate of the concatenated parameters, float64 CPU. ``[P]``."""
    return torch.cat([torch.full((p.numel(),), gamma[p], dtype=torch.float64) for p in s.params])


def mixed_dense_flow(
    a: Tensor, theta: Tensor, gbar: Tensor, noise: Tensor | float, gam: Tensor, nm: NoiseModel
) -> Tensor:
    """The flow with a per-coordinate Γ that need not commute with A (eqs. PD1–PD2).

    continuous: −2θᵀ(ΓA + AΓ)θ + Tr[AM]; discrete: θᵀ(KAK − A)θ + 4η²θᵀΓAḡ + Tr[AM],
    K = I − 2ηΓ. ``a`` ``[P, P]``; ``theta``, ``gbar``, ``gam`` ``[P]``; ``noise`` = Tr[AM].
    A scalar.
    """
    if nm.time is TimeModel.DISCRETE:
        assert nm.lr is not None
        eta = nm.lr
        kt = (1 - 2 * eta * gam) * theta
        return kt @ a @ kt - theta @ a @ theta + 4 * eta**2 * (gam * theta) @ a @ gbar + noise
    return -4 * (gam * theta) @ a @ theta + noise


def _solve_mixed(
    s: DenseSymmetry, values: Mapping[nn.Parameter, Tensor], stats: GradStats, nm: NoiseModel
) -> tuple[float, int, float]:
    """λ* where the flow with non-commuting Γ vanishes along e^{λA} (eq. PD8).

    The decay term is no longer monotone along the orbit (Γ does not commute with A), so the
    flow is scanned on a grid of |λ|·max|μ| ≤ 40 and the stable zero (the flow falling
    through 0) nearest to λ = 0 is refined by Brent's method; no stable zero: at infinity
    in the direction the flow pushes at the far end. Returns what :func:`_solve_dense` does.
    """
    mix = nm.mixed_terms(s.params, "solve_equilibrium", commuting=False)
    mu, q = s.eigvals.cpu().to(torch.float64), s.eigvecs.cpu().to(torch.float64)
    a = s.A.cpu().to(torch.float64)
    th = q.T @ s.flat(values).cpu()
    gq = q.T @ s.flat(stats.mean).cpu()
    mm = _moment(s, stats, mix.noise, s.flat(stats.mean).cpu(), _block(stats).dense[s].cpu())
    mt = torch.einsum("ij,ik,kj->j", q, mm.to(torch.float64), q)
    gam = _gamma_vec(s, mix.gamma)

    def flow(lam: float) -> float:
        e = torch.exp(lam * mu)
        noise = float((mu * mt / e.square()).sum())
        return float(mixed_dense_flow(a, q @ (e * th), q @ (gq / e), noise, gam, mix.noise))

    top = max(float(mu.abs().max()), 1e-300)
    scale = float((mu.abs() * (mt.abs() + 4 * gam.max() * th.square())).sum()) or 1.0
    f0 = flow(0.0)
    if abs(f0) <= 1e-14 * scale:
        return 0.0, 0, abs(f0) / scale
    grid = np.linspace(-_LAM_MAX / top, _LAM_MAX / top, 801)
    vals = np.array([flow(float(t)) for t in grid])
    falls = [i for i in range(len(grid) - 1) if vals[i] > 0 >= vals[i + 1]]
    if not falls:
        return 0.0, int(np.sign(vals[-1] if vals[-1] > 0 else vals[0]) or 1), 1.0
    i = min(falls, key=lambda j: abs(grid[j] + grid[j + 1]))
    root = brentq(flow, grid[i], grid[i + 1], xtol=1e-14, rtol=1e-14, maxiter=500)
    return float(root), 0, abs(flow(root)) / scale


class DenseKernel(Kernel[DenseSymmetry, DenseStats]):
    """Kernel of :class:`~noetherflow.symmetry.dense.DenseSymmetry`, one at a time."""

    name: ClassVar[str] = DenseStats.key
    block: ClassVar[type[StatsBlock]] = DenseStats

    @override
    def sample_params(self, syms: Sequence[DenseSymmetry]) -> list[nn.Parameter]:
        return [p for s in syms for p in s.params]

    def collect(self, syms: Sequence[DenseSymmetry], src: GradSource, level: Level) -> DenseStats:
        """E[ggᵀ] from the per-sample gradients of each symmetry's parameters."""
        out = DenseStats()
        for s in syms:
            f = s.flat_batched({p: src.samples(p) for p in s.params})
            out.dense[s] = f.T @ f / f.shape[0]
        return out

    @override
    def mixed_flow(self, s: DenseSymmetry, stats: GradStats, nm: NoiseModel) -> Tensor:
        """The flow with γ per parameter: Γ need not commute with A (eqs. PD1–PD2)."""
        mix = nm.mixed_terms(s.params, "noether_flow", commuting=False)
        theta = s.flat({p: p.detach() for p in s.params})
        gbar = s.flat(stats.mean)
        gam = _gamma_vec(s, mix.gamma).to(theta.device)
        a = s.A.to(theta)
        return mixed_dense_flow(a, theta, gbar, self.noise(s, stats, mix.noise), gam, mix.noise)

    def noise(self, s: DenseSymmetry, stats: GradStats, nm: NoiseModel) -> Tensor:
        """Tr[A M], M = c_mean·ḡḡᵀ + c_second·E[ggᵀ]. A scalar."""
        gbar = s.flat(stats.mean)
        mm = _moment(s, stats, nm, gbar, _block(stats).dense[s])
        return (s.A * mm).sum()

    def solve(
        self,
        syms: Sequence[DenseSymmetry],
        values: Mapping[nn.Parameter, Tensor],
        stats: GradStats,
        nm: NoiseModel,
        names: Mapping[Symmetry, str],
        opts: StepOptions,
    ) -> GroupSolve:
        """λ* of the monotone flow along e^{λA} (one symmetry)."""
        (s,) = syms
        if nm.uniform(s.params) is None:
            lam, sign, res = _solve_mixed(s, values, stats, nm)
        else:
            lam, sign, res = _solve_dense(s, values, stats, nm.uniform(s.params) or nm)
        out = GroupSolve(progress=res)
        if sign:
            out.reports.append(
                InfinityReport(
                    names[s],
                    torch.tensor(float(sign)),
                    "the flow keeps its sign along the whole orbit: equilibrium at "
                    f"{'+' if sign > 0 else '-'}infinity; left unmoved",
                )
            )
        if lam != 0.0:
            out.steps.append((s, lam))
        out.residual[s] = res
        return out

    @override
    def compose(self, total: Any, element: Any) -> Any:
        return total + element

    def distance(self, s: DenseSymmetry, total: Any) -> Tensor:
        """|λ*|."""
        return torch.tensor(abs(float(total)), dtype=torch.float64)

    def mark_infinity(self, distance: Tensor, report: InfinityReport) -> tuple[Tensor, int]:
        """The whole orbit runs off: distance inf, one direction."""
        return torch.tensor(float("inf"), dtype=torch.float64), 1


register_kernel(DenseSymmetry, DenseKernel())
