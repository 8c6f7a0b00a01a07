"""``NoetherCallback`` under the recipes of real Lightning runs (issue #31).

Gradient accumulation (the record of k micro-batches = that of one batch of the same data,
float64), one TensorBoard stream at Lightning's own step when the trainer has a logger, and
``precision="bf16-mixed"``.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import noetherflow as nf

L = pytest.importorskip("lightning")
from noetherflow.integrations.lightning import NoetherCallback  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*log_every_n_steps.*"),
    pytest.mark.filterwarnings("ignore:.*litlogger.*"),
]


class Net(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch: Any, i: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=0.01)


def fit(batch_size: int, accumulate: int, dtype: torch.dtype, **trainer: Any) -> NoetherCallback:
    torch.manual_seed(0)
    m = Net().to(dtype)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 4, generator=g, dtype=dtype), torch.randn(64, 2, generator=g, dtype=dtype)
    )
    cb = NoetherCallback(
        nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)]), every=1, distance=nf.DistanceOptions(every=1)
    )
    opts = dict(
        max_epochs=1,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=accumulate,
    )
    L.Trainer(**{**opts, **trainer}).fit(
        m, torch.utils.data.DataLoader(data, batch_size=batch_size)
    )
    return cb


def test_accumulate_grad_batches_records_the_full_batch() -> None:
    """Batches of 8 accumulated twice = batches of 16: the same run, the same records."""
    one, acc = fit(16, 1, torch.float64), fit(8, 2, torch.float64)
    assert one.monitor is not None and acc.monitor is not None
    h1, h2 = one.monitor.history, acc.monitor.history
    assert h1["step"].tolist() == h2["step"].tolist() == [0, 1, 2, 3]
    for kind in ("charge", "flow", "distance"):
        np.testing.assert_allclose(h2[f"{kind}/rescaling0"], h1[f"{kind}/rescaling0"], rtol=1e-8)
    np.testing.assert_allclose(h2["loss"], h1["loss"], rtol=1e-12)
    assert (h2["undefined"] == 0).all()


def test_one_tensorboard_stream_at_lightnings_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing import event_accumulator

    logger = L.pytorch.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    torch.manual_seed(0)
    m = Net()
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 4, generator=g), torch.randn(64, 2, generator=g)
    )
    cb = NoetherCallback(
        nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)]),
        every=1,
        distance=False,
        logging=nf.LogOptions(log_dir=tmp_path / "mon"),
    )
    L.Trainer(
        max_epochs=1,
        callbacks=[cb],
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    ).fit(m, torch.utils.data.DataLoader(data, batch_size=16))
    events = glob.glob(str(tmp_path / "**" / "events*"), recursive=True)
    assert len(events) == 1, events  # Lightning's; the monitor opened no writer of its own
    ea = event_accumulator.EventAccumulator(events[0])
    ea.Reload()
    ours = [(e.step, e.value) for e in ea.Scalars("noether/loss")]
    theirs = [(e.step, e.value) for e in ea.Scalars("train_loss")]
    assert ours == theirs and len(ours) == 4
    assert (tmp_path / "mon" / "history.csv").exists()  # the monitor's own files stay


def test_bf16_mixed_precision_runs() -> None:
    cb = fit(16, 1, torch.float32, precision="bf16-mixed")
    assert cb.monitor is not None
    h = cb.monitor.history
    assert np.isfinite(h["flow/rescaling0"]).all() and (h["undefined"] == 0).all()
