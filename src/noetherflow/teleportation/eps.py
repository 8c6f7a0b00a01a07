"""The noise equilibrium within a normalisation's eps tolerance: clip, hold, re-solve.

A scale invariance before a normalisation is exact only at eps = 0, so a teleport may move its
generators only inside the interval where eps changes the outputs by at most τ
(:func:`~noetherflow.symmetry.eps.eps_bounds`, docs/concepts/detection.md). Clipping the
solved λ into that interval (:func:`~noetherflow.clip_to_eps`) is not enough: the generators
coupled to the clipped ones (a rescaling sharing a weight with a clipped scale invariance,
paper eq. 9 solved jointly) were solved as if the clipped ones had moved all the way, and
their flows do not vanish after the teleport. :func:`solve_within_eps` therefore

1. solves the equilibrium (:func:`~noetherflow.solve_equilibrium`);
2. holds every scale-invariance generator that left its interval at the nearest bound and
   solves again for all the others with those held (``SolveOptions(fixed=...)``:
   the minimum of the convex F over the free generators, whose flows vanish there);
3. repeats 2 until no free generator leaves its interval (the held set only grows, so this
   ends after at most as many solves as there are bounded generators);
4. measures the relative output change of the teleport on float64 copies, train and eval
   mode; while it exceeds τ (several norms in a row add their changes) it halves the
   intervals and starts again from 2.

A held generator keeps its flow: it stays at its bound even where, with the others re-solved,
its own equilibrium might lie inside the interval (the held set is never shrunk: a simple,
terminating rule rather than the minimum of F over the box).

:func:`clip_to_eps` only clips: every generator of a scale invariance into its interval
(train- and eval-mode variance alike), then, while the measured change exceeds τ, the clipped
steps are halved; the generators coupled to them stay where the unclipped solve put them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import check_instance
from noetherflow._inputs import ModelInputs, Probe
from noetherflow.equilibrium import EquilibriumSolution, solve_equilibrium
from noetherflow.kernels.noise import NoiseModel
from noetherflow.solve_options import split_options
from noetherflow.stats.core import GradStats
from noetherflow.symmetry.eps import (
    EpsClip,
    EpsReport,
    check_tolerance,
    eps_bounds,
    measurer,
)
from noetherflow.symmetry.set import SymmetrySet

__all__ = ["clip_to_eps", "solve_within_eps"]

Bounds = dict[int, tuple[Tensor, Tensor]]


def _lam(sol: EquilibriumSolution, name: str) -> Tensor:
    """The total λ of a diagonal symmetry in ``sol``. Has shape ``[J]`` (float64, CPU)."""
    return torch.as_tensor(sol.elements[name], dtype=torch.float64).detach().cpu().reshape(-1)


def clip_held(
    sol: EquilibriumSolution, bounds: Bounds, held: Mapping[str, Tensor], shrink: float
) -> dict[str, Tensor] | None:
    """``held`` grown by the free generators of ``sol`` outside ``shrink`` × their interval.

    Args:
        sol: a solution with ``held`` in place.
        bounds: index → ``(lo, hi)`` ``[J]`` from :func:`eps_bounds`.
        held: symmetry name → λ ``[J]``, finite where held, NaN where free.
        shrink: the factor the intervals are scaled by (1, ½, ¼, …; 0 stays inside).

    Returns:
        The grown mapping (a held generator at the bound it crossed), or None when no free
        generator is outside its interval.
    """
    names = sol.syms.names
    out = dict(held)
    grew = False
    for i, (lo, hi) in bounds.items():
        lam, name = _lam(sol, names[i]), names[i]
        lo_s, hi_s = lo * shrink, hi * shrink
        cur = out.get(name, torch.full_like(lam, float("nan")))
        leave = torch.isnan(cur) & ((lam < lo_s) | (lam > hi_s))
        if bool(leave.any()):
            out[name] = torch.where(leave, torch.minimum(torch.maximum(lam, lo_s), hi_s), cur)
            grew = True
    return out if grew else None


def solve_within_eps(
    model: nn.Module,
    syms: SymmetrySet,
    stats: GradStats,
    inputs: Any,
    noise: NoiseModel | None = None,
    *,
    tolerance: float = 1e-6,
    seed: int = 0,
    max_halvings: int = 40,
    **solve_kwargs: Any,
) -> tuple[EquilibriumSolution, EpsReport]:
    """The noise equilibrium (paper Thm 4.3, eq. 9) with scale invariances kept eps-safe.

    See the module docstring for the procedure. Every generator that is not held (clipped)
    is at its equilibrium given the held ones: after the teleport its flow vanishes, as far
    as eps lets the statistics transport exactly (to about τ).

    Let η, S, γ denote ``lr``, ``batch_size``, ``weight_decay`` (in ``solve_kwargs``, as in
    :func:`~noetherflow.solve_equilibrium`), τ ``tolerance``.

    Args:
        model: the model the symmetries act on (not modified), in the mode it trains in.
        syms: its symmetries (:func:`noetherflow.find_symmetries`).
        stats: their statistics at the current parameters (:func:`noetherflow.collect_stats`).
        inputs: example inputs for the normalisations' variances and the measured output
            change (a tensor, a tuple of positional inputs or a dict of keyword inputs).
        noise: a :class:`~noetherflow.NoiseModel`, or the keywords ``lr``, ``batch_size`` …
            in ``solve_kwargs``.
        tolerance: τ, the largest relative output change accepted in train and eval mode.
        seed: seeds any dropout in the measuring forward passes.
        max_halvings: how often the intervals may be halved when the change exceeds τ.
        **solve_kwargs: keyword arguments of :func:`~noetherflow.solve_equilibrium`
            (``options``; ``init`` warm-starts the first solve only; ``options.fixed`` is set
            here).

    Returns:
        The solution (apply it with :func:`noetherflow.teleport`) and an
        :class:`~noetherflow.EpsReport`: the clipped generators (λ of the first solve and
        held), the re-solves, the halvings and the measured changes.

    Raises:
        ValueError: ``tolerance`` not in (0, 1) or ``max_halvings`` negative.
        TypeError: ``fixed`` among the options.
    """
    who = "solve_within_eps"
    check_tolerance(tolerance, who)
    if int(max_halvings) < 0:
        raise ValueError(f"{who}: max_halvings={max_halvings!r}; expected an int >= 0.")
    given = solve_kwargs.get("options")
    if "fixed" in solve_kwargs or getattr(given, "fixed", None) is not None:
        raise TypeError(
            f"{who}: fixed= is set by this function (the clipped generators); to hold "
            "generators of your own, call nf.solve_equilibrium(..., options=nf.SolveOptions("
            "fixed=...)) directly."
        )
    solve_kwargs, opts = split_options(solve_kwargs, who, warn=True)
    args = ModelInputs.of(inputs, who)
    bounds = eps_bounds(model, syms, args, tolerance=tolerance, seed=seed)
    first = solve_equilibrium(syms, stats, noise, options=opts, **solve_kwargs)
    kwargs = {k: v for k, v in solve_kwargs.items() if k != "init"}
    report = EpsReport(tolerance)
    measure = measurer(model, args, seed)
    shrink, names = 1.0, syms.names
    while True:
        sol = first
        held: dict[str, Tensor] = {}
        while (grown := clip_held(sol, bounds, held, shrink)) is not None:
            held = grown
            sol = solve_equilibrium(
                syms, stats, noise, options=opts.replace(fixed=held), init=sol, **kwargs
            )
            report.resolves += 1
        report.change_train, report.change_eval = measure(syms, sol.steps)
        if max(report.change_train, report.change_eval) <= tolerance:
            break
        moving = any(bool(_lam(sol, names[i]).abs().max() > 0) for i in bounds)
        if not moving or report.halvings >= max_halvings:
            break  # no scale invariance moves: narrower intervals would change nothing
        shrink /= 2
        report.halvings += 1
    for name, lam in held.items():
        gens = torch.isfinite(lam).nonzero().flatten().tolist()
        report.clipped.append(EpsClip(name, gens, _lam(first, name), _lam(sol, name)))
    return replace(sol, eps_tolerance=tolerance, probe=Probe(args)), report


def clip_to_eps(
    model: nn.Module,
    solution: EquilibriumSolution,
    inputs: Any,
    *,
    tolerance: float = 1e-6,
    seed: int = 0,
    max_halvings: int = 40,
) -> tuple[EquilibriumSolution, EpsReport]:
    """Clip the scale-invariance generators of ``solution`` to the eps-safe region.

    Only the clipped steps change: the generators coupled to them (e.g. rescalings sharing
    parameters with a clipped scale invariance) keep the values solved as if the clipped ones
    had moved all the way, so their flows do not vanish after the teleport. To solve them
    again with the clipped generators held in place, use
    :func:`noetherflow.solve_within_eps` instead (it needs the statistics); this function
    applies to any solution, e.g. random group elements.

    Args:
        model: the model ``solution`` was solved for (not modified).
        solution: from :func:`noetherflow.solve_equilibrium`.
        inputs: example inputs (a tensor, a tuple of positional inputs or a dict of keyword
            inputs, as in :func:`noetherflow.find_symmetries`).
        tolerance: largest accepted relative change of the outputs, train and eval mode.
        seed: seeds any dropout in the measuring forward passes.
        max_halvings: how often the scale-invariance steps may be halved after clipping.

    Returns:
        The clipped solution and an :class:`EpsReport`.

    Raises:
        ValueError: ``tolerance`` not in (0, 1).
    """
    check_tolerance(tolerance, "clip_to_eps")
    check_instance(model, nn.Module, "clip_to_eps: model", "the nn.Module of the solution")
    check_instance(solution, EquilibriumSolution, "clip_to_eps: solution", "an EquilibriumSolution")
    args = ModelInputs.of(inputs, "clip_to_eps")
    syms, names = solution.syms, solution.syms.names
    bounds = eps_bounds(model, syms, args, tolerance=tolerance, seed=seed)
    report = EpsReport(tolerance)
    steps = list(solution.steps)
    cum: dict[int, Tensor] = {}
    new_steps: list[tuple[int, Any]] = []
    clipped: dict[int, set[int]] = {}
    for i, el in steps:
        if i not in bounds:
            new_steps.append((i, el))
            continue
        lam = torch.as_tensor(el, dtype=torch.float64).cpu()
        lo, hi = bounds[i]
        prev = cum.get(i, torch.zeros_like(lam))
        want = prev + lam
        got = torch.minimum(torch.maximum(want, lo), hi)
        clipped.setdefault(i, set()).update(int(j) for j in torch.nonzero(got != want).flatten())
        cum[i] = got
        new_steps.append((i, (got - prev).to(torch.as_tensor(el).dtype)))
    for i, gens in clipped.items():
        if gens:
            total = sum(
                (torch.as_tensor(e, dtype=torch.float64).cpu() for j, e in steps if j == i),
                torch.zeros(1, dtype=torch.float64),
            )
            report.clipped.append(EpsClip(names[i], sorted(gens), total, cum[i]))
    measure = measurer(model, args, seed)
    while True:
        report.change_train, report.change_eval = measure(syms, new_steps)
        ok = max(report.change_train, report.change_eval) <= tolerance
        if ok or report.halvings >= max_halvings or not bounds:
            break
        new_steps = [(i, e / 2 if i in bounds else e) for i, e in new_steps]
        report.halvings += 1
    elements = dict(solution.elements)
    for i, total in cum.items():
        if names[i] in elements:
            elements[names[i]] = total * 0.5**report.halvings
    out = replace(solution, steps=new_steps, elements=elements, eps_tolerance=tolerance)
    return out, report
