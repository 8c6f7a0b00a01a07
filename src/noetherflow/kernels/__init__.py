"""One kernel per symmetry family: statistics, noise term, solve, distance and records.

Registration order (diagonal, rotation, dense) is the order in which the solver visits the
families within a sweep. Adding a family: subclass :class:`Kernel` and its
:class:`~noetherflow.stats.core.StatsBlock` in one module, then
``register_kernel(MySymmetry, MyKernel())`` (see the docs' Extending page).
"""

from noetherflow.kernels.base import (
    GradSource,
    GroupSolve,
    InfinityReport,
    Kernel,
    NoSettings,
    SampleSource,
    StepOptions,
    assemble,
    kernel_for,
    kernels_of,
    register_kernel,
    stats_from_samples,
)
from noetherflow.kernels.dense import DenseKernel, DenseStats
from noetherflow.kernels.diagonal import DiagonalKernel, DiagonalSettings, DiagonalStats
from noetherflow.kernels.noise import NoiseModel, TimeModel, resolve_noise
from noetherflow.kernels.rotation import (
    RotationKernel,
    RotationSettings,
    RotationStats,
    geometric_mean,
)
from noetherflow.stats.core import StatsBlock

__all__ = [
    "DenseKernel",
    "DenseStats",
    "DiagonalKernel",
    "DiagonalSettings",
    "DiagonalStats",
    "GradSource",
    "GroupSolve",
    "InfinityReport",
    "Kernel",
    "NoSettings",
    "NoiseModel",
    "RotationKernel",
    "RotationSettings",
    "RotationStats",
    "SampleSource",
    "StepOptions",
    "StatsBlock",
    "TimeModel",
    "assemble",
    "geometric_mean",
    "kernel_for",
    "kernels_of",
    "register_kernel",
    "resolve_noise",
    "stats_from_samples",
]
