"""The Lightning callbacks with the real ``lightning`` package (issue #19).

One run under a pseudo-terminal, where Lightning shows its rich progress bar: before the fix
the monitor's own live display clashed with it and ``trainer.fit`` ended in
``IndexError: pop from empty list`` at teardown (piped output hid it).
"""

from __future__ import annotations

import csv
import os
import select
import signal
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import noetherflow as nf

L = pytest.importorskip("lightning")
pty = pytest.importorskip("pty")  # POSIX pseudo-terminals

# Lightning's own warnings about this tiny CPU setup and its use of a deprecated torch API.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*log_every_n_steps.*"),
]
from noetherflow.integrations.lightning import NoetherCallback  # noqa: E402

SRC = str(Path(nf.__file__).resolve().parents[1])

MODULE = """
import torch, lightning as L
from torch import nn


class Net(L.LightningModule):
    def __init__(self, opt="sgd"):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
        self.opt = opt

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        if self.opt == "adam":
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        opt = torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}


def loader(batch_size=16, **kw):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randn(64, 2, generator=g)
    ds = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, **kw)
"""

SCRIPT = """
import sys, torch, lightning as L
import noetherflow as nf
from noetherflow.integrations.lightning import NoetherCallback
from pl_module import Net, loader

torch.manual_seed(0)
m = Net()
syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)])
kw = dict(lr=0.05, batch_size=16) if sys.argv[1] == "explicit" else {}
cb = NoetherCallback(syms, every=2, **kw)
L.Trainer(max_epochs=2, callbacks=[cb], logger=False, enable_checkpointing=False,
          accelerator="cpu", devices=1).fit(m, loader())
print("DONE", cb.monitor.history["step"].tolist())
"""


def run_in_pty(argv: list[str], cwd: Path, timeout: float = 300.0) -> tuple[int, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(cwd), SRC]),
        "TERM": "xterm-256color",
        "COLUMNS": "120",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("NO_COLOR", None)
    pid, fd = pty.fork()
    if pid == 0:  # child: stdin/stdout/stderr are the pseudo-terminal
        os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    out = b""
    end = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"timed out after {timeout}s; output so far:\n{out.decode()}")
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.parametrize("mode", ["explicit", "from-trainer"])
def test_fit_in_a_pseudo_terminal_exits_cleanly(tmp_path: Path, mode: str) -> None:
    (tmp_path / "pl_module.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    code, out = run_in_pty([sys.executable, "script.py", mode], tmp_path)
    assert "Traceback" not in out, out
    assert code == 0, out
    assert "DONE [0, 2, 4, 6]" in out, out
    assert "Epoch 1/1" in out  # Lightning's rich progress bar was live in the terminal


@pytest.fixture
def pl_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "pl_module.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import pl_module as mod

    return importlib.reload(mod)


def trainer(tmp_path: Path, cb, **kw) -> L.Trainer:
    return L.Trainer(
        max_epochs=2,
        callbacks=[cb],
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


def test_reads_lr_gamma_and_batch_size_from_the_trainer_and_logs_flat_scalars(
    tmp_path: Path, pl_module
) -> None:
    from lightning.pytorch.loggers import CSVLogger

    torch.manual_seed(0)
    m = pl_module.Net()
    syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2, label="fc1→fc2")])
    cb = NoetherCallback(syms, every=2)
    trainer(tmp_path, cb, logger=CSVLogger(tmp_path, name="run")).fit(m, pl_module.loader())
    mon = cb.monitor
    assert mon is not None and mon.batch_size == 16
    h = mon.history
    assert h["step"].tolist() == [0, 2, 4, 6]
    assert h["lr"].tolist() == [0.05, 0.05, 0.025, 0.025]  # StepLR per epoch of 4 steps
    assert h["weight_decay"].tolist() == [0.005] * 4  # SGD weight_decay / 2
    with open(next(tmp_path.rglob("metrics.csv"))) as fh:
        rows = list(csv.DictReader(fh))
    logged = [r for r in rows if r.get("noether/flow/fc1_to_fc2/max_abs")]
    assert len(logged) == 4
    for r, j in zip(logged, range(4), strict=True):
        assert float(r["noether/flow/fc1_to_fc2/max_abs"]) == pytest.approx(
            abs(h["flow/fc1_to_fc2"][j]).max(), rel=1e-6
        )
        assert float(r["noether/charge/fc1_to_fc2/mean"]) == pytest.approx(
            h["charge/fc1_to_fc2"][j].mean(), rel=1e-6, abs=1e-9
        )
        assert float(r["noether/lr"]) == h["lr"][j]


