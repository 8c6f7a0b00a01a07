"""``solve_equilibrium(..., options=SolveOptions(...))`` (issue #27): one options object.

The old loose keywords give the same solution and warn; unknown keywords and both forms at
once are a TypeError naming the fix; the options are checked where they are built.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import noetherflow as nf

DT = torch.float64
HYPER = {"lr": 0.1, "batch_size": 8, "weight_decay": 1e-3}


def _problem() -> tuple[nf.SymmetrySet, nf.GradStats]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).to(DT)
    x, y = torch.randn(16, 4, dtype=DT), torch.randn(16, 3, dtype=DT)
    syms = nf.find_symmetries(m, x)
    return syms, nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")


def test_the_signature_is_short() -> None:
    params = inspect.signature(nf.solve_equilibrium).parameters
    assert "options" in params and not {"tol", "ridge", "fixed", "solver"} & set(params)
    assert len(params) <= 14


def test_options_give_the_solution_of_the_old_keywords() -> None:
    syms, stats = _problem()
    name = syms.names[0]
    n = syms[name].num_generators  # type: ignore[attr-defined]
    fixed = {name: torch.tensor([0.1] + [float("nan")] * (n - 1), dtype=DT)}
    opts = nf.SolveOptions(tol=1e-13, solver="dense", fixed=fixed, max_iter=50)
    new = nf.solve_equilibrium(syms, stats, **HYPER, options=opts)
    with pytest.warns(FutureWarning, match=r"pass options=nf.SolveOptions\(tol=\.\.\., "):
        old = nf.solve_equilibrium(
            syms, stats, **HYPER, tol=1e-13, solver="dense", fixed=fixed, max_iter=50
        )
    for k, el in new.elements.items():
        assert torch.equal(torch.as_tensor(el), torch.as_tensor(old.elements[k])), k
    assert float(torch.as_tensor(new.elements[name])[0]) == pytest.approx(0.1, abs=1e-15)
    default = nf.solve_equilibrium(syms, stats, **HYPER)
    assert not torch.equal(
        torch.as_tensor(default.elements[name]), torch.as_tensor(new.elements[name])
    )


def test_wrong_calls_name_the_fix() -> None:
    syms, stats = _problem()
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['tolerance'\].*tol"):
        nf.solve_equilibrium(syms, stats, **HYPER, tolerance=1e-9)
    with pytest.raises(TypeError, match=r"both options= and the keywords ridge=\.\.\."):
        nf.solve_equilibrium(syms, stats, **HYPER, options=nf.SolveOptions(), ridge=1e-3)
    with pytest.raises(TypeError, match=r"options is a dict; expected nf.SolveOptions"):
        nf.solve_equilibrium(syms, stats, **HYPER, options={"tol": 1e-9})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tol", -1.0, r"tol=-1.0 must be >= 0"),
        ("max_iter", 0, r"max_iter=0 must be a positive integer"),
        ("max_sweeps", 2.5, r"max_sweeps=2.5 must be a positive integer"),
        ("ridge", float("nan"), r"ridge=nan"),
        ("solver", "lu", r"solver='lu' is not supported"),
    ],
)
def test_options_are_checked_when_built(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        nf.SolveOptions(**{field: value})  # type: ignore[arg-type]


def test_replace_checks_again() -> None:
    o = nf.SolveOptions(tol=1e-9)
    assert o.replace(ridge=1e-4).ridge == 1e-4 and o.replace(ridge=1e-4).tol == 1e-9
    with pytest.raises(ValueError, match="max_sweeps"):
        o.replace(max_sweeps=0)


def test_tools_forward_their_solver_mapping_as_options() -> None:
    """The teleporter's ``solver_kwargs`` is a SolveOptions (its own spelling, no warning)."""
    syms, _ = _problem()
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).to(DT)
    syms = nf.find_symmetries(m, torch.randn(4, 4, dtype=DT))
    tp = nf.EquilibriumTeleport(
        m, syms, nn.MSELoss(), lr=0.1, batch_size=8, solver_kwargs={"max_sweeps": 3}
    )
    assert tp.solve_options == nf.SolveOptions(max_sweeps=3) and tp.solver_kwargs == {}


def _two_families() -> tuple[nf.SymmetrySet, nf.GradStats]:
    torch.manual_seed(3)
    m = nn.Sequential(
        nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 4), nn.Linear(4, 2)
    ).to(DT)
    x, y = torch.randn(32, 3, dtype=DT), torch.randn(32, 2, dtype=DT)
    syms = nf.SymmetrySet(
        [nf.Rescaling(m[0], m[2], label="r"), nf.DoubleRotation(m[3], m[4], label="q")]
    )
    return syms, nf.collect_stats(m, syms, nn.MSELoss(), x, y, estimator="reference")


