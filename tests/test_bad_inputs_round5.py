"""Round 5 of bad inputs: what a user ran into in the round after round 4.

Each test failed on the code before its fix: a string ``lr="0.1"`` (a value read unparsed from
a config file) was converted by ``float()`` wherever a learning rate, a batch size or a weight
decay is taken, and a bool was a batch size of 1; a symmetry given twice to one
``SymmetrySet`` (the same object, or an equal one on the same parameters) was kept, its charge
and flow counted twice; ``estimator="microbatch"`` with micro-batches of one sample under a
training-mode BatchNorm was refused only at the first record or teleport.
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


# -- a symmetry twice in one set -----------------------------------------------------------------
def test_the_same_symmetry_twice_is_refused() -> None:
    m, _, _, _ = _mlp()
    r = nf.Rescaling(m[0], m[2])
    with pytest.raises(ValueError, match=r"symmetry 1 \('rescaling1', rescaling .*\) is the same"):
        nf.SymmetrySet([r, r])
    s = nf.SymmetrySet([r])
    with pytest.raises(nf.SymmetryDefinitionError, match=r"same object as 'rescaling0'.*Drop"):
        s.add(r)
    assert len(s) == 1


def test_an_equal_symmetry_on_the_same_parameters_is_refused() -> None:
    m, _, _, _ = _mlp()
    with pytest.raises(
        ValueError, match=r"same parameters with the same generator as 'rescaling0'"
    ):
        nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.Rescaling(m[0], m[2])])
    with pytest.raises(ValueError, match=r"\('b'\) acts on the same .* as 'a'"):
        nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="a"), nf.Rescaling(m[0], m[2], label="b")])
    w = [m[0].weight, m[0].bias]
    with pytest.raises(ValueError, match="same generator"):
        nf.SymmetrySet([nf.ScaleInvariance(w), nf.ScaleInvariance(w)])
    with pytest.raises(ValueError, match="same generator"):
        nf.SymmetrySet([nf.DoubleRotation(m[0], m[2]), nf.DoubleRotation(m[0], m[2])])
    # other generators on the same parameters are distinct symmetries
    assert (
        len(nf.SymmetrySet([nf.ScaleInvariance(w), nf.ScaleInvariance(w, per_channel=True)])) == 2
    )
    # a dense generator is compared by object only: its signature leaves the matrix out
    a = torch.zeros(8, 8, dtype=DT)
    a[0, 1] = a[1, 0] = 1.0
    d = nf.DenseSymmetry([m[0].bias], a)
    with pytest.raises(ValueError, match="same object"):
        nf.SymmetrySet([d, d])


def test_sets_of_copies_and_detection_keep_their_symmetries_once() -> None:
    import copy
    import pickle

    m, syms, x, _ = _mlp()
    for other in (copy.deepcopy(syms), pickle.loads(pickle.dumps(syms))):
        assert other.names == syms.names
        with pytest.raises(ValueError, match="same generator"):
            other.add(copy.copy(other[0]))
    found = nf.find_symmetries(m, x)
    with pytest.raises(ValueError, match="same generator"):
        nf.SymmetrySet([*found, *nf.find_symmetries(m, x)])  # a set concatenated with itself


# -- micro-batches of one sample under a training-mode BatchNorm -------------------------------
def _bn_model() -> tuple[nn.Sequential, nf.SymmetrySet, Tensor, Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).to(DT)
    syms = nf.SymmetrySet([nf.ScaleInvariance([m[0].weight, m[0].bias], per_channel=True)])
    return m.train(), syms, torch.randn(8, 4, dtype=DT), torch.randint(0, 3, (8,))


def test_microbatch_of_one_under_batchnorm_is_refused_when_built() -> None:
    m, syms, x, y = _bn_model()
    loss = nn.CrossEntropyLoss()
    msg = (
        r"micro_batch_size=1 with BatchNorm in training mode \(module '1'\).*micro_batch_size >= 2"
    )
    kw: dict[str, Any] = {"lr": 0.1, "batch_size": 8, "estimator": "microbatch"}
    with pytest.raises(nf.StatisticsError, match=msg):
        nf.NoetherMonitor(m, syms, loss_fn=loss, micro_batch_size=1, distance=False, **kw)
    with pytest.raises(nf.StatisticsError, match=msg):
        nf.EquilibriumTeleport(m, syms, loss, micro_batch_size=1, **kw)
    # the estimator itself says the same
    with pytest.raises(nf.StatisticsError, match=msg):
        nf.collect_stats(m, syms, loss, x, y, estimator="microbatch", micro_batch_size=1)
    # micro-batches of two, or the BatchNorm in eval mode (running statistics), are taken
    nf.NoetherMonitor(m, syms, loss_fn=loss, micro_batch_size=2, distance=False, **kw)
    nf.NoetherMonitor(m.eval(), syms, loss_fn=loss, micro_batch_size=1, distance=False, **kw)
