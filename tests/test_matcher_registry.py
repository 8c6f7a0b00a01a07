"""Matchers are registered like layers: the built-in ones through ``register_matcher``, and a
user-registered matcher is run by ``find_symmetries`` (its proposal checked and kept)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf
from noetherflow.symmetry._fx import patterns
from noetherflow.symmetry._fx.engine import GraphInfo, Ledger, Proposal
from noetherflow.symmetry.base import Family

DT = torch.float64


class _AbsNet(nn.Module):
    """Linear → |·| → Linear: |·| is positively homogeneous, so the rescaling holds."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 5).to(DT), nn.Linear(5, 2).to(DT)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.abs(self.a(x)))


def abs_rescaling(info: GraphInfo, src: object, ledger: Ledger) -> list[Proposal]:
    """Propose a Rescaling where a layer's output goes through torch.abs into a layer."""
    node, first = src.node, src.module  # type: ignore[attr-defined]
    users = list(node.users)
    if len(users) != 1 or users[0].target is not torch.abs or len(users[0].users) != 1:
        return []
    nxt = next(iter(users[0].users))
    second = info.module(nxt)
    if not isinstance(second, nn.Linear):
        return []
    label = f"abs-rescaling:{src.name}→{info.qual(str(nxt.target))}"  # type: ignore[attr-defined]
    return [
        Proposal(
            Family.RESCALING,
            label,
            lambda: nf.Rescaling(first, second, label=label),
            [*first.parameters(), second.weight],
            info.order[node],
        )
    ]


@pytest.fixture
def registered() -> Iterator[None]:
    patterns.register_matcher("abs-rescaling", abs_rescaling)
    yield
    patterns.MATCHERS.unregister("abs-rescaling")


def test_builtin_matchers_are_registered_in_order() -> None:
    names = [m.name for m in patterns.registered_matchers()]
    assert names[:8] == [
        "scale-explicit",
        "attention-mha",
        "affine-rescaling",
        "rescaling",
        "rotation",
        "scale",
        "layer-scale",
        "attention-contractions",
    ]
    assert [m.name for m in patterns.matchers_at("graph")] == ["attention-contractions"]


def test_user_matcher_is_run_by_find_symmetries(registered: None) -> None:
    torch.manual_seed(0)
    model, x = _AbsNet(), torch.randn(16, 3, dtype=DT)
    syms = nf.find_symmetries(model, x)
    assert syms.names == ["abs-rescaling:a→b"]
    el = syms["abs-rescaling:a→b"].random_element(0.5, torch.Generator().manual_seed(1))
    before, w0 = model(x).detach(), model.a.weight.detach().clone()
    with torch.no_grad():
        syms["abs-rescaling:a→b"].apply_(el)
        assert float((model.a.weight - w0).norm() / w0.norm()) > 1e-2  # it moved
        assert float((model(x) - before).norm() / before.norm()) < 1e-12


def test_without_the_matcher_nothing_is_found() -> None:
    torch.manual_seed(0)
    assert nf.find_symmetries(_AbsNet(), torch.randn(16, 3, dtype=DT)).names == []


def test_register_matcher_refuses_duplicates_and_bad_stages(registered: None) -> None:
    with pytest.raises(ValueError, match="abs-rescaling has a matcher already; pass replace"):
        patterns.register_matcher("abs-rescaling", abs_rescaling)
    patterns.register_matcher("abs-rescaling", abs_rescaling, replace=True)
    with pytest.raises(ValueError, match="stage='edge'; expected one of"):
        patterns.register_matcher("x", abs_rescaling, stage="edge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pass claims= exactly when stage='module'"):
        patterns.register_matcher("x", abs_rescaling, stage="module")
