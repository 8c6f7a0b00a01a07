"""Exceptions. Names say whether the problem is in the input (fixable) or in the model."""

from __future__ import annotations

__all__ = [
    "BranchWarning",
    "EpsWarning",
    "NonFiniteGradientError",
    "StatisticsError",
    "SymmetryDefinitionError",
    "SymmetryNotPresentError",
    "TeleportError",
    "UnsupportedLayerError",
]


class SymmetryDefinitionError(ValueError):
    """A symmetry was declared with parameters or shapes that cannot form it."""


class SymmetryNotPresentError(ValueError):
    """A declared symmetry changes the model's outputs: the model does not have it."""


class StatisticsError(ValueError):
    """Gradient statistics cannot be computed from the given batch or settings."""


class NonFiniteGradientError(StatisticsError):
    """A per-sample gradient statistic is NaN or infinite."""


class UnsupportedLayerError(StatisticsError):
    """The chosen estimator does not support a layer that a symmetry acts on."""


class TeleportError(ValueError):
    """A solution cannot be applied to these parameters (they moved, or another model)."""


class EpsWarning(UserWarning):
    """A teleport moves scale invariances that a normalisation's eps makes approximate.

    Raised (as a warning) by :func:`noetherflow.teleport` for a solution that was not kept
    within an eps tolerance (:func:`noetherflow.solve_within_eps`,
    :func:`noetherflow.clip_to_eps`): the outputs change through eps, by how much depends on
    the variance each normalisation divides by.
    """


class BranchWarning(UserWarning):
    """The forward branches on the values of its inputs (``if x.mean() > 0``).

    Raised (as a warning) by :func:`noetherflow.find_symmetries` when a symmetry failed on
    inputs taking another branch (dropped) or could not be checked on every branch (kept,
    not marked verified). The message names the branch (file, line, code).
    """
