"""Scale invariance: ℓ(e^λ θ_S) = ℓ(θ_S) for a parameter group S (normalisation layers).

A = I on the group (paper §4.2), C = ‖θ_S‖². Without weight decay the noise makes the norm
grow for ever (paper eq. 24): the equilibrium is at infinity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from typing_extensions import override

from noetherflow._errors import SymmetryDefinitionError
from noetherflow.symmetry.base import DiagonalSymmetry, DiagonalTerm, Family, check_params

__all__ = ["ScaleInvariance", "scaled_running_var"]


def scaled_running_var(var: Tensor, lam: Tensor, eps: float) -> Tensor:
    """BatchNorm's running variance after its input is scaled by e^λ: e^{2λ}(v + ε) − ε.

    Eval mode divides by √(v + ε); scaling v + ε (not v) by e^{2λ} keeps the eval-mode
    function exact, eps included (v·e^{2λ} alone changes it by O(ε/v)). It is a group action
    (λ then −λ gives v back). Clamped at 0 where e^{2λ}(v + ε) < ε (λ very negative): the
    eval-mode function then changes through eps, as the train-mode one does.
    ``var``: ``[C]``, ``lam``: ``[C]`` or ``[1]`` → ``[C]`` in ``var``'s dtype.
    """
    v = var.to(torch.float64)
    return ((v + eps) * torch.exp(2 * lam) - eps).clamp_min(0).to(var.dtype)


def _generators(params: Sequence[nn.Parameter], per_channel: bool, groups: int | None) -> int:
    """How many generators: 1, one per channel (dim 0) or per group of channels."""
    if per_channel and groups is not None:
        raise SymmetryDefinitionError(
            f"ScaleInvariance: per_channel=True and groups={groups}; expected one of them "
            "(per_channel is groups = the channel count)."
        )
    if not per_channel and groups is None:
        return 1
    what = "per_channel=True" if per_channel else f"groups={groups}"
    sizes = {int(p.shape[0]) for p in params}
    if len(sizes) != 1:
        raise SymmetryDefinitionError(
            f"ScaleInvariance({what}): parameters have different sizes along dim 0: "
            f"{sorted(sizes)}; expected one channel count shared by all."
        )
    c = sizes.pop()
    if groups is None:
        return c
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or c % groups:
        raise SymmetryDefinitionError(
            f"ScaleInvariance: groups={groups!r} for {c} channels; expected a positive integer "
            f"dividing {c} (e.g. the GroupNorm's num_groups)."
        )
    return groups


class ScaleInvariance(DiagonalSymmetry):
    """Joint scaling of a group of parameters leaves the loss unchanged.

    Args:
        params: the parameters scaled together, e.g. the weight and bias feeding a LayerNorm.
        per_channel: one generator per index along dim 0 (all params must share that size),
            e.g. the per-channel invariance of a conv feeding BatchNorm in training mode or an
            InstanceNorm.
        groups: one generator per group of dim 0 cut into ``groups`` equal contiguous
            chunks (all params must share that size), e.g. a conv feeding a GroupNorm with
            ``groups`` groups; ``per_channel`` is ``groups`` = the size of dim 0.
        label: optional name shown in tables.
        norm: the normalisation reading the scaled features, if any: its eps bounds the
            eps-safe moves (:func:`noetherflow.clip_to_eps`,
            :func:`noetherflow.solve_within_eps`), and for a BatchNorm ``apply_`` also scales
            its running statistics (mean by e^λ, variance + eps by e^{2λ}), so that the
            eval-mode function is unchanged (:func:`scaled_running_var`).
        norm_start: the norm channel of the first generator, when the scaled layer's
            channels reach the norm after another layer's (a ``torch.cat``): its running
            statistics are scaled from there.
    """

    family: ClassVar[Family] = Family.SCALE
    signature_is_generator: ClassVar[bool] = True
    scale_invariant: ClassVar[bool] = True
    needs_zero_eps: ClassVar[bool] = True

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        *,
        per_channel: bool = False,
        groups: int | None = None,
        label: str | None = None,
        norm: nn.Module | None = None,
        norm_start: int = 0,
    ) -> None:
        super().__init__(label=label)
        if isinstance(params, nn.Module):
            raise SymmetryDefinitionError(
                f"ScaleInvariance takes parameters, got a {type(params).__name__} module; pass "
                "the parameters whose joint scale the output ignores, e.g. [layer.weight] or "
                "list(layer.parameters())."
            )
        params = list(params)
        check_params(params, "ScaleInvariance")
        for p in params:
            if p.dim() == 0:
                raise SymmetryDefinitionError(
                    "ScaleInvariance: a 0-dimensional parameter cannot be grouped; store it as "
                    "a tensor of shape (1,)."
                )
        self._n = _generators(params, per_channel, groups)
        self.per_channel = per_channel
        self.groups = groups
        self._terms = [DiagonalTerm(p, 0, int(p.shape[0]) // self._n, 1.0) for p in params]
        self.norm = norm
        self.norm_start = norm_start

    @property
    @override
    def normalisation(self) -> nn.Module | None:
        return self.norm

    def state_buffers(self) -> list[Tensor]:
        """Buffers ``apply_`` transforms besides the parameters (BatchNorm running stats)."""
        stats = [getattr(self.norm, n, None) for n in ("running_mean", "running_var")]
        return [b for b in stats if isinstance(b, Tensor)]

    @override
    def apply_(self, element: Any) -> None:
        super().apply_(element)
        mean, var = (getattr(self.norm, n, None) for n in ("running_mean", "running_var"))
        if isinstance(mean, Tensor) and isinstance(var, Tensor):
            lam = torch.as_tensor(element).to(device=mean.device, dtype=torch.float64)
            if self.per_channel:  # the norm's channels this layer feeds (a slice after a cat)
                mean = mean.narrow(0, self.norm_start, self._n)
                var = var.narrow(0, self.norm_start, self._n)
            eps = float(getattr(self.norm, "eps", 0.0))
            with torch.no_grad():
                mean.mul_(torch.exp(lam).to(mean.dtype))
                var.copy_(scaled_running_var(var, lam, eps))

    @property
    @override
    def num_generators(self) -> int:
        return self._n

    @override
    def terms(self) -> list[DiagonalTerm]:
        return self._terms

    def signature(self, names: Mapping[int, str]) -> tuple[Any, ...]:
        """``("scale", (parameter names…), per_channel)``, and ``groups`` when given."""
        sig = ("scale", tuple(names[id(p)] for p in self.params), self.per_channel)
        return sig if self.groups is None else (*sig, self.groups)

    @override
    def describe(self) -> str:
        n = sum(t.param.numel() for t in self._terms)
        what = (
            f"{self._n} channels"
            if self.per_channel
            else f"{self._n} group" + ("s" if self._n > 1 else "")
        )
        return self.label or f"scale invariance ({what}, {n} coordinates)"
