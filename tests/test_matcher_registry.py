"""Matchers are registered like layers: the built-in ones through ``register_matcher``, in
the order their proposals are listed; registration refuses duplicates and unknown stages.
A user matcher run by ``find_symmetries``: ``tests/test_extending.py`` (docs/snippets)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import noetherflow as nf
from noetherflow.symmetry._fx import patterns
from noetherflow.symmetry._fx.engine import Proposal


def _nothing(*args: object) -> list[Proposal]:
    return []


@pytest.fixture
def registered() -> Iterator[None]:
    patterns.register_matcher("test-nothing", _nothing)
    yield
    patterns.MATCHERS.unregister("test-nothing")


def test_builtin_matchers_are_registered_in_order() -> None:
    names = [m.name for m in patterns.registered_matchers()]
    assert names[:11] == [
        "scale-explicit",
        "attention-mha",
        "embedding-projection",
        "affine-rescaling",
        "rescaling",
        "rotation",
        "scale",
        "layer-scale",
        "contraction-rescaling",
        "parameter-rotation",
        "attention-contractions",
    ]
    assert [m.name for m in patterns.matchers_at("graph")] == ["attention-contractions"]
    module = [m.name for m in patterns.matchers_at("module")]
    assert module == ["attention-mha", "embedding-projection"]


def test_a_user_matcher_comes_after_the_builtins(registered: None) -> None:
    assert [m.name for m in patterns.matchers_at("layer")][-1] == "test-nothing"


def test_register_matcher_refuses_duplicates_and_bad_stages(registered: None) -> None:
    with pytest.raises(ValueError, match="test-nothing has a matcher already; pass replace"):
        patterns.register_matcher("test-nothing", _nothing)
    patterns.register_matcher("test-nothing", _nothing, replace=True)
    with pytest.raises(ValueError, match="stage='edge'; expected one of"):
        patterns.register_matcher("x", _nothing, stage="edge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pass claims= exactly when stage='module'"):
        patterns.register_matcher("x", _nothing, stage="module")
    assert "x" not in patterns.MATCHERS


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).relu()


def test_a_module_matcher_reads_its_module_as_one_node() -> None:
    """``claims`` keeps the module whole: the matcher sees it, the layer stage does not."""
    seen: list[str] = []

    def whole(info: object, node: object, ledger: object) -> list[Proposal]:
        seen.append(str(node.target))  # type: ignore[attr-defined]
        return []

    patterns.register_matcher(
        "test-block", whole, stage="module", claims=lambda m: isinstance(m, _Block)
    )
    try:
        model = nn.Sequential(_Block(), nn.Linear(3, 2))
        nf.find_symmetries(model, torch.randn(8, 3))
        assert seen == ["0"]
    finally:
        patterns.MATCHERS.unregister("test-block")
