"""Monitor plots stay readable with many symmetries (issue #19): named lines limited, legends
outside the panels, pretty names for display."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import noetherflow as nf
from noetherflow.plotting import plot_history


def many(n_syms: int = 60, records: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h: dict[str, np.ndarray] = {"step": np.arange(records), "loss": rng.random(records)}
    for i in range(n_syms):
        h[f"charge/s{i}"] = rng.random((records, 3)) * (i + 1)
        h[f"flow/s{i}"] = rng.standard_normal(records) * (i + 1)
    return h


def legend_outside(ax, fig) -> bool:
    fig.canvas.draw()
    leg = ax.get_legend()
    r = fig.canvas.get_renderer()
    return leg.get_window_extent(r).x0 >= ax.get_window_extent(r).x1


def test_sixty_symmetries_name_the_top_k_and_group_the_rest(tmp_path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot_history(many(), tmp_path / "m.png", kinds=("loss", "charge", "flow"), top_k=5)
    FigureCanvasAgg(fig)
    assert (tmp_path / "m.png").stat().st_size > 0
    loss_ax, charge_ax, flow_ax = fig.axes
    for ax, rest in ((charge_ax, 60 * 3 - 5), (flow_ax, 60 - 5)):
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(texts) == 6 and texts[-1] == f"others ({rest})"
        assert "the 5 with the largest max" in ax.get_title(loc="left")
        assert legend_outside(ax, fig)
    flow_names = [t.get_text() for t in flow_ax.get_legend().get_texts()][:5]
    h = many()
    top = sorted(range(60), key=lambda i: -np.abs(h[f"flow/s{i}"]).max())[:5]
    assert sorted(flow_names) == sorted(f"s{i}" for i in top)
    assert [t.get_text() for t in loss_ax.get_legend().get_texts()] == ["loss"]
    assert loss_ax.get_title(loc="left") == ""
    with pytest.raises(ValueError, match="top_k=0"):
        plot_history(many(), top_k=0)


def test_monitor_plot_uses_pretty_names(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    syms = nf.SymmetrySet([nf.Rescaling(m[0], m[2], label="fc1↔fc2")])
    mon = nf.NoetherMonitor(
        m, syms, every=1, lr=0.1, batch_size=8, logging=nf.LogOptions(progress=False)
    )
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    for _ in range(2):
        with mon.track():
            loss = F.mse_loss(m(x), y)
            loss.backward()
        mon.step(loss)
        m.zero_grad()
    fig = mon.plot(kinds=("flow",), max_lines=4, top_k=3)
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert texts == ["fc1↔fc2 (median)"]
    assert "flow/fc1_and_fc2" in mon.history
