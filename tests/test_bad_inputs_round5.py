"""Round 5 of bad inputs: what a user ran into in the round after round 4.

Each test failed on the code before its fix: a string ``lr="0.1"`` (a value read unparsed from
a config file) was converted by ``float()`` wherever a learning rate, a batch size or a weight
decay is taken, and a bool was a batch size of 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


def _mlp() -> tuple[nn.Sequential, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).to(DT)
    x = torch.randn(16, 4, dtype=DT)
    y = torch.randint(0, 3, (16,))
    return m, nf.find_symmetries(m, x), x, y


# -- hyper-parameters of another type than a number -------------------------------------------
H = {"lr": 0.1, "batch_size": 16, "weight_decay": 1e-3}


def _calls() -> dict[str, Any]:
    m, syms, x, y = _mlp()
    stats = nf.collect_stats(m, syms, nn.CrossEntropyLoss(), x, y)
    loss = nn.CrossEntropyLoss()
    return {
        "solve_equilibrium": lambda h: nf.solve_equilibrium(syms, stats, **h),
        "noether_flow": lambda h: nf.noether_flow(syms, stats, **h),
        "NoiseModel.create": lambda h: nf.NoiseModel.create(**h),
        "NoetherMonitor": lambda h: nf.NoetherMonitor(m, syms, distance=False, **h),
        "EquilibriumTeleport": lambda h: nf.EquilibriumTeleport(m, syms, loss, **h),
    }


@pytest.mark.parametrize(
    "key,value",
    [
        ("lr", "0.1"),
        ("lr", True),
        ("lr", "abc"),
        ("batch_size", "16"),
        ("batch_size", True),
    ],
)
def test_hyperparameters_of_another_type_are_refused_not_converted(key: str, value: Any) -> None:
    for call in _calls().values():
        with pytest.raises(TypeError, match=rf"{key}={value!r} is a {type(value).__name__}.*"):
            call({**H, key: value})
    if isinstance(value, str) and value != "abc":
        with pytest.raises(TypeError, match=rf"expected a .*pass {key}={value}\b"):
            _calls()["noether_flow"]({**H, key: value})


@pytest.mark.parametrize(
    "who",
    [
        "solve_equilibrium",
        "noether_flow",
        "NoiseModel.create",
        "NoetherMonitor",
        "EquilibriumTeleport",
    ],
)
def test_a_string_weight_decay_is_refused_not_converted(who: str) -> None:
    with pytest.raises(TypeError, match=r"weight_decay='0.001' is a str.*pass weight_decay=0.001"):
        _calls()[who]({**H, "weight_decay": "0.001"})


@pytest.mark.parametrize(
    "lr,batch_size",
    [
        (np.float32(0.1), np.int64(16)),
        (torch.tensor(0.1, dtype=DT), torch.tensor(16)),
        (np.array(0.1), 16.0),
    ],
)
def test_numpy_scalars_and_0d_tensors_still_work(lr: Any, batch_size: Any) -> None:
    calls = _calls()
    want = calls["noether_flow"](H)
    got = calls["noether_flow"]({**H, "lr": lr, "batch_size": batch_size})
    for k in want:  # np.float32(0.1) is 0.1 to float32 precision
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=0)
    sol = calls["solve_equilibrium"]({**H, "lr": lr, "batch_size": batch_size})
    assert sol.converged
    calls["NoetherMonitor"]({**H, "lr": lr, "batch_size": batch_size})


def test_theory_and_simulator_hyperparameters_refuse_strings() -> None:
    from noetherflow.theory.ziyin2024._common import _check_positive
    from noetherflow.train._core import _check_float

    with pytest.raises(TypeError, match=r"lr='0.1' is a str.*pass lr=0.1"):
        _check_float("lr", "0.1", positive=True)
    with pytest.raises(TypeError, match=r"lr='0.1' is a str.*pass lr=0.1"):
        _check_positive("lr", "0.1")  # type: ignore[arg-type]
