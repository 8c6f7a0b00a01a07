"""Per-neuron rescaling: Linear/Conv → positively homogeneous activation → Linear/Conv.

For neuron j, the incoming weights w_j (row j of the first layer, with its bias b_j) and the
outgoing weights u_j (column j of the second layer) satisfy ℓ(e^λ w_j, e^λ b_j, e^{-λ}u_j) = ℓ,
so A = diag(I_in, −I_out) per neuron (paper §4.2) and C_j = ‖w_j‖² + b_j² − ‖u_j‖².
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import nn
from typing_extensions import override

from noetherflow._errors import SymmetryDefinitionError
from noetherflow.symmetry._fx.layers import LayerSpec, layer_spec
from noetherflow.symmetry.base import DiagonalSymmetry, DiagonalTerm, Family, check_params

__all__ = ["Rescaling"]


def linear_layer(layer: nn.Module, who: str, name: str, dense: bool = False) -> LayerSpec:
    """The layer registry's :class:`LayerSpec` of ``layer``, or a SymmetryDefinitionError.

    The layers known to detection and hooks alike: ``nn.Linear``, convolutions, Hugging Face
    ``Conv1D``, a dense layer registered with :func:`noetherflow.stats.register_layer`, or
    one that computes ``x·Wᵀ + b`` / ``x·W + b``. ``dense``: not a convolution.
    """
    spec = layer_spec(layer) if isinstance(layer, nn.Module) else None
    if spec is None or (dense and spec.conv):
        kinds = "dense linear layer" if dense else "linear or convolutional layer"
        raise SymmetryDefinitionError(
            f"{who}: {name} layer is a {type(layer).__name__}; expected a {kinds} (nn.Linear"
            f"{'' if dense else ', nn.Conv1d/2d/3d'}, Hugging Face Conv1D, or a layer "
            "registered with noetherflow.stats.register_layer). For other parameters use "
            "ScaleInvariance, DenseSymmetry or DoubleRotation.from_blocks."
        )
    return spec


def _param(layer: nn.Module, name: str) -> nn.Parameter:
    p = getattr(layer, name, None)
    return p  # type: ignore[return-value]


class Rescaling(DiagonalSymmetry):
    """Per-neuron (per-channel) rescaling between two layers.

    Args:
        first: the layer producing the neurons (``nn.Linear``, ``nn.Conv{1,2,3}d``, or any
            layer of the layer registry: HF ``Conv1D``, one registered with
            ``noetherflow.stats.register_layer``); its weight rows (along the registry's
            output axis) and bias entries scale up by e^{λ_j}.
        second: the layer consuming them; its input columns scale down by e^{-λ_j}.
        block: number of consecutive input columns of ``second`` per neuron, e.g. H·W when an
            ``nn.Flatten`` sits between a conv with C channels and a linear layer.
        start: the first input column of ``second`` reading ``first``'s neurons when the
            others read another layer (a ``torch.cat`` of two branches): the neurons occupy
            columns ``[start, start + n·block)``; None: all of them.
        label: optional name shown in tables.

    The layers must be joined by a positively homogeneous map (ReLU, LeakyReLU, identity,
    dropout, max-pooling, flatten); nothing else may read the neurons. ``SymmetrySet.verify``
    checks this numerically. Either layer may be a grouped convolution: ``first``'s output
    channels are its weight rows whatever its groups; ``second`` with G groups reads input
    channel γ·I/G + i only in the filters of group γ, at column i (a depthwise convolution:
    channel c is filter c's whole kernel).
    """

    family: ClassVar[Family] = Family.RESCALING
    signature_is_generator: ClassVar[bool] = True

    def __init__(
        self,
        first: nn.Module,
        second: nn.Module,
        *,
        block: int = 1,
        start: int | None = None,
        label: str | None = None,
    ) -> None:
        super().__init__(label=label)
        s1 = linear_layer(first, "Rescaling", "first")
        s2 = linear_layer(second, "Rescaling", "second")
        if block < 1:
            raise SymmetryDefinitionError(f"Rescaling: block must be >= 1, got {block}.")
        self._w1 = _param(first, "weight")
        self._b1 = _param(first, "bias")
        self._w2 = _param(second, "weight")
        self._axes = (s1.w_out, s2.w_in)  # neuron axis of each weight (registry layout)
        n_out = self._w1.shape[s1.w_out]
        self._groups = s2.groups  # a grouped consumer reads channel γ·I_g + i in group γ only
        n_in = self._w2.shape[s2.w_in] * s2.groups
        if s2.groups > 1 and (self._w2.shape[s2.w_in] % block != 0):
            raise SymmetryDefinitionError(
                f"Rescaling: block={block} does not divide the {self._w2.shape[s2.w_in]} input "
                f"channels per group of second (groups={s2.groups}); expected each neuron's "
                "channels inside one group."
            )
        if start is not None:
            if s2.groups > 1 or not 0 <= start <= n_in - n_out * block:
                raise SymmetryDefinitionError(
                    f"Rescaling: start={start} with {n_out} neurons × block {block} in "
                    f"second's {n_in} input columns (groups={s2.groups}); expected 0 <= start "
                    f"<= {n_in - n_out * block} and an ungrouped second."
                )
        elif n_out * block != n_in:
            raise SymmetryDefinitionError(
                f"Rescaling: layers do not chain: first has {n_out} outputs, second expects "
                f"{n_in} inputs (block={block}); expected {n_out} × block = {n_in}. "
                "Pass block=H*W when a Flatten follows a conv layer."
            )
        self.first = first
        self.second = second
        self.block = block
        self.start = start
        params = [self._w1] + ([self._b1] if self._b1 is not None else [])
        params.append(self._w2)
        check_params(params, "Rescaling")
        self._terms: list[DiagonalTerm] | None = None

    @property
    @override
    def num_generators(self) -> int:
        return int(self._w1.shape[self._axes[0]])

    @override
    def terms(self) -> list[DiagonalTerm]:
        if self._terms is None:
            terms = [DiagonalTerm(self._w1, self._axes[0], 1, 1.0)]
            if self._b1 is not None:
                terms.append(DiagonalTerm(self._b1, 0, 1, 1.0))
            if self.start is None:
                down = DiagonalTerm(self._w2, self._axes[1], self.block, -1.0, groups=self._groups)
            else:  # a slice of second's columns (the rest read another layer)
                n = self.num_generators * self.block
                down = DiagonalTerm(
                    self._w2, self._axes[1], self.block, -1.0, start=self.start, length=n
                )
            terms.append(down)
            self._terms = terms
        return self._terms

    def signature(self, names: Mapping[int, str]) -> tuple[Any, ...]:
        """``("rescaling", first weight, second weight, block[, groups][, ("start", s)])``."""
        sig: tuple[Any, ...] = ("rescaling", names[id(self._w1)], names[id(self._w2)], self.block)
        if self._groups != 1:
            sig = (*sig, self._groups)
        return sig if self.start is None else (*sig, ("start", self.start))

    @override
    def describe(self) -> str:
        return self.label or (
            f"rescaling {type(self.first).__name__}→{type(self.second).__name__} "
            f"({self.num_generators} neurons)"
        )
