"""Static view of :mod:`noetherflow`'s public API (read by type checkers and the docs).

At run time ``__init__.py`` attaches these names lazily (``lazy_loader``), so that
``noetherflow --help`` and ``--version`` answer without importing torch. A name is public when
it is imported here and listed in ``__all__`` (tests/test_layout.py checks both agree).
"""

from ._errors import (
    BranchWarning,
    EpsWarning,
    NonFiniteGradientError,
    StatisticsError,
    SymmetryDefinitionError,
    SymmetryNotPresentError,
    UnsupportedLayerError,
)
from .baselines.zhao2022 import GradNormTeleportResult, gradient_norm_teleport
from .equilibrium import (
    EquilibriumSolution,
    InfinityReport,
    geometric_mean,
    solve_equilibrium,
)
from .flow import charges, exact_step_charges, noether_flow
from .kernels import Kernel, StatsBlock, kernel_for, register_kernel
from .kernels.noise import NoiseModel, ParamDecay, TimeModel
from .monitor import NoetherMonitor, SharpnessOptions, load_history
from .optim import (
    GroupNoise,
    MomentumStep,
    StepDecomposition,
    StepRecorder,
    adamw_equilibrium_charge,
    decompose_step,
    decoupled_stationary_charge,
    from_optimizer,
    momentum_displacement,
    momentum_noise,
    stationary_moments,
)
from .sharpness import (
    EigenEstimate,
    HVPMethod,
    Sharpness,
    TraceEstimate,
    hessian_trace,
    hvp,
    sharpness,
    top_eigenvalue,
)
from .solve_options import SolveOptions
from .stats.collect import Capture, capture, collect_stats
from .stats.core import Estimator, GradStats, Level, Reduction
from .stats.distributed import all_reduce_stats
from .stats.registry import LayerHandler, register_layer
from .symmetry._fx.patterns import register_matcher
from .symmetry.base import Family, Symmetry
from .symmetry.channel import ChannelRescaling
from .symmetry.coverage import CoverageReport, CoverageStatus, ParamCoverage
from .symmetry.dense import DenseSymmetry
from .symmetry.detect import DetectionError, find_symmetries, symmetry_signature
from .symmetry.eps import EpsReport
from .symmetry.rescaling import Rescaling
from .symmetry.rotation import Block, DoubleRotation
from .symmetry.scaling import ScaleInvariance
from .symmetry.set import SymmetrySet, VerifyResult
from .teleportation.apply import FunctionChangedError, TeleportError, TeleportHandle, teleport
from .teleportation.eps import clip_to_eps, solve_within_eps
from .teleportation.optimizer_state import OptimizerState, transform_optimizer_state
from .teleportation.tool import EquilibriumTeleport, TeleportingOptimizer, TeleportRecord

__version__: str

__all__ = [
    # symmetries
    "Block",
    "ChannelRescaling",
    "DenseSymmetry",
    "DoubleRotation",
    "Family",
    "Rescaling",
    "ScaleInvariance",
    "Symmetry",
    "SymmetrySet",
    "VerifyResult",
    # detection
    "BranchWarning",
    "CoverageReport",
    "CoverageStatus",
    "EpsReport",
    "EpsWarning",
    "ParamCoverage",
    "clip_to_eps",
    "find_symmetries",
    "symmetry_signature",
    # statistics
    "Capture",
    "Estimator",
    "GradStats",
    "Level",
    "Reduction",
    "LayerHandler",
    "capture",
    "collect_stats",
    "register_layer",
    "register_matcher",
    # charges and flows
    "NoiseModel",
    "ParamDecay",
    "TimeModel",
    "charges",
    "exact_step_charges",
    "noether_flow",
    # extending: one kernel per symmetry family
    "Kernel",
    "StatsBlock",
    "kernel_for",
    "register_kernel",
    # monitoring and sharpness
    "EigenEstimate",
    "HVPMethod",
    "NoetherMonitor",
    "Sharpness",
    "SharpnessOptions",
    "SolveOptions",
    "TraceEstimate",
    "all_reduce_stats",
    "hessian_trace",
    "hvp",
    "load_history",
    "sharpness",
    "top_eigenvalue",
    # equilibrium and teleport
    "EquilibriumSolution",
    "InfinityReport",
    "TeleportHandle",
    "EquilibriumTeleport",
    "GradNormTeleportResult",
    "OptimizerState",
    "TeleportingOptimizer",
    "TeleportRecord",
    "gradient_norm_teleport",
    "transform_optimizer_state",
    "geometric_mean",
    "solve_equilibrium",
    "solve_within_eps",
    "teleport",
    # errors
    "DetectionError",
    "NonFiniteGradientError",
    "StatisticsError",
    "SymmetryDefinitionError",
    "SymmetryNotPresentError",
    "FunctionChangedError",
    "TeleportError",
    "UnsupportedLayerError",
    # optimizers beyond plain SGD (issue #18)
    "GroupNoise",
    "MomentumStep",
    "StepDecomposition",
    "StepRecorder",
    "adamw_equilibrium_charge",
    "decompose_step",
    "decoupled_stationary_charge",
    "from_optimizer",
    "momentum_displacement",
    "momentum_noise",
    "stationary_moments",
]
