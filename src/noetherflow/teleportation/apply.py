"""Apply an equilibrium solution to a model in place, function-preserving, and undo it."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from noetherflow._checks import same_fingerprint as _same
from noetherflow._errors import EpsWarning, TeleportError
from noetherflow._inputs import Probe
from noetherflow.equilibrium import EquilibriumSolution, fingerprint
from noetherflow.stats.distributed import unwrap_ddp
from noetherflow.stats.fsdp import bind_sharded
from noetherflow.symmetry.eps import eps_moved
from noetherflow.symmetry.set import SymmetrySet, rebind_symmetry
from noetherflow.teleportation.check import (
    CHECKS,
    FunctionChangedError,
    check_teleport,
    default_tolerance,
    model_dtype,
)

__all__ = ["FunctionChangedError", "TeleportError", "TeleportHandle", "teleport"]


@dataclass
class TeleportHandle:
    """Returned by :func:`teleport`; ``undo()`` restores parameters and buffers bit for bit."""

    solution: EquilibriumSolution
    _saved: dict[Tensor, Tensor] = field(repr=False)
    _undone: bool = False
    _after: tuple[tuple[float, float, float], ...] | None = field(default=None, repr=False)

    def _applied(self) -> TeleportHandle:
        """Remember the parameters' fingerprint right after the teleport (checked by undo)."""
        self._after = fingerprint(self._params())
        return self

    def _params(self) -> list[Tensor]:
        return [t for t in self._saved if isinstance(t, nn.Parameter)]

    def undo(self, *, force: bool = False) -> None:
        """Restore the parameters saved before the teleport: exactly, no inverse round-off.

        The buffers a symmetry moves (e.g. BatchNorm running statistics) are restored too.
        Parameters changed since the teleport (a training step) are refused, since restoring
        would discard that change; ``force=True`` restores them all the same.
        """
        if self._undone:
            raise RuntimeError("This teleport was already undone; undo() works once.")
        now = fingerprint(self._params()) if self._after is not None and not force else None
        if now is not None and not all(map(_same, now, self._after or ())):
            raise TeleportError(
                "undo(): the parameters changed since the teleport (an optimizer step in "
                "between?); restoring the ones saved before it would discard that change. "
                "Undo right after the teleport, or pass undo(force=True) to restore them anyway."
            )
        with torch.no_grad():
            for p, v in self._saved.items():
                p.copy_(v)
        self._undone = True


def _bind(model: nn.Module, solution: EquilibriumSolution) -> SymmetrySet:
    """The solution's symmetries acting on ``model``'s parameters (by name), e.g. a copy."""
    syms = solution.syms
    own = {id(p) for p in model.parameters()}
    params = syms.params()
    if all(id(p) in own for p in params):
        return syms
    by_name = dict(model.named_parameters())
    mapping: dict[int, nn.Parameter] = {}
    names = syms.param_names
    for i, p in enumerate(params):
        name = names.get(id(p))
        q = by_name.get(name) if name is not None else None
        if q is None and solution.fingerprint is not None:
            # match by shape and value (a copy of the model the solution was computed on)
            cands = [
                c
                for c in by_name.values()
                if c.shape == p.shape and _same(fingerprint([c])[0], solution.fingerprint[i])
            ]
            q = cands[0] if len(cands) == 1 else None
        if q is None or q.shape != p.shape:
            raise TeleportError(
                f"teleport(model, solution): cannot find the parameter of shape "
                f"{tuple(p.shape)} (name {name!r}) of the solution's symmetries in this model; "
                "expected the model the symmetries were built on or a copy of it. Build the "
                "symmetries with nf.find_symmetries (which records parameter names), or set "
                "syms.param_names = {id(p): n for n, p in original.named_parameters()}."
            )
        mapping[id(p)] = q
    out = SymmetrySet([rebind_symmetry(s, mapping) for s in syms])
    own_buffers = {id(b) for b in model.buffers()}
    if any(id(b) not in own_buffers for s in out for b in s.state_buffers()):
        # A copy's BatchNorm running statistics cannot be matched to the original's: moving
        # the original's would silently change another model.
        raise TeleportError(
            "teleport(model, solution): the solution's symmetries also transform BatchNorm "
            "running statistics of another model (they were built on the original); build "
            "the symmetries on this model (nf.find_symmetries(model, x)) and solve again, or "
            "teleport the original with teleport(solution)."
        )
    out.param_names = {id(mapping[k]): v for k, v in names.items() if k in mapping}
    return out


