"""noetherflow: parameter symmetries, Noether charges and the noise equilibrium of SGD.

Implements "Parameter Symmetry and Noise Equilibrium of Stochastic Gradient Descent"
(Ziyin et al.). Conventions (weight decay γ‖θ‖², the continuous-time factor η/S) are those
of the docs' Concepts pages (docs/concepts/flow.md says where they differ from the paper).
"""

from noetherflow._errors import (
    BranchWarning,
    EpsWarning,
    NonFiniteGradientError,
    StatisticsError,
    SymmetryDefinitionError,
    SymmetryNotPresentError,
    UnsupportedLayerError,
)
from noetherflow._optimizer_state import OptimizerState, transform_optimizer_state
from noetherflow.baselines.zhao2022 import GradNormTeleportResult, gradient_norm_teleport
from noetherflow.eps_solve import solve_within_eps
from noetherflow.equilibrium import (
    EquilibriumSolution,
    InfinityReport,
    geometric_mean,
    solve_equilibrium,
)
from noetherflow.flow import charges, exact_step_charges, noether_flow
from noetherflow.kernels import Kernel, StatsBlock, kernel_for, register_kernel
from noetherflow.kernels.noise import NoiseModel, TimeModel
from noetherflow.monitor import NoetherMonitor, SharpnessOptions, load_history
from noetherflow.optim import (
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
from noetherflow.sharpness import (
    EigenEstimate,
    HVPMethod,
    Sharpness,
    TraceEstimate,
    hessian_trace,
    hvp,
    sharpness,
    top_eigenvalue,
)
from noetherflow.stats.collect import Capture, capture, collect_stats
from noetherflow.stats.core import Estimator, GradStats, Level, Reduction
from noetherflow.stats.distributed import all_reduce_stats
from noetherflow.stats.registry import LayerHandler, register_layer
from noetherflow.symmetry.base import Family, Symmetry
from noetherflow.symmetry.channel import ChannelRescaling
from noetherflow.symmetry.coverage import CoverageReport, CoverageStatus, ParamCoverage
from noetherflow.symmetry.dense import DenseSymmetry
from noetherflow.symmetry.detect import DetectionError, find_symmetries, symmetry_signature
from noetherflow.symmetry.eps import EpsReport, clip_to_eps
from noetherflow.symmetry.rescaling import Rescaling
from noetherflow.symmetry.rotation import Block, DoubleRotation
from noetherflow.symmetry.scaling import ScaleInvariance
from noetherflow.symmetry.set import SymmetrySet, VerifyResult
from noetherflow.teleport import FunctionChangedError, TeleportError, TeleportHandle, teleport
from noetherflow.teleporter import EquilibriumTeleport, TeleportingOptimizer, TeleportRecord

__version__ = "0.1.0"

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
    # charges and flows
    "NoiseModel",
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
