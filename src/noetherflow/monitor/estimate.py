"""A cheap first estimate of the distance for coupled symmetries: one Jacobi step.

Symmetries that share parameters with a rotation (a transformer's attention: the query·key
and value·output rotations and the LayerNorm rescaling of one block all act on its fused
``c_attn``) are solved by block Gauss–Seidel sweeps over per-sample gradients transported
along the orbit (:func:`noetherflow.solve_equilibrium`), and setting those up costs many
training steps on a large model. The monitor's first distance record takes instead one
Jacobi step from the current θ: every kernel's group (all diagonal symmetries jointly, each
rotation on its own) solved on this record's statistics with the others held where they
are. That is the equilibrium of each symmetry given the others, not the joint one: the row
says so (``distance_converged`` = 0, ``distance_sweeps`` = 0), and the coupled solve proper
follows at the next distance records, spread over them (:mod:`.distance`).

Every group is solved at the same θ, so the one-at-a-time groups of a ``batchable`` kernel
are one :meth:`~noetherflow.kernels.Kernel.solve_disjoint` call (the 288 heads of a GPT-2:
batched ``eigh`` instead of 1152 small ones): it reads the same θ for each member and moves
none of them, so shared coordinates do not matter here.
"""

from __future__ import annotations

from torch import Tensor, nn

from noetherflow import _shard
from noetherflow.kernels.base import InfinityReport, StepOptions, kernels_of
from noetherflow.kernels.noise import NoiseModel
from noetherflow.solve_options import SolveOptions, kernel_settings
from noetherflow.stats.core import GradStats
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["jacobi_estimate"]


def jacobi_estimate(
    syms: SymmetrySet, stats: GradStats, nm: NoiseModel, options: SolveOptions
) -> tuple[dict[str, Tensor], list[InfinityReport]]:
    """Per symmetry name the distance of its own equilibrium with the others held; reports.

    ``options``: the solver's; what each kernel's step reads applies (its ``settings``, with
    ``options.kernels`` over the shared values). No per-sample gradients are needed: each group
    is solved from ``stats`` (its momentum displacement included).
    """
    values: dict[nn.Parameter, Tensor] = {p: _shard.full(p.detach()) for p in syms.params()}
    names = {s: n for n, s in syms.items()}
    opts = StepOptions(settings=kernel_settings(options, [k for k, _ in kernels_of(syms)]))
    distance: dict[str, Tensor] = {}
    reports: list[InfinityReport] = []
    for k, members in kernels_of(syms):
        batched = k.joint or (k.batchable and len(members) > 1)
        for part in [members] if batched else [[s] for s in members]:
            solve = k.solve if k.joint or len(part) == 1 else k.solve_disjoint
            res = solve(part, values, stats, nm, names, opts)
            total = {s: s.identity_element() for s in part}
            for s, element in res.steps:
                total[s] = k.compose(total[s], element)
            for s in part:
                distance[names[s]] = k.distance(s, total[s])
            reports.extend(res.reports)
    return distance, reports