def test_clear_early_errors(tmp_path: Path, pl_module) -> None:
    torch.manual_seed(0)
    m = pl_module.Net(opt="adam")
    syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)])
    cb = NoetherCallback(syms, every=2)
    with pytest.warns(UserWarning, match="Adam: charges and the exact per-step decomposition"):
        trainer(tmp_path, cb, logger=False).fit(m, pl_module.loader())  # Adam: no flows (#18)
    assert cb.monitor is not None
    h = cb.monitor.history
    assert not any(k.startswith("flow/") for k in h)
    assert np.isfinite(h["step_noise/rescaling0"][1:]).all()
    assert not m.fc1._forward_hooks
    m = pl_module.Net()
    syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)])
    sampler = torch.utils.data.BatchSampler(range(64), batch_size=16, drop_last=False)
    cb = NoetherCallback(syms, every=2)

    class Custom:
        def __iter__(self):
            return iter(list(sampler))

        def __len__(self) -> int:
            return len(sampler)

    loader = pl_module.loader(batch_size=None, sampler=Custom())
    with pytest.raises(ValueError, match=r"could not read the batch size.*batch_size=S"):
        trainer(tmp_path, cb, logger=False).fit(m, loader)


def test_teleport_callback_reads_the_trainers_optimizer(tmp_path: Path, pl_module) -> None:
    torch.manual_seed(0)
    m = pl_module.Net()
    syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)])
    tp = nf.EquilibriumTeleport(m, syms, F.mse_loss, batch_size=16, every=3)
    cb = tp.lightning_callback()
    trainer(tmp_path, cb, logger=False).fit(m, pl_module.loader())
    assert [r.step for r in tp.history] == [0, 3, 6]
    assert tp.optimizer is not None and (tp.lr, tp.weight_decay) == (
        0.0125,
        0.005,
    )  # after 2 epochs of StepLR


class _DictNet(L.LightningModule):
    """Takes keyword inputs and a dict batch ``{"x": …, "labels": …}`` (a HF-style batch)."""

    def __init__(self, key: str = "labels") -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch: dict, i: int) -> torch.Tensor:
        return F.mse_loss(self(x=batch["x"]), batch[self.key])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, weight_decay=0.01)


def _dict_loader(key: str = "labels") -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randn(64, 2, generator=g)
    rows = [{"x": x[i], key: y[i]} for i in range(64)]
    return torch.utils.data.DataLoader(rows, batch_size=16)  # collates to a dict of tensors


def test_default_split_takes_dict_and_batch_encoding() -> None:
    from noetherflow._inputs import ModelInputs
    from noetherflow.integrations.lightning import default_split

    x, y = torch.randn(3, 4), torch.randn(3, 2)
    inputs, targets = default_split({"x": x, "mask": None, "labels": y})
    assert isinstance(inputs, ModelInputs) and inputs.args == ()
    assert inputs.kwargs.keys() == {"x", "mask"} and inputs.kwargs["x"] is x and targets is y
    assert default_split((x, y)) == (x, y)
    transformers = pytest.importorskip("transformers")
    enc = transformers.BatchEncoding({"input_ids": x, "target": y})
    inputs, targets = default_split(enc, labels_key="target")
    assert inputs.kwargs.keys() == {"input_ids"} and targets is y
    with pytest.raises(KeyError, match=r"keys \['input_ids', 'target'\].*labels_key="):
        default_split(enc)
    with pytest.raises(ValueError, match="2-tuple or 2-list, or a dict"):
        default_split([x, y, y])


def test_dict_batches_in_both_callbacks(tmp_path: Path) -> None:
    """Keyword inputs reach the monitor's reference estimator and the teleporter."""
    torch.manual_seed(0)
    m = _DictNet("y")
    syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2, label="fc1→fc2")])
    cb = NoetherCallback(syms, every=2, estimator="reference", loss_fn=F.mse_loss, labels_key="y")
    trainer(tmp_path, cb, logger=False, max_steps=3).fit(m, _dict_loader("y"))
    assert cb.monitor is not None and cb.monitor.history["step"].tolist() == [0, 2]
    # the recorded flow at step 0 is the flow of the statistics on that batch, by hand
    torch.manual_seed(0)
    ref = _DictNet("y")
    batch = next(iter(_dict_loader("y")))
    stats = nf.collect_stats(
        ref,
        nf.SymmetrySet([nf.Rescaling(ref.fc1, ref.fc2)]),
        F.mse_loss,
        {"x": batch["x"]},
        batch["y"],
        estimator="reference",
    )
    want = nf.noether_flow(
        nf.SymmetrySet([nf.Rescaling(ref.fc1, ref.fc2)]),
        stats,
        lr=0.05,
        batch_size=16,
        weight_decay=0.005,
    )
    got = cb.monitor.history["flow/fc1_to_fc2"][0]
    assert np.allclose(got, next(iter(want.values())).numpy(), rtol=1e-5, atol=1e-12)

    m = _DictNet()
    syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)])
    tp = nf.EquilibriumTeleport(m, syms, F.mse_loss, batch_size=16, every=3)
    trainer(tmp_path, tp.lightning_callback(), logger=False, max_steps=4).fit(m, _dict_loader())
    assert [r.step for r in tp.history] == [0, 3]
    m = _DictNet("y")
    syms = nf.SymmetrySet([nf.Rescaling(m.fc1, m.fc2)])
    tp = nf.EquilibriumTeleport(m, syms, F.mse_loss, batch_size=16, every=3)
    with pytest.raises(KeyError, match=r"keys \['x', 'y'\], but no labels key 'labels'"):
        trainer(tmp_path, tp.lightning_callback(), logger=False).fit(m, _dict_loader("y"))