def _warn_eps(syms: SymmetrySet, steps: list[tuple[int, Any]]) -> None:
    """Warn when ``steps`` move a scale invariance whose normalisation has an eps."""
    moved = eps_moved(syms, steps)
    if moved:
        more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
        warnings.warn(
            f"teleport moves {len(moved)} scale invariance(s) before a normalisation "
            f"({', '.join(moved[:3])}{more}); they are exact only as the normalisation's eps → 0, "
            "so the outputs change through eps (in training mode and, for BatchNorm, in eval "
            "mode). Keep the change within a tolerance: sol, report = nf.solve_within_eps(model, "
            "syms, stats, x, tolerance=1e-6, ...) or EquilibriumTeleport(eps_tolerance=1e-6).",
            EpsWarning,
            stacklevel=3,
        )


def _in_dtype(probe: Probe, model: nn.Module) -> Probe:
    """The probe's floating-point inputs in the model's dtype, which the check runs in.

    A float32 copy of the float64 model the symmetries were found on keeps their float64 probe.
    """
    dtype = model_dtype(model)

    def cast(v: Any) -> Any:
        return v.to(dtype) if isinstance(v, Tensor) and v.is_floating_point() else v

    return Probe(probe.inputs.map(cast))


def teleport(
    *args: Any,
    probe: Any = None,
    check: str = "raise",
    check_tolerance: float | None = None,
    seed: int = 0,
) -> TeleportHandle:
    """Move the parameters along the symmetry orbits to the solved noise equilibrium.

    ``teleport(solution)`` moves the parameters the solution was computed for;
    ``teleport(model, solution)`` moves ``model``'s (the same model, or a copy of it: the
    symmetries are re-bound by parameter name, or by value for hand-built sets). Applies
    ``solution.steps`` in order, in place. The model's function is unchanged (each step is a
    symmetry); its Noether charges move to their equilibrium values. Optimizer state
    (momentum, Adam moments) is not transformed here; see ``nf.EquilibriumTeleport``.

    The teleport checks itself: the model's outputs on a probe batch, in training and eval
    mode and in its own dtype, are compared before and after (four forwards of the probe).
    The probe is ``probe`` if given, else the solution's (``solve_within_eps`` sets its
    inputs), else the example inputs of :func:`~noetherflow.find_symmetries`; a hand-built
    symmetry set without ``probe`` is not checked. The change allowed is
    ``check_tolerance``, by default the dtype's round-off (1e-4 float32, 1e-8 float64),
    10·τ for a solution kept within an eps tolerance τ, and the change not explained by the
    known normalisations' eps for an unchecked solution that moves them (which warns with
    :class:`~noetherflow.EpsWarning`); docs/concepts/teleport.md.

    Args:
        *args: ``(solution,)`` or ``(model, solution)``.
        probe: inputs to check the outputs on (a tensor, tuple or dict of keyword inputs).
        check: ``"raise"`` (default: undo the teleport and raise), ``"warn"`` (keep it and
            warn) or ``"off"``.
        check_tolerance: the relative output change allowed (see above).
        seed: seeds dropout in the probe's forwards.

    Raises:
        TeleportError: the parameters changed since the solution was computed (a training
            step in between, or the solution was applied already): solve again.
        FunctionChangedError: the outputs on the probe changed beyond the tolerance; the
            teleport was undone. The message names the symmetries responsible.
    """
    if check not in CHECKS:
        raise ValueError(f"teleport: check={check!r}; expected one of {list(CHECKS)}.")
    if check_tolerance is not None and not (
        isinstance(check_tolerance, int | float) and check_tolerance > 0
    ):
        raise ValueError(
            f"teleport: check_tolerance={check_tolerance!r}; expected a number > 0 (the "
            "relative output change allowed) or None (the default for the model's dtype)."
        )
    if len(args) == 1 and isinstance(args[0], EquilibriumSolution):
        model, solution = None, args[0]
    elif len(args) == 2 and isinstance(args[1], EquilibriumSolution):
        model, solution = args
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"teleport(model, solution): the first argument is a {type(model).__name__}; "
                "expected the nn.Module to move (or call teleport(solution): the solution "
                "knows its symmetries)."
            )
    else:
        raise TypeError(
            "teleport(solution) or teleport(model, solution): got "
            f"{[type(a).__name__ for a in args]}."
        )
    if model is not None:  # a set found before fully_shard, now on the sharded parameters
        bind_sharded(unwrap_ddp(model), solution.syms)
    syms = solution.syms if model is None else _bind(model, solution)
    params = syms.params()
    if solution.fingerprint is not None:
        now = fingerprint(params)
        moved = [
            tuple(p.shape)
            for p, a, b in zip(params, now, solution.fingerprint, strict=True)
            if not _same(a, b)
        ]
        if moved:
            raise TeleportError(
                f"teleport: parameters of shapes {moved} changed since the solution was "
                "computed (a training step in between, or this solution was applied already); "
                "a solution is valid only at the parameters it was solved at. Collect the "
                "statistics and solve again, then teleport."
            )
    eps_syms = eps_moved(syms, solution.steps) if solution.eps_tolerance is None else []
    if eps_syms:
        _warn_eps(syms, solution.steps)
    saved: dict[Tensor, Tensor] = {p: p.detach().clone() for p in params}
    for s in syms:  # buffers moved with the parameters (ScaleInvariance before a BatchNorm)
        saved.update({b: b.detach().clone() for b in s.state_buffers()})
    handle = TeleportHandle(solution, saved)
    steps = solution.steps

    def apply(only: Sequence[int] | None) -> None:
        for k, (i, element) in enumerate(steps):
            if only is None or k in only:
                syms[i].apply_(element)

    target = model if model is not None else _model_of(solution.syms)
    chosen = probe if probe is not None else solution.probe or solution.syms.probe
    if probe is not None and target is None:
        raise TypeError(
            "teleport(solution, probe=...): the symmetry set was not built by "
            "nf.find_symmetries, so the model to run the probe on is unknown; call "
            "teleport(model, solution, probe=...)."
        )
    if check == "off" or target is None or chosen is None or not steps:
        apply(None)
        return handle._applied()
    # the known normalisations' eps explains their change: compared with it ~0
    # (the original set's modules: a rebound copy's symmetries hold views of them)
    norms = [getattr(solution.syms[i], "norm", None) for i, _ in steps if syms.names[i] in eps_syms]
    check_teleport(
        target,
        _in_dtype(Probe.of(chosen, "teleport(probe=...)"), target),
        apply,
        lambda: _restore(saved),
        [syms.names[i] for i, _ in steps],
        tolerance=check_tolerance or default_tolerance(target, solution.eps_tolerance),
        zero_eps_of=_in_model(target, [m for m in norms if isinstance(m, nn.Module)], solution),
        on_change=check,
        seed=seed,
    )
    return handle._applied()


def _in_model(
    target: nn.Module, norms: list[nn.Module], solution: EquilibriumSolution
) -> list[nn.Module]:
    """``norms`` as modules of ``target`` (a copy's, by qualified name in the original)."""
    own = {id(m) for m in target.modules()}
    if all(id(m) in own for m in norms):
        return norms
    original = _model_of(solution.syms)
    names = {id(m): n for n, m in original.named_modules()} if original is not None else {}
    out = []
    for m in norms:
        if id(m) in own:
            out.append(m)
        elif id(m) in names:
            try:
                out.append(target.get_submodule(names[id(m)]))
            except AttributeError:
                continue
    return out


def _model_of(syms: SymmetrySet) -> nn.Module | None:
    """The model ``find_symmetries`` built ``syms`` on, if it is still alive."""
    ref = syms.model_ref
    return ref() if ref is not None else None


def _restore(saved: dict[Tensor, Tensor]) -> None:
    with torch.no_grad():
        for p, v in saved.items():
            p.copy_(v)
