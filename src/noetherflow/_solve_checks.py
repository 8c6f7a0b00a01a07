"""The argument checks of :func:`noetherflow.solve_equilibrium`, before any solving.

The call's form (``(syms, stats, noise)``, the old ``(model, syms, stats)`` warned), statistics
of this set at these values and finite, finite parameters, and the generators to hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor

from noetherflow import _shard
from noetherflow._checks import Fingerprint, check_stats_cover, fingerprint
from noetherflow._deprecate import is_old_model_call, warn_model
from noetherflow._divergence import is_finite
from noetherflow._errors import NonFiniteGradientError
from noetherflow.kernels import NoiseModel, kernel_for
from noetherflow.stats.core import GradStats
from noetherflow.symmetry.base import DiagonalSymmetry
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["check_fixed", "check_inputs", "parse_call"]


def parse_call(
    syms: Any, stats: Any, noise: Any
) -> tuple[SymmetrySet, GradStats, NoiseModel | None]:
    """``(syms, stats, noise)`` of a call, the old ``(model, syms, stats)`` form warned."""
    if is_old_model_call(syms, stats, SymmetrySet):
        warn_model("solve_equilibrium", "solve_equilibrium(syms, stats, noise)")
        syms, stats, noise = stats, noise, None
    if not isinstance(syms, SymmetrySet) or not isinstance(stats, GradStats):
        raise TypeError(
            "solve_equilibrium(syms, stats, noise): expected a SymmetrySet and GradStats, got "
            f"{type(syms).__name__} and {type(stats).__name__}."
        )
    if noise is not None and not isinstance(noise, NoiseModel):
        raise TypeError(
            f"solve_equilibrium: noise is a {type(noise).__name__}; expected a NoiseModel, "
            "e.g. nf.NoiseModel.create(lr=..., batch_size=...)."
        )
    return syms, stats, noise


def check_inputs(syms: SymmetrySet, stats: GradStats) -> tuple[Fingerprint, ...]:
    """Refuse statistics of another set or point, non-finite ones, non-finite parameters.

    Returns the parameters' :func:`fingerprint` (the solution's stamp), each computed once.
    """
    _shard.check_current(syms.params(), "solve_equilibrium")
    known = check_stats_cover(syms.params(), stats, "solve_equilibrium")
    try:
        stats.check_finite()
    except NonFiniteGradientError as e:
        raise NonFiniteGradientError(
            f"solve_equilibrium: {e.args[0].split(';')[0]}; the equilibrium of non-finite "
            "statistics is undefined (a diverged run?). Expected finite statistics: collect "
            "them again from a finite model and batch."
        ) from None
    bad = [tuple(p.shape) for p in syms.params() if not _shard.all_finite(p.detach(), is_finite)]
    if bad:
        raise NonFiniteGradientError(
            f"solve_equilibrium: parameters of shapes {bad} have NaN/Inf entries; expected a "
            "finite model (the run has diverged: lower the learning rate)."
        )
    rest = [p for p in syms.params() if p not in known]
    known.update(zip(rest, fingerprint(rest), strict=True))
    return tuple(known[p] for p in syms.params())


def check_fixed(syms: SymmetrySet, fixed: Mapping[str, Any] | None) -> dict[str, Tensor]:
    """``fixed`` as float64 CPU vectors ``[J]`` per diagonal symmetry name (NaN: free)."""
    out: dict[str, Tensor] = {}
    if fixed is not None and not isinstance(fixed, Mapping):
        raise TypeError(
            f"solve_equilibrium: fixed is a {type(fixed).__name__}; expected None or a mapping "
            "symmetry name → generators to hold (NaN: free), e.g. {'r': [0.2, nan, 0.0]}."
        )
    for name, value in (fixed or {}).items():
        if name not in syms.names:
            raise ValueError(
                f"solve_equilibrium: fixed names the symmetry {name!r}, which is not in the set; "
                f"expected names of syms.names, e.g. {list(syms.names)[:3]}."
            )
        s = syms[name]
        if not kernel_for(s).can_hold:
            raise TypeError(
                f"solve_equilibrium: fixed holds {name!r}, a {s.family.value} symmetry; only "
                "diagonal generators (rescaling, scale) can be held. Leave it out of fixed."
            )
        lam = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
        size = cast(DiagonalSymmetry, s).num_generators
        if tuple(lam.shape) != (size,):
            raise ValueError(
                f"solve_equilibrium: fixed[{name!r}] has shape {tuple(lam.shape)}; expected "
                f"({size},), one λ per generator: the value to hold it at, or NaN to leave it "
                "free."
            )
        if bool(torch.isinf(lam).any()):
            raise ValueError(
                f"solve_equilibrium: fixed[{name!r}] has {int(torch.isinf(lam).sum())} infinite "
                "entries; expected finite values to hold (or NaN to leave a generator free). A "
                "generator cannot be held at infinity: leave it free and read "
                "solution.at_infinity."
            )
        out[name] = lam
    return out
