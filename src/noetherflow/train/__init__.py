"""Training dynamics: SGD, GD, the stochastic gradient flow and gradient flow.

Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay``. All integrators work on any
``nn.Module`` with a per-sample loss whose batch value is the mean, add the penalty γ‖θ‖²
to the loss (as the paper does), log through ``callback(step, model)`` and record divergence in
their :class:`TrainResult` instead of raising. SGD and GD also report every update with its
gradient to ``on_update``, and SGD trains on a fixed data set or on a data stream
(``sampler``).
"""

from noetherflow.train.integrators import (
    Callback,
    GFMethod,
    LossFn,
    Sampler,
    TrainingData,
    TrainResult,
    UpdateHook,
    UpdateInfo,
    gradient_noise,
    per_sample_gradients,
    run_gd,
    run_gf,
    run_sgd,
    run_sgf,
    sample_batch,
)
from noetherflow.train.population import run_online_sgd, run_population_gd
from noetherflow.train.schedules import (
    Constant,
    GeometricDecay,
    LambdaSchedule,
    LinearWarmup,
    Schedule,
    ScheduleKind,
    ScheduleLike,
    StepDecay,
    lr_sequence,
    make_schedule,
    resolve_schedule,
)

__all__ = [
    "Callback",
    "Constant",
    "GFMethod",
    "GeometricDecay",
    "LambdaSchedule",
    "LinearWarmup",
    "LossFn",
    "Schedule",
    "ScheduleKind",
    "Sampler",
    "ScheduleLike",
    "StepDecay",
    "TrainResult",
    "TrainingData",
    "UpdateHook",
    "UpdateInfo",
    "gradient_noise",
    "lr_sequence",
    "make_schedule",
    "per_sample_gradients",
    "resolve_schedule",
    "run_gd",
    "run_gf",
    "run_online_sgd",
    "run_population_gd",
    "run_sgd",
    "run_sgf",
    "sample_batch",
]