def _el(sol: nf.EquilibriumSolution, name: str) -> torch.Tensor:
    return torch.as_tensor(sol.elements[name])


def test_a_kernel_takes_its_own_settings() -> None:
    """``SolveOptions(kernels={name: {...}})`` changes that family's solve only."""
    syms, stats = _two_families()
    base = nf.solve_equilibrium(syms, stats, **HYPER)
    shared = nf.solve_equilibrium(syms, stats, **HYPER, options=nf.SolveOptions(ridge=1.0))
    own = nf.SolveOptions(kernels={"rotation": {"ridge": 1.0}, "diagonal": {"max_iter": 1}})
    sol = nf.solve_equilibrium(syms, stats, **HYPER, options=own)
    assert torch.equal(_el(sol, "q"), _el(shared, "q"))
    assert not torch.allclose(_el(sol, "q"), _el(base, "q"), rtol=1e-6, atol=0)
    one = nf.solve_equilibrium(syms, stats, **HYPER, options=nf.SolveOptions(max_iter=1))
    assert torch.equal(_el(sol, "r"), _el(one, "r"))
    assert not torch.allclose(_el(sol, "r"), _el(base, "r"), rtol=1e-9, atol=0)


def test_kernel_settings_are_checked_against_the_kernel() -> None:
    syms, stats = _two_families()
    bad = nf.SolveOptions(kernels={"diagonal": {"ridge": 1e-3}})
    with pytest.raises(TypeError, match=r"\['ridge'\] are not settings of the diagonal kernel"):
        nf.solve_equilibrium(syms, stats, **HYPER, options=bad)
    with pytest.raises(ValueError, match=r"kernel 'dense'; the kernels here are"):
        nf.solve_equilibrium(
            syms, stats, **HYPER, options=nf.SolveOptions(kernels={"dense": {"tol": 1e-3}})
        )
    with pytest.raises(ValueError, match=r"tol=-1.0 must be >= 0"):
        nf.solve_equilibrium(
            syms, stats, **HYPER, options=nf.SolveOptions(kernels={"rotation": {"tol": -1.0}})
        )
    with pytest.raises(TypeError, match="expected a mapping kernel name"):
        nf.SolveOptions(kernels={"rotation": 1e-3})  # type: ignore[dict-item]


def test_each_kernel_owns_its_settings_and_step_options_only_the_common() -> None:
    """The family settings live in the kernels (their defaults: the reference settings);
    StepOptions carries only what every family is told."""
    import dataclasses

    from noetherflow.kernels import DiagonalKernel, RotationKernel, StepOptions
    from noetherflow.kernels._diag_newton import NewtonMethod
    from noetherflow.solve_options import kernel_settings
    from noetherflow.stats.blocks import KERNELS

    assert {f.name for f in dataclasses.fields(StepOptions)} == {
        "coupled",
        "init",
        "fixed",
        "settings",
    }
    reference = nf.SolveOptions()
    kernels = list(dict.fromkeys(KERNELS.values()))
    assert {k.name for k in kernels} >= {"diagonal", "rotation", "dense"}
    for k in kernels:
        assert k.solve_options == {f.name for f in dataclasses.fields(k.settings)}
        assert k.solve_options <= {f.name for f in dataclasses.fields(nf.SolveOptions)}
        for f in k.solve_options:  # a kernel alone solves as solve_equilibrium's defaults
            assert getattr(k.settings(), f) == getattr(reference, f), (k.name, f)
    assert DiagonalKernel.solve_options == {"tol", "max_iter", "solver"}
    assert RotationKernel.solve_options == {"tol", "max_iter", "rtol_singular", "ridge"}
    diag, rot = DiagonalKernel(), RotationKernel()
    got = kernel_settings(
        nf.SolveOptions(tol=1e-9, solver="cg", kernels={"rotation": {"ridge": 1e-3}}), [diag, rot]
    )
    assert got["diagonal"] == diag.settings(tol=1e-9, max_iter=100, solver=NewtonMethod.CG)
    assert got["rotation"] == rot.settings(tol=1e-9, max_iter=100, rtol_singular=1e-10, ridge=1e-3)
    step = StepOptions(settings=got)
    assert step.of(rot).ridge == 1e-3 and StepOptions().of(rot) == rot.settings()
