"""Noether charges under the optimizers people use: SGD with momentum, Adam, AdamW.

Beyond the paper (issue #18). ``momentum``: the exact map of (C, B, E) for heavy-ball (any
dampening) and Nesterov SGD and its stationary point; ``decompose``: the exact per-step
decomposition of any update; ``groups``: the one reader of an optimizer's param groups;
``hyper``: noise descriptions built from them; ``source``: the η and γ the monitor and
teleporter read at each use; ``adam``: the stationary condition and random-walk
equilibrium of Adam(W).
"""

from noetherflow.optim.adam import (
    adamw_angular_update,
    adamw_equilibrium_charge,
    decoupled_stationary_charge,
    rotational_equilibrium_norm,
)
from noetherflow.optim.decompose import (
    StepDecomposition,
    StepRecorder,
    bilinear_charge,
    decompose_step,
)
from noetherflow.optim.groups import ParamGroup, read_groups
from noetherflow.optim.hyper import (
    GroupNoise,
    decay_for_params,
    from_optimizer,
    group_for_params,
    optimizer_kind,
)
from noetherflow.optim.momentum import (
    EffectiveNoise,
    MomentumStep,
    moment_map,
    momentum_displacement,
    momentum_noise,
    momentum_step_moments,
    stationary_closed_form,
    stationary_moments,
    stationary_terms,
    update_charge,
)

__all__ = [
    "EffectiveNoise",
    "GroupNoise",
    "MomentumStep",
    "ParamGroup",
    "StepDecomposition",
    "StepRecorder",
    "adamw_angular_update",
    "adamw_equilibrium_charge",
    "bilinear_charge",
    "decompose_step",
    "decoupled_stationary_charge",
    "from_optimizer",
    "decay_for_params",
    "group_for_params",
    "moment_map",
    "momentum_displacement",
    "momentum_noise",
    "momentum_step_moments",
    "optimizer_kind",
    "read_groups",
    "rotational_equilibrium_norm",
    "stationary_closed_form",
    "stationary_moments",
    "stationary_terms",
    "update_charge",
]
