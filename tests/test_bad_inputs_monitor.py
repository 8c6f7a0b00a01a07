"""Monitor trust (issue #16): accumulation, clipped gradients, I/O errors, crash-torn files.

Each test failed on the code before this change (accumulation: an error about a shared
layer; clipping: flows changed; an OSError stopped training; a torn last line made
``load_history`` raise; a broken JSONL line gave a JSON error naming neither file nor line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf

DT = torch.float64


def problem() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).to(DT)
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    g = torch.Generator().manual_seed(1)
    return (
        m,
        syms,
        torch.randn(16, 5, generator=g, dtype=DT),
        torch.randn(16, 3, generator=g, dtype=DT),
    )


# -- gradient accumulation --------------------------------------------------------------------
def test_accumulation_inside_one_track_is_refused_naming_accumulation() -> None:
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=16, logging=nf.LogOptions(progress=False)
    )
    with pytest.raises(nf.StatisticsError, match="gradient accumulation"), mon.track():
        for k in range(2):  # two micro-batches, one optimizer step
            (F.mse_loss(m(x[8 * k : 8 * k + 8]), y[8 * k : 8 * k + 8]) / 2).backward()
    assert not m._forward_pre_hooks and not m._forward_hooks  # nothing left attached
    assert all(not layer._forward_hooks for layer in m)


def test_accumulated_batch_statistics_with_the_reference_estimator() -> None:
    """The documented way: estimator='reference' on the whole accumulated batch."""
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        lr=0.1,
        batch_size=16,
        logging=nf.LogOptions(progress=False),
        estimator="reference",
        loss_fn=F.mse_loss,
    )
    with mon.track():
        for k in range(2):
            (F.mse_loss(m(x[8 * k : 8 * k + 8]), y[8 * k : 8 * k + 8]) / 2).backward()
    grad = m[0].weight.grad.clone()
    row = mon.step(inputs=x, targets=y)
    assert row is not None
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    want = nf.noether_flow(syms, stats, lr=0.1, batch_size=16)["rescaling0"]
    assert torch.allclose(torch.as_tensor(row["flow/rescaling0"]), want, rtol=1e-12, atol=0)
    assert torch.equal(m[0].weight.grad, grad)  # .grad left as the loop made it


def test_shared_layer_error_is_not_called_accumulation() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(4, 4).to(DT)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = lin, nn.Linear(4, 2).to(DT)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(torch.relu(self.a(x)))))

    m = Twice()
    syms = nf.SymmetrySet([nf.Rescaling(m.a, m.b)])
    mon = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=4, logging=nf.LogOptions(progress=False)
    )
    with pytest.raises(nf.UnsupportedLayerError, match="ran twice") as err, mon.track():
        m(torch.randn(4, 4, dtype=DT)).sum().backward()
    assert "accumulation" not in str(err.value)
    assert "estimator='microbatch'" in str(err.value) and "mon.step(loss, inputs=x" in str(
        err.value
    )


# -- gradients changed after the backward ---------------------------------------------------
def test_clipping_between_backward_and_step_does_not_change_the_record() -> None:
    rows = []
    for clip in (False, True):
        m, syms, x, y = problem()
        mon = nf.NoetherMonitor(
            m, syms, every=1, lr=0.1, batch_size=16, logging=nf.LogOptions(progress=False)
        )
        m.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm=1e-3)
        rows.append(mon.step(loss))
    stats = nf.collect_stats(m, syms, F.mse_loss, x, y, estimator="reference")
    want = nf.noether_flow(syms, stats, lr=0.1, batch_size=16)["rescaling0"]
    for row in rows:
        assert row is not None
        assert torch.allclose(torch.as_tensor(row["flow/rescaling0"]), want, rtol=1e-10, atol=0)
        assert np.all(np.isfinite(row["distance/rescaling0"]))
    assert np.array_equal(rows[0]["distance/rescaling0"], rows[1]["distance/rescaling0"])


# -- I/O errors -------------------------------------------------------------------------------
def train(
    mon: nf.NoetherMonitor, m: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int
) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        mon.step(loss)
        opt.step()


class FullDisk:
    """A TensorBoard-like writer whose disk is full."""

    def __init__(self) -> None:
        self.calls = 0

    def add_scalar(self, *a: Any) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def add_histogram(self, *a: Any) -> None:
        raise OSError(28, "No space left on device")


def test_writer_oserror_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    m, syms, x, y = problem()
    tb = FullDisk()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        lr=0.1,
        batch_size=16,
        logging=nf.LogOptions(progress=False, log_dir=tmp_path, tensorboard=tb),
    )
    with pytest.warns(RuntimeWarning, match="No space left on device") as rec:
        train(mon, m, x, y, 4)
    assert len([w for w in rec if "No space" in str(w.message)]) == 1
    assert tb.calls == 1  # stopped after the failure
    mon.close()
    assert len(mon.history["step"]) == 4
    assert nf.load_history(tmp_path / "history.csv")["step"].tolist() == [0, 1, 2, 3]


def test_csv_oserror_mid_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        lr=0.1,
        batch_size=16,
        logging=nf.LogOptions(
            progress=False, log_dir=tmp_path, tensorboard=False, formats=("csv",)
        ),
    )
    train(mon, m, x, y, 2)
    from noetherflow.monitor import history as _history

    real = _history._write_line

    def full(path: Path, text: str, *, mode: str = "a") -> None:
        real(path, text[: len(text) // 2], mode=mode)  # half the line reached the disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_history, "_write_line", full)
    with pytest.warns(RuntimeWarning, match=r"history\.csv failed at step 2"):
        train(mon, m, x, y, 3)
    monkeypatch.setattr(_history, "_write_line", real)
    mon.close()
    assert len(mon.history["step"]) == 5
    with pytest.warns(RuntimeWarning, match=r"history\.csv, line 4: the last line is incomplete"):
        back = nf.load_history(tmp_path / "history.csv")
    assert back["step"].tolist() == [0, 1]
    assert np.array_equal(back["flow/rescaling0"], mon.history["flow/rescaling0"][:2])


def test_on_record_oserror_is_reported_once() -> None:
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=16, logging=nf.LogOptions(progress=False)
    )
    seen: list[dict[str, float]] = []
    mon.on_record(seen.append)

    @mon.on_record
    def broken(rec: dict[str, float]) -> None:
        raise OSError("connection reset")

    with pytest.warns(RuntimeWarning, match="connection reset"):
        train(mon, m, x, y, 3)
    assert len(seen) == 3


# -- files after a crash ----------------------------------------------------------------------
def written(tmp_path: Path) -> nf.NoetherMonitor:
    m, syms, x, y = problem()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        lr=0.1,
        batch_size=16,
        logging=nf.LogOptions(progress=False, log_dir=tmp_path, tensorboard=False),
    )
    train(mon, m, x, y, 3)
    mon.close()
    return mon


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path, fmt: str) -> None:
    mon = written(tmp_path)
    p = tmp_path / f"history.{fmt}"
    text = p.read_text()
    lines = text.splitlines(keepends=True)
    p.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 3])
    line = len(lines)
    with pytest.warns(RuntimeWarning, match=rf"history\.{fmt}, line {line}: the last line is"):
        back = nf.load_history(p)
    assert back["step"].tolist() == [0, 1]
    for k, v in back.items():
        np.testing.assert_array_equal(v, mon.history[k][:2])


def test_csv_cut_inside_the_last_number_is_not_read_as_a_shorter_number(tmp_path: Path) -> None:
    written(tmp_path)
    p = tmp_path / "history.csv"
    p.write_text(p.read_text()[:-3])  # the last cell loses its tail and the newline
    with pytest.warns(RuntimeWarning, match="line 4"):
        assert nf.load_history(p)["step"].tolist() == [0, 1]


def test_broken_jsonl_line_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    written(tmp_path)
    p = tmp_path / "history.jsonl"
    lines = p.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:20] + "\n"
    p.write_text("".join(lines))
    with pytest.raises(ValueError, match=r"history\.jsonl, line 2: not a monitor record"):
        nf.load_history(p)
    lines[1] = json.dumps({"step": 1}) + "\n"  # valid JSON, not a record of this run
    p.write_text("".join(lines))
    with pytest.raises(ValueError, match=r"line 2: .*keys or shapes differ"):
        nf.load_history(p)
