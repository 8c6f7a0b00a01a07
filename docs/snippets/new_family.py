"""A new symmetry family in one file: its group action, statistics block and kernel.

``GroupScale`` scales a whole group of parameters by one generator (A = I), so
F(λ) = ½(Tr M e^{−2λ} + κ‖θ‖² e^{2λ}) has the closed-form minimum λ* = ¼ log(Tr M / κ‖θ‖²).
``register_kernel`` at the end is the only registration: ``collect_stats`` (every
estimator), ``noether_flow``, ``solve_equilibrium`` and ``teleport`` then work for it
(``tests/test_extending.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.kernels import (
    GradSource,
    GroupSolve,
    InfinityReport,
    Kernel,
    StatsBlock,
    StepOptions,
    register_kernel,
)
from noetherflow.stats.core import Level
from noetherflow.symmetry.base import Family, Symmetry

DT = torch.float64


# --8<-- [start:kernel]
class GroupScale(Symmetry):
    """θ ↦ e^λ θ on a group of parameters (A = I): C = ‖θ‖², a scalar element λ."""

    family: ClassVar[Family] = Family("group-scale")  # a new family names itself
    # capabilities the drivers read (instead of asking which family this is):
    scale_invariant: ClassVar[bool] = True  # AdamW's equilibrium-norm prediction applies
    needs_zero_eps: ClassVar[bool] = True  # verified with the norms' eps → 0

    def __init__(self, params: Sequence[nn.Parameter], *, label: str | None = None) -> None:
        super().__init__(label=label)
        self._params = list(params)

    @property
    def params(self) -> list[nn.Parameter]:
        return self._params

    @property
    def size(self) -> int:
        return 1

    def charge_of(self, values: Mapping[nn.Parameter, Tensor]) -> Tensor:
        return sum(values[p].to(DT).square().sum() for p in self._params)  # type: ignore[return-value]

    def act_(self, element: Any, values: Mapping[nn.Parameter, Tensor]) -> None:
        for p in self._params:
            values[p].mul_(math.exp(float(element)))

    def transport_grads_(self, element: Any, grads: Mapping[nn.Parameter, Tensor]) -> None:
        for p in self._params:
            grads[p].mul_(math.exp(-float(element)))

    def random_element(self, scale: float, generator: torch.Generator) -> float:
        return float(torch.rand((), generator=generator, dtype=DT) * 2 - 1) * scale

    def identity_element(self) -> float:
        return 0.0


@dataclass
class GroupScaleStats(StatsBlock):
    """Per symmetry, E‖g‖² over its parameters (a scalar)."""

    key: ClassVar[str] = "group_scale"
    sq_total: dict[Symmetry, Tensor] = field(default_factory=dict)


class GroupScaleKernel(Kernel[GroupScale, GroupScaleStats]):
    """flow = −κ‖θ‖² + Tr M, M = c_mean ḡḡᵀ + c_second E[ggᵀ]; λ* = ¼ log(Tr M / κ‖θ‖²)."""

    name: ClassVar[str] = GroupScaleStats.key
    block: ClassVar[type[StatsBlock]] = GroupScaleStats

    def collect(self, syms: Sequence[GroupScale], src: GradSource, level: Level) -> GroupScaleStats:
        out = GroupScaleStats()
        for s in syms:
            want = {p: (0,) for p in s.params}
            sums = src.axis_sq(want)
            out.sq_total[s] = sum(sums[(p, 0)].to(DT).sum() for p in s.params)  # type: ignore[assignment]
        return out

    def noise(self, s: GroupScale, stats: nf.GradStats, nm: nf.NoiseModel) -> Tensor:
        blk = stats.block(self.name)
        assert isinstance(blk, GroupScaleStats)
        gbar2 = sum(stats.mean[p].to(DT).square().sum() for p in s.params)
        return nm.c_mean * gbar2 + nm.c_second * blk.sq_total[s]

    def solve(
        self,
        syms: Sequence[GroupScale],
        values: Mapping[nn.Parameter, Tensor],
        stats: nf.GradStats,
        nm: nf.NoiseModel,
        names: Mapping[Symmetry, str],
        opts: StepOptions,
    ) -> GroupSolve:
        (s,) = syms
        tr_m = float(self.noise(s, stats, nm))
        kc = nm.kappa * float(s.charge_of(values))
        out = GroupSolve()
        if tr_m <= 0 or kc <= 0:
            out.reports.append(InfinityReport(names[s], torch.tensor(1.0), "no restoring term"))
            return out
        lam = 0.25 * math.log(tr_m / kc)
        out.steps.append((s, lam))
        out.residual[s] = 0.0
        return out

    def compose(self, total: Any, element: Any) -> Any:
        return total + element

    def distance(self, s: GroupScale, total: Any) -> Tensor:
        return torch.tensor(abs(float(total)), dtype=torch.float64)

    def mark_infinity(self, distance: Tensor, report: InfinityReport) -> tuple[Tensor, int]:
        return torch.tensor(math.inf), 1


register_kernel(GroupScale, GroupScaleKernel())
# --8<-- [end:kernel]
