"""One registration, the whole pipeline (#26/#27): a layer registered once as
docs/snippets/extending.py shows (``noetherflow.stats.register_layer``) is found by
``find_symmetries`` (its layout from the registration, not guessed), hooked (hooks agree with
the torch.func reference in float64), solved and teleported (the function unchanged).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.symmetry._fx import layers as detection_layers

if "extending_examples" in sys.modules:
    ex = sys.modules["extending_examples"]
else:
    _spec = importlib.util.spec_from_file_location(
        "extending_examples",
        Path(__file__).resolve().parents[1] / "docs" / "snippets" / "extending.py",
    )
    assert _spec is not None and _spec.loader is not None
    ex = importlib.util.module_from_spec(_spec)
    sys.modules["extending_examples"] = ex
    _spec.loader.exec_module(ex)

DT = torch.float64


def test_registered_layer_is_found_hooked_solved_and_teleported() -> None:
    assert ex.TransposedLinear in detection_layers.LAYERS  # the registration, not a guess
    torch.manual_seed(0)
    model = nn.Sequential(ex.TransposedLinear(3, 6), nn.ReLU(), ex.TransposedLinear(6, 2))
    x, y = torch.randn(32, 3, dtype=DT), torch.randn(32, 2, dtype=DT)
    syms = nf.find_symmetries(model, x)
    assert syms.names == ["rescaling:0→2"]
    hooks = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="hooks")
    ref = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="reference")
    for p in syms.params():
        assert torch.allclose(hooks.mean[p], ref.mean[p], rtol=1e-12, atol=1e-15)
        assert torch.allclose(hooks.sq[p], ref.sq[p], rtol=1e-10, atol=1e-15)
    sol = nf.solve_equilibrium(syms, hooks, lr=0.1, batch_size=8, weight_decay=1e-3)
    assert sol.max_distance() > 1e-3
    before = model(x).detach()
    nf.teleport(sol)  # checks itself on the probe kept by find_symmetries
    after = model(x).detach()
    assert float((after - before).norm() / before.norm()) < 1e-12
    at = nf.collect_stats(model, syms, F.mse_loss, x, y)
    flows = nf.noether_flow(syms, at, lr=0.1, batch_size=8, weight_decay=1e-3)
    assert all(float(torch.as_tensor(v).abs().max()) < 1e-6 for v in flows.values())


def test_detection_registry_refuses_silent_overwrite() -> None:
    with pytest.raises(ValueError, match="has a detection pattern already"):
        spec = detection_layers.LayerSpec(-1, -1, 0, 1)
        detection_layers.register_layer(nn.Linear, lambda m: spec)


def test_hand_built_symmetries_take_registered_layers() -> None:
    """``Rescaling``/``DoubleRotation`` read the layer registry's layout, not a class list."""
    torch.manual_seed(1)
    a, b = ex.TransposedLinear(3, 5), ex.TransposedLinear(5, 2)
    x = torch.randn(9, 3, dtype=DT)
    for sym, net in (
        (nf.Rescaling(a, b), nn.Sequential(a, nn.ReLU(), b)),
        (nf.DoubleRotation(a, b), nn.Sequential(a, b)),
    ):
        w0 = a.weight.detach().clone()
        with torch.no_grad():
            before = net(x)
            sym.apply_(sym.random_element(0.5, torch.Generator().manual_seed(2)))
            after = net(x)
        assert float((a.weight.detach() - w0).norm() / w0.norm()) > 1e-2  # it moved them
        assert float((after - before).norm() / before.norm()) < 1e-12, type(sym).__name__
    with pytest.raises(nf.SymmetryDefinitionError, match="layer is a ReLU; expected a linear"):
        nf.Rescaling(nn.ReLU(), b)
    conv = nn.Conv1d(5, 2, 1).to(DT)
    with pytest.raises(nf.SymmetryDefinitionError, match="expected a dense linear layer"):
        nf.DoubleRotation(a, conv)
