"""The docs' one-file extensions (docs/extending.md, docs/snippets/), end to end.

* ``new_layer.py``: a layer registered once as the docs show
  (``noetherflow.register_layer``) is found by ``find_symmetries`` (its layout from the
  registration, not guessed), hooked (hooks agree with the torch.func reference in float64),
  solved and teleported (the function unchanged);
* ``new_family.py``: a family with its own kernel is collected (hooks = reference), flowed,
  solved and teleported, and its flow vanishes there;
* ``new_matcher.py``: a registered matcher's proposal is found by ``find_symmetries``.
"""

from __future__ import annotations

import pytest
import snippets
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.symmetry._fx import layers as detection_layers
from noetherflow.symmetry._fx import patterns

ex = snippets.load("new_layer")
fam = snippets.load("new_family")
matcher = snippets.load("new_matcher")

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


def test_new_family_file_end_to_end() -> None:
    torch.manual_seed(4)
    ln = nn.LayerNorm(5, eps=0.0, elementwise_affine=False)
    model = nn.Sequential(nn.Linear(4, 5), ln, nn.Linear(5, 2)).to(DT)
    x, y = torch.randn(24, 4, dtype=DT), torch.randn(24, 2, dtype=DT)
    syms = nf.SymmetrySet([fam.GroupScale([model[0].weight, model[0].bias], label="g")])
    syms.verify(model, x)  # strict: raises if it changed the model
    hooks = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="hooks")
    ref = nf.collect_stats(model, syms, F.mse_loss, x, y, estimator="reference")
    h, r = (
        hooks.block("group_scale").sq_total[syms["g"]],
        ref.block("group_scale").sq_total[syms["g"]],
    )
    assert abs(float(h - r)) < 1e-12 * float(r) and float(r) > 0
    noise = nf.NoiseModel.create(lr=0.1, batch_size=4, weight_decay=1e-2)
    flow = nf.noether_flow(syms, hooks, noise)["g"]
    assert abs(float(flow)) > 1e-6  # away from equilibrium to begin with
    sol = nf.solve_equilibrium(syms, hooks, noise)
    assert abs(float(sol.elements["g"])) > 1e-3
    before = model(x).detach()
    nf.teleport(model, sol)
    assert float((model(x).detach() - before).norm() / before.norm()) < 1e-12
    after = nf.noether_flow(syms, nf.collect_stats(model, syms, F.mse_loss, x, y), noise)["g"]
    assert abs(float(after)) < 1e-9 * abs(float(flow))


class _AbsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 5).to(DT), nn.Linear(5, 2).to(DT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.abs(self.a(x)))


def test_new_matcher_file_is_run_by_find_symmetries() -> None:
    torch.manual_seed(0)
    model, x = _AbsNet(), torch.randn(16, 3, dtype=DT)
    assert patterns.MATCHERS.values()[-1].fn is matcher.abs_rescaling
    syms = nf.find_symmetries(model, x)
    assert syms.names == ["abs-rescaling:a→b"]
    before, w0 = model(x).detach(), model.a.weight.detach().clone()
    with torch.no_grad():
        syms["abs-rescaling:a→b"].apply_(syms[0].random_element(0.5, torch.Generator()))
        assert float((model.a.weight - w0).norm() / w0.norm()) > 1e-2  # it moved
        assert float((model(x) - before).norm() / before.norm()) < 1e-12
    patterns.MATCHERS.unregister("abs-rescaling")
    try:
        assert nf.find_symmetries(model, x).names == []  # the built-in matchers miss it
    finally:
        nf.register_matcher("abs-rescaling", matcher.abs_rescaling)


def test_a_symmetry_two_matchers_propose_is_returned_once() -> None:
    from noetherflow.symmetry._fx import tables

    torch.manual_seed(0)
    model, x = _AbsNet(), torch.randn(16, 3, dtype=DT)
    tables.register_function_op(torch.abs, "homogeneous")  # the built-in matcher sees it too
    try:
        syms = nf.find_symmetries(model, x)
    finally:
        tables.FUNCTION_OPS.unregister(torch.abs)
    assert len(syms) == 1  # not refused as a repeat: kept once, the other named in its note
    (name,) = syms.names
    other = "abs-rescaling:a→b" if name == "rescaling:a→b" else "rescaling:a→b"
    assert name in ("rescaling:a→b", "abs-rescaling:a→b")
    assert f"also proposed as {other}" in syms.detection.sym_notes[name]


def test_registered_layer_names_its_input_width_when_the_model_fails() -> None:
    model = nn.Sequential(ex.TransposedLinear(4, 3), nn.ReLU(), ex.TransposedLinear(3, 2))
    with pytest.raises(nf.DetectionError, match="first TransposedLinear layer expects 4 input"):
        nf.find_symmetries(model, torch.randn(2, 7, dtype=DT))
