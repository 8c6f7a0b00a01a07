"""A teleport that checks itself (#26): no silent function change, whatever the cause.

Each trap below changed the outputs silently before: a normalisation whose eps detection did
not see (``F.layer_norm`` inside a module, like ConvNeXtV2's LayerNorm subclass), and a
symmetry that holds on the example's branch only. Now the teleport compares the outputs on
a probe batch in train and eval mode, undoes itself and raises, naming the symmetry.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.equilibrium import EquilibriumSolution

DT = torch.float64


class _FunctionalNorm(nn.Module):
    """Linear → F.layer_norm (eps 0.1, no module) → Linear: the eps is never registered."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(F.layer_norm(self.a(x), (6,), eps=0.1))


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x)
        return self.b(torch.relu(h) if x.mean() > 0 else torch.tanh(h))


def _solution(syms: nf.SymmetrySet, size: float, seed: int = 0) -> EquilibriumSolution:
    """A solution moving every symmetry by a random element of ``size``."""
    gen = torch.Generator().manual_seed(seed)
    steps = [(i, s.random_element(size, gen)) for i, s in enumerate(syms)]
    return EquilibriumSolution(syms, steps, {}, {})


def _outputs(model: nn.Module, x: Tensor) -> dict[bool, Tensor]:
    out = {}
    for train in (True, False):
        model.train(train)
        with torch.no_grad():
            out[train] = model(x).clone()
    return out


def test_unseen_eps_teleport_is_undone_and_names_the_symmetry() -> None:
    torch.manual_seed(0)
    model = _FunctionalNorm().to(DT)
    x = torch.randn(8, 4, dtype=DT)
    syms = nf.find_symmetries(model, x)
    assert "scale:a→layer_norm" in syms.names
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    sol = _solution(syms, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nf.EpsWarning)  # eps unknown: no EpsWarning ...
        with pytest.raises(nf.FunctionChangedError, match=r"scale:a→layer_norm \(") as info:
            nf.teleport(sol)  # ... but the probe sees the change
    assert "teleport undone" in str(info.value)
    for n, p in model.named_parameters():
        assert torch.equal(p, params[n]), n  # undone bit for bit
    # what the teleport would have done silently
    before = _outputs(model, x)
    handle = nf.teleport(sol, check="off")
    after = _outputs(model, x)
    assert float((after[False] - before[False]).norm() / before[False].norm()) > 1e-3
    handle.undo()
    with pytest.warns(UserWarning, match="teleport changed the model's outputs"):
        nf.teleport(sol, check="warn")
    assert not torch.equal(model.a.weight, params["a.weight"])  # kept, as asked


def test_exact_teleport_passes_the_check_in_float32() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    model.append(nn.Linear(16, 3))
    x = torch.randn(32, 4)
    syms = nf.find_symmetries(model, x)
    assert len(syms) == 2
    before = model(x).detach()
    handle = nf.teleport(_solution(syms, 3.0))
    assert not torch.equal(model[0].weight, handle._saved[model[0].weight])
    after = model(x).detach()
    assert float((after - before).norm() / before.norm()) < 1e-4


def test_explicit_probe_catches_a_symmetry_of_one_branch() -> None:
    """A hand-built set has no probe; ``probe=`` gives one (here: inputs of the other branch)."""
    torch.manual_seed(2)
    model = _Branchy().to(DT)
    x = torch.randn(8, 4, dtype=DT).abs()
    syms = nf.SymmetrySet([nf.Rescaling(model.a, model.b)])
    sol = _solution(syms, 1.0)
    with pytest.raises(TypeError, match=r"teleport\(model, solution, probe=...\)"):
        nf.teleport(sol, probe=x)
    handle = nf.teleport(model, sol, probe=x)  # exact on the relu branch
    handle.undo()
    with pytest.raises(nf.FunctionChangedError, match="rescaling"):
        nf.teleport(model, sol, probe=-x)


def test_teleport_check_arguments_are_validated() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    syms = nf.find_symmetries(model, torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"check='loud'; expected one of \['raise'"):
        nf.teleport(_solution(syms, 1.0), check="loud")
    with pytest.raises(ValueError, match="check_tolerance=-1"):
        nf.teleport(_solution(syms, 1.0), check_tolerance=-1)


def test_equilibrium_teleport_checks_on_its_batch() -> None:
    torch.manual_seed(3)
    model = _FunctionalNorm().to(DT)
    x, y = torch.randn(16, 4, dtype=DT), torch.randn(16, 3, dtype=DT)
    syms = nf.find_symmetries(model, x)
    tp = nf.EquilibriumTeleport(model, syms, F.mse_loss, lr=0.5, batch_size=4, weight_decay=0)
    before = model(x).detach()
    try:
        tp.teleport(x, y)
    except nf.FunctionChangedError as exc:
        assert "scale:a→layer_norm" in str(exc)
        assert torch.equal(model(x).detach(), before)
    else:  # the equilibrium moved it little: then the outputs must be unchanged
        after = model(x).detach()
        assert float((after - before).norm() / before.norm()) <= 1e-8


def test_unchecked_eps_teleport_of_a_copy_is_judged_without_eps() -> None:
    """An unchecked solution moving a known LayerNorm (EpsWarning): the check compares with
    that norm's eps ~0, on the copy's own norm too, so only an unexplained change raises."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8, eps=0.1), nn.Linear(8, 2)).to(DT)
    x = torch.randn(16, 4, dtype=DT)
    syms = nf.find_symmetries(model, x)
    sol = _solution(syms, 2.0)
    clone = copy.deepcopy(model)
    before = _outputs(clone, x)
    with pytest.warns(nf.EpsWarning):
        nf.teleport(clone, sol)
    after = _outputs(clone, x)
    assert float((after[False] - before[False]).norm() / before[False].norm()) > 1e-3  # via eps
    with pytest.warns(nf.EpsWarning):
        nf.teleport(sol)
