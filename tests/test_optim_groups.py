"""One reader of an optimizer's param groups (issue #27): values, wrappers, and a guard."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch
from torch import nn

from noetherflow.optim import from_optimizer
from noetherflow.optim.groups import groups_holding, read_groups, unwrap
from noetherflow.optim.source import adam_settings, sgd_settings

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "noetherflow"


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def test_sgd_groups_are_read_as_pytorch_applies_them() -> None:
    m = _net()
    opt = torch.optim.SGD(
        [
            {"params": m[0].parameters(), "momentum": 0.9, "dampening": 0.3, "nesterov": False},
            {"params": m[1].parameters(), "dampening": 0.5, "weight_decay": 0.02},
        ],
        lr=0.1,
    )
    g0, g1 = read_groups(opt)
    assert (g0.kind, g0.lr, g0.momentum, g0.dampening) == ("sgd", 0.1, 0.9, 0.3)
    # PyTorch ignores dampening without momentum
    assert (g1.momentum, g1.dampening, g1.weight_decay) == (0.0, 0.0, 0.02)
    assert g1.shrink == 1.0 - 0.1 * 0.02
    assert g1.params == tuple(m[1].parameters())


@pytest.mark.parametrize(
    ("make", "kind", "shrink"),
    [
        (lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1), "adamw", 1 - 0.01 * 0.1),
        (lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1), "adam", 1.0),
        (
            lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
            "adamw",
            1 - 0.01 * 0.1,
        ),
        (lambda p: torch.optim.RMSprop(p, lr=0.01, weight_decay=0.1), "other", 1.0),
    ],
)
def test_adaptive_kinds_and_shrinks(make, kind, shrink) -> None:
    (g,) = read_groups(make(_net().parameters()))
    assert g.kind == kind
    assert g.shrink == pytest.approx(shrink, rel=0, abs=1e-15)


def test_wrappers_are_unwrapped_by_every_reader() -> None:
    m = _net()
    inner = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5, weight_decay=0.04)

    class Wrapper:  # the shape of LightningOptimizer / TeleportingOptimizer
        optimizer = inner

    w = Wrapper()
    assert unwrap(w) is inner
    assert read_groups(w) == read_groups(inner)
    # from_optimizer refused a wrapper before it used the one reader
    (gn,) = from_optimizer(w, 8)  # type: ignore[arg-type]
    assert (gn.lr, gn.momentum, gn.weight_decay) == (0.1, 0.5, 0.02)
    assert sgd_settings(w, m.parameters(), owner="X")[:4] == (0.1, 0.02, 0.5, False)


def test_settings_readers_agree_with_the_groups() -> None:
    m = _net()
    opt = torch.optim.AdamW(
        [
            {"params": m[0].parameters(), "weight_decay": 0.0},
            {"params": m[1].parameters(), "weight_decay": 0.05},
        ],
        lr=3e-3,
        betas=(0.8, 0.99),
    )
    a = adam_settings(opt, m.parameters(), owner="X")
    assert (a.kind, a.lr, a.weight_decay, a.beta1, a.beta2, a.mixed_decay) == (
        "adamw",
        3e-3,
        0.05,
        0.8,
        0.99,
        True,
    )
    assert [g.index for g in groups_holding(opt, m[1].parameters(), "X")] == [1]
    with pytest.raises(ValueError, match=r"X\(optimizer=...\): 1 of the 3 parameters"):
        groups_holding(opt, [*m[1].parameters(), nn.Parameter(torch.zeros(1))], "X")


def test_param_groups_are_read_in_one_module() -> None:
    """Outside ``optim/groups.py`` no library module reads ``.param_groups`` itself."""
    pat = re.compile(r"\.param_groups\b")
    where = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel == "optim/groups.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if pat.search(code) and not code.strip().startswith(("``", '"', "'")):
                where.append(f"{rel}:{n}: {line.strip()}")
    assert not where, "read param groups through noetherflow.optim.groups:\n" + "\n".join(where)
