"""Former home of the teleporter; kept so that old imports keep working.

Now: :mod:`noetherflow.teleporter` (:class:`EquilibriumTeleport`, :class:`TeleportingOptimizer`,
:class:`TeleportRecord`), :mod:`noetherflow._optimizer_state`
(:func:`transform_optimizer_state`, :class:`OptimizerState`),
:mod:`noetherflow.baselines.zhao2022` (:func:`gradient_norm_teleport`) and
:mod:`noetherflow.integrations.lightning` (the Lightning callbacks). Import from
``noetherflow`` directly.
"""

from noetherflow._optimizer_state import OptimizerState, transform_optimizer_state
from noetherflow.baselines.zhao2022 import GradNormTeleportResult, gradient_norm_teleport
from noetherflow.teleporter import EquilibriumTeleport, TeleportingOptimizer, TeleportRecord

__all__ = [
    "EquilibriumTeleport",
    "GradNormTeleportResult",
    "OptimizerState",
    "TeleportRecord",
    "TeleportingOptimizer",
    "gradient_norm_teleport",
    "transform_optimizer_state",
]
