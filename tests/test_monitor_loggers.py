"""TensorBoard scalars per symmetry, on_record for any logger, ASCII history keys (issue #19)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.monitor.history import flat_record, symmetry_key, symmetry_keys

DT = torch.float64
ASCII_KEY = re.compile(r"^[A-Za-z0-9_.\-/]+$")


def detected() -> tuple[nn.Module, nf.SymmetrySet, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4), nn.Linear(4, 3)
    ).to(DT)
    x, y = torch.randn(24, 5, dtype=DT), torch.randint(0, 3, (24,))
    syms = nf.find_symmetries(m, x[:8])
    return m, syms, x, y


def train(
    mon: nf.NoetherMonitor, m: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int
) -> None:
    opt = torch.optim.SGD(m.parameters(), lr=0.05, weight_decay=2e-3)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with mon.track():
            loss = F.cross_entropy(m(x), y)
            loss.backward()
        mon.step(loss)
        opt.step()


def test_symmetry_keys_are_ascii_stable_and_unique() -> None:
    assert symmetry_key("rescaling:0→2") == "rescaling.0_to_2"
    assert symmetry_key("layer1↔layer2") == "layer1_and_layer2"
    assert symmetry_key("rotation:attn/q→attn/k") == "rotation.attn.q_to_attn.k"
    assert symmetry_key("échelle (fc1)") == "echelle_fc1"
    # a non-ASCII separator becomes "_", not nothing (BERT's "rotation:…query·…key[h0]")
    assert symmetry_key("rotation:attn.query·attn.key[h0]") == "rotation.attn.query_attn.key_h0"
    assert symmetry_key("rescaling0") == "rescaling0"
    for k in ("rescaling.0_to_2", "layer1_and_layer2", "a-b_c.d"):
        assert symmetry_key(k) == k  # idempotent on keys
    keys = symmetry_keys(["a→b", "a_to_b", "a b", "a_b"])
    assert list(keys.values()) == ["a_to_b", "a_to_b_2", "a_b", "a_b_2"]


def test_history_keys_are_ascii_and_names_stay_for_display(tmp_path: Path) -> None:
    m, syms, x, y = detected()
    assert any(not n.isascii() for n in syms.names)  # detection's pretty names use "→"
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        lr=0.05,
        batch_size=24,
        logging=nf.LogOptions(log_dir=tmp_path, progress=False, tensorboard=False),
    )
    train(mon, m, x, y, 2)
    mon.close()
    h = mon.history
    assert all(ASCII_KEY.match(k) for k in h), [k for k in h if not ASCII_KEY.match(k)]
    for name in syms.names:
        assert f"flow/{symmetry_key(name)}" in h
    header = (tmp_path / "history.csv").read_text().splitlines()[0]
    assert header.isascii()
    assert set(nf.load_history(tmp_path / "history.jsonl")) == set(h)


def test_on_record_gets_flat_ascii_floats() -> None:
    m, syms, x, y = detected()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=2,
        distance=nf.DistanceOptions(every=2),
        lr=0.05,
        batch_size=24,
        logging=nf.LogOptions(progress=False),
    )
    got: list[dict[str, float]] = []
    mon.on_record(got.append)
    train(mon, m, x, y, 4)
    assert [int(r["step"]) for r in got] == [0, 2]
    h = mon.history
    for j, rec in enumerate(got):
        assert all(ASCII_KEY.match(k) and type(v) is float for k, v in rec.items())
        assert rec["loss"] == h["loss"][j] and rec["lr"] == 0.05
        flows = []
        for name in syms.names:
            key = mon.keys[name]
            v = h[f"flow/{key}"][j]
            if v.ndim:  # vectors: summaries, not dropped
                assert rec[f"flow/{key}/max_abs"] == np.abs(v).max()
                assert rec[f"flow/{key}/mean"] == pytest.approx(v.mean(), rel=1e-15, abs=0)
                assert rec[f"charge/{key}/mean"] == pytest.approx(
                    h[f"charge/{key}"][j].mean(), rel=1e-15, abs=0
                )
                assert rec[f"distance/{key}/max"] == h[f"distance/{key}"][j].max()
            else:
                assert rec[f"flow/{key}"] == float(v)
            flows.append(np.abs(v).max())
        assert rec["summary/max_abs_flow"] == max(flows)
    with pytest.raises(TypeError, match="callable"):
        mon.on_record("wandb")  # type: ignore[arg-type]


def test_flat_record_leaves_out_nan_and_keeps_inf() -> None:
    row = {
        "step": np.asarray(3),
        "loss": np.asarray(np.nan),
        "distance/a": np.asarray([1.0, np.inf]),
        "flow/a": np.asarray([np.nan, np.nan]),
        "charge_matrix/r": np.eye(2),
        "charge/r": np.asarray(2.0),
    }
    assert flat_record(row) == {
        "step": 3.0,
        "distance/a/max": np.inf,
        "charge/r": 2.0,
        "summary/max_distance": np.inf,
    }


def test_tensorboard_event_file_has_scalars_per_symmetry_and_histograms(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")  # the optional extra
    from tensorboard.backend.event_processing import event_accumulator

    m, syms, x, y = detected()
    mon = nf.NoetherMonitor(
        m,
        syms,
        every=1,
        lr=0.05,
        batch_size=24,
        logging=nf.LogOptions(log_dir=tmp_path, progress=False, tensorboard=True),
    )
    train(mon, m, x, y, 3)
    mon.close()
    ea = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0}
    )
    ea.Reload()
    tags = ea.Tags()
    h = mon.history
    assert all(t.isascii() for t in tags["scalars"])
    want_scalars = {"loss", "lr", "weight_decay", "summary/max_abs_flow", "summary/max_distance"}
    for name, s in syms.items():
        key = mon.keys[name]
        if isinstance(s, nf.DoubleRotation):
            want_scalars |= {f"charge/{key}", f"flow/{key}", f"distance/{key}"}
        else:
            want_scalars |= {f"flow/{key}/max_abs", f"charge/{key}/mean", f"distance/{key}/max"}
            assert f"flow/{key}" in tags["histograms"]
    assert want_scalars <= set(tags["scalars"]), want_scalars - set(tags["scalars"])
    key = next(mon.keys[n] for n, s in syms.items() if not isinstance(s, nf.DoubleRotation))
    events = ea.Scalars(f"flow/{key}/max_abs")
    assert [e.step for e in events] == [0, 1, 2]
    np.testing.assert_allclose(
        [e.value for e in events], np.abs(h[f"flow/{key}"]).max(axis=1), rtol=1e-6, atol=0
    )
    np.testing.assert_allclose([e.value for e in ea.Scalars("loss")], h["loss"], rtol=1e-6)


def test_readme_monitor_snippet_runs_and_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = Path(__file__).resolve().parents[1] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
    snippet = next(b for b in blocks if "nf.NoetherMonitor(" in b)
    assert "mon.close()" in snippet
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x, y = torch.randn(384, 4), torch.randint(0, 3, (384,))  # 12 batches of 32
    ns = {
        "nf": nf,
        "torch": torch,
        "model": model,
        "syms": nf.SymmetrySet([nf.Rescaling(model[0], model[2])]),
        "loss_fn": F.cross_entropy,
        "x": x,  # defined by the README's first example; the snippet's loader reads them
        "y": y,
    }
    exec(compile(snippet, "README.md", "exec"), ns)
    mon = ns["mon"]
    assert mon.history["step"].tolist() == [0, 10]
    assert mon.history["weight_decay"].tolist() == [1e-4, 1e-4]
    assert (tmp_path / "runs/x/monitor.png").exists()
    assert nf.load_history(tmp_path / "runs/x")["step"].tolist() == [0, 10]


def test_wandb_and_mlflow_callbacks_pass_the_step_as_a_step() -> None:
    """issue #31: the step is the step axis, never a metric; non-finite values left out."""
    from noetherflow.integrations.loggers import mlflow_on_record, wandb_on_record

    class Run:
        def __init__(self) -> None:
            self.defined: list[tuple[str, dict[str, object]]] = []
            self.logged: list[dict[str, float]] = []
            self.steps: list[tuple[dict[str, float], int]] = []

        def define_metric(self, name: str, **kw: object) -> None:
            self.defined.append((name, kw))

        def log(self, metrics: dict[str, float]) -> None:
            self.logged.append(metrics)

        def log_metrics(self, metrics: dict[str, float], step: int) -> None:
            self.steps.append((metrics, step))

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2])])
    mon = nf.NoetherMonitor(
        m, syms, every=2, lr=0.1, batch_size=16, logging=nf.LogOptions(progress=False)
    )
    w, f = Run(), Run()
    mon.on_record(wandb_on_record(w))
    mon.on_record(mlflow_on_record(f))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    for _ in range(4):
        with mon.track():
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
        mon.step(loss)
        m.zero_grad()
    mon.close()
    assert ("noether/*", {"step_metric": "noether/step"}) in w.defined
    assert [r["noether/step"] for r in w.logged] == [0, 2]
    assert [s for _, s in f.steps] == [0, 2]
    for metrics in [*w.logged, *(mt for mt, _ in f.steps)]:
        assert "noether/loss" in metrics and "step" not in metrics
        assert all(np.isfinite(v) for v in metrics.values())
    assert all("noether/step" not in mt for mt, _ in f.steps)
