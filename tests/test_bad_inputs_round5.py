"""Round 5 of bad inputs: what a user ran into in the round after round 4.

Each test failed on the code before its fix: a string ``lr="0.1"`` (a value read unparsed from
a config file) was converted by ``float()`` wherever a learning rate, a batch size or a weight
decay is taken, and a bool was a batch size of 1; a symmetry given twice to one
``SymmetrySet`` (the same object, or an equal one on the same parameters) was kept, its charge
and flow counted twice; ``estimator="microbatch"`` with micro-batches of one sample under a
training-mode BatchNorm was refused only at the first record or teleport;
``NoetherMonitor(batch_size=32)`` on batches of 64 scaled the noise term η/S of every flow
without a word.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_bad_inputs_round4 import _mlp
from torch import Tensor, nn

import noetherflow as nf

DT = torch.float64


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


def test_a_string_set_on_the_monitor_is_refused() -> None:
    m, syms, _, _ = _mlp()
    mon = nf.NoetherMonitor(m, syms, distance=False, **H)
    with pytest.raises(TypeError, match=r"lr='0.2' is a str.*pass lr=0.2"):
        mon.lr = "0.2"  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"weight_decay='0.01' is a str"):
        mon.weight_decay = "0.01"  # type: ignore[assignment]
    assert mon.lr == 0.1 and mon.weight_decay == 1e-3
    mon.lr = np.float64(0.2)
    assert mon.lr == 0.2


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
    with pytest.raises(TypeError, match=r"lr=True is a bool"):
        _check_positive("lr", True)
    _check_positive("lr", torch.tensor(0.1, dtype=DT))  # a 0-d tensor is a number


def test_a_string_in_a_per_parameter_weight_decay_is_refused() -> None:
    m, _, _, _ = _mlp()
    p = next(iter(m.parameters()))
    with pytest.raises(TypeError, match=r"weight_decay\[.*\]='1e-4' is a str.*pass .*=0.0001"):
        nf.NoiseModel.create(lr=0.1, batch_size=16, weight_decay={p: "1e-4"})
    nm = nf.NoiseModel.create(lr=0.1, batch_size=16, weight_decay={p: 1e-4})
    assert nm.decay is not None


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


def test_a_subset_naming_a_symmetry_twice_is_refused() -> None:
    m, _, _, _ = _mlp()
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2]), nf.DoubleRotation(m[0], m[2])])
    n = len(syms)
    with pytest.raises(ValueError, match=r"index 0 names symmetry 0 .* again.*sorted\(set"):
        syms.subset([0, 0])
    with pytest.raises(ValueError, match=rf"index -{n} names symmetry 0 "):
        syms.subset([0, -n])  # the same symmetry by a negative index
    with pytest.raises(IndexError):
        syms.subset([n])
    assert syms.subset([n - 1, 0]).names == [syms.names[n - 1], syms.names[0]]


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


# -- batch_size other than the samples the hooks count -------------------------------------------
def _steps(mon: nf.NoetherMonitor, m: nn.Module, x: Tensor, y: Tensor, k: int = 1) -> None:
    """Two recorded steps of ``len(x)`` samples each, in ``k`` accumulated micro-batches."""
    for _ in range(2):
        for xb, yb in zip(x.chunk(k), y.chunk(k), strict=True):
            with mon.track():
                (nn.functional.cross_entropy(m(xb), yb) / k).backward()
        mon.step()
        m.zero_grad(set_to_none=True)


def _monitor(m: nn.Module, syms: nf.SymmetrySet, batch_size: int, **kw: Any) -> nf.NoetherMonitor:
    return nf.NoetherMonitor(
        m,
        syms,
        every=1,
        lr=0.1,
        batch_size=batch_size,
        distance=False,
        logging=nf.LogOptions(progress=False),
        **kw,
    )


def test_batch_size_other_than_the_samples_seen_is_warned_once() -> None:
    m, syms, x, y = _mlp()  # 16 samples a step
    mon = _monitor(m, syms, 32)
    with pytest.warns(UserWarning, match=r"batch_size=32\): record step 0 counted 16 samples") as w:
        _steps(mon, m, x, y)
    said = [str(r.message) for r in w if "counted" in str(r.message)]
    assert len(said) == 1, said  # once, not at every record
    assert "η/S of its flows and distances is 0.5×" in said[0]
    assert "Pass batch_size=16, the samples per optimizer step" in said[0]
    assert len(mon.history["step"]) == 2  # a warning, not an error: the records are kept


def test_accumulated_batch_is_the_batch_size() -> None:
    m, syms, x, y = _mlp()
    _steps(_monitor(m, syms, 16), m, x, y, k=2)  # 2 × 8 samples, batch_size = 16: no warning
    with pytest.warns(UserWarning, match=r"batch_size=8\).*counted 16 samples.*batch_size=16"):
        _steps(_monitor(m, syms, 8), m, x, y, k=2)  # the micro-batch given


def test_batch_estimators_count_the_samples_of_their_batch() -> None:
    m, syms, x, y = _mlp()
    loss = nn.CrossEntropyLoss()
    for est, mb in (("reference", 1), ("microbatch", 4)):  # microbatch: 4 micro-batches of 4
        mon = _monitor(m, syms, 16, estimator=est, micro_batch_size=mb, loss_fn=loss)
        mon.step(loss(m(x), y), inputs=x, targets=y)
        mon = _monitor(m, syms, 64, estimator=est, micro_batch_size=mb, loss_fn=loss)
        with pytest.warns(UserWarning, match=r"batch_size=64\).*counted 16 samples"):
            mon.step(loss(m(x), y), inputs=x, targets=y)


def test_lightning_counts_an_epochs_last_smaller_batch() -> None:
    """40 samples in batches of 16: the last step has 8, its S is 8 (was 16, and warned)."""
    L = pytest.importorskip("lightning")
    from noetherflow.integrations.lightning import NoetherCallback

    class Net(L.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.fc2(torch.relu(self.fc1(x)))

        def training_step(self, batch: Any, i: int) -> Tensor:
            return nn.functional.mse_loss(self(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    net = Net().to(DT)
    data = torch.utils.data.TensorDataset(
        torch.randn(40, 4, dtype=DT), torch.randn(40, 2, dtype=DT)
    )
    cb = NoetherCallback(nf.SymmetrySet([nf.Rescaling(net.fc1, net.fc2)]), every=1, distance=False)
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(net, torch.utils.data.DataLoader(data, batch_size=16))
    assert cb.monitor is not None and cb.monitor.batch_size == 8
    assert len(cb.monitor.history["step"]) == 3
