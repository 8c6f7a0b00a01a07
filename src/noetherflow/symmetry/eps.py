"""Keep a teleport inside the region where a normalisation's eps does not matter.

Scale invariance before a normalisation is exact only at eps = 0. With eps > 0, scaling the
features entering the norm by s = e^λ turns its normalised output x̂ = (x − μ)/√(v + ε) into
s(x − μ)/√(s²v + ε) = (x − μ)/√(v + ε e^{−2λ}), a relative change

    r(λ) = | √((v + ε) / (v + ε e^{−2λ})) − 1 |,

where v is the variance the norm divides by: the batch variance of each channel (BatchNorm,
training mode), its running variance (BatchNorm, eval mode, whose running statistics the
teleport scales along, see :class:`~noetherflow.symmetry.scaling.ScaleInvariance`), the
per-sample variance or mean square (LayerNorm, GroupNorm, RMSNorm, InstanceNorm; the smallest
one over the example batch, per channel or group where each has its own generator).
``r(λ) ≤ τ`` holds on an interval of λ:

    (v + ε)/(1 + τ)² ≤ v + ε e^{−2λ} ≤ (v + ε)/(1 − τ)².

The eps-safe intervals (:func:`eps_bounds`) and the measured output change of a teleport
(:func:`measurer`, on a float64 copy in train and eval mode) are what
:func:`noetherflow.clip_to_eps` and :func:`noetherflow.solve_within_eps` (both in
:mod:`noetherflow.teleportation.eps`, which needs the solver) build on; the
:class:`EpsReport` says which generators were clipped and what was measured.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._inputs import ModelInputs
from noetherflow.symmetry._fx.capture import flat_outputs
from noetherflow.symmetry._fx.layers import norm_spec
from noetherflow.symmetry.set import _rebind, _to64, copy_mapping

__all__ = ["EpsClip", "EpsReport", "eps_bounds", "eps_interval", "measurer"]


def eps_interval(var: Tensor, eps: float, tol: float) -> tuple[Tensor, Tensor]:
    """λ range with relative change r(λ) ≤ ``tol`` of the normalised output.

    Args:
        var: the variance v the norm divides by, one per generator. Shape ``[J]``.
        eps: the norm's eps.
        tol: the tolerance τ on the relative change, 0 < τ < 1.

    Returns:
        ``(lo, hi)``, each of shape ``[J]`` (float64; ``hi`` may be +inf).
    """
    v = var.to(torch.float64).clamp_min(0)
    top = ((v + eps) / (1 - tol) ** 2 - v) / eps  # e^{−2λ} ≤ top
    bottom = ((v + eps) / (1 + tol) ** 2 - v) / eps  # e^{−2λ} ≥ bottom
    lo = -0.5 * torch.log(top)
    hi = torch.where(bottom > 0, -0.5 * torch.log(bottom.clamp_min(1e-300)), math.inf)
    return lo, hi


@dataclass(frozen=True)
class EpsClip:
    """One scale invariance whose generators were clipped: indices, λ before and after."""

    name: str
    generators: list[int]
    before: Tensor
    after: Tensor


@dataclass
class EpsReport:
    """What :func:`clip_to_eps` or :func:`noetherflow.solve_within_eps` changed and measured.

    Attributes:
        tolerance: τ, the largest accepted relative output change.
        clipped: the scale invariances with clipped generators (λ before and after).
        halvings: how often the steps (:func:`clip_to_eps`) or the eps-safe intervals
            (``solve_within_eps``) were halved because the measured change exceeded τ.
        change_train, change_eval: relative output change of the teleport (float64).
        resolves: equilibrium solves with clipped generators held fixed
            (``solve_within_eps``; 0 for :func:`clip_to_eps`, which does not re-solve).
    """

    tolerance: float
    clipped: list[EpsClip] = field(default_factory=list)
    halvings: int = 0
    change_train: float = 0.0
    change_eval: float = 0.0
    resolves: int = 0

    def __repr__(self) -> str:
        clipped = [c.name for c in self.clipped]
        return (
            f"EpsReport(tolerance={self.tolerance:g}, clipped={clipped}, "
            f"halvings={self.halvings}, change_train={self.change_train:.3g}, "
            f"change_eval={self.change_eval:.3g}, resolves={self.resolves})"
        )

    def __str__(self) -> str:
        lines = [
            f"eps tolerance {self.tolerance:g}: relative output change after the teleport "
            f"{self.change_train:.3g} (train mode), {self.change_eval:.3g} (eval mode)"
        ]
        for c in self.clipped:
            lines.append(f"  {c.name}: clipped generators {c.generators}")
        if self.halvings:
            lines.append(f"  halved {self.halvings} times")
        if self.resolves:
            lines.append(f"  re-solved {self.resolves} times with the clipped generators held")
        return "\n".join(lines)


def _norm_variance(
    norm: nn.Module, x: Tensor, generators: int, train: bool, start: int = 0
) -> Tensor:
    """The variance the norm divides by, per generator (``[generators]``).

    One generator: the smallest variance of any normalised group. Per channel (BatchNorm,
    InstanceNorm) or per group (GroupNorm): each channel's (group's) smallest over the
    samples, from channel ``start`` on (a layer concatenated after another's channels).
    """
    spec = norm_spec(norm)
    assert spec is not None
    x = x.detach().to(torch.float64)
    rv = getattr(norm, "running_var", None)
    if not train and isinstance(rv, Tensor):
        v = rv.to(torch.float64)  # BatchNorm (InstanceNorm with running statistics), eval mode
    elif spec.batch:
        v = x.movedim(1, 0).reshape(x.shape[1], -1).var(1, unbiased=False)
    elif spec.instance:
        v = x.reshape(x.shape[0], x.shape[1], -1).var(-1, unbiased=False).amin(0)
    elif isinstance(norm, nn.GroupNorm):
        v = x.reshape(x.shape[0], norm.num_groups, -1).var(-1, unbiased=False).amin(0)
    elif spec.rms or "RMS" in type(norm).__name__:
        v = x.pow(2).mean(spec.axis)
    else:
        v = x.var(spec.axis, unbiased=False)
    if generators == 1:
        return v.min().reshape(1)
    per = x.shape[1] // v.numel()  # channels per entry of v: 1, or a GroupNorm's group size
    return v.narrow(0, start // per, generators)


def _run(model: nn.Module, inp: ModelInputs, train: bool, seed: int) -> Tensor:
    model.train(train)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        return flat_outputs(inp(model))


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def eps_bounds(
    model: nn.Module,
    syms: Any,
    inputs: Any,
    *,
    tolerance: float,
    seed: int = 0,
) -> dict[int, tuple[Tensor, Tensor]]:
    """The eps-safe λ interval of every scale invariance before a normalisation.

    The variance each norm divides by is read on a copy of ``model`` in training mode (batch
    variance) and in eval mode (running variance where the norm keeps one); the interval of
    :func:`eps_interval` is the intersection of the two.

    Args:
        model: the model the symmetries act on (not modified).
        syms: a :class:`~noetherflow.SymmetrySet`.
        inputs: example inputs (a tensor, a tuple of positional inputs or a dict of keyword
            inputs).
        tolerance: τ, 0 < τ < 1.
        seed: seeds any dropout in the forward passes.

    Returns:
        Index in ``syms`` → ``(lo, hi)``, each ``[num_generators]`` float64 on the CPU (``hi``
        may be +inf); symmetries that are not such scale invariances are left out.
    """
    args = ModelInputs.of(inputs, "clip_to_eps")
    bounds: dict[int, tuple[Tensor, Tensor]] = {}
    seen: dict[int, list[Tensor]] = {}
    for i, s in enumerate(syms):
        norm = s.normalisation
        if norm is None:
            continue
        spec = norm_spec(norm)
        if spec is None:
            continue
        probe = copy.deepcopy(model)
        pnorm = probe.get_submodule(_qualname(model, norm))
        hook = pnorm.register_forward_pre_hook(
            lambda _m, a, i=i: seen.setdefault(i, []).append(a[0])
        )
        for train in (True, False):
            _run(probe, args, train, seed)
        hook.remove()
        eps = float(getattr(norm, spec.eps_attr))
        los, his = [], []
        for x, train in zip(seen.get(i, []), (True, False), strict=False):
            start = int(getattr(s, "norm_start", 0))
            var = _norm_variance(norm, x, s.num_generators, train, start)  # the model's running_var
            lo, hi = eps_interval(var, eps, tolerance)
            los.append(lo)
            his.append(hi)
        if los:
            bounds[i] = (torch.stack(los).amax(0), torch.stack(his).amin(0))
    return bounds


def _qualname(model: nn.Module, target: nn.Module) -> str:
    for n, m in model.named_modules():
        if m is target:
            return n
    raise ValueError(
        f"clip_to_eps: the normalisation {type(target).__name__} of a symmetry is not a module "
        "of the model; pass the model the symmetries were found on."
    )


def eps_moved(syms: Any, steps: list[tuple[int, Any]]) -> list[str]:
    """Names of the scale invariances before a normalisation that ``steps`` move (sorted).

    ``steps``: ``(index in syms, element)`` pairs, as in :attr:`EquilibriumSolution.steps`.
    """
    return sorted(
        {
            syms.names[i]
            for i, el in steps
            if syms[i].normalisation is not None
            and _eps_of(syms[i].normalisation) != 0  # eps = 0: the invariance is exact
            and bool(torch.as_tensor(el).ne(0).any())
        }
    )


def _eps_of(norm: Any) -> float:
    """The eps of a normalisation module (nonzero when unknown; None is a default > 0)."""
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    return 1.0 if eps is None else float(eps)


def check_tolerance(tolerance: float, who: str) -> None:
    """Raise ValueError unless ``tolerance`` is a real number with 0 < τ < 1 (the eps tolerance)."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise ValueError(
            f"{who}: tolerance={tolerance!r} is a {type(tolerance).__name__}; expected a number "
            "in (0, 1) (the largest relative output change), e.g. 1e-6."
        )
    if not 0 < tolerance < 1:
        raise ValueError(
            f"{who}: tolerance must be in (0, 1) (the largest relative output change), got "
            f"{tolerance}; e.g. 1e-6."
        )


def measurer(
    model: nn.Module, args: ModelInputs, seed: int
) -> Callable[[Any, list[tuple[int, Any]]], tuple[float, float]]:
    """Relative output change of applying ``steps`` on float64 copies, train and eval mode."""
    args64 = args.map(_to64)

    def measure(syms: Any, steps: list[tuple[int, Any]]) -> tuple[float, float]:
        out = []
        for train in (True, False):
            m64 = copy.deepcopy(model).to(torch.float64)
            base = _run(m64, args64, train, seed)
            m64 = copy.deepcopy(model).to(torch.float64)
            mapping = copy_mapping(model, m64)
            mods = dict(zip(map(id, model.modules()), m64.modules(), strict=True))
            for i, el in steps:
                s64 = _rebind(syms[i], mapping)
                for key, ref in vars(syms[i]).items():  # its modules (a norm): the copy's own
                    if isinstance(ref, nn.Module) and id(ref) in mods:
                        setattr(s64, key, mods[id(ref)])
                s64.apply_(el)
            out.append(_rel(_run(m64, args64, train, seed), base))
        return out[0], out[1]

    return measure
