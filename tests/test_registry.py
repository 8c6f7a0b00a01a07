"""The one Registry class behind every extension axis: its subclass rule, its refusal of
silent overwrites, its errors, and that hooks, detection, norms and kernels all use it."""

from __future__ import annotations

import pytest
from torch import Tensor, nn

from noetherflow._registry import Registry, qualname
from noetherflow.kernels import base as kernels_base
from noetherflow.stats import registry as hooks
from noetherflow.symmetry._fx import layers as detection
from noetherflow.symmetry._fx import patterns, tables


class _Kept(nn.Linear):
    """Inherits nn.Linear's forward: matched by nn.Linear's entry."""


class _Own(nn.Linear):
    """Its own forward: not matched unless registered itself."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).flip(-1)


class _Marker:
    """Stands in for FSDPModule: a mixin without a forward."""


_Sharded = type("FSDPLinear", (_Marker, nn.Linear), {})


def _reg() -> Registry[str]:
    return Registry("label", register_with="reg.register(cls, label)")


def test_mro_rule_matches_inherited_forward_only() -> None:
    reg = _reg()
    reg.register(nn.Linear, "linear")
    reg.register(nn.Module, "module")
    assert reg.lookup(nn.Linear) == "linear"
    assert reg.lookup(_Kept) == "linear"
    assert reg.lookup(_Sharded) == "linear"  # FSDP<Class> resolves to Class
    assert reg.lookup(_Own) is None  # nn.Module's forward is not _Own's either
    assert reg.match(_Kept) == (nn.Linear, "linear")
    reg.register(_Own, "own")
    assert reg.lookup(_Own) == "own"  # the cache is cleared by a registration
    assert list(reg) == [nn.Linear, nn.Module, _Own]
    assert reg.values() == ["linear", "module", "own"]
    assert len(reg) == 3 and _Own in reg and _Kept not in reg


def test_refuses_silent_overwrite_and_names_the_fix() -> None:
    reg = _reg()
    reg.register(nn.Linear, "a")
    with pytest.raises(ValueError, match=r"Linear has a label already; pass replace=True"):
        reg.register(nn.Linear, "b")
    assert reg.lookup(nn.Linear) == "a"
    reg.register(nn.Linear, "b", replace=True)
    assert reg.lookup(nn.Linear) == "b"
    with pytest.raises(KeyError, match=r"ReLU has no label .*register one with reg\.register"):
        reg[nn.ReLU]
    with pytest.raises(TypeError, match="not a class or a name"):
        reg.register(3, "x")  # type: ignore[arg-type]
    reg.unregister(nn.Linear)
    assert reg.lookup(nn.Linear) is None
    with pytest.raises(KeyError, match="no label to remove"):
        reg.unregister(nn.Linear)


def test_qualified_name_keys_never_import_and_list_seen_classes() -> None:
    reg = _reg()
    reg.register(qualname(_Kept), "by name")
    assert reg.classes() == []
    assert reg.lookup(_Kept) == "by name"
    assert reg.lookup(type("Sub", (_Kept,), {})) == "by name"
    assert reg.classes() == [_Kept]


def test_every_registry_is_one() -> None:
    every = (hooks.LAYERS, detection.LAYERS, detection.NORMS, kernels_base.KERNELS)
    for r in (*every, tables.MODULE_OPS, tables.FUNCTION_OPS, tables.METHOD_OPS, patterns.MATCHERS):
        assert isinstance(r, Registry)
    assert hooks.handler_for(_Kept(2, 3)) is hooks.handler_for(nn.Linear(2, 3))
    assert hooks.handler_for(_Own(2, 3)) is None
    assert hooks.handler_for(_Sharded(2, 3)) is not None
    assert detection.layer_spec(_Kept(2, 3)) == detection.layer_spec(nn.Linear(2, 3))
    with pytest.raises(ValueError, match="LayerNorm has a normalisation spec already"):
        detection.register_norm(nn.LayerNorm, lambda m: detection.NormSpec(-1, False))
    with pytest.raises(ValueError, match="Linear has a hook handler already; pass overwrite"):
        hooks.register_layer(nn.Linear, hooks.LayerHandler(hooks.linear_factors))


class _Abs(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.abs()


def test_a_registered_activation_module_is_read_by_the_rescaling_matcher() -> None:
    """An op-table entry (``register_module_op``) is all a new activation needs."""
    import torch

    import noetherflow as nf

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), _Abs(), nn.Linear(5, 2)).double()
    x = torch.randn(16, 3, dtype=torch.float64)
    assert nf.find_symmetries(model, x).names == []  # traced through: |x| is not in the tables
    tables.register_module_op(_Abs, "homogeneous")
    try:
        assert nf.find_symmetries(model, x).names == ["rescaling:0→2"]
        with pytest.raises(ValueError, match="_Abs has a feature rule already"):
            tables.register_module_op(_Abs, "homogeneous")
        with pytest.raises(ValueError, match="kind='odd'; expected one of"):
            tables.register_module_op(_Kept, "odd")
    finally:
        tables.MODULE_OPS.unregister(_Abs)


class _TorchAbs(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        import torch

        return torch.abs(x)


def test_function_and_method_ops_are_registries() -> None:
    """A function or tensor method is one call to teach detection; no silent overwrite."""
    import torch
    import torch.nn.functional as F

    import noetherflow as nf

    assert tables.function_op(F.relu) == "homogeneous"
    assert tables.function_op(torch.reshape) == "move"
    assert tables.function_op(F.layer_norm) == "normalisation"
    assert tables.function_op(torch.abs) is None
    assert tables.method_op("view") == "move" and tables.method_op("abs") is None

    def apply_rotary_pos_emb(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k  # each model defines its own: found by name

    assert tables.function_op(apply_rotary_pos_emb) == "rotary"
    torch.manual_seed(0)
    x = torch.randn(16, 3, dtype=torch.float64)
    for make, register, drop in [
        (
            _TorchAbs,
            lambda: tables.register_function_op(torch.abs, "homogeneous"),
            lambda: tables.FUNCTION_OPS.unregister(torch.abs),
        ),
        (
            _Abs,  # x.abs()
            lambda: tables.register_method_op("abs", "homogeneous"),
            lambda: tables.METHOD_OPS.unregister("abs"),
        ),
    ]:
        model = nn.Sequential(nn.Linear(3, 5), make(), nn.Linear(5, 2)).double()
        # (the docs' abs matcher, when another test registered it, proposes its own name)
        assert "rescaling:0→2" not in nf.find_symmetries(model, x).names
        register()
        try:
            assert "rescaling:0→2" in nf.find_symmetries(model, x).names
        finally:
            drop()
    with pytest.raises(
        ValueError, match=r"relu has a function feature rule already; pass overwrite"
    ):
        tables.register_function_op(F.relu, "approximate")
    with pytest.raises(ValueError, match=r"view has a method feature rule already; pass overwrite"):
        tables.register_method_op("view", "move")
    with pytest.raises(ValueError, match=r"kind='odd'; expected one of"):
        tables.register_function_op(torch.abs, "odd")
    with pytest.raises(ValueError, match=r"kind='rotary'; expected one of"):
        tables.register_method_op("abs", "rotary")
    tables.register_function_op(F.relu, "homogeneous", overwrite=True)  # explicit: allowed
    assert tables.function_op(F.relu) == "homogeneous"
