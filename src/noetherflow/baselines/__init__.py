"""Other papers' methods, kept apart from the library's own, for comparison in experiments.

* :mod:`noetherflow.baselines.zhao2022` — symmetry teleportation to maximise ‖∇L‖²
  (Zhao et al., 2022).
"""

from noetherflow.baselines.zhao2022 import GradNormTeleportResult, gradient_norm_teleport

__all__ = ["GradNormTeleportResult", "gradient_norm_teleport"]
