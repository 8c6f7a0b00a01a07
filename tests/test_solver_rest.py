"""A coupled solve stops where the last sweep left every flow at tol (issue 28).

A sweep's first step measures its flow before moving (``GroupSolve.before``); when the
steps after it touch one another nowhere and each was solved exactly in the last sweep
(nothing moved after it), that measurement and their residuals are every flow at the values
the last sweep left, so the sweeps stop there without the rest of a sweep that only
confirms. Pinned in float64: the measurement is the flow before the move (a second solve's
measurement is the first's residual), the stop happens and saves the confirming sweep's
later steps, the equilibrium is the one the full sweeps reach, the flows vanish after the
teleport, and a plan whose later steps share coordinates never stops early.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_solver_batched import KW, _model, _stats, lands_at_zero_flow
from torch import Tensor, nn

import noetherflow as nf
import noetherflow.equilibrium as eq
from noetherflow._sweep_plan import plan_sweep, steps_apart
from noetherflow.kernels import kernel_for
from noetherflow.kernels.base import StepOptions, overlaps_by_param
from noetherflow.kernels.rotation import RotationKernel
from noetherflow.symmetry.rotation import Block

DT = torch.float64


def _count_rotation_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = RotationKernel.solve_disjoint

    def spy(self: RotationKernel, syms: Any, *a: Any, **k: Any) -> Any:
        calls.append(len(syms))
        return real(self, syms, *a, **k)

    monkeypatch.setattr(RotationKernel, "solve_disjoint", spy)
    return calls


def test_the_first_step_measures_its_flow_before_its_move() -> None:
    m, syms, x, y = _model(heads=4)
    st = _stats(m, syms, x, y)
    (r,) = [s for s in syms if s.family.value == "rescaling"]
    k = kernel_for(r)
    values = {p: p.detach().clone() for p in r.params}
    nm = nf.NoiseModel.create(**KW)
    opts = StepOptions(coupled=True)
    first = k.solve([r], values, st, nm, {r: "r"}, opts)
    assert first.before is not None and first.before > 1e-3  # away from its equilibrium
    assert first.progress < 1e-12  # its own Newton converged
    ((_, lam),) = first.steps
    r.act_(lam, values)
    with torch.no_grad():
        for p in r.params:
            p.copy_(values[p])
    again = k.solve([r], values, _stats(m, syms, x, y), nm, {r: "r"}, opts)
    # measured before moving: at the moved values, fresh statistics, the first's residual
    assert again.before is not None and again.before < 1e-11
    assert not again.steps or float(again.steps[0][1].abs().max()) < 1e-10


def test_a_solve_stops_where_the_last_sweep_left_no_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    m, syms, x, y = _model(heads=4)
    st = _stats(m, syms, x, y)
    calls = _count_rotation_steps(monkeypatch)
    # at this tolerance the rescaling's flow reaches tol a sweep before the heads' measure
    opts = nf.SolveOptions(tol=1e-8)
    sol = nf.solve_equilibrium(syms, st, options=opts, **KW)
    rest = list(calls)
    calls.clear()
    with monkeypatch.context() as mp:
        mp.setattr(eq, "at_rest", lambda *a: False)
        full = nf.solve_equilibrium(syms, st, options=opts, **KW)
    assert sol.converged and full.converged and sol.iterations == full.iterations > 2
    # the last sweep stopped after its rescaling step: one batched head step fewer
    assert len(rest) == len(calls) - 1
    # the same equilibrium as the confirming sweep reaches: λ, and P = GGᵀ per head
    for name, e in sol.elements.items():
        e, f = torch.as_tensor(e), torch.as_tensor(full.elements[name])
        if e.dim() == 2:
            e, f = e @ e.T, f @ f.T
        assert float((e - f).abs().max()) <= 1e-7 * max(float(f.abs().max()), 1.0), name
    assert max(sol.residual.values()) <= 1e-8
    # and every flow gone at the teleported model, from fresh statistics
    lands_at_zero_flow(m, syms, x, y, sol, 1e-7)


def _rotation_chain() -> tuple[nn.Module, nf.SymmetrySet, Tensor, Tensor]:
    """Four linear layers, a GL(6) rotation between each consecutive pair: the second and
    the third share the middle weight's coordinates (rows of one, columns of the other)."""
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 6), nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3))
    m = m.double()
    rots = [
        nf.DoubleRotation.from_blocks(
            [Block(m[i].weight, 0, 0, 6), Block(m[i].bias, 0, 0, 6)],
            [Block(m[i + 1].weight, 1, 0, 6)],
            label=f"rot{i}",
        )
        for i in range(3)
    ]
    x, y = torch.randn(40, 5, dtype=DT), torch.randn(40, 3, dtype=DT)
    return m, nf.SymmetrySet(rots), x, y


def test_later_steps_sharing_coordinates_never_stop_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, heads, _, _ = _model(heads=4)
    touches = {s: list(v) for s, v in overlaps_by_param(list(heads)).items()}
    assert steps_apart(plan_sweep(list(heads), touches), touches)
    m, chain, x, y = _rotation_chain()
    touches = {s: list(v) for s, v in overlaps_by_param(list(chain)).items()}
    plan = plan_sweep(list(chain), touches)
    assert len(plan) == 3 and not steps_apart(plan, touches)
    st = _stats(m, chain, x, y)
    stops: list[bool] = []
    real = eq.at_rest

    def spy(*a: Any) -> bool:
        stops.append(real(*a))
        return stops[-1]

    monkeypatch.setattr(eq, "at_rest", spy)
    sol = nf.solve_equilibrium(chain, st, **KW)
    assert sol.converged and sol.iterations > 2 and stops and not any(stops)


def test_a_step_that_reports_no_residual_is_not_at_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    m, syms, x, y = _model(heads=4)
    st = _stats(m, syms, x, y)
    real = RotationKernel.solve_disjoint

    def silent(self: RotationKernel, *a: Any, **k: Any) -> Any:
        out = real(self, *a, **k)
        out.residual.clear()  # a kernel that does not say what flow it left
        return out

    stops: list[bool] = []
    real_rest = eq.at_rest

    def spy(*a: Any) -> bool:
        stops.append(real_rest(*a))
        return stops[-1]

    monkeypatch.setattr(RotationKernel, "solve_disjoint", silent)
    monkeypatch.setattr(eq, "at_rest", spy)
    sol = nf.solve_equilibrium(syms, st, options=nf.SolveOptions(tol=1e-8), **KW)
    assert sol.converged and stops and not any(stops)  # the full sweeps' own stop instead
