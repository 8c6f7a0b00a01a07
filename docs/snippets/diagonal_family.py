"""A new diagonal family in one class: the rescaling between two ``[in, out]`` layers.

The diagonal kernel (statistics, noise term, joint Newton solve, distance, optimizer-state
transport) finds the class by MRO, so the class is all there is.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from noetherflow.symmetry.base import DiagonalSymmetry, DiagonalTerm, Family


# --8<-- [start:diagonal-family]
class TransposedRescaling(DiagonalSymmetry):
    """Per-neuron rescaling between two ``[in, out]`` linear layers joined by a ReLU."""

    family: ClassVar[Family] = Family.RESCALING

    def __init__(self, first: nn.Module, second: nn.Module) -> None:
        super().__init__(label="trescale")
        w1, b1, w2 = first.weight, first.bias, second.weight
        assert isinstance(w1, nn.Parameter) and isinstance(b1, nn.Parameter)
        assert isinstance(w2, nn.Parameter)
        self._terms = [
            DiagonalTerm(w1, 1, 1, 1.0),  # output columns of W1 [in, d]
            DiagonalTerm(b1, 0, 1, 1.0),
            DiagonalTerm(w2, 0, 1, -1.0),  # input rows of W2 [d, out]
        ]

    @property
    def num_generators(self) -> int:
        return int(self._terms[1].param.shape[0])

    def terms(self) -> list[DiagonalTerm]:
        return self._terms


# --8<-- [end:diagonal-family]
