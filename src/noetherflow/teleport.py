"""Apply an equilibrium solution to a model in place, function-preserving, and undo it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from noetherflow.equilibrium import EquilibriumSolution

__all__ = ["TeleportHandle", "teleport"]


@dataclass
class TeleportHandle:
    """Returned by :func:`teleport`; ``undo()`` restores parameters and buffers bit for bit."""

    solution: EquilibriumSolution
    _saved: dict[Tensor, Tensor]
    _undone: bool = False

    def undo(self) -> None:
        """Restore the parameters (and the buffers a symmetry moves, e.g. BatchNorm running
        statistics) saved before the teleport: exactly, no inverse round-off."""
        if self._undone:
            raise RuntimeError("This teleport was already undone; undo() works once.")
        with torch.no_grad():
            for p, v in self._saved.items():
                p.copy_(v)
        self._undone = True


def teleport(model: nn.Module | None, solution: EquilibriumSolution) -> TeleportHandle:
    """Move the parameters along the symmetry orbits to the solved noise equilibrium.

    Applies ``solution.steps`` in order, in place. The model's function is unchanged (each
    step is a symmetry); its Noether charges move to their equilibrium values. Optimizer state
    (momentum, Adam moments) is not transformed here; see ``nf.EquilibriumTeleport`` for that.
    ``model`` is accepted for symmetry with the other calls and is not used.
    """
    syms = solution.syms
    saved: dict[Tensor, Tensor] = {p: p.detach().clone() for p in syms.params()}
    for s in syms:  # buffers moved with the parameters (ScaleInvariance before a BatchNorm)
        saved.update({b: b.detach().clone() for b in getattr(s, "state_buffers", list)()})
    for i, element in solution.steps:
        syms[i].apply_(element)
    return TeleportHandle(solution, saved)
